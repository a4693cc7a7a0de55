"""The handlers of a run's lease: a worker claims and releases it, an owner or operator
revokes it, and the watchdog observes the run and recovers it.

A worker that leaves with a side effect of unknown outcome sends the run to unknown,
however it leaves (``lost_lease_events``, also used by an erasure that ends a lease).
"""

from __future__ import annotations

from handoff.ledger import events as ev
from handoff.ledger import inputs
from handoff.ledger.errors import CapacityExceeded, InvalidInput, LeaseHeld, NotAuthorized, StaleLease

from . import commands as C
from . import handle_work as work
from . import transitions as T
from .checkpoint import Checkpoint
from .handler import Context, state_change
from .stall import CLASSIFICATIONS


def claim(cp: Checkpoint, c: C.Claim, ctx: Context) -> list[ev.Event]:
    worker = inputs.name("worker", c.worker)
    if ctx.actor.name != worker:
        raise NotAuthorized(f"worker {ctx.actor.name} cannot claim run {cp.run_id} on behalf of {worker}")
    if cp.lease is not None and cp.worker == worker:
        raise LeaseHeld(
            f"run {cp.run_id} is already held by worker {worker} under lease {cp.lease}. If "
            "that is this worker, keep using the token its claim printed, or release with it "
            "before claiming again; if the token is lost, wait for the watchdog to revoke "
            f"lease {cp.lease} once it stops beating, or ask the run's owner or an operator",
            lease=cp.lease, same_worker=True,
        )
    if cp.lease is not None:
        raise LeaseHeld(
            f"run {cp.run_id} is held by {cp.worker} under lease {cp.lease}; wait for it to "
            "release, or for the watchdog to revoke it if it stops beating. A worker does not "
            "revoke another worker's lease; that is for the run's owner or an operator",
            lease=cp.lease,
        )
    if not isinstance(c.token_digest, str) or not inputs.HEX_DIGEST.fullmatch(c.token_digest):
        raise InvalidInput(
            "a claim must carry token_digest, the hex sha256 of a fresh secret "
            "(ledger.store.new_lease_secret); Ledger.claim draws one for you",
            field="token_digest",
        )
    if ctx.owner_load is not None and ctx.owner_load >= cp.policy.owner_cap:
        raise CapacityExceeded(
            f"owner {cp.owner} already has {ctx.owner_load} active runs, its cap of "
            f"{cp.policy.owner_cap}; wait for one to finish or close one",
        )
    return [ev.LeaseGranted(worker=worker, lease=cp.max_lease + 1, token_digest=c.token_digest)]


def release(cp: Checkpoint, c: C.Release, ctx: Context) -> list[ev.Event]:
    released = ev.LeaseReleased(lease=c.lease, reason=inputs.text("reason", c.reason))
    return [released, *_orphaned_effects(cp, "released the lease", "release")]


def _orphaned_effects(cp: Checkpoint, how: str, via: str) -> list[ev.Event]:
    """A worker leaving with a side effect of unknown outcome sends the run to unknown."""
    lost = [e for e in cp.pending_effects if e.lease == cp.lease]
    if not lost or cp.state not in T.WORKING:
        return []
    keys = ", ".join(e.key for e in lost)
    return [state_change(cp, T.UNKNOWN, via, f"side effect {keys} has no recorded outcome and its worker {how}")]


def lost_lease_events(cp: Checkpoint, reason: str, via: str) -> list[ev.Event]:
    revoked = ev.LeaseRevoked(lease=cp.lease, reason=reason)  # type: ignore[arg-type]
    return [revoked, *_orphaned_effects(cp, "lost the lease", via)]


def revoke(cp: Checkpoint, c: C.Revoke, ctx: Context) -> list[ev.Event]:
    reason = inputs.text("reason", c.reason, empty=False)
    if cp.lease is None:
        raise StaleLease(f"run {cp.run_id} has no lease to revoke")
    if c.lease is not None and c.lease != cp.lease:
        raise StaleLease(f"lease {c.lease} is not run {cp.run_id}'s current lease ({cp.lease}); nothing revoked")
    return lost_lease_events(cp, reason, "revoke")


def observe(cp: Checkpoint, c: C.Observe, ctx: Context) -> list[ev.Event]:
    return [ev.WatchdogObserved(
        watcher=ctx.actor.name, classification=inputs.choice("classification", c.classification, CLASSIFICATIONS),
        progress_seq=inputs.count("progress_seq", c.progress_seq), reason=inputs.text("reason", c.reason),
        interval_s=float(c.interval_s), beat_us=work.liveness_figure("beat_us", c.beat_us),
        beats=work.liveness_figure("beats", c.beats),
    )]


def recover(cp: Checkpoint, c: C.Recover, ctx: Context) -> list[ev.Event]:
    action = inputs.choice("action", c.action, T.RECOVERY_ACTIONS)
    reason = inputs.text("reason", c.reason)
    decided = ev.RecoveryDecided(
        watcher=ctx.actor.name, action=action, classification=inputs.choice("classification", c.classification, CLASSIFICATIONS),
        progress_seq=inputs.count("progress_seq", c.progress_seq), reason=reason,
        beat_us=work.liveness_figure("beat_us", c.beat_us), beats=work.liveness_figure("beats", c.beats),
    )
    if action == "revoke_lease":
        if cp.lease is None:
            raise StaleLease(f"run {cp.run_id} has no lease to revoke")
        if c.lease is not None and c.lease != cp.lease:
            raise StaleLease(
                f"the watchdog judged lease {c.lease}, but run {cp.run_id} is now under lease "
                f"{cp.lease}; nothing revoked (observe the run again)"
            )
        return [decided, *lost_lease_events(cp, reason or "heartbeat timeout", "recover")]
    if action == "pause":
        block = C.Block(
            reason=f"paused by watchdog {ctx.actor.name}: {reason or 'progress repeated past the retry budget'}",
            next_action="a person reviews the run, then 'handoff unblock' (or close it)",
        )
        return [decided, *work.block(cp, block, ctx, via="recover")]
    return [decided]
