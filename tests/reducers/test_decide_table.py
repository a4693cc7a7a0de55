"""decide as the pure function it is, driven by a table (as h11 tests its state machine).

Each row is (state, actor, command) -> the events decide returns, by type, or the error
class it raises. A state is a Checkpoint folded by the checkpoint reducer from a short
event list (``STATES``): no store, no SQLite, no clock. Every command of
reducers/commands.py has an accepted and a refused row; then the rules that hold for every
command (a terminal run refuses writes, a stale lease proves nothing, nothing moves a run
outside MOVES, an actor the authority row does not list is refused) over the whole grid
and with hypothesis. tests/reducers/test_decide.py proves the same refusals through the
real store, where a refusal must also leave the log unchanged.
"""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.store import Actor, Step
from handoff.reducers import authority
from handoff.reducers import commands as C
from handoff.reducers import sanitize as sz
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import Checkpoint, fold
from handoff.reducers.decide import HANDLERS, Context, decide

HEX = "ab" * 32
OTHER_HEX = "cd" * 32
RESULT = "/work/report.md"

OWNER = Actor("owner", "alice")
STRANGER = Actor("owner", "mallory")  # an owner, but not this run's
HOLDER = Actor("worker", "w1")  # holds lease 1 where a state has one
OTHER_WORKER = Actor("worker", "w2")
OPERATOR = Actor("operator", "op")
WATCHDOG = Actor("watchdog", "dog")
ACTORS = {"owner": OWNER, "stranger": STRANGER, "holder": HOLDER, "other_worker": OTHER_WORKER,
          "operator": OPERATOR, "watchdog": WATCHDOG}


# --- the states: short event lists, folded ----------------------------------------------

#: Who records each event type in these histories (the fold reads it: progress_seq).
_BY = {"lease_granted": "worker:w1", "state_changed": "worker:w1", "artifact_recorded": "worker:w1",
       "side_effect_started": "worker:w1", "result_submitted": "worker:w1"}


def _opened(*, review: bool = False) -> ev.HandoffOpened:
    return ev.HandoffOpened(goal="write the report", target="chat:#ops", owner="alice", result_path=RESULT,
                            require_review=review)


def _moves(*states: str) -> list[ev.Event]:
    return [ev.StateChanged(from_state=a, to_state=b) for a, b in zip(states, states[1:])]


CLAIMED = [_opened(), ev.LeaseGranted(worker="w1", lease=1, token_digest=HEX)]
EXECUTING = [*CLAIMED, *_moves(T.QUEUED, T.PLANNING, T.EXECUTING)]
EFFECT = [*EXECUTING, ev.SideEffectStarted(key="mail-1", what="mail the report")]
VERIFYING = [*CLAIMED, *_moves(T.QUEUED, T.PLANNING, T.EXECUTING, T.VERIFYING)]
ARTIFACT = [*VERIFYING, ev.ArtifactRecorded(path=RESULT, kind="report", bytes=12, sha256=HEX)]
SUCCEEDED = [*ARTIFACT, ev.ResultSubmitted(summary="done", artifacts=(RESULT,)), *_moves(T.VERIFYING, T.SUCCEEDED),
             ev.EvidenceRecorded(kind="tests", outcome="pass")]
SENDING = [*SUCCEEDED, ev.DeliveryAttempted(key="send-1", target="chat:#ops", by="alice")]
UNKNOWN = [*EFFECT, ev.LeaseRevoked(lease=1, reason="no heartbeat"), *_moves(T.EXECUTING, T.UNKNOWN)]

