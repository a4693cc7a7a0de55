"""An import admits only history that live commands could have written.

Each forged file below is re-chained (valid hashes, so only the rules can tell) and must be
refused with the typed error a live write would get, naming the line, while the ledger
stays exactly as it was. Live histories of any shape (hypothesis) import unchanged.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger import jsonl
from handoff.ledger.store import GENESIS_HASH, Recorded, chain_hash, request_digest
from handoff.testing import issued

T0 = 1_700_000_000_000_000  # 2023-11-14, in µs


def forge(run_id: str, steps: list[tuple[str, int | None, ev.Event]], *, t0: int = T0,
          times: list[int] | None = None, keys: dict[int, tuple[str, bytes]] | None = None) -> list[bytes]:
    """Export lines of a run written by hand: (actor, lease, event) per seq, hashes chained;
    ``keys``: seq -> (idempotency key, its digest) for the events that carry one."""
    prev, out = GENESIS_HASH, []
    for i, (actor, lease, event) in enumerate(steps):
        seq, payload, tag = i + 1, ev.encode(event), ev.tag_of(event)
        at = times[i] if times else t0 + i * 1000
        key, digest = (keys or {}).get(seq, (None, None))
        h = chain_hash(prev, run_id, seq, tag, actor, lease, key, at, ev.SCHEMA_VERSION, payload)
        rec = Recorded(run_id, seq, 0, tag, actor, lease, key, at, ev.SCHEMA_VERSION, payload, prev, h)
        out.append(jsonl.to_line(rec, digest))
        prev = h
    return out


OPEN = ("owner:alice", None, ev.HandoffOpened(goal="g", target="chat:#ops", owner="alice"))
CLAIM = ("worker:w1", None, ev.LeaseGranted(worker="w1", lease=1))


def to(frm: str, dst: str, lease: int | None = 1, actor: str = "worker:w1") -> tuple[str, int | None, ev.Event]:
    return (actor, lease, ev.StateChanged(from_state=frm, to_state=dst))


def snapshot(lg: Ledger) -> tuple[Any, ...]:
    conn = sqlite3.connect(lg.store.path)
    try:
        return (conn.execute("SELECT * FROM events ORDER BY position").fetchall(),
                conn.execute("SELECT * FROM heads ORDER BY run_id").fetchall(),
                conn.execute("SELECT * FROM checkpoints ORDER BY run_id").fetchall())
    finally:
        conn.close()


@pytest.fixture
def lg(lg):
    """tests/conftest.py's ledger, with run "keep" already in it."""
    lg.open(run_id="keep", goal="already here", target="t", owner="bob")
    return lg


