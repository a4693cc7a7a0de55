"""The handlers of the owner's part of a result: its review, the authority the owner
hands on, its sanitization check and delivery (attempted once, then confirmed, failed or
unanswered), sending it back (reopen) and closing the run without delivery.
"""

from __future__ import annotations

from handoff.ledger import events as ev
from handoff.ledger import inputs
from handoff.ledger.errors import DeliveryRefused, IllegalTransition, InvalidInput, LedgerError, SanitizationRequired

from . import commands as C
from . import sanitize as sz
from . import transitions as T
from .checkpoint import Checkpoint
from .handler import Context, state_change


def review(cp: Checkpoint, c: C.ReviewResult, ctx: Context) -> list[ev.Event]:
    to = T.SUCCEEDED if c.approve else T.EXECUTING
    move = state_change(cp, to, "review", "approved" if c.approve else "rejected")
    return [ev.ReviewDecided(by=ctx.actor.name, approved=bool(c.approve), notes=inputs.text("notes", c.notes)), move]


def transfer(cp: Checkpoint, c: C.TransferAuthority, ctx: Context) -> list[ev.Event]:
    action = inputs.choice("action", c.action, T.TRANSFERABLE)
    return [ev.AuthorityTransferred(action=action, to=inputs.name("to", c.to))]


def sanitize(cp: Checkpoint, c: C.Sanitize, ctx: Context) -> list[ev.Event]:
    if cp.state != T.SUCCEEDED and cp.state != T.READY_FOR_REVIEW:
        raise IllegalTransition(
            f"run {cp.run_id} is {cp.state}; a sanitization check reads a submitted result, so it is "
            "recorded once the run is ready_for_review or succeeded", state=cp.state)
    if not isinstance(c.bundle_sha256, str) or not inputs.HEX_DIGEST.fullmatch(c.bundle_sha256):
        raise InvalidInput("bundle_sha256 must be the hex sha256 of what was scanned", field="bundle_sha256")
    if not isinstance(c.items, (tuple, list)) or not isinstance(c.findings, (tuple, list)):
        raise InvalidInput("items and findings must be lists", field="items")
    for i, item in enumerate(c.items):
        if not isinstance(item, ev.ScannedItem) or not inputs.HEX_DIGEST.fullmatch(item.sha256):
            raise InvalidInput(f"items[{i}] must name a part with its hex sha256", field="items")
        inputs.text(f"items[{i}].name", item.name, max_len=4096, empty=False)
    for i, f in enumerate(c.findings):
        if not isinstance(f, ev.Finding):
            raise InvalidInput(f"findings[{i}] must be a Finding", field="findings")
        inputs.name(f"findings[{i}].detector", f.detector)
    if bool(c.passed) != (not c.findings):
        raise InvalidInput("a check passes exactly when it has no findings", field="passed")
    rules = sz.rules_digest(cp.delivery.patterns)
    if c.rules_sha256 != rules:
        raise InvalidInput(
            "rules_sha256 is not the digest of this version's detectors and the contract's patterns "
            "(reducers.sanitize.rules_digest); the check ran other rules", field="rules_sha256")
    return [ev.SanitizationChecked(passed=bool(c.passed), bundle_sha256=c.bundle_sha256, items=tuple(c.items),
                                   findings=tuple(c.findings), rules_sha256=rules, by=ctx.actor.name)]


def deliver(cp: Checkpoint, c: C.Deliver, ctx: Context) -> list[ev.Event]:
    key = inputs.name("delivery_key", c.key)
    d = cp.delivery
    if d.confirmed_key is not None:
        if d.confirmed_key == key:
            return []  # a retried attempt of a confirmed delivery: nothing to send again
        raise DeliveryRefused(
            f"run {cp.run_id} was already delivered to {d.target} under key {d.confirmed_key}; a "
            "second delivery would be a double send"
        )
    bundle = c.bundle_sha256
    if not isinstance(bundle, str) or (bundle and not inputs.HEX_DIGEST.fullmatch(bundle)):
        raise InvalidInput("bundle_sha256 must be a hex sha256 or empty", field="bundle_sha256")
    # A public target's gate applies to every send, a repeat under an open key included.
    try:
        sz.gate(d, run_id=cp.run_id, key=key, bundle_sha256=bundle,
                artifacts=[(a.path, a.sha256) for a in cp.artifacts if a.exists])
    except LedgerError:
        raise
    except Exception as exc:  # a detector that fails must not read as a pass, nor escape untyped
        raise SanitizationRequired(
            f"a sanitization detector failed while checking the delivery key of run {cp.run_id} "
            f"({type(exc).__name__}); nothing was recorded and delivery to its public target stays refused. "
            "Try another key; if it keeps failing, check the contract's sanitize patterns") from None
    same = d.attempt(key)
    if same is not None:
        if same.open:
            if bundle and same.bundle_sha256 and bundle != same.bundle_sha256:
                raise DeliveryRefused(
                    f"delivery {key!r} of run {cp.run_id} was attempted with other content (sha256 "
                    f"{same.bundle_sha256[:12]}, now {bundle[:12]}); a key stands for one content. Settle "
                    "it ('handoff delivered' or 'handoff delivery-failed') first")
            return []
        raise DeliveryRefused(f"delivery key {key!r} already failed on run {cp.run_id}; a new attempt needs a new key")
    pending = d.pending
    if pending is not None:
        raise DeliveryRefused(
            f"delivery {pending.key!r} of run {cp.run_id} has no outcome yet; confirm it ('handoff "
            "delivered') or mark it failed ('handoff delivery-failed') before another attempt"
        )
    if not cp.delivery_ready:
        why = ("it is " + cp.state) if cp.state != T.SUCCEEDED else (
            "no passing evidence is recorded" if not cp.evidence_ok else "the review has not approved it")
        raise DeliveryRefused(f"run {cp.run_id} is not ready to deliver: {why}")
    return [ev.DeliveryAttempted(key=key, target=cp.target, by=ctx.actor.name, bundle_sha256=bundle)]