STATES: dict[str, list[ev.Event]] = {
    "fresh": [],
    "queued": [_opened()],
    "claimed": CLAIMED,
    "planning": [*CLAIMED, *_moves(T.QUEUED, T.PLANNING)],
    "executing": EXECUTING,
    "effect_pending": EFFECT,
    "verifying": VERIFYING,
    "verifying_with_artifact": ARTIFACT,
    "blocked": [*EXECUTING, ev.BlockerRaised(blocker_id=1, reason="needs a token", next_action="ask alice"),
                *_moves(T.EXECUTING, T.BLOCKED)],
    "unknown": UNKNOWN,
    "unknown_reclaimed": [*UNKNOWN, ev.LeaseGranted(worker="w1", lease=2, token_digest=HEX)],
    "ready_for_review": [_opened(review=True), *CLAIMED[1:], *_moves(T.QUEUED, T.PLANNING, T.EXECUTING, T.VERIFYING),
                         ev.ArtifactRecorded(path=RESULT, kind="report", bytes=12, sha256=HEX),
                         ev.ResultSubmitted(summary="done", artifacts=(RESULT,)),
                         *_moves(T.VERIFYING, T.READY_FOR_REVIEW)],
    "succeeded": SUCCEEDED,
    "succeeded_transferred": [*SUCCEEDED, ev.AuthorityTransferred(action="deliver", to="w2")],
    "check_failed": [*SUCCEEDED, ev.SanitizationChecked(passed=False, bundle_sha256=HEX, by="alice")],
    "sending": SENDING,
    "delivered": [*SENDING, ev.DeliveryConfirmed(key="send-1", receipt="msg-1"), *_moves(T.SUCCEEDED, T.DELIVERED),
                  ev.LeaseReleased(lease=1, reason="delivered")],
    "cancelled": [*EXECUTING, ev.RunClosed(disposition="cancelled", by="alice"), *_moves(T.EXECUTING, T.CANCELLED),
                  ev.LeaseReleased(lease=1, reason="closed as cancelled")],
    "failed": [_opened(), ev.RunClosed(disposition="failed", by="alice"), *_moves(T.QUEUED, T.FAILED)],
}


def folded(name: str, run_id: str = "r1") -> Checkpoint:
    """The Checkpoint the checkpoint reducer folds from ``STATES[name]``."""
    steps = [Step(run_id=run_id, seq=i, type=type(e).__struct_config__.tag, recorded_us=1_000_000 * i, event=e,
                  actor=_BY.get(type(e).__struct_config__.tag, "owner:alice"))
             for i, e in enumerate(STATES[name], 1)]
    return fold(steps, run_id)


CHECKPOINTS = {name: folded(name) for name in STATES}


def test_the_states_are_what_they_are_named():
    """The fixtures hold: each folded state is the lifecycle state its name says."""
    named = {"fresh": T.QUEUED, "claimed": T.QUEUED, "effect_pending": T.EXECUTING,
             "verifying_with_artifact": T.VERIFYING, "unknown_reclaimed": T.UNKNOWN,
             "succeeded_transferred": T.SUCCEEDED, "check_failed": T.SUCCEEDED, "sending": T.SUCCEEDED}
    for name, cp in CHECKPOINTS.items():
        assert cp.state == named.get(name, name), name
        assert cp.opened == (name != "fresh"), name
    assert CHECKPOINTS["executing"].lease == 1 and CHECKPOINTS["unknown"].lease is None
    assert CHECKPOINTS["unknown_reclaimed"].lease == 2 and CHECKPOINTS["sending"].delivery.pending is not None
    assert CHECKPOINTS["succeeded"].delivery_ready and not CHECKPOINTS["ready_for_review"].delivery_ready


# --- the table ------------------------------------------------------------------------------

_OPEN = C.Open(goal="write the report", target="chat:#ops", owner="alice")
_SAVE = C.SaveGraphCheckpoint(thread_id="t1", checkpoint_id="c1", checkpoint={"v": 1}, metadata={"source": "input"},
                              values={"messages": HEX})
_WRITES = C.SaveGraphWrites(thread_id="t1", checkpoint_id="c1", task_id="task-1",
                            writes=(ev.GraphWrite(idx=0, channel="messages", sha256=HEX),))
_SANITIZE = C.Sanitize(passed=True, bundle_sha256=HEX, rules_sha256=sz.rules_digest(()))


class Row(msgspec.Struct, frozen=True):
    state: str
    actor: str
    cmd: C.Command
    expect: tuple[str, ...] | type[E.LedgerError]
    owner_load: int | None = None
    parent: str | None = None  # a fork's parent state (folded as run "p")


def R(state: str, actor: str, cmd: C.Command, *expect: Any, **ctx: Any) -> Row:
    """One row: an error class, or the event type names decide returns, in order."""
    if len(expect) == 1 and isinstance(expect[0], type):
        return Row(state, actor, cmd, expect[0], **ctx)
    return Row(state, actor, cmd, tuple(expect), **ctx)


