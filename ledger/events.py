"""Every fact the ledger can hold, as one tagged union of frozen msgspec Structs.

Tags are explicit and stable: they are what is stored, so renaming a class never
changes stored data. New fields must take defaults and no stored field may change its
type; that is the whole schema-evolution rule (see docs/events.md).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

#: Bumped when the meaning of stored payloads changes in a way a reader must know.
#: Version 1 lacked ProgressRecorded.advances, ArtifactRecorded.exists,
#: WatchdogObserved.interval_s and Policy.delivery_timeout_s / owner_cap; readers default them.
#: Version 2 lacked LeaseGranted.token_digest: such a lease has no token, and no write can
#: prove it holds it (docs/reliability.md, "Lease tokens").
#: Version 3 lacked the workers' ``attrs`` and HandoffOpened.progress_kinds: a reader that
#: does not know declared kinds would refuse a history that uses them.
SCHEMA_VERSION = 4
#: From this version on, decoding a payload and encoding the event again gives the very
#: bytes that were stored: fields added since are left out while unset (``UNSET``), so
#: an event without them encodes as its version wrote it. An import compares the two.
CANONICAL_SINCE = 3

#: What a worker may attach to a record: model, tokens, cost, tool, trace and span ids.
#: String keys; text, whole or decimal numbers, or booleans. The bounds are rules, kept in
#: ledger/inputs.py (``check_attrs``); here is only the shape a payload may have.
Attrs = dict[str, str | int | float | bool]
#: A contract's own progress kinds, by working state (reducers/transitions.py checks them).
DeclaredKinds = dict[str, tuple[str, ...]]


class Event(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=False):
    """Base of every event. Subclasses name a past-tense fact."""


class Policy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Timeouts and budgets a watchdog applies to one run, fixed when it opens."""

    heartbeat_timeout_s: float = 60.0
    progress_timeout_s: float = 300.0
    retry_budget: int = 3
    delivery_timeout_s: float = 600.0
    owner_cap: int = 10


class SendPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """How the ledger itself sends a result to an adapter target (docs/delivery.md).

    ``token_env`` names the environment variable holding a bearer token for a webhook:
    the name is part of the contract, the secret never is.
    """

    timeout_s: float = 30.0
    retries: int = 2
    backoff_s: float = 1.0
    max_bytes: int = 10 * 1024 * 1024
    inline: bool = True
    token_env: str = ""


class HandoffOpened(Event, tag="handoff_opened"):
    """The contract, written before any worker may start.

    ``public`` marks a target others can see: delivery there needs a passing sanitization
    check (``sanitization_checked``) over exactly what is sent; ``sanitize_patterns`` are
    the owner's own regular expressions, checked with the built-in detectors.
    """

    goal: str
    target: str
    owner: str
    origin: str = ""
    result_path: str | None = None
    stop_rules: tuple[str, ...] = ()
    require_review: bool = False
    policy: Policy = Policy()
    public: bool = False
    sanitize_patterns: tuple[str, ...] = ()
    send: SendPolicy = SendPolicy()
    progress_kinds: DeclaredKinds | UnsetType = UNSET


class LeaseGranted(Event, tag="lease_granted"):
    """A worker now holds the run; ``lease`` is its fencing number (strictly increasing).

    ``token_digest`` is the hex sha256 of the secret half of the token the claim printed
    (see ledger.store.lease_digest); the token itself is never stored. Empty for a lease
    granted before tokens existed.
    """

    worker: str
    lease: int
    token_digest: str = ""


class LeaseReleased(Event, tag="lease_released"):
    """The holder gave the run back of its own accord."""

    lease: int
    reason: str = ""


class LeaseRevoked(Event, tag="lease_revoked"):
    """Someone else (watchdog, owner, operator) took the run away from its holder."""

    lease: int
    reason: str


class AuthorityTransferred(Event, tag="authority_transferred"):
    """The owner let a named actor perform one owner-only action (review, deliver, close)."""

    action: str
    to: str


class HeartbeatRecorded(Event, tag="heartbeat_recorded"):
    """The lease holder is alive. Says nothing about progress.

    Most beats are kept beside the log (``ledger.store.Liveness``); one that is logged says
    how many beats its lease had sent by then (``beats``) and when the one before it was
    (``previous_us``), so the gap before it is in the log. Ledgers written before beats were
    kept beside the log have a logged beat for every beat, without these two fields.
    """

    attrs: Attrs | UnsetType = UNSET
    beats: int | UnsetType = UNSET
    previous_us: int | UnsetType = UNSET


class StateChanged(Event, tag="state_changed"):
    """The lifecycle moved from one state to another (see reducers/transitions.py)."""

    from_state: str
    to_state: str
    reason: str = ""


class ProgressRecorded(Event, tag="progress_recorded"):
    """The worker reports a step; ``advances`` says whether it counts as progress."""

    kind: str
    detail: str = ""
    advances: bool = True
    attrs: Attrs | UnsetType = UNSET


class ArtifactRecorded(Event, tag="artifact_recorded"):
    """A file the run produced, measured by the ledger itself, not taken on trust."""

    path: str
    kind: str
    bytes: int
    sha256: str
    exists: bool = True
    attrs: Attrs | UnsetType = UNSET


