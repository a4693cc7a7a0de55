"""Admission of imported history: would the rules have written this event here?

An import brings events written elsewhere. Each one is admitted only if a live command
could have produced it at that point: the command is rebuilt from the event and decided
again against the run's fold (``decide``, the same rules and the same typed refusals a live
write meets), and what decide returns must be the event itself. A command that writes
several events (submit writes the result and the move; close writes the closing, the move
and the release) leaves the rest as ``Pending``: the next events of the run must be exactly
those, under the same actor, lease and time. Pure: no I/O, no clock.
"""

from __future__ import annotations

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import HistoryRefused, InvalidInput
from handoff.ledger.inputs import check_actor
from handoff.ledger.store import Actor

from . import commands as C
from .checkpoint import Checkpoint
from .decide import Context, decide


class Pending(msgspec.Struct, frozen=True):
    """The events still owed by the command that wrote the event before, and its envelope."""

    events: tuple[ev.Event, ...]
    actor: str
    lease: int | None
    recorded_us: int
    seq: int


#: Fields an event may carry that the rules do not determine (another version may add
#: optional ones, such as a digest of a lease's secret): only these are compared.
_COMPARED: dict[type[ev.Event], tuple[str, ...]] = {ev.LeaseGranted: ("worker", "lease")}


def _same(a: ev.Event, b: ev.Event) -> bool:
    if type(a) is not type(b):
        return False
    fields = _COMPARED.get(type(a))
    if fields is None:
        return a == b
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def command_of(event: ev.Event, lease: int | None) -> C.Command | None:
    """The command that writes ``event`` as the first of its events (``lease``: the envelope's)."""
    e = event
    match e:
        case ev.HandoffOpened():
            return C.Open(goal=e.goal, target=e.target, owner=e.owner, origin=e.origin, result_path=e.result_path,
                          stop_rules=e.stop_rules, require_review=e.require_review, policy=e.policy,
                          public=e.public, sanitize_patterns=e.sanitize_patterns, send=e.send,
                          progress_kinds=e.progress_kinds)
        case ev.LeaseGranted():
            # A grant exported before lease tokens has no digest: no token can prove it, so
            # nobody writes under it after the import; a placeholder lets decide judge the rest.
            return C.Claim(worker=e.worker, token_digest=e.token_digest or "0" * 64)
        case ev.LeaseReleased():
            return C.Release(lease=e.lease, reason=e.reason)
        case ev.LeaseRevoked():
            return C.Revoke(reason=e.reason, lease=e.lease)
        case ev.AuthorityTransferred():
            return C.TransferAuthority(action=e.action, to=e.to)
        case ev.HeartbeatRecorded():
            return C.Heartbeat(lease=lease, attrs=e.attrs, beats=e.beats, previous_us=e.previous_us)  # type: ignore[arg-type]
        case ev.StateChanged():
            return C.Transition(lease=lease, to=e.to_state, reason=e.reason)  # type: ignore[arg-type]
        case ev.ProgressRecorded():
            return C.Progress(lease=lease, kind=e.kind, detail=e.detail, attrs=e.attrs)  # type: ignore[arg-type]
        case ev.ArtifactRecorded():
            return C.RecordArtifact(lease=lease, path=e.path, kind=e.kind, bytes=e.bytes,  # type: ignore[arg-type]
                                    sha256=e.sha256, exists=e.exists, attrs=e.attrs)
        case ev.EvidenceRecorded():
            return C.RecordEvidence(kind=e.kind, outcome=e.outcome, detail=e.detail, lease=lease, attrs=e.attrs)
        case ev.BlockerRaised():
            return C.Block(reason=e.reason, next_action=e.next_action, lease=lease)
        case ev.BlockerCleared():
            return C.Unblock(resolution=e.resolution, blocker_id=e.blocker_id, lease=lease)
        case ev.SideEffectStarted():
            return C.StartEffect(lease=lease, key=e.key, what=e.what, attrs=e.attrs)  # type: ignore[arg-type]
        case ev.SideEffectConfirmed():
            return C.ConfirmEffect(key=e.key, outcome=e.outcome, lease=lease, attrs=e.attrs)
        case ev.ReconciliationRecorded():
            return C.ConfirmEffect(key=e.key, outcome=e.outcome, note=e.note, lease=lease, attrs=e.attrs)
        case ev.ResultSubmitted():
            return C.Submit(lease=lease, summary=e.summary)  # type: ignore[arg-type]
        case ev.ReviewDecided():
            return C.ReviewResult(approve=e.approved, notes=e.notes)
        case ev.DeliveryAttempted():
            return C.Deliver(key=e.key, bundle_sha256=e.bundle_sha256)
        case ev.DeliveryUnanswered():
            return C.RecordUnanswered(key=e.key, reason=e.reason)
        case ev.SanitizationChecked():
            return C.Sanitize(passed=e.passed, bundle_sha256=e.bundle_sha256, items=e.items,
                              findings=e.findings, rules_sha256=e.rules_sha256)
        case ev.DeliveryConfirmed():
            return C.ConfirmDelivery(key=e.key, receipt=e.receipt)
        case ev.DeliveryFailed():
            return C.FailDelivery(key=e.key, error=e.error)
        case ev.RunClosed():
            return C.Close(disposition=e.disposition, reason=e.reason)
        case ev.WatchdogObserved():
            return C.Observe(classification=e.classification, progress_seq=e.progress_seq, reason=e.reason,
                             interval_s=e.interval_s, beat_us=e.beat_us, beats=e.beats)
        case ev.RecoveryDecided():
            return C.Recover(action=e.action, classification=e.classification, progress_seq=e.progress_seq,
                             reason=e.reason, beat_us=e.beat_us, beats=e.beats)
        case ev.RunForked():
            return C.Fork(parent=e.parent, at_seq=e.parent_seq)
        case ev.ArtifactWithdrawn():
            return C.WithdrawArtifact(path=e.path, reason=e.reason, lease=lease)
        case ev.GraphCheckpointSaved():
            return C.SaveGraphCheckpoint(thread_id=e.thread_id, checkpoint_id=e.checkpoint_id, checkpoint=e.checkpoint,
                                         metadata=e.metadata, values=e.values, namespace=e.namespace,
                                         parent_id=e.parent_id, lease=lease, extends=e.extends)
        case ev.GraphWritesSaved():
            return C.SaveGraphWrites(thread_id=e.thread_id, checkpoint_id=e.checkpoint_id, task_id=e.task_id,
                                     writes=e.writes, namespace=e.namespace, task_path=e.task_path, lease=lease)
        case ev.ValuesErased():
            return C.EraseValues(reason=e.reason, values=e.values, checkpoints=e.checkpoints,
                                 everything=e.everything, lease=lease)
    return None