ROWS: list[Row] = [
    # open
    R("fresh", "owner", _OPEN, "HandoffOpened"),
    R("fresh", "operator", _OPEN, "HandoffOpened"),
    R("fresh", "holder", _OPEN, E.NotAuthorized),
    R("fresh", "watchdog", _OPEN, E.NotAuthorized),
    R("queued", "owner", _OPEN, E.RunExists),
    R("fresh", "owner", C.Open(goal="  ", target="chat:#ops", owner="alice"), E.InvalidInput),
    # claim
    R("queued", "holder", C.Claim(worker="w1", token_digest=HEX), "LeaseGranted"),
    R("queued", "other_worker", C.Claim(worker="w1", token_digest=HEX), E.NotAuthorized),
    R("queued", "owner", C.Claim(worker="alice", token_digest=HEX), E.NotAuthorized),
    R("queued", "holder", C.Claim(worker="w1"), E.InvalidInput),
    R("executing", "holder", C.Claim(worker="w1", token_digest=HEX), E.LeaseHeld),
    R("executing", "other_worker", C.Claim(worker="w2", token_digest=HEX), E.LeaseHeld),
    R("queued", "holder", C.Claim(worker="w1", token_digest=HEX), E.CapacityExceeded, owner_load=10),
    R("fresh", "holder", C.Claim(worker="w1", token_digest=HEX), E.UnknownRun),
    # heartbeat
    R("executing", "holder", C.Heartbeat(lease=1), "HeartbeatRecorded"),
    R("executing", "holder", C.Heartbeat(lease=2), E.StaleLease),
    R("executing", "holder", C.Heartbeat(lease=None), E.NotAuthorized),  # type: ignore[arg-type]
    R("executing", "owner", C.Heartbeat(lease=1), E.NotAuthorized),
    R("executing", "holder", C.Heartbeat(lease=0), E.InvalidInput),
    # transition
    R("executing", "holder", C.Transition(lease=1, to=T.VERIFYING), "StateChanged"),
    R("planning", "holder", C.Transition(lease=1, to=T.VERIFYING), E.IllegalTransition),
    R("executing", "holder", C.Transition(lease=1, to="done"), E.InvalidInput),
    R("unknown_reclaimed", "holder", C.Transition(lease=2, to=T.EXECUTING), E.IllegalTransition),
    R("executing", "operator", C.Transition(lease=1, to=T.VERIFYING), E.NotAuthorized),
    # progress
    R("executing", "holder", C.Progress(lease=1, kind="tool_outcome"), "ProgressRecorded"),
    R("executing", "holder", C.Progress(lease=1, kind="note"), "ProgressRecorded"),
    R("planning", "holder", C.Progress(lease=1, kind="tool_outcome"), E.IllegalProgress),
    R("executing", "holder", C.Progress(lease=1, kind="made_up"), E.InvalidInput),
    R("executing", "watchdog", C.Progress(lease=1, kind="tool_outcome"), E.NotAuthorized),
    # artifact
    R("verifying", "holder", C.RecordArtifact(lease=1, path=RESULT, kind="report", bytes=12, sha256=HEX, exists=True),
      "ArtifactRecorded"),
    R("verifying", "holder", C.RecordArtifact(lease=1, path=RESULT, kind="report", bytes=1, sha256="x", exists=True),
      E.InvalidInput),
    R("verifying", "owner", C.RecordArtifact(lease=1, path=RESULT, kind="report", bytes=1, sha256=HEX, exists=True),
      E.NotAuthorized),
    # evidence
    R("succeeded", "owner", C.RecordEvidence(kind="lint", outcome="pass"), "EvidenceRecorded"),
    R("executing", "holder", C.RecordEvidence(kind="tests", outcome="fail", lease=1), "EvidenceRecorded"),
    R("executing", "operator", C.RecordEvidence(kind="tests", outcome="maybe"), E.InvalidInput),  # type: ignore[arg-type]
    R("executing", "watchdog", C.RecordEvidence(kind="tests", outcome="pass"), E.NotAuthorized),
    R("executing", "stranger", C.RecordEvidence(kind="tests", outcome="pass"), E.NotAuthorized),
    # block
    R("executing", "owner", C.Block(reason="needs a token", next_action="ask alice"), "BlockerRaised", "StateChanged"),
    R("blocked", "owner", C.Block(reason="and a review", next_action="ask bob"), "BlockerRaised"),
    R("executing", "holder", C.Block(reason="r", next_action="n", lease=1), "BlockerRaised", "StateChanged"),
    R("executing", "owner", C.Block(reason="", next_action="ask alice"), E.InvalidInput),
    R("executing", "watchdog", C.Block(reason="r", next_action="n"), E.NotAuthorized),
    R("cancelled", "owner", C.Block(reason="late", next_action="nothing"), E.TerminalRun),
    # unblock
    R("blocked", "owner", C.Unblock(resolution="token given"), "BlockerCleared", "StateChanged"),
    R("blocked", "owner", C.Unblock(resolution="x", blocker_id=5), E.InvalidInput),
    R("executing", "owner", C.Unblock(resolution="x"), E.IllegalTransition),
    R("blocked", "watchdog", C.Unblock(resolution="x"), E.NotAuthorized),
    # effect_start
    R("executing", "holder", C.StartEffect(lease=1, key="mail-1", what="mail the report"), "SideEffectStarted"),
    R("effect_pending", "holder", C.StartEffect(lease=1, key="mail-1", what="mail the report")),
    R("effect_pending", "holder", C.StartEffect(lease=1, key="mail-1", what="open a PR"), E.IdempotencyConflict),
    R("claimed", "holder", C.StartEffect(lease=1, key="k", what="send"), E.IllegalTransition),
    R("executing", "operator", C.StartEffect(lease=1, key="k", what="send"), E.NotAuthorized),
    # effect_confirm
    R("effect_pending", "holder", C.ConfirmEffect(key="mail-1", outcome="done", lease=1), "SideEffectConfirmed"),
    R("effect_pending", "operator", C.ConfirmEffect(key="mail-1", outcome="absent"), "ReconciliationRecorded"),
    R("unknown", "owner", C.ConfirmEffect(key="mail-1", outcome="done", note="it went"), "ReconciliationRecorded"),
    R("effect_pending", "operator", C.ConfirmEffect(key="nope", outcome="done"), E.UnknownEffect),
    R("effect_pending", "watchdog", C.ConfirmEffect(key="mail-1", outcome="done"), E.NotAuthorized),
    # submit
    R("verifying_with_artifact", "holder", C.Submit(lease=1, summary="done"), "ResultSubmitted", "StateChanged"),
    R("verifying", "holder", C.Submit(lease=1), E.EvidenceMissing),
    R("executing", "holder", C.Submit(lease=1), E.IllegalTransition),
    R("verifying_with_artifact", "owner", C.Submit(lease=1), E.NotAuthorized),
    # review
    R("ready_for_review", "owner", C.ReviewResult(approve=True), "ReviewDecided", "StateChanged"),
    R("ready_for_review", "operator", C.ReviewResult(approve=False, notes="wrong"), "ReviewDecided", "StateChanged"),
    R("verifying", "owner", C.ReviewResult(approve=True), E.IllegalTransition),
    R("ready_for_review", "holder", C.ReviewResult(approve=True), E.NotAuthorized),
    R("ready_for_review", "stranger", C.ReviewResult(approve=True), E.NotAuthorized),
    # transfer
    R("succeeded", "owner", C.TransferAuthority(action="deliver", to="w2"), "AuthorityTransferred"),
    R("succeeded", "owner", C.TransferAuthority(action="publish", to="w2"), E.InvalidInput),
    R("succeeded", "holder", C.TransferAuthority(action="deliver", to="w1"), E.NotAuthorized),
    R("succeeded", "stranger", C.TransferAuthority(action="deliver", to="mallory"), E.NotAuthorized),
    # deliver
    R("succeeded", "owner", C.Deliver(key="send-1"), "DeliveryAttempted"),
    R("succeeded_transferred", "other_worker", C.Deliver(key="send-1"), "DeliveryAttempted"),
    R("sending", "owner", C.Deliver(key="send-1")),
    R("sending", "owner", C.Deliver(key="send-2"), E.DeliveryRefused),
    R("verifying_with_artifact", "owner", C.Deliver(key="send-1"), E.DeliveryRefused),
    R("ready_for_review", "owner", C.Deliver(key="send-1"), E.DeliveryRefused),
    R("succeeded", "holder", C.Deliver(key="send-1"), E.NotAuthorized),
    R("succeeded", "stranger", C.Deliver(key="send-1"), E.NotAuthorized),
    R("cancelled", "owner", C.Deliver(key="send-1"), E.TerminalRun),
    R("delivered", "owner", C.Deliver(key="send-1")),
    R("delivered", "owner", C.Deliver(key="send-2"), E.DeliveryRefused),
    # delivered
    R("sending", "owner", C.ConfirmDelivery(key="send-1", receipt="msg-1"),
      "DeliveryConfirmed", "StateChanged", "LeaseReleased"),
    R("succeeded", "owner", C.ConfirmDelivery(key="send-1", receipt="msg-1"), E.DeliveryRefused),
    R("delivered", "owner", C.ConfirmDelivery(key="send-1", receipt="msg-1")),
    R("delivered", "owner", C.ConfirmDelivery(key="send-1", receipt="msg-2"), E.DeliveryRefused),
    R("failed", "owner", C.ConfirmDelivery(key="send-1", receipt="msg-1"), E.TerminalRun),
    R("sending", "holder", C.ConfirmDelivery(key="send-1", receipt="msg-1"), E.NotAuthorized),
    # delivery_failed
    R("sending", "owner", C.FailDelivery(key="send-1", error="503"), "DeliveryFailed"),
    R("succeeded", "owner", C.FailDelivery(key="send-1", error="503"), E.DeliveryRefused),
    R("sending", "watchdog", C.FailDelivery(key="send-1", error="503"), E.NotAuthorized),
    # delivery_unanswered
    R("sending", "owner", C.RecordUnanswered(key="send-1", reason="timed out"), "DeliveryUnanswered"),
    R("succeeded", "owner", C.RecordUnanswered(key="send-1", reason="timed out"), E.DeliveryRefused),
    R("sending", "holder", C.RecordUnanswered(key="send-1", reason="timed out"), E.NotAuthorized),
    # sanitize
    R("succeeded", "owner", _SANITIZE, "SanitizationChecked"),
    R("succeeded_transferred", "other_worker", _SANITIZE, "SanitizationChecked"),  # comes with deliver
    R("executing", "owner", _SANITIZE, E.IllegalTransition),
    R("succeeded", "owner", C.Sanitize(passed=True, bundle_sha256=HEX, rules_sha256=OTHER_HEX), E.InvalidInput),
    R("succeeded", "watchdog", _SANITIZE, E.NotAuthorized),
    # release
    R("executing", "holder", C.Release(lease=1), "LeaseReleased"),
    R("effect_pending", "holder", C.Release(lease=1, reason="shift over"), "LeaseReleased", "StateChanged"),
    R("executing", "holder", C.Release(lease=2), E.StaleLease),
    R("executing", "owner", C.Release(lease=1), E.NotAuthorized),
    # revoke
    R("executing", "watchdog", C.Revoke(reason="no heartbeat"), "LeaseRevoked"),
    R("effect_pending", "owner", C.Revoke(reason="stop", lease=1), "LeaseRevoked", "StateChanged"),
    R("queued", "operator", C.Revoke(reason="no heartbeat"), E.StaleLease),
    R("executing", "owner", C.Revoke(reason="stop", lease=7), E.StaleLease),
    R("executing", "holder", C.Revoke(reason="mine now"), E.NotAuthorized),
    R("executing", "owner", C.Revoke(reason=""), E.InvalidInput),
    # close
    R("executing", "owner", C.Close(disposition="no_op"), "RunClosed", "StateChanged", "LeaseReleased"),
    R("queued", "operator", C.Close(disposition="failed"), "RunClosed", "StateChanged"),
    R("sending", "owner", C.Close(disposition="cancelled"), E.DeliveryRefused),
    R("cancelled", "owner", C.Close(disposition="failed"), E.TerminalRun),
    R("executing", "holder", C.Close(disposition="no_op"), E.NotAuthorized),
    R("executing", "stranger", C.Close(disposition="no_op"), E.NotAuthorized),
    R("executing", "owner", C.Close(disposition="done"), E.InvalidInput),  # type: ignore[arg-type]
    # fork (the child is fresh; its parent, run "p", is in the context)
    R("fresh", "owner", C.Fork(parent="p", at_seq=3), "RunForked", parent="executing"),
    R("fresh", "operator", C.Fork(parent="p", at_seq=3), "RunForked", parent="executing"),
    R("fresh", "stranger", C.Fork(parent="p", at_seq=3), E.NotAuthorized, parent="executing"),
    R("fresh", "owner", C.Fork(parent="p", at_seq=99), E.InvalidInput, parent="executing"),
    R("fresh", "operator", C.Fork(parent="p", at_seq=3), E.UnknownRun),
    R("fresh", "owner", C.Fork(parent="p", at_seq=3), E.NotAuthorized),  # no parent: nobody to be owner of
    R("fresh", "owner", C.Fork(parent="p", at_seq=5), E.TerminalRun, parent="cancelled"),
    R("queued", "owner", C.Fork(parent="p", at_seq=3), E.RunExists, parent="executing"),
    # observe
    R("executing", "watchdog", C.Observe(classification="healthy", progress_seq=3), "WatchdogObserved"),
    R("delivered", "watchdog", C.Observe(classification="silent", progress_seq=3), "WatchdogObserved"),
    R("executing", "watchdog", C.Observe(classification="fine", progress_seq=3), E.InvalidInput),
    R("executing", "owner", C.Observe(classification="healthy", progress_seq=3), E.NotAuthorized),
    R("fresh", "watchdog", C.Observe(classification="healthy", progress_seq=0), E.UnknownRun),
    # recover
    R("executing", "watchdog", C.Recover(action="revoke_lease", classification="unavailable", progress_seq=3),
      "RecoveryDecided", "LeaseRevoked"),
    R("effect_pending", "watchdog", C.Recover(action="revoke_lease", classification="unavailable", progress_seq=3,
                                              lease=1), "RecoveryDecided", "LeaseRevoked", "StateChanged"),
    R("executing", "operator", C.Recover(action="pause", classification="stalled", progress_seq=3),
      "RecoveryDecided", "BlockerRaised", "StateChanged"),
    R("executing", "watchdog", C.Recover(action="mark_stalled", classification="stalled", progress_seq=3),
      "RecoveryDecided"),
    R("queued", "watchdog", C.Recover(action="revoke_lease", classification="unavailable", progress_seq=0),
      E.StaleLease),
    R("executing", "watchdog", C.Recover(action="revoke_lease", classification="unavailable", progress_seq=3,
                                         lease=7), E.StaleLease),
    R("executing", "watchdog", C.Recover(action="reboot", classification="stalled", progress_seq=3), E.InvalidInput),
    R("executing", "holder", C.Recover(action="pause", classification="stalled", progress_seq=3), E.NotAuthorized),
    R("cancelled", "watchdog", C.Recover(action="pause", classification="stalled", progress_seq=3), E.TerminalRun),
    # withdraw_artifact
    R("verifying_with_artifact", "owner", C.WithdrawArtifact(path=RESULT, reason="wrong file"), "ArtifactWithdrawn"),
    R("verifying_with_artifact", "holder", C.WithdrawArtifact(path=RESULT, reason="wrong file", lease=1),
      "ArtifactWithdrawn"),
    R("verifying", "owner", C.WithdrawArtifact(path=RESULT, reason="wrong file"), E.UnknownArtifact),
    R("succeeded", "owner", C.WithdrawArtifact(path=RESULT, reason="wrong file"), E.IllegalTransition),
    R("verifying_with_artifact", "watchdog", C.WithdrawArtifact(path=RESULT, reason="x"), E.NotAuthorized),
    # reopen
    R("check_failed", "owner", C.Reopen(reason="leaks a key"), "RunReopened", "StateChanged"),
    R("succeeded", "owner", C.Reopen(reason="leaks a key"), E.IllegalTransition),
    R("ready_for_review", "owner", C.Reopen(reason="leaks a key"), E.IllegalTransition),
    R("check_failed", "owner", C.Reopen(reason=""), E.InvalidInput),
    R("check_failed", "holder", C.Reopen(reason="leaks a key"), E.NotAuthorized),
    # save_graph_checkpoint
    R("queued", "owner", _SAVE, "GraphCheckpointSaved"),
    R("executing", "holder", msgspec.structs.replace(_SAVE, lease=1), "GraphCheckpointSaved"),
    R("executing", "owner", _SAVE, E.LeaseHeld),
    R("executing", "holder", msgspec.structs.replace(_SAVE, lease=2), E.StaleLease),
    R("queued", "owner", msgspec.structs.replace(_SAVE, values={"messages": "not a digest"}), E.InvalidInput),
    R("queued", "watchdog", _SAVE, E.NotAuthorized),
    # save_graph_writes
    R("queued", "operator", _WRITES, "GraphWritesSaved"),
    R("queued", "owner", msgspec.structs.replace(_WRITES, writes=()), E.InvalidInput),
    R("executing", "owner", _WRITES, E.LeaseHeld),
    R("queued", "holder", _WRITES, E.NotAuthorized),
    # erase_values
    R("queued", "owner", C.EraseValues(reason="retention", values=(HEX,)), "ValuesErased"),
    R("queued", "owner", C.EraseValues(reason="retention")),
    R("cancelled", "operator", C.EraseValues(reason="a deletion request", everything=True), "ValuesErased"),
    R("executing", "owner", C.EraseValues(reason="retention", values=(HEX,), lease=1), "LeaseRevoked", "ValuesErased"),
    R("executing", "holder", C.EraseValues(reason="retention", values=(HEX,), lease=1), "ValuesErased"),
    R("executing", "owner", C.EraseValues(reason="retention", values=(HEX,)), E.LeaseHeld),
    R("executing", "owner", C.EraseValues(reason="retention", values=(HEX,), lease=7), E.StaleLease),
    R("queued", "owner", C.EraseValues(reason="retention", values=(HEX,), lease=1), E.StaleLease),
    R("queued", "watchdog", C.EraseValues(reason="retention", values=(HEX,)), E.NotAuthorized),
]


