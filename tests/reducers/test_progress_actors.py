"""progress_seq moves with the work, never with the watchdog's or a lease's own records.

The watchdog judges progress; if its decisions (or what they force: a revoked lease's
move to unknown, a pause's blocker and move to blocked) counted as progress, the stall
clock, ``last_progress`` and the key of the next decision would all start from the
watchdog's act instead of the work's last step.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.reducers import checkpoint as ck
from handoff.reducers import stall
from handoff.reducers import transitions as T
from handoff.testing import strategies as S
from handoff.watchdog import watch_once

from tests.support import S as S_US
from tests.support import Clock

from .helpers import WATCHDOG, bring


def _ledger(tmp_path, clock: Clock) -> Ledger:
    return Ledger(str(tmp_path / "ledger.db"), clock=clock, synchronous="NORMAL")


def test_the_watchdogs_revoke_does_not_advance_progress(tmp_path):
    """Seed 003's case: executing, a side effect started, the worker silent. The watchdog
    revokes the lease and the run goes to unknown; the last progress is still the work's."""
    clock = Clock()
    lg = _ledger(tmp_path, clock)
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.effect_start(run.id, run.lease, "mail-1", "mail the report", worker=run.worker)
    before = lg.checkpoint(run.id)
    clock.advance(before.policy.heartbeat_timeout_s + 1)
    acts = watch_once(lg, name="dog", now_us=clock.now)
    assert [(a.action, a.outcome) for a in acts if a.run_id == run.id] == [("revoke_lease", "committed")]
    after = lg.checkpoint(run.id)
    assert after.state == T.UNKNOWN and after.lease is None
    assert after.progress_seq == before.progress_seq
    assert after.watch.last_progress == before.watch.last_progress
    status = lg.status(run.id)
    assert status["progress_seq"] == before.progress_seq
    assert status["last_progress"]["kind"] == "state:executing"
    assert lg.check() == []  # the views were kept by the same rule
    lg.close()


def test_a_pause_does_not_advance_progress_and_the_stall_clock_keeps_its_start(tmp_path):
    """A run stalled past its retry budget is paused (blocker raised, moved to blocked):
    neither counts, so last_progress still names the work's last step."""
    clock = Clock()
    lg = _ledger(tmp_path, clock)
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id="r1", progress_timeout_s=10, retry_budget=1)
    lease = lg.claim("r1", "w1")
    lg.transition("r1", lease, T.PLANNING, worker="w1")
    lg.progress("r1", lease, "plan_committed", "v1", worker="w1")
    last = lg.checkpoint("r1").watch.last_progress
    actions = []
    for _ in range(4):  # one progress-timeout window per pass, heartbeats all along
        clock.advance(11)
        lg.heartbeat("r1", lease, worker="w1")
        actions += [a.action for a in watch_once(lg, name="dog", now_us=clock.now) if a.outcome == "committed"]
    cp = lg.checkpoint("r1")
    assert "pause" in actions and cp.state == T.BLOCKED
    assert cp.watch.last_progress == last
    lg.close()


def test_owner_steps_still_advance(tmp_path):
    """The owner's workflow steps are progress, as the seeds list them."""
    clock = Clock()
    lg = _ledger(tmp_path, clock)
    bring(lg, tmp_path, T.READY_FOR_REVIEW)
    before = lg.checkpoint("r1").progress_seq
    lg.review("r1", True, by="alice")
    cp = lg.checkpoint("r1")
    # review_decided and the move to succeeded
    assert cp.progress_seq == before + 2 and cp.watch.last_progress.kind == "state:succeeded"
    lg.close()


# --- random histories ------------------------------------------------------------------

_ACTORS = st.sampled_from(["worker:w1", "owner:alice", "operator:op", "watchdog:dog"])
_LEASE_TYPES = frozenset({"lease_granted", "lease_released", "lease_revoked"})


def _records(steps: list[tuple[ev.Event, str]]) -> list:
    """Envelopes for (event, actor) pairs, one per actor: as_records with the actor varying."""
    out = []
    for i, (e, actor) in enumerate(steps):
        rec = S.as_records([e], actor=actor, start_us=1_700_000_000_000_000 + i * S_US)[0]
        out.append(ck.msgspec.structs.replace(rec, seq=i + 1, position=i + 1))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(S.events(), _ACTORS), max_size=30))
def test_no_watchdog_or_lease_event_ever_moves_progress(steps):
    """Over any history: an event by the watchdog, a lease event, and a move only a lease's
    end makes leave progress_seq and last_progress exactly as they were; and the stall
    clock's start is the last progress of a worker, owner or operator (or the claim)."""
    records = _records(steps)
    w = stall.initial()
    last_boundary = None
    for rec, (e, actor) in zip(records, steps):
        nxt = stall.evolve(w, rec, e)
        moved = nxt.progress_seq != w.progress_seq
        by_watchdog = actor.startswith("watchdog:")
        lease_end_move = isinstance(e, ev.StateChanged) and (e.from_state, e.to_state) in T.LEASE_END_MOVES
        if by_watchdog or rec.type in _LEASE_TYPES or lease_end_move:
            assert not moved and nxt.last_progress == w.last_progress, (rec.type, actor)
        if moved:
            assert nxt.progress_seq == w.progress_seq + 1
            assert nxt.last_progress.event_seq == rec.seq and nxt.last_progress.at_us == rec.recorded_us
            last_boundary = rec
        w = nxt
    assert (w.last_progress is None) == (last_boundary is None)
    if last_boundary is not None:
        assert not last_boundary.actor.startswith("watchdog:")
        assert w.last_progress.at_us == last_boundary.recorded_us


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(S.events(), _ACTORS), max_size=25))
def test_the_lean_fold_reads_the_actor_too(steps):
    """A store folds over Steps (no hashes); the actor must travel with them, or the two
    folds would disagree on every watchdog event."""
    from handoff.ledger.store import Step

    records = _records(steps)
    lean = [Step(r.run_id, r.seq, r.type, r.recorded_us, r.event, r.actor) for r in records]
    assert ck.fold(records, "r1") == ck.fold(lean, "r1")


