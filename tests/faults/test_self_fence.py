"""``handoff run`` fences itself when it cannot record heartbeats, on both backends.

The issue's complaint: with the store locked for 12 s against a 3 s heartbeat timeout the
child ran on while the wrapper only retried; across a partition that is split brain.
Here the ledger is made unreachable for longer than the heartbeat timeout (SQLite:
another process holds the write lock; PostgreSQL: the worker's proxy blackholes), with
a real wrapper, a real child that writes one timestamped line per action, and then:

- no child action is later than the moment the watchdog could have revoked the lease
  (the last recorded heartbeat's time plus the heartbeat timeout);
- the wrapper exits 75 (FENCED_EXIT), and once the ledger answers again it records why
  it stopped the child (the release's reason; a progress note too in a working state)
  and releases the lease.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from handoff import Ledger
from handoff.worker import FENCED_EXIT
from tests.faults.conftest import ROOT, agent, child_env, wait_until
from tests.faults.pg.conftest import proxies  # noqa: F401 - the fixture
from tests.support import executable

TIMEOUT_S = 2.0  # the run's heartbeat timeout


def _actions(path: str) -> list[float]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [float(line.split()[0]) for line in f if line.endswith("\n")]


def _wrapper(db: str, actions: str) -> subprocess.Popen[str]:
    argv = [*executable(), "run", "--goal", "fence me", "--target", "chat:#ops", "--owner", "alice",
            "--heartbeat-timeout", str(TIMEOUT_S), "--worker", "w1", "--heartbeat-every", "0.25",
            "--grace", "5", "--json", "--",
            sys.executable, "-m", "tests.faults.pg.agents", "actor", actions, "120"]
    return subprocess.Popen(argv, cwd=ROOT, env=child_env(HANDOFF_DB=db), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _proof_seen(db: str) -> int:
    """The last heartbeat a watchdog would judge from, read while the wrapper is still cut
    off (another connection, on the ledger's side of the cut): the run as it stands, its
    beats kept beside the log included (beats still land between the order to cut and the
    cut itself). Read before the ledger answers again, so a beat that waited through the
    outage is not counted as proof."""
    with Ledger(db) as lg:
        (run,) = [h.run_id for h in lg.store.list_runs()]
        w = lg.checkpoint(run).watch
        assert w.lease_since_us is not None, "the run was never claimed"
        return max(w.lease_since_us, w.last_heartbeat_us or 0)


def _fence_holds(lg: Ledger, actions: list[float], cut_at_wall: float, back_at_wall: float,
                 last_proof_us: int) -> dict[str, object]:
    """The checks both backends share; returns the evidence. ``cut_at_wall``: when the test
    started cutting the wrapper off; ``back_at_wall``: when the ledger was reachable again;
    ``last_proof_us``: the last heartbeat the watchdog could see before then (``_proof_seen``)."""
    (run,) = [h.run_id for h in lg.store.list_runs()]
    log = list(lg.log(run))
    # Whatever beats the log holds from before the outage ended, the kept beat is not older.
    logged = [r.recorded_us for r in log if r.type in ("heartbeat_recorded", "lease_granted")
              and r.recorded_us / 1e6 < back_at_wall]
    assert logged and max(logged) <= last_proof_us, (logged, last_proof_us)
    could_revoke = last_proof_us / 1e6 + TIMEOUT_S
    after_cut = [a for a in actions if a >= cut_at_wall]
    assert after_cut, "the child never acted after the cut: the test proves nothing"
    assert max(actions) < could_revoke, (
        f"the child acted {max(actions) - could_revoke:.3f}s after the watchdog could have revoked")
    # The run was never moved past queued, so the release's reason carries the why.
    released = [r for r in log if r.type == "lease_released"]
    assert len(released) == 1, [r.type for r in log]
    assert "child stopped by the wrapper" in released[0].event.reason
    assert lg.verify() == []
    return {"child_actions_after_cut": len(after_cut),
            "last_action_before_possible_revoke_s": round(could_revoke - max(actions), 3),
            "recorded": [r.type for r in log[-2:]]}


def _finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, object], str]:
    out, err = proc.communicate(timeout=60)
    doc = json.loads(out)
    return proc.returncode, doc, err


def test_sqlite_wrapper_stops_its_child_while_another_process_holds_the_lock(tmp_path, procs, evidence):
    db = str(tmp_path / "ledger.db")
    actions = str(tmp_path / "actions")
    w = _wrapper(db, actions)
    procs.append(w)
    wait_until(lambda: len(_actions(actions)) > 20, what="the child acting")
    time.sleep(0.6)  # a few heartbeats recorded
    marker = str(tmp_path / "locked")
    cut_at = time.time()
    locker = agent("locker", db, marker, "IMMEDIATE")
    procs.append(locker)
    wait_until(lambda: os.path.exists(marker), what="the lock being held")
    time.sleep(TIMEOUT_S * 2)  # held for twice the heartbeat timeout
    assert w.poll() is None or w.returncode == FENCED_EXIT
    proof_us = _proof_seen(db)  # a reader is not blocked by the held write lock (WAL)
    back_at = time.time()
    locker.send_signal(signal.SIGKILL)
    locker.wait()
    rc, doc, err = _finish(w)
    assert rc == FENCED_EXIT, err
    assert doc["fenced"] is True and doc["returncode"] == FENCED_EXIT and doc["released"] is True
    assert doc["silent_s"] >= TIMEOUT_S * 0.75
    assert "the child is stopped now" in err
    with Ledger(db) as lg:
        ev = _fence_holds(lg, _actions(actions), cut_at, back_at, proof_us)
    evidence.add("self_fence_sqlite", lock_held_s=TIMEOUT_S * 2, heartbeat_timeout_s=TIMEOUT_S,
                 exit=rc, silent_s=doc["silent_s"], signal=doc["signal"], **ev)


def test_postgres_wrapper_stops_its_child_while_its_proxy_blackholes(tmp_path, procs, evidence, proxies):
    from tests.pg import fresh_url

    url = fresh_url()
    proxy = proxies(url)
    actions = str(tmp_path / "actions")
    w = _wrapper(proxy.url(url), actions)
    procs.append(w)
    wait_until(lambda: len(_actions(actions)) > 20, timeout=60, what="the child acting")
    time.sleep(0.6)
    cut_at = time.time()
    proxy.blackhole()
    time.sleep(TIMEOUT_S * 2)
    assert w.poll() is None or w.returncode == FENCED_EXIT
    proof_us = _proof_seen(url)  # over a connection of its own, not through the proxy
    back_at = time.time()
    proxy.heal()
    rc, doc, err = _finish(w)
    assert rc == FENCED_EXIT, err
    assert doc["fenced"] is True and doc["released"] is True
    with Ledger(url) as lg:
        ev = _fence_holds(lg, _actions(actions), cut_at, back_at, proof_us)
    evidence.add("self_fence_postgres", blackhole_s=TIMEOUT_S * 2, heartbeat_timeout_s=TIMEOUT_S,
                 exit=rc, silent_s=doc["silent_s"], signal=doc["signal"], proxy=proxy.counts, **ev)


@pytest.mark.parametrize("margin", ["-1", "2", "5"])
def test_a_fence_margin_not_below_the_timeout_is_refused(tmp_path, margin):
    """A margin of the whole timeout or more would stop every child at once; negative is nonsense."""
    db = str(tmp_path / "ledger.db")
    r = subprocess.run([*executable(), "run", "--goal", "g", "--target", "chat:#ops", "--owner", "alice",
                        "--heartbeat-timeout", "2", "--worker", "w1", "--fence-margin", margin, "--",
                        "true"], cwd=ROOT, env=child_env(HANDOFF_DB=db), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert "margin" in r.stderr