def _context(row: Row) -> Context:
    parent = folded(row.parent, "p") if row.parent is not None else None
    return Context(actor=ACTORS[row.actor], owner_load=row.owner_load, parent=parent)


def _id(row: Row) -> str:
    want = row.expect.__name__ if isinstance(row.expect, type) else "+".join(row.expect) or "nothing"
    return f"{C.name_of(row.cmd)}-{row.state}-{row.actor}-{want}"


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_the_table(row: Row):
    cp = CHECKPOINTS[row.state]
    if isinstance(row.expect, type):
        with pytest.raises(E.LedgerError) as info:
            decide(cp, row.cmd, _context(row))
        assert type(info.value) is row.expect, f"{info.value.type}: {info.value.message}"
        assert info.value.message
    else:
        out = decide(cp, row.cmd, _context(row))
        assert tuple(type(e).__name__ for e in out) == row.expect
    assert cp == folded(row.state), "decide changed the checkpoint it was given"


def test_every_command_has_an_accepted_and_a_refused_row():
    accepted = {C.name_of(r.cmd) for r in ROWS if not isinstance(r.expect, type)}
    refused = {C.name_of(r.cmd) for r in ROWS if isinstance(r.expect, type)}
    every = {cls.__struct_config__.tag for cls in typing.get_args(C.AnyCommand)}
    assert every == set(T.PERMISSIONS) == {cls.__struct_config__.tag for cls in HANDLERS}
    assert every - accepted == set() and every - refused == set()


