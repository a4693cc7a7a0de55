"""watch_once, the library core of 'handoff watch', on a ledger with a clock we move."""

from __future__ import annotations

from handoff.facade import WATCHER_BEAT_PERIOD_S
from handoff.watchdog import _act, _plan, watch_once
from handoff.reducers.stall import classify

from tests.support import working_run


def events(clocked_lg, run, type_=None):
    return [r for r in clocked_lg.log(run) if type_ is None or r.type == type_]


def done(actions, outcome="committed"):
    return [(a.run_id, a.action) for a in actions if a.outcome == outcome]


def test_unavailable_worker_loses_its_lease_once(clocked_lg, clock):
    working_run(clocked_lg, "r1", heartbeat_timeout_s=10)
    clock.advance(5)
    assert done(watch_once(clocked_lg, name="wd")) == []
    clock.advance(6)
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "revoke_lease")]
    assert clocked_lg.checkpoint("r1").lease is None
    assert done(watch_once(clocked_lg, name="wd")) == []
    assert len(events(clocked_lg, "r1", "lease_revoked")) == 1


def test_stall_is_observed_once_per_window_then_paused_past_the_budget(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=1000, progress_timeout_s=10, retry_budget=2)
    clock.advance(11)
    clocked_lg.heartbeat("r1", lease, worker="w1")
    first = watch_once(clocked_lg, name="wd")
    assert done(first) == [("r1", "observe"), ("r1", "mark_stalled")]
    again = watch_once(clocked_lg, name="wd")  # same window: nothing new
    assert done(again) == [] and done(again, "duplicate") == [("r1", "observe"), ("r1", "mark_stalled")]
    clock.advance(10)
    clocked_lg.heartbeat("r1", lease, worker="w1")
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "observe")]
    assert classify(clocked_lg.checkpoint("r1"), now_us=clock.now).action == "pause"
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "pause")]
    cp = clocked_lg.checkpoint("r1")
    assert cp.state == "blocked" and "paused by watchdog wd" in cp.blockers[0].reason
    clock.advance(100)
    assert done(watch_once(clocked_lg, name="wd")) == []  # blocked is not a stall
    assert len(events(clocked_lg, "r1", "watchdog_observed")) == 2
    assert len(events(clocked_lg, "r1", "recovery_decided")) == 2


def test_progress_resets_the_stall(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=1000, progress_timeout_s=10)
    clock.advance(11)
    assert done(watch_once(clocked_lg, name="wd"))[0] == ("r1", "observe")
    clocked_lg.progress("r1", lease, "tool_outcome", "moved", worker="w1")
    assert done(watch_once(clocked_lg, name="wd")) == []
    clock.advance(11)
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "observe"), ("r1", "mark_stalled")]


def test_side_effect_of_unknown_outcome_is_flagged_once_never_retried(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=5)
    clocked_lg.effect_start("r1", lease, "deploy-1", "deploy v1", worker="w1")
    clock.advance(6)
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "revoke_lease")]
    assert clocked_lg.checkpoint("r1").state == "unknown"
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "reconcile")]
    clock.advance(60)
    assert done(watch_once(clocked_lg, name="wd")) == []
    assert [r.event.action for r in events(clocked_lg, "r1", "recovery_decided")] == ["revoke_lease", "reconcile"]
    assert events(clocked_lg, "r1", "side_effect_started")  # started once; the watchdog never re-runs it


def test_ambiguous_delivery_asks_for_reconciliation_once(clocked_lg, clock, tmp_path):
    lease = working_run(clocked_lg, "r1", state="verifying", delivery_timeout_s=30)
    f = tmp_path / "r.txt"
    f.write_text("result")
    clocked_lg.artifact("r1", lease, str(f), worker="w1")
    clocked_lg.evidence("r1", "tests", "pass", lease=lease)
    clocked_lg.submit("r1", lease, worker="w1")
    clocked_lg.release("r1", lease, worker="w1")
    clocked_lg.deliver("r1", "k1", by="alice")
    clock.advance(31)
    assert done(watch_once(clocked_lg, name="wd")) == [("r1", "reconcile_delivery")]
    clock.advance(31)
    assert done(watch_once(clocked_lg, name="wd")) == []
    assert clocked_lg.checkpoint("r1").delivery.confirmed_key is None  # nothing was resent


def test_healthy_blocked_and_finished_runs_are_left_alone(clocked_lg, clock):
    lease = working_run(clocked_lg, "healthy", heartbeat_timeout_s=100, progress_timeout_s=100)
    working_run(clocked_lg, "blocked", heartbeat_timeout_s=1, progress_timeout_s=1)
    clocked_lg.block("blocked", "needs creds", "alice grants")
    working_run(clocked_lg, "closed", heartbeat_timeout_s=1)
    clocked_lg.close_run("closed", "no_op", by="alice")
    clock.advance(50)
    clocked_lg.heartbeat("healthy", lease, worker="w1")
    assert watch_once(clocked_lg, name="wd") == []
    for run in ("healthy", "blocked", "closed"):
        assert not events(clocked_lg, run, "watchdog_observed") and not events(clocked_lg, run, "recovery_decided")


