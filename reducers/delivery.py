"""Delivery proof: was the result sent to the recorded target, and exactly once?

The fold keeps what the log says happened; ``status`` adds the one judgement that
needs a clock (an attempt with no outcome for too long is *ambiguous*), with ``now``
passed in. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec.structs import replace

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded

from .subfold import SubFold


#: Target schemes whose receiver honours a delivery key, so a send of unknown outcome may
#: be repeated under the same key without a second effect: a webhook gets it as the
#: ``Idempotency-Key`` header, a directory as the file name. ``cmd:`` does not: whatever
#: the command does, it does again.
KEY_HONOURING = ("http://", "https://", "file://")
#: Schemes the ledger can send to itself (handoff/delivery); any other target is sent by a
#: person and recorded by hand.
ADAPTER_SCHEMES = KEY_HONOURING + ("cmd:",)


def honours_keys(target: str) -> bool:
    return target.startswith(KEY_HONOURING)


def has_adapter(target: str) -> bool:
    return target.startswith(ADAPTER_SCHEMES)


class Attempt(msgspec.Struct, frozen=True):
    key: str
    by: str
    at_us: int
    seq: int
    outcome: str | None = None  # None (pending), "unknown" (unanswered), "confirmed", "failed"
    receipt: str = ""
    error: str = ""
    bundle_sha256: str = ""
    unknown_us: int | None = None  # when it was recorded unanswered

    @property
    def open(self) -> bool:
        """No outcome is known yet: pending, or sent without an answer."""
        return self.outcome is None or self.outcome == "unknown"


class Check(msgspec.Struct, frozen=True):
    """The latest sanitization check of the run (``sanitization_checked``)."""

    passed: bool
    bundle_sha256: str
    items: tuple[ev.ScannedItem, ...]
    findings: tuple[ev.Finding, ...]
    rules_sha256: str
    seq: int


class Delivery(msgspec.Struct, frozen=True):
    target: str = ""
    attempts: tuple[Attempt, ...] = ()
    confirmed_key: str | None = None
    receipt: str | None = None
    confirmed_seq: int | None = None
    public: bool = False
    patterns: tuple[str, ...] = ()
    send: ev.SendPolicy = ev.SendPolicy()
    check: Check | None = None
    #: The seq of the last event that changed what a delivery would send (an artifact
    #: recorded or withdrawn, a result submitted): a check older than it no longer counts.
    changed_seq: int = 0

    @property
    def pending(self) -> Attempt | None:
        for a in reversed(self.attempts):
            if a.open:
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
    return replace(d, target=e.target, public=e.public, patterns=e.sanitize_patterns, send=e.send)


def _attempted(d: Delivery, rec: Recorded, e: ev.DeliveryAttempted) -> Delivery:
    attempt = Attempt(e.key, e.by, rec.recorded_us, rec.seq, bundle_sha256=e.bundle_sha256)
    return replace(d, attempts=d.attempts + (attempt,))


def _unanswered(d: Delivery, rec: Recorded, e: ev.DeliveryUnanswered) -> Delivery:
    return _set_outcome(d, e.key, outcome="unknown", error=e.reason, unknown_us=rec.recorded_us)


def _checked(d: Delivery, rec: Recorded, e: ev.SanitizationChecked) -> Delivery:
    check = Check(e.passed, e.bundle_sha256, e.items, e.findings, e.rules_sha256, rec.seq)
    return replace(d, check=check)


def _changed(d: Delivery, rec: Recorded, e: ev.Event) -> Delivery:
    return replace(d, changed_seq=rec.seq)


def _confirmed(d: Delivery, rec: Recorded, e: ev.DeliveryConfirmed) -> Delivery:
    d = _set_outcome(d, e.key, outcome="confirmed", receipt=e.receipt)
    return replace(d, confirmed_key=e.key, receipt=e.receipt, confirmed_seq=rec.seq)


def _failed(d: Delivery, rec: Recorded, e: ev.DeliveryFailed) -> Delivery:
    return _set_outcome(d, e.key, outcome="failed", error=e.error)


def _forked(d: Delivery, rec: Recorded, e: ev.RunForked) -> Delivery:
    # A child run's delivery starts over; an unresolved parent attempt stays the parent's,
    # and so does the parent's sanitization check.
    return Delivery(target=d.target, public=d.public, patterns=d.patterns, send=d.send,
                    changed_seq=rec.seq)


#: The only events that change a delivery; a table, so the other events cost one lookup.
_RULES: dict[type[ev.Event], Callable[[Delivery, Recorded, Any], Delivery]] = {
    ev.HandoffOpened: _opened,
    ev.DeliveryAttempted: _attempted,
    ev.DeliveryConfirmed: _confirmed,
    ev.DeliveryFailed: _failed,
    ev.DeliveryUnanswered: _unanswered,
    ev.SanitizationChecked: _checked,
    ev.ArtifactRecorded: _changed,
    ev.ArtifactWithdrawn: _changed,
    ev.ResultSubmitted: _changed,
    ev.RunForked: _forked,
}


def rule_for(cls: type[ev.Event]) -> Callable[[Delivery, Recorded, Any], Delivery] | None:
    """What an event of this type does to the delivery, or None when it does not concern it."""
    return _RULES.get(cls)


_FOLD = SubFold(initial, rule_for)
#: ``evolve(d, rec, event)`` applies one event (``d`` itself when it does not concern the
#: delivery); ``fold(records)`` folds a run's delivery alone.
evolve, fold = _FOLD.evolve, _FOLD.fold


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


def ambiguous_from_us(d: Delivery, timeout_s: float, over: Callable[[float], int]) -> int | None:
    """The first instant the open attempt is ``ambiguous`` (None: no open attempt).

    An attempt left without an outcome for longer than ``timeout_s`` is; so is, at once,
    a send recorded unanswered to a target that does not honour keys, where only a person
    can find out what happened. ``over(s)`` is the fewest µs strictly longer than ``s``
    (projections.view_rows._over), so the views and ``status`` agree to the µs.
    """
    pending = d.pending
    if pending is None or d.confirmed_key is not None:
        return None
    if pending.outcome == "unknown" and not honours_keys(d.target) and pending.unknown_us is not None:
        return pending.unknown_us
    return pending.at_us + over(timeout_s)


def status(
    d: Delivery, *, ready: bool, now_us: int, timeout_s: float
) -> tuple[str, str]:
    """(status, why): ``stage``, with an attempt older than ``timeout_s`` at ``now_us``
    judged ``ambiguous``, and an unanswered send to a target that ignores keys at once."""
    at = stage(d, ready=ready)
    if at == "confirmed":
        return at, f"confirmed under key {d.confirmed_key}: {d.receipt}"
    if at == "attempted":
        pending = d.pending
        assert pending is not None
        age = (now_us - pending.at_us) / 1e6
        if pending.outcome == "unknown" and not honours_keys(d.target):
            return "ambiguous", (
                f"attempt {pending.key} by {pending.by} was sent and not answered ({pending.error}); "
                f"{d.target.split(':', 1)[0]}: targets do not honour keys, so a person must check the "
                "target and record 'handoff delivered' or 'handoff delivery-failed'; never resend"
            )
        if age > timeout_s:
            retry = (f"check the target, or send again under the same key ('handoff deliver --send --delivery-key "
                     f"{pending.key}'), which it honours" if honours_keys(d.target)
                     else "reconcile with the target before any retry")
            return "ambiguous", f"attempt {pending.key} by {pending.by} has had no outcome for {age:.0f}s; {retry}"
        if pending.outcome == "unknown":
            return at, (f"attempt {pending.key} was sent and not answered ({pending.error}); the target "
                        f"honours keys: send again with 'handoff deliver --send --delivery-key {pending.key}'")
        return at, f"attempt {pending.key} by {pending.by} awaits its outcome"
    if at == "failed":
        last = d.attempts[-1]
        return at, f"attempt {last.key} failed: {last.error}; a new attempt may be made"
    if at == "ready":
        return at, "result, evidence and review are in place"
    return at, "no approved, evidenced result yet"