def test_a_command_without_a_handler_is_invalid_input():
    class Unknown(C.Command, tag="unknown_command"):
        pass

    with pytest.raises(E.InvalidInput) as info:
        decide(CHECKPOINTS["executing"], Unknown(), Context(actor=OWNER))
    assert info.value.field == "command"


# --- the rules over the whole grid -----------------------------------------------------------

#: One command of each kind: its first accepted row's (a lease in it is lease 1, the others ignore it).
SAMPLES: list[C.Command] = sorted({type(r.cmd): r.cmd for r in reversed(ROWS) if not isinstance(r.expect, type)}.values(),
                                  key=C.name_of)
#: The commands that write to an existing run (open and fork make a new one).
WRITES = [c for c in SAMPLES if C.name_of(c) not in T.READ_ONLY | T.AFTER_END | {"open", "fork"}]
OPENED = [n for n in STATES if n != "fresh"]
TERMINALS = [n for n in OPENED if CHECKPOINTS[n].terminal]


def _outcome(cp: Checkpoint, cmd: C.Command, actor: Actor) -> list[ev.Event] | E.LedgerError:
    try:
        return decide(cp, cmd, Context(actor=actor, parent=CHECKPOINTS["executing"]))
    except E.LedgerError as exc:
        return exc


def test_every_cell_of_the_grid_is_events_or_a_typed_refusal():
    """No (state, command, actor) escapes as anything but events or a LedgerError, and an
    accepted command moves the run only along MOVES, from where it stands."""
    for state in STATES:
        cp = CHECKPOINTS[state]
        for cmd in SAMPLES:
            for actor in ACTORS.values():
                out = _outcome(cp, cmd, actor)
                if isinstance(out, E.LedgerError):
                    continue
                moves = [e for e in out if isinstance(e, ev.StateChanged)]
                for m in moves:
                    assert (m.from_state, m.to_state) in T.MOVES, (state, C.name_of(cmd), m)
                assert not moves or moves[0].from_state == cp.state