FORGED = {
    "a worker event under a revoked lease": (
        [OPEN, CLAIM, to("queued", "planning"), ("operator:root", None, ev.LeaseRevoked(lease=1, reason="gone")),
         ("worker:w1", 1, ev.ProgressRecorded(kind="note"))], E.StaleLease, 5),
    "a lease granted out of thin air": (
        [OPEN, ("worker:w1", None, ev.LeaseGranted(worker="w1", lease=7))], E.HistoryRefused, 2),
    "a lease granted while another is held": (
        [OPEN, CLAIM, ("worker:w2", None, ev.LeaseGranted(worker="w2", lease=2))], E.LeaseHeld, 3),
    "a release naming a lease that is not the current one": (
        [OPEN, CLAIM, ("worker:w1", 1, ev.LeaseReleased(lease=3))], E.StaleLease, 3),
    "a delivery confirmed with no attempt": (
        [OPEN, ("owner:alice", None, ev.DeliveryConfirmed(key="k", receipt="r"))], E.DeliveryRefused, 2),
    "a jump from planning to delivered": (
        [OPEN, CLAIM, to("queued", "planning"), to("planning", "delivered")], E.IllegalTransition, 4),
    "a state change whose from_state is not the run's": (
        [OPEN, CLAIM, to("executing", "planning")], E.HistoryRefused, 3),
    "progress that does not count in the state, marked as progress": (
        [OPEN, CLAIM, to("queued", "planning"), ("worker:w1", 1, ev.ProgressRecorded(kind="tool_outcome"))],
        E.IllegalProgress, 4),
    "an event after the run ended": (
        [OPEN, ("owner:alice", None, ev.RunClosed(disposition="cancelled", by="alice")),
         to("queued", "cancelled", None, "owner:alice"), ("owner:alice", None, ev.EvidenceRecorded(kind="k", outcome="pass"))],
        E.TerminalRun, 4, [T0, T0 + 1, T0 + 1, T0 + 2]),
    "a watchdog decision written by a worker": (
        [OPEN, CLAIM, ("worker:w1", 1, ev.RecoveryDecided(watcher="w1", action="mark_stalled",
                                                          classification="stalled", progress_seq=0))],
        E.NotAuthorized, 3),
    "an owner action by someone else": (
        [OPEN, ("owner:mallory", None, ev.RunClosed(disposition="no_op", by="mallory"))], E.NotAuthorized, 2),
    "a command cut in the middle (closed, never moved)": (
        [OPEN, ("owner:alice", None, ev.RunClosed(disposition="cancelled", by="alice"))], E.HistoryRefused, None),
    "a worker event with no lease in its envelope": (
        [OPEN, CLAIM, ("worker:w1", None, ev.HeartbeatRecorded())], E.NotAuthorized, 3),
    "an actor of an unknown kind": (
        [OPEN, ("admin:root", None, ev.AuthorityTransferred(action="close", to="x"))], E.InvalidInput, 2),
    "a run that does not begin with its contract": (
        [CLAIM], E.UnknownRun, 1),
    "an artifact withdrawn that was never recorded": (
        [OPEN, CLAIM, ("worker:w1", 1, ev.ArtifactWithdrawn(path="/tmp/never", reason="typo"))],
        E.UnknownArtifact, 3),
}


@pytest.mark.parametrize("name", list(FORGED))
def test_forged_history_is_refused_and_the_ledger_is_untouched(lg, name):
    steps, error, line, *times = FORGED[name]
    lines = forge("r1", steps, times=times[0] if times else None)
    before = snapshot(lg)
    with pytest.raises(error) as info:
        lg.import_lines(lines)
    assert type(info.value) is error, info.value
    if line is not None:
        assert info.value.message.startswith(f"line {line}:"), info.value.message
    assert snapshot(lg) == before
    # The same file without its forged tail goes in: the refusal was about that line.
    if line is not None and line > 1:
        assert lg.import_lines(lines[: line - 1])["imported"] == line - 1


def test_a_withdrawal_a_live_command_wrote_is_admitted(lg):
    recorded = ev.ArtifactRecorded(path="/tmp/typo.md", kind="result", bytes=0, sha256="", exists=False)
    lines = forge("r1", [OPEN, CLAIM, ("worker:w1", 1, recorded),
                         ("worker:w1", 1, ev.ArtifactWithdrawn(path="/tmp/typo.md", reason="mistyped"))])
    assert lg.import_lines(lines)["imported"] == 4
    assert lg.checkpoint("r1").artifacts == ()


@pytest.mark.parametrize("at, why", [(253_402_300_800_000_000, "after 9999"), (0, "before 2000")])
def test_times_out_of_range_are_refused(lg, at, why):
    lines = forge("r1", [OPEN, CLAIM], times=[T0, at])
    before = snapshot(lg)
    with pytest.raises(E.InvalidInput, match="line 2: .*recorded_us"):
        lg.import_lines(lines)
    assert snapshot(lg) == before


def test_a_clock_that_stepped_back_imports_as_it_was_written(lg, tmp_path):
    """Live writes take the clock as it is (an NTP correction can step it back by days),
    so a ledger's own export must import whatever its clock did."""
    from handoff import Ledger

    ahead = {"now": lg.clock() + 2 * 86_400_000_000}
    with Ledger(str(tmp_path / "c.db"), clock=lambda: ahead["now"]) as src:
        src.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        ahead["now"] = lg.clock()  # the host's clock corrected, two days back
        src.evidence("r1", "review", "pass", by="ops")
        lines = list(src.export())
    with Ledger(str(tmp_path / "d.db"), clock=lambda: ahead["now"] + 3 * 86_400_000_000) as dst:
        assert dst.import_lines(lines)["imported"] == 2


