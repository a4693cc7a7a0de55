"""Delivery proof: was the result sent to the recorded target, and exactly once?

The fold keeps what the log says happened; ``status`` adds the one judgement that
needs a clock (an attempt with no outcome for too long is *ambiguous*), with ``now``
passed in. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from msgspec.structs import replace

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded


class Attempt(msgspec.Struct, frozen=True):
    key: str
    by: str
    at_us: int
    seq: int
    outcome: str | None = None  # None (pending), "confirmed", "failed"
    receipt: str = ""
    error: str = ""


class Delivery(msgspec.Struct, frozen=True):
    target: str = ""
    attempts: tuple[Attempt, ...] = ()
    confirmed_key: str | None = None
    receipt: str | None = None
    confirmed_seq: int | None = None

    @property
    def pending(self) -> Attempt | None:
        for a in reversed(self.attempts):
            if a.outcome is None:
                return a
        return None

    @property
    def latest_key(self) -> str | None:
        """The confirmed key, else the last attempt's, else None (what status shows as ``key``)."""
        return self.confirmed_key or (self.attempts[-1].key if self.attempts else None)

    def attempt(self, key: str) -> Attempt | None:
        for a in self.attempts:
            if a.key == key:
                return a
        return None


def initial() -> Delivery:
    return Delivery()


def _set_outcome(d: Delivery, key: str, **changes: object) -> Delivery:
    return replace(
        d, attempts=tuple(replace(a, **changes) if a.key == key else a for a in d.attempts)
    )


def _opened(d: Delivery, rec: Recorded, e: ev.HandoffOpened) -> Delivery:
    return replace(d, target=e.target)


def _attempted(d: Delivery, rec: Recorded, e: ev.DeliveryAttempted) -> Delivery:
    return replace(d, attempts=d.attempts + (Attempt(e.key, e.by, rec.recorded_us, rec.seq),))


def _confirmed(d: Delivery, rec: Recorded, e: ev.DeliveryConfirmed) -> Delivery:
    d = _set_outcome(d, e.key, outcome="confirmed", receipt=e.receipt)
    return replace(d, confirmed_key=e.key, receipt=e.receipt, confirmed_seq=rec.seq)


def _failed(d: Delivery, rec: Recorded, e: ev.DeliveryFailed) -> Delivery:
    return _set_outcome(d, e.key, outcome="failed", error=e.error)


def _forked(d: Delivery, rec: Recorded, e: ev.RunForked) -> Delivery:
    # A child run's delivery starts over; an unresolved parent attempt stays the parent's.
    return Delivery(target=d.target)


#: The only events that change a delivery; a table, so the other events cost one lookup.
_RULES: dict[type[ev.Event], Callable[[Delivery, Recorded, Any], Delivery]] = {
    ev.HandoffOpened: _opened,
    ev.DeliveryAttempted: _attempted,
    ev.DeliveryConfirmed: _confirmed,
    ev.DeliveryFailed: _failed,
    ev.RunForked: _forked,
}


def evolve(d: Delivery, rec: Recorded, event: ev.Event) -> Delivery:
    """Apply one event; returns ``d`` itself when the event does not concern delivery."""
    rule = _RULES.get(type(event))
    return d if rule is None else rule(d, rec, event)


def fold(records: Iterable[Recorded]) -> Delivery:
    d = initial()
    for rec in records:
        d = evolve(d, rec, rec.event)
    return d


#: Every stage a delivery can be at. ``ambiguous`` is the one that needs a clock.
STAGES = ("not_ready", "ready", "attempted", "ambiguous", "failed", "confirmed")


def stage(d: Delivery, *, ready: bool) -> str:
    """Where the delivery stands by the log alone: not_ready, ready, attempted, failed or
    confirmed. The one rule for it: ``status`` (packets), the deliveries view and the CLI's
    write documents all call this. ``ready`` comes from the checkpoint (result submitted,
    evidence present, review approved when required)."""
    if d.confirmed_key is not None:
        return "confirmed"
    if d.pending is not None:
        return "attempted"
    if d.attempts and d.attempts[-1].outcome == "failed":
        return "failed"
    return "ready" if ready else "not_ready"


def status(
    d: Delivery, *, ready: bool, now_us: int, timeout_s: float
) -> tuple[str, str]:
    """(status, why): ``stage``, with an attempt older than ``timeout_s`` at ``now_us``
    judged ``ambiguous``."""
    at = stage(d, ready=ready)
    if at == "confirmed":
        return at, f"confirmed under key {d.confirmed_key}: {d.receipt}"
    if at == "attempted":
        pending = d.pending
        assert pending is not None
        age = (now_us - pending.at_us) / 1e6
        if age > timeout_s:
            return "ambiguous", (
                f"attempt {pending.key} by {pending.by} has had no outcome for {age:.0f}s; "
                "reconcile with the target before any retry"
            )
        return at, f"attempt {pending.key} by {pending.by} awaits its outcome"
    if at == "failed":
        last = d.attempts[-1]
        return at, f"attempt {last.key} failed: {last.error}; a new attempt may be made"
    if at == "ready":
        return at, "result, evidence and review are in place"
    return at, "no approved, evidenced result yet"
