"""The stall scan judges due runs from their stall view rows, and reads a packet only when asked.

``Ledger.stalls`` reads the due index (liveness signals), then the progress columns of the
runs whose worker is alive, and classifies whole only the runs whose verdict needs more
(``stall.needs_packet``). Its answers must equal ``stall.classify`` on a fresh fold; the
runs judged from their rows come as ``queries.DueRun``, whose packet is read on first use.
"""

from __future__ import annotations

import sqlite3

import pytest

from handoff import Ledger
from handoff.projections import queries
from handoff.reducers import stall
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint
from tests.support import S


@pytest.fixture
def fleet(tmp_path, clock):
    """Runs in each shape the scan tells apart, and the time at which all are due."""
    lg = Ledger(str(tmp_path / "ledger.db"), clock=clock)
    result = tmp_path / "result.md"
    result.write_text("a substantive result\n")
    leases = {}
    for run in ("silent", "stuck", "fine", "lost", "attempt", "queued"):
        lg.open(goal=f"goal {run}", target="chat:#ops", owner="alice", run_id=run,
                heartbeat_timeout_s=30, progress_timeout_s=120, delivery_timeout_s=60, retry_budget=2)
    for run in ("silent", "stuck", "fine", "lost", "attempt"):
        leases[run] = lg.claim(run, f"w-{run}")
        lg.transition(run, leases[run], "planning")
    lg.effect_start("lost", leases["lost"], "mail-1", "send a mail")
    lg.release("lost", leases["lost"], "gone")
    for state in ("executing", "verifying"):
        lg.transition("attempt", leases["attempt"], state)
    lg.artifact("attempt", leases["attempt"], str(result))
    lg.evidence("attempt", "spellcheck", "pass", lease=leases["attempt"])
    lg.submit("attempt", leases["attempt"], "done")
    lg.deliver("attempt", "send-1", by="alice")
    clock.advance(100)
    lg.heartbeat("stuck", leases["stuck"])
    lg.heartbeat("fine", leases["fine"])
    lg.progress("fine", leases["fine"], "plan_committed", "planned")
    clock.advance(25)
    yield lg, leases
    lg.close()


def classified(lg: Ledger, now: int) -> dict[str, stall.Health]:
    out = {}
    for head in lg.store.list_runs():
        h = stall.classify(lg.store.fold(head.run_id, AGGREGATE), now_us=now)
        if h.needs_attention and not head.run_id.startswith("watcher:"):
            out[head.run_id] = h
    return out


def test_verdicts_equal_classify_at_every_instant(fleet, clock):
    lg, _ = fleet
    now = clock()
    for at in (now, now + 10 * S, now + 30 * S, now + 61 * S, now + 200 * S, now + 10**10):
        got = {cp.run_id: h for cp, h in lg.stalls(now=at)}
        assert got == classified(lg, at), at
        assert {cp.run_id: h for cp, h in lg.iter_stalls(now=at)} == got
    kinds = {cp.run_id: h.classification for cp, h in lg.stalls(now=now + 10**10)}
    assert kinds == {"silent": "unavailable", "stuck": "unavailable", "fine": "unavailable",
                     "lost": "needs_reconciliation", "attempt": "delivery_ambiguous"}
    # Now: "fine" beat and progressed 25 s ago; "stuck" beat then but has not progressed
    # in 125 s (timeout 120); "silent" has not beaten since its claim.
    kinds = {cp.run_id: h.classification for cp, h in lg.stalls(now=now)}
    assert kinds == {"silent": "unavailable", "stuck": "stalled", "lost": "needs_reconciliation",
                     "attempt": "delivery_ambiguous"}


def test_a_progress_verdict_reads_the_progress_columns(fleet, clock):
    lg, leases = fleet
    lg.heartbeat("stuck", leases["stuck"])  # beating, but no progress for 125 s of 120
    [(cp, h)] = [(cp, h) for cp, h in lg.stalls(now=clock()) if cp.run_id == "stuck"]
    assert (h.classification, h.action) == ("stalled", "mark_stalled")
    assert h == stall.classify(lg.store.fold("stuck", AGGREGATE), now_us=clock())


def test_row_judged_runs_read_no_packet_until_opened(fleet, clock, monkeypatch):
    lg, _ = fleet
    views = lg.store.views
    reads: list[tuple[str, tuple]] = []
    for name in ("get", "get_many"):
        real = getattr(views, name)

        def spy(table, keys, columns, _real=real):
            reads.append((table, tuple(columns)))
            return _real(table, keys, columns)

        monkeypatch.setattr(views, name, spy)
    found = lg.stalls(now=clock() + 10**10)
    packets = [r for r in reads if r[1] == ("packet",)]
    assert len(packets) == 1  # one read, together, for the two runs whose verdict needs the packet
    by_run = {cp.run_id: cp for cp, _ in found}
    assert isinstance(by_run["lost"], Checkpoint) and isinstance(by_run["attempt"], Checkpoint)
    silent = by_run["silent"]
    assert isinstance(silent, queries.DueRun)
    assert (silent.run_id, silent.state, silent.lease, silent.worker, silent.terminal) == (
        "silent", "planning", 1, "w-silent", False)
    reads.clear()
    fold = lg.store.fold("silent", AGGREGATE)
    assert silent.watch == fold.watch and silent.policy == fold.policy and silent.progress_seq == fold.progress_seq
    assert silent == fold and silent.checkpoint == fold
    assert silent.goal == "goal silent"
    assert reads == [("checkpoints", ("packet",))]  # opened once, kept


def test_the_cli_shape_is_unchanged(fleet, clock):
    from handoff import render as R

    lg, _ = fleet
    now = clock() + 10**10
    lazy = {cp.run_id: R.stall_row(cp, h) for cp, h in lg.stalls(now=now)}
    eager = {}
    for run, h in classified(lg, now).items():
        eager[run] = R.stall_row(lg.store.fold(run, AGGREGATE), h)
    assert lazy == eager


def test_views_of_an_older_version_read_only_classify_packets(fleet, clock, tmp_path):
    lg, _ = fleet
    path = lg.store.path
    now = clock() + 10**10
    want = {cp.run_id: h for cp, h in lg.stalls(now=now)}
    lg.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE projection_versions SET version = 1 WHERE name = 'stall_watch'")
    conn.commit()
    conn.close()
    with Ledger(path, readonly=True) as ro:
        assert not ro.projector.current
        got = ro.stalls(now=now)
        assert all(isinstance(cp, Checkpoint) for cp, _ in got)
        assert {cp.run_id: h for cp, h in got} == want
        assert {cp.run_id: h for cp, h in ro.iter_stalls(now=now)} == want
    with Ledger(path) as rw:  # a writable open refolds the view at this version
        assert rw.projector.current and rw.check() == []
        assert {cp.run_id: h for cp, h in rw.stalls(now=now)} == want
