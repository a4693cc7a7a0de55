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


class StaleLease(Refused):
    """The write carried a lease that is no longer the run's current one."""

    @classmethod
    def superseded(cls, run_id: str, lease: int, current: int | None, holder: str | None) -> StaleLease:
        """The one wording of "you were replaced", used by the store and by decide alike."""
        now = f"the current lease is {current}, held by {holder}" if current is not None else "no lease is held now"
        return cls(
            f"lease {lease} is no longer valid for run {run_id} ({now}); this worker was "
            "replaced or released the run and must stop writing",
            run_id=run_id, lease=lease, current_lease=current,
        )


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


# --- a check found damage (exit 4) -------------------------------------------------


class DamageFound(LedgerError):
    """A check found the ledger not as it was written (what ``verify`` reports as problems)."""

    exit_code = 4


class HeadAnchorBroken(DamageFound):
    """A head digest kept outside the ledger is no longer contained in it: its tail was
    cut, or its history rewritten, since the digest was taken."""