class EvidenceRecorded(Event, tag="evidence_recorded"):
    """A check that was run (tests, lint, inspection) and how it came out."""

    kind: str
    outcome: Literal["pass", "fail", "skipped"]
    detail: str = ""
    attrs: Attrs | UnsetType = UNSET


class BlockerRaised(Event, tag="blocker_raised"):
    """The run cannot go on without something named; ``next_action`` says what."""

    blocker_id: int
    reason: str
    next_action: str


class BlockerCleared(Event, tag="blocker_cleared"):
    """A blocker is gone and why."""

    blocker_id: int
    resolution: str


class SideEffectStarted(Event, tag="side_effect_started"):
    """An external action began whose outcome must be confirmed before any retry."""

    key: str
    what: str
    attrs: Attrs | UnsetType = UNSET


class SideEffectConfirmed(Event, tag="side_effect_confirmed"):
    """The outcome of a started side effect is known: it happened, or it did not."""

    key: str
    outcome: Literal["done", "absent"]
    attrs: Attrs | UnsetType = UNSET


class ReconciliationRecorded(Event, tag="reconciliation_recorded"):
    """Someone looked at the world to learn a side effect's fate after its worker was lost."""

    key: str
    outcome: Literal["done", "absent"]
    note: str = ""
    attrs: Attrs | UnsetType = UNSET


class ResultSubmitted(Event, tag="result_submitted"):
    """The worker says the work is done and points at the artifacts that prove it."""

    summary: str = ""
    artifacts: tuple[str, ...] = ()


class ReviewDecided(Event, tag="review_decided"):
    """The owner (or whoever holds review authority) approved or rejected the result."""

    by: str
    approved: bool
    notes: str = ""


class DeliveryAttempted(Event, tag="delivery_attempted"):
    """A send of the result to the recorded target began, under an idempotency key.

    ``bundle_sha256`` is the digest of what is (or will be) sent, measured by the ledger
    when it reads the files; empty when the owner records a send made by hand without it.
    """

    key: str
    target: str
    by: str
    bundle_sha256: str = ""


class DeliveryConfirmed(Event, tag="delivery_confirmed"):
    """The target acknowledged the send; ``receipt`` is its proof."""

    key: str
    receipt: str


class DeliveryFailed(Event, tag="delivery_failed"):
    """The send is known not to have arrived; a new attempt may follow."""

    key: str
    error: str


class DeliveryUnanswered(Event, tag="delivery_unanswered"):
    """A send went out (or may have) and no answer says whether it arrived: a timeout after
    the request left, a connection closed before the reply. The attempt stays open; only a
    target that honours the key may be sent to again under it."""

    key: str
    reason: str