def test_every_advancing_type_is_refused_to_the_watchdog_and_allowed_to_the_rest():
    """The table, exhaustively: which actor kinds may advance with which event types."""
    for tag, kind in itertools.product(sorted(T.ADVANCING_EVENTS | {"progress_recorded"}),
                                       (T.WORKER, T.OWNER, T.OPERATOR, T.WATCHDOG)):
        assert T.advances(tag, kind) == (kind != T.WATCHDOG), (tag, kind)
    for move in T.LEASE_END_MOVES:
        assert move[1] == T.UNKNOWN
        assert not any(T.advances("state_changed", k, move) for k in (T.WORKER, T.OWNER, T.OPERATOR))
    assert T.advances("state_changed", T.WORKER, (T.EXECUTING, T.VERIFYING))
    assert not T.advances("heartbeat_recorded", T.WORKER)
    assert WATCHDOG.kind == T.WATCHDOG


# --- a ledger whose views an older version folded ----------------------------------------


def _as_the_old_rule_kept_it(path: str, run_id: str, old_versions: bool) -> None:
    """Rewrite the views as a version that counted the watchdog's move to unknown kept them:
    progress_seq one higher, the last progress that move; optionally with the old versions."""
    import sqlite3

    from msgspec.structs import replace

    from handoff.projections import view_rows

    conn = sqlite3.connect(path, isolation_level=None)
    (blob,) = conn.execute("SELECT packet FROM checkpoints WHERE run_id=?", (run_id,)).fetchone()
    cp = view_rows.decode_checkpoint(blob)
    seq = cp.progress_seq + 1
    last = stall.LastProgress(seq, "state:unknown", cp.last_event_us, cp.last_seq)
    old = replace(cp, watch=replace(cp.watch, progress_seq=seq, last_progress=last))
    conn.execute("UPDATE checkpoints SET progress_seq=?, packet=? WHERE run_id=?",
                 (seq, view_rows.encode_checkpoint(old), run_id))
    conn.execute("UPDATE stall_watch SET progress_seq=?, last_progress_kind=?, last_progress_us=? WHERE run_id=?",
                 (seq, last.kind, last.at_us, run_id))
    if old_versions:
        conn.execute("UPDATE projection_versions SET version = version - 1 WHERE name IN ('checkpoints', 'stall_watch')")
    conn.close()


def _revoked_run(tmp_path) -> tuple[str, str, int]:
    clock = Clock()
    path = str(tmp_path / "ledger.db")
    lg = Ledger(path, clock=clock, synchronous="NORMAL")
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.effect_start(run.id, run.lease, "mail-1", "mail the report", worker=run.worker)
    clock.advance(lg.checkpoint(run.id).policy.heartbeat_timeout_s + 1)
    watch_once(lg, name="dog", now_us=clock.now)
    right = lg.checkpoint(run.id).progress_seq
    lg.close()
    return path, run.id, right


def test_views_an_older_fold_kept_need_a_rebuild_and_a_writable_open_refolds_them(tmp_path):
    from handoff.projections.engine import NEEDS_REBUILD

    path, run_id, right = _revoked_run(tmp_path)
    _as_the_old_rule_kept_it(path, run_id, old_versions=True)
    with Ledger(path, readonly=True) as ro:
        assert ro.status(run_id)["progress_seq"] == right + 1  # answered from the views as kept
        # One line per view that needs the rebuild, not a mismatch per run.
        assert [(d["projection"], d["run_id"], d["folded"]) for d in ro.check()] == [
            ("checkpoints", None, NEEDS_REBUILD), ("stall_watch", None, NEEDS_REBUILD)]
    with Ledger(path) as rw:  # any writable open refolds them from the unchanged log
        assert rw.check() == []
        assert rw.status(run_id)["progress_seq"] == right
        assert rw.status(run_id)["last_progress"]["kind"] == "state:executing"


def test_rebuild_refolds_rows_kept_by_the_old_rule(tmp_path):
    """The same rows under the current version numbers are a real difference; a rebuild
    is the answer."""
    path, run_id, right = _revoked_run(tmp_path)
    _as_the_old_rule_kept_it(path, run_id, old_versions=False)
    with Ledger(path) as lg:
        assert {(d["projection"], d["column"]) for d in lg.check()} >= {
            ("checkpoints", "progress_seq"), ("stall_watch", "progress_seq")}
        lg.rebuild()
        assert lg.check() == [] and lg.status(run_id)["progress_seq"] == right
