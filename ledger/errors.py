"""Every refusal the ledger can give, as a typed error.

A refusal always means nothing was written. Each class says in its docstring what was
wrong; each message also says what to do next. ``exit_code`` is what the CLI returns:
1 the ledger's rules said no, 2 the input was malformed, 3 the store itself failed, 4 a
check found damage.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every error this library raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @property
    def type(self) -> str:
        return type(self).__name__


# --- refused by the rules (exit 1) -------------------------------------------------


class Refused(LedgerError):
    """The ledger's rules do not allow this write."""


class SeqConflict(Refused):
    """The caller expected another head seq; someone else wrote first."""


class ValueNotStored(SeqConflict):
    """A write continues or names a value kept beside the run's log that the run does not
    store (erased, or never written): the writer's picture of the run is old. Re-read the
    run and store the value whole. A SeqConflict, since the cure is the same: read again."""


class StaleLease(Refused):
    """The write's lease token does not prove it holds the run's current lease.

    ``details["why"]`` says which: ``ended`` (revoked, released or superseded),
    ``never_issued``, ``wrong_token`` (the number is current, the secret is not its
    holder's), ``no_token`` (a lease granted before tokens existed, or a bare number).
    No message names the current lease: a refused worker has nothing to retry with.
    """

    @classmethod
    def superseded(cls, run_id: str, lease: int, current: int | None, holder: str | None,
                   max_lease: int | None = None) -> StaleLease:
        """The one wording of "this lease is not yours to write with", used by the store and
        by decide alike. ``current`` and ``holder`` only choose the wording; neither is shown."""
        if max_lease is not None and lease > max_lease:
            return cls(
                f"lease {lease} was never issued for run {run_id}, so it proves nothing: use the "
                "token your own 'handoff claim' printed. A number read from status or the log is "
                "not a token and will be refused",
                run_id=run_id, lease=lease, why="never_issued",
            )
        return cls(
            f"lease {lease} of run {run_id} has ended (revoked, released, or replaced by a later "
            "claim); this worker must stop writing to the run. Numbers or tokens read from status "
            "or the log prove nothing and will be refused too; claim the run again only if it "
            "should be yours",
            run_id=run_id, lease=lease, why="ended",
        )

    @classmethod
    def wrong_token(cls, run_id: str, lease: int) -> StaleLease:
        return cls(
            f"the token given for lease {lease} of run {run_id} is not that lease's token; only "
            "the output of the 'handoff claim' that took the lease carries it. This worker does "
            "not hold the run and must stop writing to it",
            run_id=run_id, lease=lease, why="wrong_token",
        )

    @classmethod
    def untokened(cls, run_id: str, lease: int) -> StaleLease:
        return cls(
            f"lease {lease} of run {run_id} was granted before lease tokens existed, so no write "
            "can prove it holds it; writes under it are refused. The owner or the watchdog must "
            f"revoke it ('handoff revoke {run_id}'), then the worker claims again and uses the "
            "token that claim prints",
            run_id=run_id, lease=lease, why="no_token",
        )


class LeaseLost(Refused):
    """A worker holding a lease in a block (``lease()``, ``handoff run``) lost it: the
    ledger refused it (revoked, superseded, the run ended) or no heartbeat could be
    recorded for the heartbeat timeout less the fence margin, so the watchdog may give it
    away. Every later verb of the block is refused with this, before anything is written.

    ``details["why"]`` is ``lost``, ``fenced`` or ``released`` (the holder gave it back).
    """


class ClaimAlreadyMade(Refused):
    """A keyed claim was retried: the claim happened once and its token cannot be shown again."""


class ReservedKey(Refused):
    """The idempotency key is in a namespace reserved for another kind of actor."""


class IdempotencyConflict(Refused):
    """An idempotency key was reused for a different request."""


class IllegalTransition(Refused):
    """The lifecycle table does not allow this move from the run's current state."""


class TerminalRun(Refused):
    """The run has ended; only read-only observation is accepted."""


class NotAuthorized(Refused):
    """The actor may not perform this action (owner-only without a transfer, and so on)."""


class DeliveryRefused(Refused):
    """The delivery step is out of order: not ready, never attempted, already confirmed."""