def test_an_existing_run_is_only_extended_by_a_history_that_continues_it(lg, tmp_path):
    head = forge("r1", [OPEN])
    assert lg.import_lines(head)["imported"] == 1
    # Same prefix, then new events that pass the rules (the grant among them): extended.
    longer = forge("r1", [OPEN, CLAIM, to("queued", "planning")])
    assert lg.import_lines(longer) == {"imported": 2, "skipped": 1, "runs": 1}
    before = snapshot(lg)
    # Another history under the same run id: refused, nothing changes.
    other = forge("r1", [OPEN, ("worker:w9", None, ev.LeaseGranted(worker="w9", lease=1))])
    with pytest.raises(E.InvalidInput, match="different event at seq 2"):
        lg.import_lines(other)
    # The continuation must pass the rules against the stored run too.
    bad_tail = forge("r1", [OPEN, CLAIM, to("queued", "planning"), ("owner:alice", None, ev.StateChanged(
        from_state="planning", to_state="delivered"))])
    with pytest.raises(E.NotAuthorized, match="line 4"):
        lg.import_lines(bad_tail)
    assert snapshot(lg) == before


def test_an_import_writes_nothing_under_a_lease_the_ledger_already_holds(lg):
    """A write under a lease must show its token; an import has none. So once a lease is
    in the ledger (claimed live, or brought by an earlier import), later imports cannot
    write under it: only the holder can, live."""
    lg.open(run_id="live", goal="g", target="chat:#ops", owner="alice")
    token = lg.claim("live", "w1")
    stored = list(lg.log("live"))  # re-chained by forge: the same events, then one more
    forged = forge("live", [(r.actor, r.lease, r.event) for r in stored] + [to("queued", "planning")],
                   times=[r.recorded_us for r in stored] + [stored[-1].recorded_us + 1000])
    before = snapshot(lg)
    with pytest.raises(E.StaleLease) as info:
        lg.import_lines(forged)
    assert info.value.details.get("why") == "imported_under_a_live_lease"
    assert snapshot(lg) == before
    assert lg.transition("live", token, "planning").result.outcome == "committed"  # the holder, live


def test_a_refusal_late_in_the_file_rolls_back_everything_before_it(lg):
    good = [line for rid in ("a", "b", "c") for line in forge(rid, [OPEN, CLAIM])]
    bad = forge("d", [OPEN, to("queued", "planning", None, "owner:alice")])
    before = snapshot(lg)
    with pytest.raises(E.NotAuthorized, match="line 8"):
        lg.import_lines(good + bad)
    assert snapshot(lg) == before


def test_an_optional_field_added_to_lease_granted_is_not_a_refusal(lg):
    """Another version may add an optional field to lease_granted (a digest of the lease's
    secret): the rules decide the worker and the number, not such extras."""
    payload = json.dumps({"type": "lease_granted", "worker": "w1", "lease": 1, "token_sha256": "ab" * 32}).encode()
    granted = msgspec.json.decode(payload, type=ev.LeaseGranted)
    assert lg.import_lines(forge("r1", [OPEN, ("worker:w1", None, granted)]))["imported"] == 2


def test_a_watchers_stream_holds_only_its_beats(lg):
    beat = ev.WatchdogObserved(watcher="dog", classification="alive", progress_seq=0, interval_s=10.0)
    assert lg.import_lines(forge("watcher:dog", [("watchdog:dog", None, beat)]))["imported"] == 1
    forged = ev.WatchdogObserved(watcher="cat", classification="alive", progress_seq=0, interval_s=10.0)
    with pytest.raises(E.HistoryRefused):
        lg.import_lines(forge("watcher:cat2", [("watchdog:cat", None, forged)]))