def admit(
    cp: Checkpoint,
    pending: Pending | None,
    *,
    seq: int,
    actor: str,
    lease: int | None,
    recorded_us: int,
    event: ev.Event,
    parent: Checkpoint | None = None,
) -> Pending | None:
    """Admit one imported event of ``cp``'s run, or raise the refusal a live write would get.

    ``pending`` is what the previous event's command still owes; the return value is what
    this one's owes (None when its command is complete). ``parent`` is the parent's fold
    at the fork point, for a ``run_forked``.
    """
    tag = ev.tag_of(event)
    if pending is not None:
        want = pending.events[0]
        envelope = (actor, lease, recorded_us) == (pending.actor, pending.lease, pending.recorded_us)
        if not (envelope and _same(want, event)):
            raise HistoryRefused(
                f"seq {seq} is {tag} by {actor}, but the command that wrote seq {pending.seq} also "
                f"writes {ev.tag_of(want)} right after it, by the same actor at the same time; the "
                "history was cut or edited",
                seq=seq,
            )
        rest = pending.events[1:]
        return Pending(rest, actor, lease, recorded_us, pending.seq) if rest else None
    try:
        who = check_actor(Actor.parse(actor))
    except InvalidInput as exc:
        raise InvalidInput(f"seq {seq}: actor {actor[:60]!r} is not valid ({exc.message})", field="actor") from None
    cmd = command_of(event, lease)
    if cmd is None:  # pragma: no cover - every event type has its command
        raise HistoryRefused(f"seq {seq}: no command writes {tag}", seq=seq)
    out = decide(cp, cmd, Context(actor=who, owner_load=None, parent=parent))
    wants_lease = getattr(cmd, "lease", None) if who.kind == "worker" else None
    if lease != wants_lease:
        raise HistoryRefused(
            f"seq {seq} ({tag} by {actor}) carries lease {lease} in its envelope, where a live "
            f"write would carry {wants_lease}",
            seq=seq,
        )
    if not out:
        raise HistoryRefused(
            f"seq {seq} ({tag}) repeats a command that had already taken effect; a live write "
            "records nothing for it",
            seq=seq,
        )
    if not _same(out[0], event):
        raise HistoryRefused(
            f"seq {seq} is {msgspec.json.encode(event).decode()[:200]}, but at that point the rules "
            f"write {msgspec.json.encode(out[0]).decode()[:200]} for that command",
            seq=seq,
        )
    rest = tuple(out[1:])
    return Pending(rest, actor, lease, recorded_us, seq) if rest else None