class SanitizationRequired(DeliveryRefused):
    """A public target's delivery lacks a passing sanitization check over exactly what
    would be sent (none, a failed one, or one older than the last change)."""


class ResendRefused(DeliveryRefused):
    """The last send's outcome is unknown and the target does not honour delivery keys, so
    sending again could deliver twice; a person must settle it first."""


class TargetNotAllowed(DeliveryRefused):
    """The target is an adapter target (a command, a web request, a file write) that the
    allow-list in force does not name; nothing was sent and nothing was written."""


class EvidenceMissing(Refused):
    """A result was submitted without a substantive, existing artifact."""


class CapacityExceeded(Refused):
    """The owner already has as many active runs as its cap allows."""


class RunExists(Refused):
    """A run with this id already exists."""


class UnknownRun(Refused):
    """No run has this id."""


class TargetAppeared(Refused):
    """Something was created at the import's target path while a new ledger was being built."""


class HistoryRefused(Refused):
    """Imported history that no sequence of live commands could have written."""


class LeaseHeld(Refused):
    """Another worker holds the run's lease; it must be released or revoked first."""


class UnknownEffect(Refused):
    """No side effect with this key was started on the run."""


class IllegalProgress(Refused):
    """This progress kind is not progress in the run's current state."""


class UnknownArtifact(Refused):
    """No artifact is recorded at this path on the run (never recorded, or withdrawn)."""


# --- malformed input (exit 2) ------------------------------------------------------


class InvalidInput(LedgerError):
    """A field the caller supplied is malformed; ``field`` names which."""

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None, **details: object) -> None:
        super().__init__(message, field=field, **details)
        self.field = field


class RedactedExportRefused(InvalidInput):
    """A redacted export (``export --redact``) was offered to import: it is a sanitized
    derivative for reading, its payloads no longer match their hashes, and it is never a
    ledger."""


class PayloadTooLarge(InvalidInput):
    """An event's encoded payload is over the store's size limit."""


class UnknownEventType(InvalidInput):
    """The event is not one of the types in ledger/events.py."""


# --- the store failed (exit 3) -----------------------------------------------------


class StoreError(LedgerError):
    """The store could not do its job; nothing was written."""

    exit_code = 3


class NotALedger(StoreError):
    """The file exists but is not a handoff ledger."""


class SchemaTooNew(StoreError):
    """The ledger was written by a newer version of handoff-ledger."""


class StoreUnavailable(StoreError):
    """Locked past the timeout, read-only, disk full or otherwise unwritable."""


class CorruptLedger(StoreError):
    """The file or a stored event cannot be read back as written."""


class OutcomeUnknown(StoreError):
    """The commit failed at its last step (an I/O error while syncing): it may have landed.

    The WAL frames can already be on disk, so after a crash the write may come back.
    Retry with the same idempotency key: a stored write answers ``duplicate``.
    """


class BackendUnavailable(StoreUnavailable):
    """The ledger address names a storage backend this installation does not have."""


class CollectorUnavailable(LedgerError):
    """A trace could not be handed to its collector (unreachable, refused, or it answered
    with an error): the ledger is untouched and a follower's position did not move."""

    exit_code = 3


# --- a check found damage (exit 4) -------------------------------------------------


class DamageFound(LedgerError):
    """A check found the ledger not as it was written (what ``verify`` reports as problems)."""

    exit_code = 4


class HeadAnchorBroken(DamageFound):
    """A head digest kept outside the ledger is no longer contained in it: its tail was
    cut, or its history rewritten, since the digest was taken."""


# --- the exit codes, read from the classes above -----------------------------------


def by_exit_code() -> dict[int, list[type[LedgerError]]]:
    """Every error type of this module under its ``exit_code``, in definition order: the
    one source of the CLI's exit codes and of docs/cli.md's table."""
    out: dict[int, list[type[LedgerError]]] = {}
    for value in globals().values():
        if isinstance(value, type) and issubclass(value, LedgerError) and value.__module__ == __name__:
            out.setdefault(int(value.exit_code), []).append(value)
    return dict(sorted(out.items()))
