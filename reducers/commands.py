"""What callers ask for: one frozen Struct per command, tagged so it encodes stably.

A command's encoding is what an idempotency key stands for: a retried command with the
same key and the same fields is a no-op; the same key with other fields is refused.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from handoff.ledger.events import Attrs, DeclaredKinds, Finding, GraphRef, GraphWrite, Policy, ScannedItem, SendPolicy


class Command(msgspec.Struct, frozen=True, tag_field="command"):
    """Fields added after a command was first stored (``attrs``, ``progress_kinds``) are
    ``UNSET`` when not given, so a command without them still encodes to the bytes an
    earlier version stored for its idempotency key."""


class Open(Command, tag="open"):
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


class Claim(Command, tag="claim"):
    """``token_digest`` is ledger.store.lease_digest of the secret the claimer drew; the
    ledger keeps only the digest, so only the claimer can later prove the lease."""

    worker: str
    token_digest: str = ""


class Heartbeat(Command, tag="heartbeat"):
    """``beats`` and ``previous_us`` are the liveness kept beside the log, as the Ledger read
    it inside the write (whatever a caller put there is replaced); an import carries the
    logged event's own."""

    lease: int
    attrs: Attrs | UnsetType = UNSET
    beats: int | UnsetType = UNSET
    previous_us: int | UnsetType = UNSET


class Transition(Command, tag="transition"):
    lease: int
    to: str
    reason: str = ""


class Progress(Command, tag="progress"):
    lease: int
    kind: str
    detail: str = ""
    attrs: Attrs | UnsetType = UNSET


class RecordArtifact(Command, tag="artifact"):
    """Measured by the caller's API layer (size, sha256, existence), never by the worker's word."""

    lease: int
    path: str
    kind: str
    bytes: int
    sha256: str
    exists: bool
    attrs: Attrs | UnsetType = UNSET


class RecordEvidence(Command, tag="evidence"):
    kind: str
    outcome: Literal["pass", "fail", "skipped"]
    detail: str = ""
    lease: int | None = None
    attrs: Attrs | UnsetType = UNSET


class Block(Command, tag="block"):
    reason: str
    next_action: str
    lease: int | None = None


class Unblock(Command, tag="unblock"):
    resolution: str
    blocker_id: int | None = None
    lease: int | None = None


class StartEffect(Command, tag="effect_start"):
    lease: int
    key: str
    what: str
    attrs: Attrs | UnsetType = UNSET


class ConfirmEffect(Command, tag="effect_confirm"):
    key: str
    outcome: Literal["done", "absent"]
    note: str = ""
    lease: int | None = None
    attrs: Attrs | UnsetType = UNSET


class Submit(Command, tag="submit"):
    lease: int
    summary: str = ""


class ReviewResult(Command, tag="review"):
    approve: bool
    notes: str = ""


class TransferAuthority(Command, tag="transfer"):
    action: str
    to: str


class Deliver(Command, tag="deliver"):
    """``bundle_sha256``: the digest of what will be sent, measured by the API from the
    files themselves (the gate of a public target compares it with the last check)."""

    key: str
    bundle_sha256: str = ""


class RecordUnanswered(Command, tag="delivery_unanswered"):
    key: str
    reason: str


class Sanitize(Command, tag="sanitize"):
    """A sanitization check's result, scanned by the API (reducers.sanitize.scan) over the
    bundle it built from the files."""

    passed: bool
    bundle_sha256: str
    items: tuple[ScannedItem, ...] = ()
    findings: tuple[Finding, ...] = ()
    rules_sha256: str = ""


class ConfirmDelivery(Command, tag="delivered"):
    key: str
    receipt: str


class FailDelivery(Command, tag="delivery_failed"):
    key: str
    error: str


class Release(Command, tag="release"):
    lease: int
    reason: str = ""


class Revoke(Command, tag="revoke"):
    reason: str
    lease: int | None = None


class Close(Command, tag="close"):
    disposition: Literal["no_op", "cancelled", "failed"]
    reason: str = ""


class Fork(Command, tag="fork"):
    parent: str
    at_seq: int


class Observe(Command, tag="observe"):
    """``beat_us`` and ``beats``: the liveness judged from, filled in by the Ledger inside
    the write (as ``Heartbeat``'s)."""

    classification: str
    progress_seq: int
    reason: str = ""
    interval_s: float = 0.0
    beat_us: int | UnsetType = UNSET
    beats: int | UnsetType = UNSET


class Recover(Command, tag="recover"):
    """``lease`` is the lease the watchdog judged; a revocation aimed at it cannot hit a newer one."""

    action: str
    classification: str
    progress_seq: int
    reason: str = ""
    lease: int | None = None
    beat_us: int | UnsetType = UNSET
    beats: int | UnsetType = UNSET


class WithdrawArtifact(Command, tag="withdraw_artifact"):
    """Take back a recorded artifact by its recorded path; the file itself is not touched."""

    path: str
    reason: str
    lease: int | None = None


class Reopen(Command, tag="reopen"):
    """Send a succeeded result that the sanitization gate refused back to verifying."""

    reason: str


class SaveGraphCheckpoint(Command, tag="save_graph_checkpoint"):
    """A graph framework's checkpoint (LangGraph's ``put``); its values were stored beside
    the log under the sha256s in ``values`` (``Ledger.save_graph_checkpoint``)."""

    thread_id: str
    checkpoint_id: str
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    values: dict[str, str]
    namespace: str = ""
    parent_id: str = ""
    lease: int | None = None
    extends: dict[str, str] | UnsetType = UNSET


class SaveGraphWrites(Command, tag="save_graph_writes"):
    """A graph task's pending writes against a saved checkpoint (LangGraph's ``put_writes``)."""

    thread_id: str
    checkpoint_id: str
    task_id: str
    writes: tuple[GraphWrite, ...]
    namespace: str = ""
    task_path: str = ""
    lease: int | None = None


class EraseValues(Command, tag="erase_values"):
    """Record which values beside the log are about to be deleted, and which saved graph
    checkpoints go with them (``Ledger.erase_values`` deletes them once this is written)."""

    reason: str
    values: tuple[str, ...] = ()
    checkpoints: tuple[GraphRef, ...] = ()
    everything: bool = False
    lease: int | None = None


AnyCommand = (
    Open | Claim | Heartbeat | Transition | Progress | RecordArtifact | RecordEvidence | Block
    | Unblock | StartEffect | ConfirmEffect | Submit | ReviewResult | TransferAuthority | Deliver
    | ConfirmDelivery | FailDelivery | RecordUnanswered | Sanitize | Release | Revoke | Close | Fork | Observe | Recover
    | WithdrawArtifact | Reopen | SaveGraphCheckpoint | SaveGraphWrites | EraseValues
)

_enc = msgspec.json.Encoder()


def encode(command: Command) -> bytes:
    return _enc.encode(command)


def request_bytes(command: Command) -> bytes:
    """What an idempotency key stands for. A claim's token digest is left out: a retried
    claim draws a new secret, yet it is the same request."""
    if isinstance(command, Claim):
        command = Claim(worker=command.worker)
    return _enc.encode(command)


def name_of(command: Command) -> str:
    return command.__struct_config__.tag  # type: ignore[return-value]
