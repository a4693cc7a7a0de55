"""Matrix row 4 and the server's limits, on a PRIVATE PostgreSQL cluster this session starts.

Never the shared server on 5432: other agents' tests use it. tests/faults/pg/cluster.py
makes a throw-away cluster (initdb into a temporary directory, a free port, run as the
``postgres`` OS user under root); these tests crash it (SIGKILL of the postmaster) and
stop it in immediate mode, and fill its connection slots.
"""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from handoff import Ledger
from handoff.ledger.store import Actor
from tests.faults.conftest import handoff, scale, wait_until

from .conftest import pg_agent
from .history import check, read_history

OWNER = Actor("owner", "alice")


def _database(cluster, name: str) -> str:
    with psycopg.connect(cluster.url, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    return cluster.url.rsplit("/", 1)[0] + "/" + name


def _retry(lg: Ledger):
    def again(run: str, key: str):
        client, _, i = key.rpartition("-")
        return lg.evidence(run, "check", "pass", f"{client} {i}", actor=OWNER, key=key)
    return again


@pytest.mark.slow  # scaled: bounded by default (one way, one restart), both ways and 4 restarts with --slow
@pytest.mark.parametrize("how", ["sigkill-postmaster", "stop-immediate"])
def test_server_stopped_hard_and_restarted_during_appends(private_cluster, tmp_path, procs, evidence, how):
    if how == "stop-immediate" and os.environ.get("HANDOFF_TEST_SCALE") != "full":
        pytest.skip("the second way of stopping runs in the full matrix only (--slow)")
    url = _database(private_cluster, "restart_" + how.replace("-", "_"))
    writers, per_writer = 4, scale(60, 600)
    with Ledger(url) as lg:
        runs = [lg.open(goal=f"run {i}", target="chat:#ops", owner="alice") for i in range(writers)]
        shared = lg.open(goal="shared", target="chat:#ops", owner="alice")
    hists = [str(tmp_path / f"h{i}.jsonl") for i in range(writers)]
    stop = str(tmp_path / "stop")
    # The writers go on past their plan until told to stop, so every restart finds them at
    # work: one that finished early would leave a restart that hits no client.
    for i in range(writers):
        procs.append(pg_agent("writer", url, hists[i], f"w{i}", f"{runs[i]},{shared}", per_writer, 200, stop))
    restarts, down_exits = 0, []
    for _ in range(scale(1, 4)):
        # Crash while the writers are busy: once each has been acknowledged some more (a
        # writer still starting, slow on a busy machine, would have no connection to lose).
        seen = [len(read_history([h])) for h in hists]
        wait_until(lambda: all(len(read_history([h])) >= seen[i] + 10 for i, h in enumerate(hists)), timeout=120,
                   what="every writer appending")
        _all_running(procs)
        crashed_at = [len(read_history([h])) for h in hists]
        if how == "sigkill-postmaster":
            private_cluster.crash()
        else:
            private_cluster.stop_immediate()
        # While it is down, a client gets a one-line store error, exit 3.
        r = handoff("status", "--json", db=url, timeout=60)
        down_exits.append(r.returncode)
        assert r.returncode == 3 and "StoreUnavailable" in r.stderr, r.stderr
        time.sleep(0.5)
        private_cluster.start()
        restarts += 1
        # The restart hit the writers: each one's next call after the crash found its
        # connection gone and said so (failed, or unknown if it was committing).
        wait_until(lambda: _met_the_restart(hists, crashed_at) == set(range(writers)), timeout=120,
                   what="every writer to meet the restart")
    # Every writer is past its plan and past the last restart: stop them.
    wait_until(lambda: all(sum(r["status"] == "ok" for r in read_history([h])) >= per_writer for h in hists),
               timeout=300, what="the writers finishing their plan")
    open(stop, "w").close()
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    with Ledger(url) as lg:
        history = read_history(hists)
        counts = check(lg, history, _retry(lg))
    assert counts["failed"] + counts["unknown"] >= restarts * writers, counts
    planned = {f"w{i}-{k}" for i in range(writers) for k in range(per_writer)}
    assert planned <= {r["key"] for r in history}, "a writer skipped part of its plan"
    evidence.add(f"pg_row4_server_restart[{how}]", restarts=restarts, exits_while_down=down_exits, **counts)


def _met_the_restart(hists: list[str], crashed_at: list[int]) -> set[int]:
    """The writers whose history, since the crash, holds a call that failed or is unknown."""
    return {i for i, h in enumerate(hists)
            if any(r["status"] in ("failed", "unknown") for r in read_history([h])[crashed_at[i]:])}


def _all_running(procs) -> None:
    for p in procs:
        assert p.poll() is None, f"a writer ended before the restart (exit {p.returncode}):\n{p.stderr.read()}"


def test_out_of_connections_is_a_typed_store_error_and_writes_nothing(private_cluster, evidence):
    url = _database(private_cluster, "out_of_slots")
    with Ledger(url) as lg:
        run = lg.open(goal="full", target="chat:#ops", owner="alice")
        before = [(r.position, r.hash) for r in lg.store.read_all()]
    held = []
    try:
        while True:  # take every slot the server has
            try:
                held.append(psycopg.connect(url, autocommit=True, connect_timeout=3))
            except psycopg.OperationalError:
                break
        r = handoff("evidence", run, "--kind", "check", "--outcome", "pass", "--by", "alice", db=url)
        assert r.returncode == 3, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "too many clients" in r.stderr
        assert "out of resources" in r.stderr, r.stderr
        with pytest.raises(Exception) as caught:
            Ledger(url)
        assert type(caught.value).__name__ == "StoreUnavailable"
    finally:
        for c in held:
            c.close()
    with Ledger(url) as lg:
        assert [(r.position, r.hash) for r in lg.store.read_all()] == before
    ok = handoff("evidence", run, "--kind", "check", "--outcome", "pass", "--by", "alice", db=url)
    assert ok.returncode == 0, ok.stderr
    evidence.add("pg_limits_out_of_connections", slots_taken=len(held), exit=r.returncode, error=r.stderr.strip()[:160])
