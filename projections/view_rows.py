"""What each materialized view holds, as pure functions from a run's checkpoint to rows.

A row depends on the fold alone, never on the clock, so a rebuilt view equals the one
kept inline byte for byte. Judgements that need "now" are made at query time from the
deadlines stored here (see queries.py).
"""

from __future__ import annotations

from typing import Any

import msgspec

from handoff.reducers import delivery, stall
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import Checkpoint

_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder(Checkpoint)

FAR = None  # no deadline: the run cannot need attention by time alone


def encode_checkpoint(cp: Checkpoint) -> bytes:
    return _enc.encode(cp)


def decode_checkpoint(blob: bytes) -> Checkpoint:
    return _dec.decode(blob)


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)


def _over(seconds: float) -> int:
    """The fewest whole µs ``d`` with ``d / 1e6 > seconds``: how the reducers compare an age
    with a timeout. ``_us(seconds) + 1`` is off by one µs for binary floats such as
    ``5 * 1e-6`` (4.9999999999999996e-06), where 5 / 1e6 already exceeds it."""
    d = max(_us(seconds), 0)
    while d > 0 and (d - 1) / 1e6 > seconds:
        d -= 1
    while not d / 1e6 > seconds:
        d += 1
    return d


def next_deadline(cp: Checkpoint) -> int | None:
    """The earliest time at which stall.classify could say "needs attention", or None.

    0 means it needs attention already, whatever the time. This mirrors the order of
    checks in reducers.stall.classify; tests/projections compare the two on every run.
    """
    if not cp.opened:
        return 0
    if cp.terminal or cp.state == T.BLOCKED:
        return FAR
    lost = [e for e in cp.pending_effects if e.lease != cp.lease or cp.lease is None]
    if lost or cp.state == T.UNKNOWN:
        return 0
    pol = cp.policy
    # the first instant the attempt is ambiguous (one rule: reducers.delivery)
    delivery_deadline = delivery.ambiguous_from_us(cp.delivery, pol.delivery_timeout_s, _over)
    if cp.state in (T.READY_FOR_REVIEW, T.SUCCEEDED):
        return delivery_deadline
    if cp.lease is None:
        return FAR if cp.state == T.QUEUED and delivery_deadline is None else 0
    w = cp.watch
    beat = w.last_heartbeat_us if w.last_heartbeat_us is not None else w.lease_since_us
    if beat is None:
        return 0
    since = w.lease_since_us or 0
    if w.last_progress is not None:
        since = max(since, w.last_progress.at_us)
    # classify uses "strictly more than the timeout": _over gives that first instant.
    candidates = [beat + _over(pol.heartbeat_timeout_s), since + _over(pol.progress_timeout_s)]
    if delivery_deadline is not None:
        candidates.append(delivery_deadline)
    return min(candidates)


def checkpoint_row(cp: Checkpoint, last_position: int) -> dict[str, Any]:
    return {
        "run_id": cp.run_id,
        "state": cp.state,
        "terminal": int(cp.terminal),
        "owner": cp.owner,
        "target": cp.target,
        "worker": cp.worker,
        "lease": cp.lease,
        "progress_seq": cp.progress_seq,
        "last_seq": cp.last_seq,
        "updated_us": cp.last_event_us,
        "fork_parent": cp.fork_parent,
        "packet": encode_checkpoint(cp),
    }


def stall_row(cp: Checkpoint) -> dict[str, Any]:
    w = cp.watch
    pol = cp.policy
    return {
        "run_id": cp.run_id,
        "live": int(not cp.terminal),
        "state": cp.state,
        "lease": cp.lease,
        "last_heartbeat_us": w.last_heartbeat_us,
        "lease_since_us": w.lease_since_us,
        "progress_seq": w.progress_seq,
        "last_progress_kind": w.last_progress.kind if w.last_progress else None,
        "last_progress_us": w.last_progress.at_us if w.last_progress else None,
        "retry_count": w.repeats,
        "pending_effects": len(cp.pending_effects),
        "next_deadline_us": next_deadline(cp),
        # What stall.judge reads besides the columns above, so the stall scan judges a due
        # run from this row, decoding its packet only where stall.needs_packet says so.
        "worker": cp.worker,
        "heartbeat_timeout_s": float(pol.heartbeat_timeout_s),
        "progress_timeout_s": float(pol.progress_timeout_s),
        "retry_budget": pol.retry_budget,
        "needs_packet": int(stall.needs_packet(cp)),
    }


def delivery_row(cp: Checkpoint) -> dict[str, Any]:
    d = cp.delivery
    pending = d.pending
    ambiguous = delivery.ambiguous_from_us(d, cp.policy.delivery_timeout_s, _over)
    return {
        "run_id": cp.run_id,
        "target": cp.target,
        "status": delivery.stage(d, ready=cp.delivery_ready),
        "key": d.latest_key,
        "receipt": d.receipt,
        "attempts": len(d.attempts),
        "attempted_us": pending.at_us if pending else None,
        # queries.deliveries calls an attempt ambiguous once now > this (as reducers.delivery does).
        "ambiguous_after_us": None if ambiguous is None else ambiguous - 1,
    }


def owner_active(cp: Checkpoint) -> tuple[str, int]:
    """(owner, 1 if this run counts against the owner's concurrency cap else 0)."""
    return cp.owner, int(cp.lease is not None and not cp.terminal)
