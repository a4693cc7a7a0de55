"""Seed 003's table, row by row: in each state, what advances progress_seq and what does not.

Every case goes through the real Ledger on a SQLite file. Progress is judged only by
progress_seq; activity that is not progress is still logged, so the log grows while the
sequence stands still.
"""

from __future__ import annotations

import pytest

from handoff import Actor
from handoff.ledger import errors as E
from handoff.reducers import transitions as T

from .helpers import OPERATOR, WATCHDOG, bring, log, new_ledger, refused


def _progress(kind: str):
    def act(lg, run):
        return lg.progress(run.id, run.lease, kind, worker=run.worker)
    return act


def _repeat(times: int, act):
    def many(lg, run):
        for _ in range(times):
            out = act(lg, run)
        return out
    return many


def _save_blocker(lg, run):
    return lg.block(run.id, "the staging database is down", "page the on-call DBA", lease=run.lease, actor=run.actor)


def _reconcile(lg, run):
    # No lease: an operator looked at the world after the worker was lost.
    return lg.effect_confirm(run.id, "mail-1", "done", note="the mail is in the outbox log", actor=OPERATOR)


def _restart_worker(lg, run):
    return lg.claim(run.id, "w2")


#: (state, what counts as progress there, what does not): seed 003's table.
TABLE = [
    (T.PLANNING, ("plan_committed", _progress("plan_committed")), ("token_callback", _progress("token_callback"))),
    (T.EXECUTING, ("tool_outcome", _progress("tool_outcome")), ("tool_retry", _progress("tool_retry"))),
    (T.VERIFYING, ("verifier_result", _progress("verifier_result")), ("verifier_heartbeat", _progress("verifier_heartbeat"))),
    (T.BLOCKED, ("blocker_raised", _save_blocker), ("waiting", _repeat(3, _progress("waiting")))),
    (T.UNKNOWN, ("reconciliation_recorded", _reconcile), ("worker_restart", _restart_worker)),
]
IDS = [row[0] for row in TABLE]


@pytest.mark.parametrize("state, counts, _", TABLE, ids=IDS)
def test_progress_event_advances_progress_seq(tmp_path, state, counts, _):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    before = lg.checkpoint(run.id)
    kind, act = counts
    act(lg, run)
    after = lg.checkpoint(run.id)
    assert after.progress_seq == before.progress_seq + 1
    assert after.watch.last_progress is not None and after.watch.last_progress.kind == kind
    assert after.state == state, "recording progress does not move the run"


@pytest.mark.parametrize("state, _, not_progress", TABLE, ids=IDS)
def test_activity_that_is_not_progress_leaves_progress_seq_alone(tmp_path, state, _, not_progress):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    before, events_before = lg.checkpoint(run.id), len(log(lg))
    name, act = not_progress
    act(lg, run)
    after = lg.checkpoint(run.id)
    assert len(log(lg)) > events_before, f"{name} is still recorded: it is activity"
    assert after.progress_seq == before.progress_seq, f"{name} must not count as progress in {state}"
    assert after.watch.last_progress == before.watch.last_progress
    assert after.state == state


@pytest.mark.parametrize("state", [T.EXECUTING], ids=str)
@pytest.mark.parametrize("kind", sorted(T.PROGRESS_KINDS[T.EXECUTING]))
def test_every_executing_progress_kind_counts(tmp_path, state, kind):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    seq = lg.checkpoint(run.id).progress_seq
    assert lg.progress(run.id, run.lease, kind, worker=run.worker).checkpoint.progress_seq == seq + 1


def test_the_table_in_transitions_matches_seed_003():
    assert "plan_committed" in T.PROGRESS_KINDS[T.PLANNING]
    assert "tool_outcome" in T.PROGRESS_KINDS[T.EXECUTING]
    assert "verifier_result" in T.PROGRESS_KINDS[T.VERIFYING]
    assert {"token_callback", "tool_retry", "verifier_heartbeat", "waiting", "worker_restart"} <= T.NOT_PROGRESS
    assert not T.NOT_PROGRESS & T.ALL_PROGRESS_KINDS, "a kind cannot be both progress and not"
    assert "heartbeat_recorded" not in T.ADVANCING_EVENTS and "lease_granted" not in T.ADVANCING_EVENTS


# --- heartbeats and observations are liveness, never advancement -----------------------