@given(state=st.sampled_from(TERMINALS), cmd=st.sampled_from(WRITES), actor=st.sampled_from(list(ACTORS.values())))
def test_a_terminal_run_refuses_every_write(state, cmd, actor):
    out = _outcome(CHECKPOINTS[state], cmd, actor)
    name = C.name_of(cmd)
    retry = name in ("deliver", "delivered") and state == T.DELIVERED  # an idempotent retry of the end
    if not retry:
        assert isinstance(out, E.TerminalRun), (name, out)
    else:
        assert not isinstance(out, E.TerminalRun)


LEASED = [c for c in SAMPLES if authority.RULES[C.name_of(c)].lease and hasattr(c, "lease")]
LIVE = [n for n in OPENED if not CHECKPOINTS[n].terminal]


@given(state=st.sampled_from(LIVE), cmd=st.sampled_from(LEASED), lease=st.integers(1, 2**31))
def test_a_worker_under_any_other_lease_is_refused_as_stale(state, cmd, lease):
    cp = CHECKPOINTS[state]
    out = _outcome(cp, msgspec.structs.replace(cmd, lease=lease), HOLDER)
    if lease != cp.lease:
        assert isinstance(out, E.StaleLease), (state, C.name_of(cmd), out)
    else:
        assert not isinstance(out, (E.StaleLease, E.NotAuthorized))