def test_watcher_liveness_is_what_status_reports(clocked_lg, clock):
    working_run(clocked_lg, "r1", heartbeat_timeout_s=100)
    assert clocked_lg.status("r1")["monitored"]["covered"] is False
    watch_once(clocked_lg, name="wd", interval_s=5)
    mon = clocked_lg.status("r1")["monitored"]
    assert mon["covered"] is True and mon["watchers"] == ["wd"]
    # Beats are at least WATCHER_BEAT_PERIOD_S apart; three missed periods end coverage.
    clock.advance(3 * WATCHER_BEAT_PERIOD_S - 1)
    assert clocked_lg.status("r1")["monitored"]["covered"] is True
    clock.advance(2)
    assert clocked_lg.status("r1")["monitored"]["covered"] is False


def test_watcher_beats_are_throttled(clocked_lg, clock):
    working_run(clocked_lg, "r1", heartbeat_timeout_s=1000)
    for _ in range(10):
        watch_once(clocked_lg, name="wd", interval_s=1)
        clock.advance(1)
    beats = list(clocked_lg.store.read_run("watcher:wd"))
    assert 1 < len(beats) <= 10 / (WATCHER_BEAT_PERIOD_S / 2) + 1


def test_a_second_watcher_never_repeats_a_decision(clocked_lg, clock):
    working_run(clocked_lg, "r1", heartbeat_timeout_s=1000, progress_timeout_s=10)
    clock.advance(11)
    assert len(done(watch_once(clocked_lg, name="a"))) == 2
    other = watch_once(clocked_lg, name="b")
    assert done(other) == [] and len(done(other, "duplicate")) == 2


def test_nothing_is_done_when_the_run_moved_on_since_it_was_classified(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=10)
    clock.advance(11)
    seen = clocked_lg.checkpoint("r1")
    health = classify(seen, now_us=clock.now)
    assert health.classification == "unavailable"
    clocked_lg.heartbeat("r1", lease, worker="w1")  # the worker was alive after all
    (action, cmd, key), = _plan(seen, health, clock.now)
    assert _act(clocked_lg, "wd", seen, action, cmd, key) == ("skipped", None, None)
    assert clocked_lg.checkpoint("r1").lease == lease.lease


def test_replay_does_not_claim_a_watcher_that_started_later(clocked_lg, clock):
    working_run(clocked_lg, "r1", heartbeat_timeout_s=1000)
    clock.advance(60)
    watch_once(clocked_lg, name="wd", interval_s=5)
    assert clocked_lg.status("r1")["monitored"]["covered"] is True
    assert clocked_lg.status("r1", at_seq=1)["monitored"]["covered"] is False


def _moving_between_scan_and_act(clocked_lg, move):
    """watch_once with ``move`` run right after the stall scan: the worker's own write
    landing while the watchdog plans (another process, in real life)."""
    scan = clocked_lg.stalls

    def stalls(now=None):
        found = scan(now=now)
        move()
        return found

    clocked_lg.stalls = stalls
    try:
        return watch_once(clocked_lg, name="wd")
    finally:
        del clocked_lg.stalls


def test_a_beat_after_the_scan_saves_the_lease_though_the_packet_is_read_later(clocked_lg, clock):
    """The scan judges from the stall view's row and reads a run's packet only when the
    watchdog plans, after the worker's beat: the guard must compare with the row the
    verdict was judged from, not with that later packet, or it revokes a live worker."""
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=5)
    clock.advance(60)
    acts = _moving_between_scan_and_act(clocked_lg, lambda: clocked_lg.heartbeat("r1", lease, worker="w1"))
    assert [(a.action, a.outcome) for a in acts] == [("revoke_lease", "skipped")]
    assert events(clocked_lg, "r1", "lease_revoked") == []
    assert clocked_lg.status("r1")["lease"] == 1


def test_progress_after_the_scan_saves_a_stalled_run_from_its_observation(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=1000, progress_timeout_s=10, retry_budget=2)
    clock.advance(11)
    clocked_lg.heartbeat("r1", lease, worker="w1")
    acts = _moving_between_scan_and_act(
        clocked_lg, lambda: clocked_lg.progress("r1", lease, "tool_outcome", "moved on", key="late", worker="w1"))
    assert [(a.action, a.outcome) for a in acts][:1] == [("observe", "skipped")]
    assert events(clocked_lg, "r1", "watchdog_observed") == []
