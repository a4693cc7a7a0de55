"""A wall clock that jumps backward must never make a silent or idle run look healthy.

The ledger's timestamps come from the wall clock; the watchdog's Sightings time how long
a run's heartbeat value and progress_seq stood still by its own monotonic clock.
"""

from handoff.watchdog import Sightings, watch_once
from handoff.reducers.stall import classify

from tests.support import working_run


def test_a_clock_jumping_back_hides_a_stall_from_timestamps_alone(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=10, progress_timeout_s=30)
    clock.advance(-3600)  # the machine's clock is set back an hour
    for _ in range(40):
        clock.advance(1)
        clocked_lg.heartbeat("r1", lease, worker="w1")
    cp = clocked_lg.checkpoint("r1")
    # By timestamps the last progress is in the future: it would look healthy.
    assert classify(cp, now_us=clock.now).classification == "healthy"
    # Measured by sequence, 40 s passed with progress_seq unchanged: stalled.
    assert classify(cp, now_us=clock.now, unchanged_s=40).classification == "stalled"


def test_the_watchdog_flags_it_with_its_own_monotonic_record(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1", heartbeat_timeout_s=10, progress_timeout_s=30)
    clock.advance(-3600)
    sightings, mono = Sightings(), 1000.0
    acted = []
    for _ in range(40):
        clock.advance(1)
        mono += 1
        clocked_lg.heartbeat("r1", lease, worker="w1")
        acted += watch_once(clocked_lg, name="wd", sightings=sightings, mono_s=mono)
    assert [a.action for a in acted if a.outcome == "committed"] == ["observe", "mark_stalled"]


def test_a_silent_worker_is_unavailable_even_if_its_last_beat_looks_recent(clocked_lg, clock):
    working_run(clocked_lg, "r1", heartbeat_timeout_s=10, progress_timeout_s=1000)
    clock.advance(-3600)  # its last beat now reads as an hour in the future
    sightings, mono = Sightings(), 50.0
    acted = []
    for _ in range(12):
        clock.advance(1)
        mono += 1
        acted += watch_once(clocked_lg, name="wd", sightings=sightings, mono_s=mono)
    assert [a.action for a in acted if a.outcome == "committed"] == ["revoke_lease"]
    assert clocked_lg.checkpoint("r1").lease is None