@given(state=st.sampled_from(LIVE), cmd=st.sampled_from([c for c in SAMPLES if C.name_of(c) not in ("open", "fork")]),
       actor=st.sampled_from([OPERATOR, WATCHDOG, OTHER_WORKER, STRANGER]))
def test_an_actor_the_authority_row_does_not_list_is_refused(state, cmd, actor):
    """The row in authority.RULES is the policy: a kind it does not list (and no owner by
    name, no worker under the lease, no transfer) is NotAuthorized, whatever the state."""
    rule = authority.RULES[C.name_of(cmd)]
    cp = CHECKPOINTS[state]
    out = _outcome(cp, cmd, actor)
    transferred = rule.carried_by is not None and cp.may(rule.carried_by, actor.name)
    listed = actor.kind in rule.kinds and actor.kind != T.OWNER
    if actor.kind == T.WORKER and rule.lease:
        return  # judged by its lease (the test above)
    if not listed and not transferred:
        assert isinstance(out, E.NotAuthorized), (state, C.name_of(cmd), actor, out)
    else:  # the policy lets it through (a handler may still refuse: a claim on behalf of another)
        authority.check(cp, C.name_of(cmd), cmd, actor)


def test_the_authority_rows_read_the_transition_tables():
    for name, allowed in T.PERMISSIONS.items():
        rule = authority.RULES[name]
        assert rule.command == name
        assert rule.kinds | ({"lease"} if rule.lease else set()) == allowed
        granted = T.COMES_WITH.get(name, name)
        assert rule.carried_by == (granted if granted in T.TRANSFERABLE else None)
    assert authority.RULES["deliver"].who == "the operator or the owner"
    assert authority.RULES["evidence"].who == "a worker holding the lease or the operator or the owner"