# --- every live history is admitted (hypothesis) ----------------------------------------


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(issued(), min_size=1, max_size=40))
def test_every_history_written_by_live_commands_imports_unchanged(tmp_path_factory, script):
    d = tmp_path_factory.mktemp("live")
    with Ledger(str(d / "src.db")) as src:
        src.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        for run_id, actor, cmd in script:
            try:
                src.execute(run_id, cmd, actor=actor)
            except E.LedgerError:
                pass
        lines = list(src.export())
        heads = {h.run_id: (h.last_seq, h.last_hash, h.lease) for h in src.store.list_runs()}
    with Ledger(str(d / "dst.db")) as dst:
        assert dst.import_lines(lines)["imported"] == len(lines)
        assert {h.run_id: (h.last_seq, h.last_hash, h.lease) for h in dst.store.list_runs()} == heads
        assert dst.verify() == [] and dst.check() == []


def test_an_imported_live_lease_answers_to_its_own_token_and_no_other(tmp_path):
    """The grant's digest travels with the export: the holder's token works in the copy,
    the number alone or a made-up token does not, and neither writes anything."""
    with Ledger(str(tmp_path / "src.db")) as src:
        src.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        token = src.claim("r1", "w1")
        src.transition("r1", token, "planning")
        lines = list(src.export())
    with Ledger(str(tmp_path / "dst.db")) as dst:
        dst.import_lines(lines)
        before = snapshot(dst)
        for forged in (f"{token.lease}", f"{token.lease}.{'A' * 43}"):
            with pytest.raises((E.StaleLease, E.InvalidInput)):
                dst.progress("r1", forged, "note", "not the holder")
        assert snapshot(dst) == before
        assert dst.progress("r1", token, "note", "the holder goes on").result.outcome == "committed"
        assert dst.verify() == [] and dst.check() == []


def test_an_import_cannot_use_the_watchdogs_keys(lg):
    """The watch: namespace is the watchdog's on import as on a live write, so an imported
    line cannot sit on the key of a decision the watchdog has yet to make."""
    key = "watch:r1:revoke_lease:2:1"
    lines = forge("r1", [OPEN, ("operator:mallory", None, ev.EvidenceRecorded(kind="x", outcome="pass"))],
                  keys={2: (key, b"\x01" * 32)})
    before = snapshot(lg)
    with pytest.raises(E.ReservedKey, match="line 2"):
        lg.import_lines(lines)
    assert snapshot(lg) == before


def test_a_copied_digest_does_not_answer_another_actors_request(lg):
    """An imported key whose digest was computed for someone else's request must not make
    that request answer "already done": the key's event was written by another actor."""
    from handoff.ledger.store import Actor
    from handoff.reducers import commands as C

    cmd = C.RecordEvidence(kind="review", outcome="pass")
    digest = request_digest("operator:alice", None, [C.request_bytes(cmd)])  # what alice's request would be
    lines = forge("r1", [OPEN, ("operator:mallory", None, ev.EvidenceRecorded(kind="x", outcome="fail"))],
                  keys={2: ("review-1", digest)}, times=[lg.clock() - 2000, lg.clock() - 1000])
    lg.import_lines(lines)
    before = snapshot(lg)
    with pytest.raises(E.IdempotencyConflict):
        lg.execute("r1", cmd, actor=Actor("operator", "alice"), key="review-1")
    assert snapshot(lg) == before


def test_an_event_dated_after_now_is_refused(lg):
    """A heartbeat dated ahead would keep a dead worker looking alive: history cannot be
    later than the importing ledger's clock, give or take ten minutes."""
    now = lg.clock()
    lines = forge("r1", [OPEN, CLAIM], times=[now, now + 3_600_000_000])
    before = snapshot(lg)
    with pytest.raises(E.InvalidInput, match="line 2: .*after now"):
        lg.import_lines(lines)
    assert snapshot(lg) == before
    assert lg.import_lines(forge("r1", [OPEN, CLAIM], times=[now, now + 60_000_000]))["imported"] == 2
