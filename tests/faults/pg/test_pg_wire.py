"""Matrix rows 2 and 3: a commit whose answer is lost, and writers' backends killed.

Every client operation is recorded (invoked / ok / failed / unknown) by the client
process itself, and tests/faults/pg/history.py's checker proves afterwards: no ok
operation missing from the log, no failed one present, every unknown one resolved by
its key, no event doubled, seqs contiguous, verify clean.
"""

from __future__ import annotations

import random
import time

import pytest

from handoff import Ledger
from handoff.ledger.store import Actor
from tests.faults.conftest import read_jsonl, scale

from .conftest import pg_agent
from .history import check, read_history

OWNER = Actor("owner", "alice")


def _retry(lg: Ledger):
    def again(run: str, key: str):
        # The same request as the writer's: the same text, the same key.
        client, _, i = key.rpartition("-")
        detail = "once" if client == "" or key.startswith("commit") else f"{client} {i}"
        return lg.evidence(run, "check", "pass", detail, actor=OWNER, key=key)
    return again


@pytest.mark.parametrize("lands", [True, False], ids=["commit-reaches-server", "commit-lost-too"])
def test_blackhole_during_commit_is_outcome_unknown_and_its_key_settles_it(pg_url, proxies, tmp_path, evidence, lands):
    with Ledger(pg_url) as lg:
        run = lg.open(goal="commit into the void", target="chat:#ops", owner="alice")
        before = [r.position for r in lg.store.read_all()]
    proxy = proxies(pg_url)
    proxy.blackhole_after(b"COMMIT", deliver=lands)
    hist = str(tmp_path / "history.jsonl")
    p = pg_agent("one", proxy.url(pg_url), hist, run, "commit-1", "1")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "unknown", (out, err)  # never "nothing written", never success
    assert proxy.counts["triggered"] == 1
    recs = read_jsonl(hist)
    assert [r["status"] for r in recs] == ["invoked", "unknown"] and recs[1]["error"] == "OutcomeUnknown"
    with Ledger(pg_url) as lg:
        stored = [r for r in lg.store.read_all() if r.idempotency_key == "commit-1"]
        assert len(stored) == (1 if lands else 0)
        counts = check(lg, read_history([hist]), _retry(lg))
        assert counts["unknown_landed" if lands else "unknown_retried_in"] == 1
        assert len([r for r in lg.store.read_all()]) == len(before) + 1
    evidence.add(f"pg_row2_blackhole_during_commit[{'lands' if lands else 'lost'}]", **counts)


