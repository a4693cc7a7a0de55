"""reducers/timeline.py: the fold behind the report, checked against the ledger's own answers.

The packet the report shows after each event must be exactly what 'handoff replay --at'
prints for that seq; the lanes must agree with the log; the summary's proofs must be
events of the run that say what the answer says. A property test runs the fold over
arbitrary events (legal or not), where it must stay total and well-formed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from handoff import Ledger
from handoff.reducers import timeline
from handoff.render import summarize
from handoff.testing import as_records, events
from handoff.watchdog import watch_once
from tests.support import Clock

from .story import incident


def _ledger(tmp_path) -> tuple[Ledger, Clock, str]:
    clock = Clock()
    lg = Ledger(str(tmp_path / "ledger.db"), clock=clock)
    return lg, clock, incident(lg, clock, tmp_path)


def test_the_packet_after_each_event_is_what_replay_prints(tmp_path):
    lg, _, run = _ledger(tmp_path)
    with lg:
        tl = lg.report(run)
        packets = timeline.undelta(tl.packets)
        assert len(packets) == len(tl.records) == tl.last_seq  # a short run keeps every event whole
        assert any("delta" in p for p in tl.packets) and "delta" not in tl.packets[0]
        for rec, packet in zip(tl.records, packets):
            assert packet == lg.status(run, at_seq=rec["seq"]), f"seq {rec['seq']}"


def test_a_watcher_that_beat_before_the_run_covers_its_first_events_as_replay_says(tmp_path):
    clock = Clock()
    with Ledger(str(tmp_path / "ledger.db"), clock=clock) as lg:
        watch_once(lg, name="ops", now_us=clock(), interval_s=20)  # the story's watchdog, before any run
        clock.advance(1)
        run = incident(lg, clock, tmp_path)
        tl = lg.report(run)
        packets = timeline.undelta(tl.packets)
        covered = [p["monitored"]["covered"] for p in packets]
        assert covered[0] is True  # the early watcher's beat, one second before the contract
        for rec, packet in zip(tl.records, packets):
            assert packet["monitored"] == lg.status(run, at_seq=rec["seq"])["monitored"], rec["seq"]


def test_every_event_is_drawn_once_in_its_lane(tmp_path):
    lg, _, run = _ledger(tmp_path)
    with lg:
        tl = lg.report(run)
        log = list(lg.log(run))
    lanes = dict(tl.lanes)
    assert set(lanes) >= {"state", "lease:worker-a", "lease:worker-b", "heartbeats", "progress", "watchdog",
                          "blockers", "effects", "artifacts", "review", "delivery"}
    assert [s for s, _ in tl.beats] == [r.seq for r in log if r.type == "heartbeat_recorded"]
    by_kind = {}
    for item in tl.items:
        assert item.lane in lanes
        assert item.end_us is None or item.end_us >= item.start_us
        by_kind.setdefault(item.kind, []).append(item)
    # worker-a's lease was revoked by the watchdog; worker-b's released with the delivery.
    (a,) = [i for i in tl.items if i.lane == "lease:worker-a"]
    (b,) = [i for i in tl.items if i.lane == "lease:worker-b"]
    seq_of = {r.type: r.seq for r in log}
    assert a.kind == "lease-revoked" and a.end_seq == seq_of["lease_revoked"]
    assert b.kind == "lease-released" and b.end_seq == seq_of["lease_released"]
    # The watchdog's windows: unavailable from worker-a's last beat to the revocation,
    # stalled from the last progress until the blocker (the blocked state's progress).
    (unavailable,) = by_kind["window-unavailable"]
    last_beat_a = max(r.recorded_us for r in log if r.type == "heartbeat_recorded" and r.lease == 1)
    assert unavailable.start_us == last_beat_a and unavailable.end_seq == seq_of["lease_revoked"]
    (stalled,) = by_kind["window-stalled"]
    assert stalled.end_seq == seq_of["blocker_raised"]
    assert [i.kind for i in tl.items if i.lane == "effects"] == ["effect-reconciled", "effect-unknown",
                                                                  "effect-reconciled"]
    assert by_kind["delivery-confirmed"][0].end_seq == seq_of["delivery_confirmed"]
    assert len(by_kind["delivered"]) == 1
    states = [i.label for i in tl.items if i.lane == "state" and i.kind.startswith("state-")]
    assert states == ["queued", "planning", "executing", "unknown", "executing", "blocked", "executing",
                      "verifying", "ready_for_review", "succeeded", "delivered"]


def test_the_summary_answers_name_events_that_prove_them(tmp_path):
    lg, _, run = _ledger(tmp_path)
    with lg:
        tl = lg.report(run)
        log = {r.seq: r for r in lg.log(run)}
    answers = {a.id: a for a in tl.answers}
    assert set(answers) == {"state", "contract", "lease", "progress", "stalled", "watchdog", "delivered"}
    for a in tl.answers:
        assert all(s in log for s in a.proof), a
    assert answers["state"].answer == "delivered" and log[answers["state"].proof[0]].event.to_state == "delivered"
    assert [log[s].type for s in answers["lease"].proof] == ["lease_granted", "lease_released"]
    assert [log[s].event.action for s in answers["watchdog"].proof] == ["revoke_lease", "mark_stalled"]
    assert "exactly once" in answers["delivered"].answer and "chat:#ops message 1" in answers["delivered"].answer
    assert [log[s].type for s in answers["delivered"].proof] == ["delivery_attempted", "delivery_confirmed"]
    assert answers["stalled"].answer.startswith("not stalled at the end")


def test_as_of_a_seq_the_report_is_the_story_then(tmp_path):
    lg, _, run = _ledger(tmp_path)
    with lg:
        seq = next(r.seq for r in lg.log(run) if r.type == "recovery_decided" and r.event.action == "mark_stalled")
        tl = lg.report(run, at_seq=seq + 1)
        assert tl.last_seq == seq + 1 and tl.records[-1]["seq"] == seq + 1
        assert tl.final_packet == lg.status(run, at_seq=seq + 1)
        answers = {a.id: a for a in tl.answers}
        assert answers["stalled"].answer.startswith("stalled since") and seq in answers["stalled"].proof
        assert answers["state"].answer == "executing"
        assert answers["delivered"].answer.startswith("no:")
        # As of a time: the same cut, with the end of the story at that time.
        at = next(r.recorded_us for r in lg.log(run, after_seq=seq) if r.seq == seq + 1)
        by_time = lg.report(run, as_of_us=at)
        assert by_time.last_seq >= seq + 1 and by_time.end_us == at
        assert all(r["at_us"] <= at for r in by_time.records)


def test_a_long_run_keeps_heartbeats_as_seq_and_time(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "FULL_RECORD_BUDGET", 20)
    lg, _, run = _ledger(tmp_path)
    with lg:
        tl = lg.report(run)
        log = list(lg.log(run))
    beats = [r.seq for r in log if r.type == "heartbeat_recorded"]
    kept = [r["seq"] for r in tl.records]
    assert len(kept) == 20 and not set(kept) & set(beats)
    assert sorted(kept + [c[0] for c in tl.compact]) == [r.seq for r in log]
    assert {c[2] for c in tl.compact} >= {"heartbeat_recorded"}


def test_a_fork_draws_its_own_events_and_names_its_origin(tmp_path):
    lg, _, run = _ledger(tmp_path)
    with lg:
        child = lg.fork(run, 20, new_run_id="inc-4711.retry", by="alice")
        tl = lg.report(child)
        assert tl.fork == {"parent": run, "parent_seq": 20, "seq": 1}
        assert [r["seq"] for r in tl.records] == [1] and tl.records[0]["type"] == "run_forked"
        assert timeline.undelta(tl.packets)[0] == lg.status(child, at_seq=1)
        # Its state lane starts at the fork, in the state it inherited; the last progress
        # was its origin's, so no event of this run can prove it.
        (band,) = [i for i in tl.items if i.lane == "state" and i.kind.startswith("state-")]
        assert band.seq == 1 and band.label == lg.checkpoint(run, at_seq=20).state
        answers = {a.id: a for a in tl.answers}
        assert answers["progress"].proof == () and answers["state"].proof == (1,)


@settings(max_examples=60, deadline=None)
@given(st.lists(events(), min_size=1, max_size=40), st.integers(1, 40))
def test_the_fold_is_total_and_well_formed_over_any_events(evs, cut):
    records = as_records(evs)
    tl = timeline.build(records, "r1", summarize=summarize, last_seq=len(records), at_seq=cut)
    drawn = min(cut, len(records))
    assert tl.last_seq == drawn and [r["seq"] for r in tl.records] == list(range(1, drawn + 1))
    assert len(timeline.undelta(tl.packets)) == drawn
    seqs = set(range(1, drawn + 1))
    for item in tl.items:
        assert item.seq in seqs and (item.end_seq is None or item.end_seq in seqs)
        assert item.end_us is None or item.end_us >= item.start_us
    for a in tl.answers:
        assert set(a.proof) <= seqs, a