@pytest.mark.parametrize("state", [T.QUEUED, T.PLANNING, T.EXECUTING, T.VERIFYING, T.BLOCKED, T.UNKNOWN,
                                   T.READY_FOR_REVIEW, T.SUCCEEDED])
def test_heartbeats_never_advance_progress_seq(tmp_path, state):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    if run.lease is None:
        run.lease = lg.claim(run.id, "w2")
        run.worker = "w2"
    seq = lg.checkpoint(run.id).progress_seq
    for _ in range(5):
        lg.heartbeat(run.id, run.lease, worker=run.worker)
        lg.observe(run.id, "healthy", seq, interval_s=30, watcher="dog")
    cp = lg.checkpoint(run.id)
    assert cp.progress_seq == seq
    assert cp.watch.last_heartbeat_us is not None


def test_heartbeats_under_a_clock_that_jumps_back_are_not_progress(tmp_path):
    """Only the sequence says whether a run advanced: backdated beats change nothing there."""
    from handoff import Ledger

    import itertools

    # A logged beat reads the clock more often than a kept one: past the list, time stays at 100 s.
    ticks = itertools.chain([1_000, 2_000, 3_000, 4_000, 500, 400, 300, 200, 100], itertools.repeat(100))
    lg = Ledger(str(tmp_path / "l.db"), synchronous="NORMAL", clock=lambda: next(ticks) * 1_000_000)
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id="r1")
    lease = lg.claim("r1", "w1")
    lg.transition("r1", lease, T.PLANNING, worker="w1")
    before = lg.checkpoint("r1")
    for _ in range(5):
        lg.heartbeat("r1", lease, worker="w1")
    after = lg.checkpoint("r1")
    assert after.progress_seq == before.progress_seq
    assert after.watch.last_progress == before.watch.last_progress
    # Every beat reached the run's liveness row (counted), and the last beat is the last one
    # sent, not the latest timestamp (reducers/liveness.last_beat), as when every beat was logged.
    assert lg.store.liveness(["r1"])["r1"].beats == 5
    assert after.watch.last_heartbeat_us == 100 * 1_000_000, "the last beat is the last one sent"


# --- progress of the wrong kind for the state ---------------------------------------------


def _wrong_kinds():
    for state in (T.PLANNING, T.EXECUTING, T.VERIFYING):
        for kind in sorted(T.ALL_PROGRESS_KINDS - T.PROGRESS_KINDS[state]):
            yield state, kind
    for state in (T.BLOCKED, T.QUEUED):
        for kind in sorted(T.ALL_PROGRESS_KINDS):
            yield state, kind
    yield T.QUEUED, "token_callback"


@pytest.mark.parametrize("state, kind", list(_wrong_kinds()))
def test_wrong_state_progress_is_refused_and_writes_nothing(tmp_path, state, kind):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    if run.lease is None:
        run.lease = lg.claim(run.id, "w2")
        run.worker = "w2"
    seq = lg.checkpoint(run.id).progress_seq
    refused(lg, E.IllegalProgress, lambda: lg.progress(run.id, run.lease, kind, worker=run.worker), state)
    assert lg.checkpoint(run.id).progress_seq == seq


def test_progress_in_unknown_is_a_reconciliation_not_a_progress_call(tmp_path):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.UNKNOWN)
    lease = lg.claim(run.id, "w2")
    refused(lg, E.IllegalProgress, lambda: lg.progress(run.id, lease, "reconciliation_recorded", worker="w2"),
            "effect-confirm")
    refused(lg, E.IllegalProgress, lambda: lg.progress(run.id, lease, "tool_outcome", worker="w2"), "unknown")


def test_unknown_progress_kind_is_malformed_input(tmp_path):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.EXECUTING)
    exc = refused(lg, E.InvalidInput, lambda: lg.progress(run.id, run.lease, "did_stuff", worker=run.worker),
                  "unknown progress kind", "tool_outcome")
    assert exc.field == "kind"


def test_a_stale_worker_cannot_fake_progress(tmp_path):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.revoke(run.id, "replaced", actor=WATCHDOG)
    lg.claim(run.id, "w2")
    seq = lg.checkpoint(run.id).progress_seq
    refused(lg, E.StaleLease, lambda: lg.progress(run.id, run.lease, "tool_outcome", worker="w1"), "lease 1")
    assert lg.checkpoint(run.id).progress_seq == seq
    assert Actor("worker", "w1")  # the old worker is still a worker; only its lease is stale