def test_writers_backends_terminated_repeatedly_lose_and_double_nothing(pg_url, tmp_path, procs, evidence):
    writers = 4
    per_writer = scale(150, 600)
    with Ledger(pg_url) as lg:
        runs = [lg.open(goal=f"run {i}", target="chat:#ops", owner="alice") for i in range(writers)]
        shared = lg.open(goal="shared", target="chat:#ops", owner="alice")
    hists = [str(tmp_path / f"h{i}.jsonl") for i in range(writers)]
    for i in range(writers):
        procs.append(pg_agent("writer", pg_url, hists[i], f"w{i}", f"{runs[i]},{shared}", per_writer))
    import psycopg

    rng = random.Random(13)
    kills = 0
    with psycopg.connect(pg_url, autocommit=True) as admin:
        while any(p.poll() is None for p in procs):
            time.sleep(rng.uniform(0.02, 0.1))
            pids = [r[0] for r in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name = 'handoff-ledger'").fetchall()]
            if pids:
                pid = rng.choice(pids)
                if admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                    kills += 1
    for p in procs:
        assert p.wait() == 0, p.stderr.read()
    with Ledger(pg_url) as lg:
        counts = check(lg, read_history(hists), _retry(lg))
    assert counts["operations"] == writers * per_writer
    assert counts["ok"] >= writers * per_writer - counts["unknown"]
    assert kills >= 5, "too few backends were killed for the test to mean anything"
    evidence.add("pg_row3_terminate_backend", writers=writers, kills=kills, **counts)


def test_a_silent_server_is_given_up_after_the_reply_timeout_and_a_cut_after_reconnecting(pg_url, proxies, evidence):
    """The other proxy modes, through the API in this process over real TCP: a read into a
    blackhole fails typed after lock timeout + reply timeout (it used to wait for ever); a
    cut connection fails typed and the next call reconnects; a slow link only slows."""
    from handoff.ledger.errors import OutcomeUnknown, StoreUnavailable
    from handoff.ledger.postgres import PostgresStore

    with Ledger(pg_url) as lg:
        run = lg.open(goal="wire", target="chat:#ops", owner="alice")
    proxy = proxies(pg_url)
    lg = Ledger(store=PostgresStore(proxy.url(pg_url), busy_timeout_s=0.3, reply_timeout_s=0.7))
    try:
        before = lg.checkpoint(run).last_seq
        proxy.blackhole()
        t = time.monotonic()
        with pytest.raises(StoreUnavailable) as silent:
            lg.checkpoint(run)
        waited = time.monotonic() - t
        assert 0.9 <= waited < 5, waited
        assert "no answer from the server within 1s" in silent.value.message
        proxy.pass_()
        assert lg.evidence(run, "check", "pass", "after the silence", actor=OWNER, key="w1").result.outcome == "committed"
        proxy.cut()
        # The write is guessed (this store wrote the run last), so its one message carries
        # its COMMIT: cut off, its outcome is unknown, and the retry with the same key
        # settles it (committed now, or 'duplicate' had the message reached the server).
        with pytest.raises((StoreUnavailable, OutcomeUnknown)):
            lg.evidence(run, "check", "pass", "into the cut", actor=OWNER, key="w2")
        proxy.pass_()
        assert lg.evidence(run, "check", "pass", "into the cut", actor=OWNER,
                           key="w2").result.outcome in ("committed", "duplicate")
        proxy.delay(0.02)
        t = time.monotonic()
        assert lg.evidence(run, "check", "pass", "slowly", actor=OWNER, key="w3").result.outcome == "committed"
        slow = time.monotonic() - t
        assert slow >= 0.04
        proxy.pass_()
        assert lg.checkpoint(run).last_seq == before + 3
        assert lg.verify() == []
    finally:
        lg.close()
    evidence.add("pg_wire_proxy_modes", blackholed_read_gave_up_after_s=round(waited, 2),
                 delayed_write_s=round(slow, 2), proxy=proxy.counts)


def test_a_writer_cut_off_inside_its_transaction_holds_the_others_back_only_briefly(pg_url, proxies, tmp_path, evidence):
    """Writer A is cut off with its write on the wire (the proxy holds the message that
    carries its COMMIT). A write takes its locks inside that one message, which the server
    runs only once it has all of it: A holds no lock, so a write to the same run and one
    to another run get through at once. Once the wire heals, A's write reaches a run that
    moved: it is decided again from the new head and lands, or A reports the outcome
    unknown or failed; the history check below holds either way."""
    with Ledger(pg_url) as lg:
        run_a = lg.open(goal="cut inside", target="chat:#ops", owner="alice")
        run_b = lg.open(goal="bystander", target="chat:#ops", owner="alice")
    proxy = proxies(pg_url)
    proxy.blackhole_after(b"COMMIT", deliver=False)
    hist = str(tmp_path / "history.jsonl")
    a = pg_agent("one", proxy.url(pg_url), hist, run_a, "cut-inside", "20")
    try:
        deadline = time.monotonic() + 60
        while proxy.counts["triggered"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.counts["triggered"] == 1
        waited = {}
        with Ledger(pg_url, busy_timeout_s=5) as lg:
            for name, run in (("other run", run_b), ("same run", run_a)):
                t = time.monotonic()
                assert lg.evidence(run, "check", "pass", name, actor=OWNER, key=f"by-{run}").result.outcome == "committed"
                waited[name] = round(time.monotonic() - t, 2)
        assert max(waited.values()) < 4.5, waited
    finally:
        proxy.heal()
        out, err = a.communicate(timeout=120)
    assert out.strip() in ("ok", "unknown", "failed"), (out, err)
    with Ledger(pg_url) as lg:
        counts = check(lg, read_history([hist]), _retry(lg))
    evidence.add("pg_wire_cut_inside_a_transaction", waited_s=waited, cut_writer=out.strip(), **counts)
