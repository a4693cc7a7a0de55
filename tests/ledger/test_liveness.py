"""Heartbeats kept beside the log, on every backend (tests/backends.py).

A beat moves the run's liveness row, fenced by the lease token, and writes no event unless it
matters to an audit: the lease's first sign of life is the grant, a beat that ends a silence,
one whose attrs changed and one per summary window go into the log with the beats counted so
far and the beat before. Readers of the run as it stands see the kept beat; a replay as of
an earlier seq reads the log alone; the watchdog judges from the kept beat and records it.
"""

from __future__ import annotations

import pytest

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.store import Actor
from handoff.reducers.checkpoint import AGGREGATE
from handoff.reducers import liveness
from handoff.watchdog import watch_once

S = 1_000_000  # µs per second


class Clock:
    """A clock the test moves: the store stamps events with it, the beats too."""

    def __init__(self) -> None:
        self.now = 1_800_000_000 * S

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> int:
        self.now += int(seconds * S)
        return self.now


@pytest.fixture
def setup(backend):
    clock = Clock()
    backend.here = backend.address()
    lg = backend.ledger(clock, backend.here)
    run = lg.open(goal="summarize the incident", target="file:///tmp/liveness-out", owner="alice",
                  heartbeat_timeout_s=60)
    token = lg.claim(run, "w1")
    return lg, run, token, clock


def _events(lg: Ledger, run: str) -> list[tuple[str, ev.Event]]:
    return [(r.type, r.event) for r in lg.log(run)]


def test_an_alive_worker_beats_without_writing_to_the_log(setup):
    lg, run, token, clock = setup
    before = _events(lg, run)
    for _ in range(30):
        clock.advance(20)
        out = lg.heartbeat(run, token)
        assert out.result.outcome == "unchanged" and out.result.positions == ()
        assert out.checkpoint.watch.last_heartbeat_us == clock.now
    assert _events(lg, run) == before
    live = lg.store.liveness([run])[run]
    assert (live.lease, live.beat_us, live.beats) == (token.lease, clock.now, 30)
    # The run as it stands shows the kept beat; as of its last seq, the log's (the grant).
    assert lg.checkpoint(run).watch.last_heartbeat_us == clock.now
    granted = lg.checkpoint(run, at_seq=len(before)).watch.last_heartbeat_us
    assert granted < clock.now - 500 * S
    # Alive (beating) although its log's last sign of life is ten minutes old; not
    # progressing for that long either, which is what "stalled" says.
    assert lg.status(run, now=clock.now)["health"]["classification"] == "stalled"


def test_an_idle_worker_writes_at_most_ten_events_an_hour(setup):
    lg, run, token, clock = setup
    start = len(_events(lg, run))
    for _ in range(180):  # an hour at the default policy: a beat every 20 s
        clock.advance(20)
        lg.heartbeat(run, token)
    logged = _events(lg, run)[start:]
    assert 1 <= len(logged) <= 10
    marks = [e for t, e in logged if t == "heartbeat_recorded"]
    assert len(marks) == len(logged) == 3600 // int(liveness.DEFAULT_MARK_S)
    # Each mark counts every beat of the lease so far and names the one before it.
    assert [m.beats for m in marks] == [45, 90, 135, 180]
    assert all(isinstance(m.previous_us, int) for m in marks)


def test_the_beats_that_matter_are_logged_with_the_gap_before_them(setup):
    lg, run, token, clock = setup
    clock.advance(20)
    assert lg.heartbeat(run, token).result.outcome == "unchanged"
    last = clock.now
    clock.advance(31)  # past half the 60 s timeout: a silence ended
    out = lg.heartbeat(run, token)
    assert out.result.outcome == "committed"
    t, e = _events(lg, run)[-1]
    assert t == "heartbeat_recorded" and e.previous_us == last and e.beats == 2
    clock.advance(20)
    assert lg.heartbeat(run, token).result.outcome == "unchanged"
    clock.advance(20)
    out = lg.heartbeat(run, token, attrs={"model": "m-2"})  # attrs changed
    assert out.result.outcome == "committed" and _events(lg, run)[-1][1].attrs == {"model": "m-2"}
    clock.advance(20)
    assert lg.heartbeat(run, token, attrs={"model": "m-2"}).result.outcome == "unchanged"
    clock.advance(20)
    assert lg.heartbeat(run, token).result.outcome == "committed"  # attrs dropped: changed again


def test_a_beat_without_the_lease_is_refused_and_changes_nothing(setup, backend):
    lg, run, token, clock = setup
    clock.advance(20)
    lg.heartbeat(run, token)
    log, live = _events(lg, run), lg.store.liveness([run])
    forged = f"{token.lease}.{'A' * 43}"
    with pytest.raises(E.StaleLease):
        lg.heartbeat(run, forged)
    assert _events(lg, run) == log and lg.store.liveness([run]) == live
    lg.revoke(run, "the operator took it back", by="alice")
    log, live = _events(lg, run), lg.store.liveness([run])
    clock.advance(5)
    with pytest.raises(E.StaleLease):
        lg.heartbeat(run, token)  # inside its quiet limit, but the lease is gone
    assert _events(lg, run) == log and lg.store.liveness([run]) == live
    # A new holder's beats are its own; the old token stays refused.
    second = lg.claim(run, "w2")
    clock.advance(5)
    assert lg.heartbeat(run, second).result.outcome == "unchanged"
    with pytest.raises(E.StaleLease):
        lg.heartbeat(run, token)
    with pytest.raises(E.UnknownRun):
        lg.heartbeat("no-such-run", token)


