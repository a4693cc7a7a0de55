"""Delivering a run's result: the attempt, the send through the target's adapter, the
sanitization check a public target needs, the recorded outcome, and the ledger's list of
targets a send may use (handoff/delivery/ holds the adapters, the bundle and the list's
rules; these methods join them to the ledger's write path).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput, ResendRefused, SanitizationRequired
from handoff.ledger.inputs import check_seconds, check_seq
from handoff.ledger.store import Actor, EventStore
from handoff.reducers import commands as C
from handoff.reducers.checkpoint import Checkpoint

from .results import Outcome, Sent

#: A sanitization check records at most this many findings (then one that counts the rest);
#: ``Ledger.sanitize`` returns them all.
MAX_RECORDED_FINDINGS = 200


class Delivering:
    """The delivery verbs of ``Ledger``; ``execute`` and ``checkpoint`` are the Ledger's."""

    store: EventStore

    def deliver(self, run_id: str, delivery_key: str, *, send: bool = False, timeout_s: float | None = None,
                retries: int | None = None, env: Any = None, by: str) -> Any:
        """Record a delivery attempt under ``delivery_key``; retrying the same key sends nothing twice.

        Without ``send`` the owner sends the result itself and records the outcome with
        ``delivered`` or ``delivery_failed``; returns the write's ``Outcome``. With
        ``send=True`` the ledger sends it through the target's adapter (``send_delivery``)
        and returns a ``Sent``. A public target's attempt needs a passing ``sanitize``
        over exactly what is sent either way.
        """
        if send:
            return self.send_delivery(run_id, delivery_key, by=by, timeout_s=timeout_s, retries=retries, env=env)
        # No idempotency key on purpose: decide itself treats a retry of a pending or
        # confirmed attempt as a no-op and refuses a key that already failed.
        cp = self.checkpoint(run_id)
        digest = ""
        if cp.delivery.public and cp.delivery.confirmed_key is None:
            from handoff.delivery import bundle as db

            digest = db.build(cp).sha256  # the gate compares it with the last check
        return self.execute(run_id, C.Deliver(key=delivery_key, bundle_sha256=digest), actor=Actor("owner", by))

    def send_delivery(self, run_id: str, delivery_key: str, *, by: str, timeout_s: float | None = None,
                      retries: int | None = None, env: Any = None, sleep: Callable[[float], None] = time.sleep) -> Sent:
        """Send the result to the contract's target and record what happened, in that order:
        the attempt (before anything leaves), the send, then the confirmation with its
        receipt, the failure, or ``delivery_unanswered`` when the outcome cannot be known.

        A repeat under an open key sends again only to a target that honours keys (http(s)
        with ``Idempotency-Key``, ``file://``); to a ``cmd:`` target it is refused
        (``ResendRefused``): a person checks the target and records ``delivered`` or
        ``delivery_failed``. ``timeout_s`` and ``retries`` override the contract's ``send``
        settings; ``env`` (default ``os.environ``) is where a bearer token is read from.
        Everything that can be refused is refused before the attempt is recorded.
        """
        from handoff.delivery import adapters as da
        from handoff.delivery import bundle as db
        from handoff.reducers import delivery as dl

        cp = self.checkpoint(run_id)
        policy = cp.delivery.send
        if timeout_s is not None:
            timeout_s = check_seconds(timeout_s, "timeout", low=0.0, low_open=True)
        if retries is not None:
            retries = check_seq(retries, "retries", low=0, high=20)
        if cp.delivery.confirmed_key == delivery_key:
            return Sent("confirmed", False, cp.delivery.receipt or "", "", 0, cp)
        from handoff.delivery import allowed as al

        al.check(cp.target, self.allowed_targets(), run_id=run_id, whose="the ledger's list of allowed targets",
                 how="Allow it with 'handoff targets --allow TARGET' (Ledger.allow_targets), or deliver by "
                     "hand: 'handoff deliver' without --send, send it, then 'handoff delivered'",
                 see="'handoff targets' shows it (Ledger.allowed_targets)")
        adapter = da.adapter_for(cp.target, policy, timeout_s=timeout_s, env=env)
        bundle = db.build(cp)
        adapter.prepare(bundle, delivery_key, run_id)  # what the send could never carry: refused before the record
        honours = dl.honours_keys(cp.target)

        def refuse_resend(c: Checkpoint) -> None:
            a = c.delivery.attempt(delivery_key)
            if a is not None and a.open and not honours:
                raise ResendRefused(
                    f"delivery {delivery_key!r} of run {run_id} was already attempted and its outcome is not known; "
                    f"{cp.target.split(':', 1)[0]}: targets do not honour delivery keys, so sending again could "
                    "deliver twice. Check the target, then record 'handoff delivered' or 'handoff "
                    "delivery-failed'", key=delivery_key)

        refuse_resend(cp)
        from handoff.reducers.authority import authorize

        for record in (C.ConfirmDelivery(key=delivery_key, receipt="-"), C.FailDelivery(key=delivery_key, error="-"),
                       C.RecordUnanswered(key=delivery_key, reason="-")):
            authorize(cp, record, Actor("owner", by))  # it must be able to record what happens
        out = self.execute(run_id, C.Deliver(key=delivery_key, bundle_sha256=bundle.sha256), actor=Actor("owner", by))
        if out.result.outcome != "committed":
            if out.checkpoint.delivery.confirmed_key == delivery_key:
                return Sent("confirmed", False, out.checkpoint.delivery.receipt or "", "", 0, out.checkpoint)
            refuse_resend(out.checkpoint)
        result = adapter.send(bundle, delivery_key, run_id, retries=policy.retries if retries is None else retries,
                              backoff_s=policy.backoff_s, sleep=sleep)
        actor = Actor("owner", by)
        if result.outcome == "confirmed":
            out = self.execute(run_id, C.ConfirmDelivery(key=delivery_key, receipt=result.receipt), actor=actor)
        elif result.outcome == "failed":
            out = self.execute(run_id, C.FailDelivery(key=delivery_key, error=result.error), actor=actor)
        else:
            out = self.execute(run_id, C.RecordUnanswered(key=delivery_key, reason=result.error), actor=actor)
        return Sent(result.outcome, True, result.receipt, result.error, result.tries, out.checkpoint)

    def sanitize(self, run_id: str, *, by: str) -> dict[str, Any]:
        """Run the sanitization detectors over exactly what a delivery would send now and
        record the check (``sanitization_checked``) with the digests it read. A check with
        findings is recorded too (``passed`` false), naming detector, part and line, never
        the matched text. An artifact that cannot be read as recorded refuses the check
        (typed, nothing recorded): what cannot be read cannot pass.

        Returns ``{"run_id", "passed", "bundle_sha256", "items", "findings", "seq"}``.
        """
        from handoff.delivery import bundle as db
        from handoff.reducers import sanitize as sz

        cp = self.checkpoint(run_id)
        bundle = db.build(cp)
        try:
            findings = sz.scan(bundle.parts, cp.delivery.patterns)
        except Exception as exc:  # a detector that fails must not read as a pass
            raise SanitizationRequired(
                f"a sanitization detector failed on run {run_id} ({type(exc).__name__}); nothing was recorded "
                "and delivery to its public target stays refused") from None
        kept = findings
        if len(findings) > MAX_RECORDED_FINDINGS:  # the log keeps the first ones and a count of the rest
            rest = findings[MAX_RECORDED_FINDINGS:]
            kept = (*findings[:MAX_RECORDED_FINDINGS],
                    ev.Finding(sz.MORE, f"{len(rest)} more findings", 0, sum(f.count for f in rest)))
        cmd = C.Sanitize(passed=not findings, bundle_sha256=bundle.sha256, items=bundle.items, findings=kept,
                         rules_sha256=sz.rules_digest(cp.delivery.patterns))
        out = self.execute(run_id, cmd, actor=Actor("owner", by))
        return {"run_id": run_id, "passed": not findings, "bundle_sha256": bundle.sha256,
                "items": [msgspec.to_builtins(i) for i in bundle.items],
                "findings": [msgspec.to_builtins(f) for f in findings], "seq": out.result.last_seq}

    # --- the delivery targets the ledger may send to (handoff/delivery/allowed.py) ------

    def allowed_targets(self) -> tuple[str, ...] | None:
        """The ledger's list of delivery targets a send may use (patterns: a target in full,
        or a prefix ending in ``*``), or None when no list is set and every adapter target
        may be sent to. Kept in the ledger itself, so every process and host that sends
        from this ledger follows it."""
        import json

        from handoff.delivery import allowed as al

        text = self.store.setting(al.SETTING)
        if text is None:
            return None
        try:
            patterns = json.loads(text)
            return al.check_patterns(patterns)
        except (ValueError, InvalidInput):
            # Unreadable (edited behind the store): refuse every send until it is set again.
            return ()

    def set_allowed_targets(self, patterns: Iterable[str] | None) -> tuple[str, ...] | None:
        """Replace the ledger's list of allowed delivery targets (``None`` lifts it: every
        adapter target may be sent to again; ``()`` lets no send through). Every pattern is
        checked first; a bad one changes nothing. Returns the list now in force."""
        import json

        from handoff.delivery import allowed as al

        checked = None if patterns is None else al.check_patterns(patterns)
        self.store.put_setting(al.SETTING, None if checked is None else json.dumps(list(checked)))
        return checked

    def allow_targets(self, *patterns: str) -> tuple[str, ...]:
        """Add patterns to the ledger's list of allowed delivery targets (starting one when
        none is set: from then on only what the list names is sent). Returns the list."""
        from handoff.delivery import allowed as al

        added = al.check_patterns(patterns)
        if not added:
            raise InvalidInput("name at least one target to allow", field="target")
        now = self.set_allowed_targets((*(self.allowed_targets() or ()), *added))
        assert now is not None
        return now

    def deny_targets(self, *patterns: str) -> tuple[str, ...]:
        """Remove patterns from the ledger's list (exactly as listed); a list left empty lets
        no send through. Refused (nothing changed) for a pattern the list does not hold."""
        current = self.allowed_targets()
        if not patterns:
            raise InvalidInput("name at least one target to remove from the list", field="target")
        missing = [p for p in patterns if current is None or p not in current]
        if missing:
            listed = "no list is set" if current is None else f"it holds {', '.join(map(repr, current)) or 'nothing'}"
            raise InvalidInput(f"{missing[0]!r:.200} is not on the ledger's list of allowed targets ({listed}); "
                               "remove a pattern exactly as 'handoff targets' lists it", field="target")
        assert current is not None
        now = self.set_allowed_targets(tuple(p for p in current if p not in patterns))
        assert now is not None
        return now