def delivered(cp: Checkpoint, c: C.ConfirmDelivery, ctx: Context) -> list[ev.Event]:
    key = inputs.name("delivery_key", c.key)
    receipt = inputs.text("receipt", c.receipt, empty=False)
    d = cp.delivery
    attempt = d.attempt(key)
    if attempt is None:
        raise DeliveryRefused(f"no delivery with key {key!r} was attempted on run {cp.run_id}; record the attempt with 'handoff deliver' first")
    if attempt.outcome == "confirmed":
        if attempt.receipt == receipt:
            return []
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} was already confirmed with another receipt")
    if d.confirmed_key is not None:
        raise DeliveryRefused(f"run {cp.run_id} was already delivered under key {d.confirmed_key}; this would be a double send")
    if attempt.outcome == "failed":
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} was marked failed; it cannot be confirmed now")
    out: list[ev.Event] = [ev.DeliveryConfirmed(key=key, receipt=receipt), state_change(cp, T.DELIVERED, "delivered")]
    if cp.lease is not None:
        out.append(ev.LeaseReleased(lease=cp.lease, reason="delivered"))
    return out


def delivery_failed(cp: Checkpoint, c: C.FailDelivery, ctx: Context) -> list[ev.Event]:
    key = inputs.name("delivery_key", c.key)
    attempt = cp.delivery.attempt(key)
    if attempt is None or not attempt.open:
        state = "was never attempted" if attempt is None else f"is already {attempt.outcome}"
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} {state}; nothing to mark failed")
    return [ev.DeliveryFailed(key=key, error=inputs.text("error", c.error, empty=False))]


def unanswered(cp: Checkpoint, c: C.RecordUnanswered, ctx: Context) -> list[ev.Event]:
    key = inputs.name("delivery_key", c.key)
    reason = inputs.text("reason", c.reason, empty=False)
    attempt = cp.delivery.attempt(key)
    if attempt is None or not attempt.open:
        state = "was never attempted" if attempt is None else f"is already {attempt.outcome}"
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} {state}; it cannot be left unanswered")
    if attempt.outcome == "unknown" and attempt.error == reason:
        return []  # the same send, unanswered the same way: nothing new to record
    return [ev.DeliveryUnanswered(key=key, reason=reason)]


def reopen(cp: Checkpoint, c: C.Reopen, ctx: Context) -> list[ev.Event]:
    """Back to verifying, only for a result that cannot leave as it is: succeeded, its
    latest sanitization check failed, and no send of it is under way."""
    reason = inputs.text("reason", c.reason, empty=False)
    if cp.state == T.READY_FOR_REVIEW:
        raise IllegalTransition(
            f"run {cp.run_id} is ready_for_review: it waits for its review, and reopen is for a succeeded result. Reject the review "
            f"instead ('handoff review {cp.run_id} --by OWNER --reject --notes ...'): that sends it back "
            "to executing", state=cp.state, to=T.VERIFYING)
    move = state_change(cp, T.VERIFYING, "reopen", reason)
    pending = cp.delivery.pending
    if pending is not None:
        raise DeliveryRefused(
            f"delivery {pending.key!r} of run {cp.run_id} has no outcome yet; reopening now could leave a "
            "send nobody accounted for. Record what happened first ('handoff delivered' or 'handoff "
            "delivery-failed')")
    check = cp.delivery.check
    if check is None or check.passed:
        what = "no sanitization check is recorded" if check is None else f"its latest sanitization check (seq {check.seq}) passed"
        raise IllegalTransition(
            f"run {cp.run_id} is succeeded and {what}: nothing stops its delivery, so it is not reopened. "
            "Reopen sends back a result whose sanitization check failed; to stop the run instead, close it",
            state=cp.state, to=T.VERIFYING)
    return [ev.RunReopened(by=ctx.actor.name, reason=reason, check_seq=check.seq), move]


def close(cp: Checkpoint, c: C.Close, ctx: Context) -> list[ev.Event]:
    disposition = inputs.choice("disposition", c.disposition, set(T.CLOSE_DISPOSITIONS))
    pending = cp.delivery.pending
    if pending is not None:
        raise DeliveryRefused(
            f"delivery {pending.key!r} of run {cp.run_id} has no outcome; confirm or fail it before "
            "closing, or the run could end with a send nobody accounted for"
        )
    move = state_change(cp, disposition, "close", c.reason)
    out: list[ev.Event] = [ev.RunClosed(disposition=disposition, by=ctx.actor.name, reason=inputs.text("reason", c.reason)), move]  # type: ignore[arg-type]
    if cp.lease is not None:
        out.append(ev.LeaseReleased(lease=cp.lease, reason=f"closed as {disposition}"))
    return out