class ScannedItem(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One part of what a delivery sends, as a sanitization check read it."""

    name: str
    sha256: str
    bytes: int


class Finding(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Where a detector matched: never the matched text itself, which may be a secret."""

    detector: str
    item: str
    line: int
    count: int = 1


class SanitizationChecked(Event, tag="sanitization_checked"):
    """The detectors ran over everything a delivery would send; ``passed`` is false when
    any of them matched (``findings`` says where) or a part could not be read."""

    passed: bool
    bundle_sha256: str
    items: tuple[ScannedItem, ...] = ()
    findings: tuple[Finding, ...] = ()
    rules_sha256: str = ""
    by: str = ""


class RunClosed(Event, tag="run_closed"):
    """The run ended without delivery: no-op, cancelled or failed."""

    disposition: Literal["no_op", "cancelled", "failed"]
    by: str
    reason: str = ""


class WatchdogObserved(Event, tag="watchdog_observed"):
    """A watchdog looked at the run and classified it; no action implied."""

    watcher: str
    classification: str
    progress_seq: int
    reason: str = ""
    interval_s: float = 0.0
    #: The liveness the watchdog judged from: the last beat (µs) and the lease's beats so far.
    beat_us: int | UnsetType = UNSET
    beats: int | UnsetType = UNSET


class RecoveryDecided(Event, tag="recovery_decided"):
    """A watchdog chose one bounded recovery action for the run."""

    watcher: str
    action: str
    classification: str
    progress_seq: int
    reason: str = ""
    #: The liveness the decision rests on, as in ``WatchdogObserved``.
    beat_us: int | UnsetType = UNSET
    beats: int | UnsetType = UNSET


class RunForked(Event, tag="run_forked"):
    """First event of a child run: it continues ``parent`` as it stood at ``parent_seq``."""

    parent: str
    parent_seq: int


class ArtifactWithdrawn(Event, tag="artifact_withdrawn"):
    """A recorded artifact no longer counts (a mistyped path, a superseded file); the log
    keeps its record, and ``reason`` says why it was taken back."""

    path: str
    reason: str


class RunReopened(Event, tag="run_reopened"):
    """The owner sent a succeeded result back to verifying because its latest sanitization
    check (the one at ``check_seq``) failed, so it cannot be delivered as it is; a worker
    then withdraws what the check found and records the result again. ``reason`` says why."""

    by: str
    reason: str
    check_seq: int


class GraphWrite(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One value a graph task wrote (LangGraph's ``put_writes``): its index in the task's
    writes (negative for the framework's special channels), the channel, and the sha256
    of the value, which is stored beside the log (``Ledger.values``)."""

    idx: int
    channel: str
    sha256: str


class GraphCheckpointSaved(Event, tag="graph_checkpoint_saved"):
    """A graph framework saved its state (LangGraph's ``put``): which thread, namespace and
    checkpoint, its parent, its metadata, the checkpoint itself without its channel values
    (``checkpoint``: versions, versions seen, timestamp), and per channel the sha256 of the
    value it holds (``values``). The values live beside the log, written once each; the
    event is what proves them (``verify``)."""

    thread_id: str
    checkpoint_id: str
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    values: dict[str, str]
    namespace: str = ""
    parent_id: str = ""
    #: Channels whose stored value holds only the items appended since the parent
    #: checkpoint: channel -> the parent's version of that channel, whose value comes
    #: first (a list that grows by a message a step stores a message a step).
    extends: dict[str, str] | UnsetType = UNSET


class GraphWritesSaved(Event, tag="graph_writes_saved"):
    """A graph task's pending writes against one checkpoint (LangGraph's ``put_writes``);
    each value's sha256 names it beside the log."""

    thread_id: str
    checkpoint_id: str
    task_id: str
    writes: tuple[GraphWrite, ...]
    namespace: str = ""
    task_path: str = ""


class GraphRef(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """One saved graph checkpoint, by namespace and id."""

    namespace: str
    checkpoint_id: str


class ValuesErased(Event, tag="values_erased"):
    """Values stored beside the log were deleted, recorded before they are: the sha256 of
    each (``values``), and which saved graph checkpoints (with their writes) no longer
    exist: ``checkpoints``, or every one saved before this event when ``everything``.
    ``reason`` names the request (``delete_thread``, ``delete_for_runs``, ``prune``). The
    events that referenced the values stay; ``verify`` reports the values as erased."""

    reason: str
    values: tuple[str, ...] = ()
    checkpoints: tuple[GraphRef, ...] = ()
    everything: bool = False


AnyEvent = (
    HandoffOpened
    | LeaseGranted
    | LeaseReleased
    | LeaseRevoked
    | AuthorityTransferred
    | HeartbeatRecorded
    | StateChanged
    | ProgressRecorded
    | ArtifactRecorded
    | EvidenceRecorded
    | BlockerRaised
    | BlockerCleared
    | SideEffectStarted
    | SideEffectConfirmed
    | ReconciliationRecorded
    | ResultSubmitted
    | ReviewDecided
    | DeliveryAttempted
    | DeliveryConfirmed
    | DeliveryFailed
    | DeliveryUnanswered
    | SanitizationChecked
    | RunClosed
    | WatchdogObserved
    | RecoveryDecided
    | RunForked
    | ArtifactWithdrawn
    | RunReopened
    | GraphCheckpointSaved
    | GraphWritesSaved
    | ValuesErased
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls for cls in AnyEvent.__args__  # type: ignore[attr-defined]
}

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    """The canonical payload bytes of an event (JSON, keys in field order, tag first)."""
    return _encoder.encode(event)


def decode(payload: bytes) -> Event:
    """Decode stored payload bytes; raises msgspec.ValidationError / DecodeError."""
    return _decoder.decode(payload)


def decode_many(payloads: list[bytes]) -> list[Event]:
    """Decode a page of payloads in one call: the same events as ``decode`` on each.

    Joined by newlines and read as JSON lines, a page decodes ~1.5x faster. JSON lines
    skips blank lines and accepts several values on one line, so that reading is only
    trusted when no payload holds a newline (one line per payload) and none is blank
    (every line yields a value): then as many values as payloads means one each.
    Anything unusual is decoded one by one, which raises for the payload that is wrong.
    """
    blob = b"\n".join(payloads)
    if blob.count(b"\n") == len(payloads) - 1 and all(map(bytes.strip, payloads)):
        try:
            events = _decoder.decode_lines(blob)
        except (msgspec.ValidationError, msgspec.DecodeError):
            events = None
        if events is not None and len(events) == len(payloads):
            return events
    return [_decoder.decode(p) for p in payloads]


def attrs_of(event: object) -> dict[str, str | int | float | bool]:
    """An event's attributes as a plain dict (empty when it has none, or no such field)."""
    attrs = getattr(event, "attrs", UNSET)
    return {} if attrs is UNSET else dict(attrs)


def declared_kinds(opened: HandoffOpened) -> dict[str, tuple[str, ...]]:
    """A contract's own progress kinds as a plain dict (empty when it declared none)."""
    kinds = opened.progress_kinds
    return {} if kinds is UNSET else dict(kinds)


def tag_of_type(cls: type[Event]) -> str:
    """The tag an event type is stored under (its ``type`` column)."""
    return cls.__struct_config__.tag  # type: ignore[return-value]


def tag_of(event: Event) -> str:
    return event.__struct_config__.tag  # type: ignore[return-value]