def test_a_second_process_sees_the_kept_beat(setup, backend):
    lg, run, token, clock = setup
    if not backend.shared:
        pytest.skip("this backend's ledger is seen by one handle only")
    other = Ledger(store=backend.open(backend.here, clock=clock), clock=clock)
    for _ in range(3):
        clock.advance(20)
        assert other.heartbeat(run, token).result.outcome == "unchanged"
    assert lg.checkpoint(run).watch.last_heartbeat_us == clock.now


def test_the_watchdog_judges_from_the_kept_beat_and_records_it(setup):
    lg, run, token, clock = setup
    lg.transition(run, token, "planning")
    lg.transition(run, token, "executing")
    for _ in range(6):  # two minutes of beats, none in the log: the log's last sign is old
        clock.advance(20)
        lg.heartbeat(run, token)
        lg.progress(run, token, "tool_outcome", "step") if _ % 2 else None
    assert [a for a in watch_once(lg, now_us=clock.now) if a.run_id == run and a.action == "revoke_lease"] == []
    assert lg.checkpoint(run).lease == token.lease
    # Silence past the timeout: revoked once, the decision carrying what it judged from.
    seen = lg.store.liveness([run])[run]
    clock.advance(61)
    acts = [a for a in watch_once(lg, now_us=clock.now) if a.run_id == run and a.action == "revoke_lease"]
    assert [a.outcome for a in acts] == ["committed"]
    decided = [e for t, e in _events(lg, run) if t == "recovery_decided"]
    assert decided[-1].beat_us == seen.beat_us and decided[-1].beats == seen.beats
    assert lg.checkpoint(run).lease is None
    assert [a for a in watch_once(lg, now_us=clock.now) if a.action == "revoke_lease" and a.outcome == "committed"] == []


def test_a_worker_that_beats_but_does_not_progress_is_still_stalled(setup):
    lg, run, token, clock = setup
    lg.transition(run, token, "planning")
    lg.transition(run, token, "executing")
    for _ in range(20):  # 400 s of beats, past the 300 s progress timeout
        clock.advance(20)
        lg.heartbeat(run, token)
    health = lg.status(run, now=clock.now)["health"]
    assert health["classification"] == "stalled"
    assert [cp.run_id for cp, h in lg.stalls(now=clock.now) if h.classification == "stalled"] == [run]


def test_logged_beats_and_decisions_survive_export_and_import(setup, backend, tmp_path):
    lg, run, token, clock = setup
    clock.advance(40)
    lg.heartbeat(run, token)  # logged: ends a silence
    clock.advance(120)
    watch_once(lg, now_us=clock.now)  # revokes, recording the liveness seen
    lines = list(lg.export())
    copy = Ledger(str(tmp_path / "copy.db"), clock=clock)
    copy.import_lines(lines)
    assert [r.payload for r in copy.log(run)] == [r.payload for r in lg.log(run)]
    assert copy.verify() == []


def test_a_clock_stepped_back_logs_the_beat_and_a_silence_after_it_is_found(setup):
    lg, run, token, clock = setup
    lg.transition(run, token, "planning")
    clock.advance(20)
    assert lg.heartbeat(run, token).result.outcome == "unchanged"
    clock.advance(-600)  # the host's clock steps back ten minutes
    assert lg.heartbeat(run, token).result.outcome == "committed"  # so the stall index moves back too
    clock.advance(20)
    assert lg.heartbeat(run, token).result.outcome == "unchanged"
    clock.advance(61)  # then the worker dies: one heartbeat timeout later, it is found
    assert lg.status(run, now=clock.now)["health"]["classification"] == "unavailable"
    assert [cp.run_id for cp, h in lg.stalls(now=clock.now) if h.classification == "unavailable"] == [run]


def test_no_event_can_date_a_beat_ahead_of_itself(setup):
    """A watchdog's event says which beat it judged from; the fold takes that beat only when
    it lies between the lease's grant and the event itself, so an event appended by a role
    that holds no token (or an edited export) cannot keep a dead worker looking alive."""
    lg, run, token, clock = setup
    granted = lg.checkpoint(run).watch.last_heartbeat_us
    clock.advance(5)
    for forged in (clock.now + 3600 * S, 2**60, granted - 1):
        lg.store.append(run, [ev.WatchdogObserved(watcher="w", classification="healthy", progress_seq=0,
                                                  beat_us=forged, beats=1)], actor=Actor("watchdog", "w"))
        assert lg.store.fold(run, AGGREGATE).watch.last_heartbeat_us == granted
    seen = clock.now - 2 * S  # a beat the decision could have seen is taken
    lg.store.append(run, [ev.WatchdogObserved(watcher="w", classification="healthy", progress_seq=0,
                                              beat_us=seen, beats=1)], actor=Actor("watchdog", "w"))
    assert lg.store.fold(run, AGGREGATE).watch.last_heartbeat_us == seen
