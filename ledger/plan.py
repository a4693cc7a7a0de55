"""The write plan every backend follows, with no I/O: what a write checks and what it stamps.

A write enters the store once (``append`` or ``execute``), is checked there, once, and
then meets the run's head inside the backend's write transaction. Everything decided
between those two points lives here, so the two dialects cannot drift apart on a rule:
the argument checks, the fence (expected seq, the lease and its token), a repeated
idempotency key's outcome, what ``decide`` may return, a fork's shape, and the stamping
of a batch (seqs, the per-run hash chain, and the lease moves its events make). The
lease moves are also what an import and ``verify`` replay (``LeaseState.move``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import events as ev
from .errors import IdempotencyConflict, InvalidInput, SeqConflict, StaleLease
from .inputs import check_actor, check_idempotency_key, check_run_id
from .store import (
    GENESIS_HASH,
    Actor,
    AppendResult,
    Decision,
    Head,
    LeaseToken,
    chain_hash,
    encode_events,
    request_digest,
)


class Request:
    """A write's inputs after their one check: what the dialect carries into its transaction."""

    __slots__ = ("run_id", "actor", "key", "token", "digest", "events", "encoded", "expected_seq")

    def __init__(self, run_id: str, actor: str, key: str | None, token: LeaseToken | None,
                 digest: bytes | None, events: tuple[ev.Event, ...] = (),
                 encoded: list[tuple[str, bytes]] | None = None, expected_seq: int | None = None) -> None:
        self.run_id, self.actor, self.key, self.token = run_id, actor, key, token
        self.digest, self.events, self.encoded, self.expected_seq = digest, events, encoded, expected_seq

    @property
    def lease(self) -> int | None:
        """The lease number an append's envelope carries (the token's)."""
        return self.token.lease if self.token is not None else None


def _common(run_id: str, actor: Actor, key: str | None, lease: str | None) -> LeaseToken | None:
    check_run_id(run_id)
    check_actor(actor)
    check_idempotency_key(key, actor)
    return LeaseToken.parse(lease) if lease is not None else None


def append_request(run_id: str, events: Any, *, actor: Actor, expected_seq: int | None,
                   lease: str | None, key: str | None, max_payload: int) -> Request:
    """``append``'s arguments, checked and encoded before any transaction begins."""
    token = _common(run_id, actor, key, lease)
    try:
        # Materialise once: a generator would be consumed by encode_events and the
        # insert would then see an empty batch yet acknowledge it.
        events = tuple(events)
    except TypeError:
        raise InvalidInput("events must be a sequence of events", field="events") from None
    if not events:
        raise InvalidInput("an append needs at least one event", field="events")
    if expected_seq is not None and (
        isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0
    ):
        raise InvalidInput("expected_seq must be a whole number >= 0", field="expected_seq")
    encoded = encode_events(events, max_payload)
    actor_s = str(actor)
    lease_n = token.lease if token is not None else None
    digest = request_digest(actor_s, lease_n, [p for _, p in encoded]) if key else None
    return Request(run_id, actor_s, key, token, digest, events, encoded, expected_seq)


def execute_request(run_id: str, *, actor: Actor, key: str | None, lease: str | None,
                    digest_of: bytes | None) -> Request:
    """``execute``'s arguments, checked before any transaction begins."""
    token = _common(run_id, actor, key, lease)
    actor_s = str(actor)
    digest = request_digest(actor_s, None, [digest_of or b""]) if key else None
    return Request(run_id, actor_s, key, token, digest)


def check_fence(run_id: str, head: Head | None, expected_seq: int | None, lease: int | None,
                max_lease: int | None = None) -> None:
    """The head is where the caller expected it, and ``lease`` (a number) is the current one."""
    actual = head.last_seq if head else 0
    if expected_seq is not None and expected_seq != actual:
        raise SeqConflict(
            f"run {run_id} is at seq {actual}, not {expected_seq} as expected; someone "
            "else wrote first. Re-read the run and decide again",
            run_id=run_id, actual_seq=actual, expected_seq=expected_seq,
        )
    if lease is not None:
        current = head.lease if head else None
        if current != lease:
            raise StaleLease.superseded(run_id, lease, current, head.lease_holder if head else None,
                                        max_lease if max_lease is not None else 0)


def check_token(run_id: str, head: Head | None, max_lease: int, token: LeaseToken, digest: str | None) -> None:
    """Does ``token`` prove the run's current lease? The number first, then its secret's
    digest against the one the grant stored, compared in constant time."""
    check_fence(run_id, head, None, token.lease, max_lease)
    if digest is None:
        raise StaleLease.untokened(run_id, token.lease)
    if not token.matches(digest):
        raise StaleLease.wrong_token(run_id, token.lease)


def check_repeat(run_id: str, key: str, digest: bytes | None, actor: str, stored: bytes | None,
                 by: str, seq: int) -> None:
    """A key already stored on the run: the same request (nothing to do) or a conflict.

    The digest covers the actor, so for anything this library wrote the second test adds
    nothing; it stops an imported line whose digest was copied from another actor's
    request from answering that actor's live command as "already done"."""
    if stored != digest or by != actor:
        raise IdempotencyConflict(
            f"idempotency key {key!r} was already used on run {run_id} (seq {seq}) for a "
            "different request; use a new key for a new request",
            run_id=run_id, seq=seq,
        )


def unchanged(run_id: str, head: Head | None) -> AppendResult:
    """A command with nothing to add. Not "duplicate": no key was replayed."""
    seq = head.last_seq if head else 0
    return AppendResult(run_id, "unchanged", seq, seq, ())


def check_decision(run_id: str, decision: Decision, token: LeaseToken | None, head: Head | None,
                   max_lease: int) -> None:
    """What ``decide`` returned may be written under the token the write showed."""
    if decision.lease is not None and (token is None or token.lease != decision.lease):
        # A number alone proves nothing: the write must have shown that lease's token.
        raise StaleLease(
            f"a write under lease {decision.lease} of run {run_id} must carry that "
            "lease's token (the one its claim printed); nothing was written",
            run_id=run_id, lease=decision.lease, why="no_token",
        )
    check_fence(run_id, head, None, decision.lease, max_lease)


def check_fork(run_id: str, seq: int, fork: ev.RunForked, parent_head: Callable[[str], Head | None]) -> None:
    """history() follows run_forked to the parent: refuse what would loop or dangle.

    The parent must already exist, so lineage is acyclic by construction. ``parent_head``
    reads a run's head in the write's transaction."""
    if seq != 1:
        raise InvalidInput(
            f"run_forked can only be the first event of a new run; run {run_id} "
            f"would get it at seq {seq}",
            field="events",
        )
    parent = fork.parent
    if parent == run_id or not isinstance(parent, str):
        raise InvalidInput(f"run {run_id} cannot be forked from itself", field="parent")
    check_run_id(parent, "parent")
    head = parent_head(parent)
    if head is None or not 0 <= fork.parent_seq <= head.last_seq:
        at = head.last_seq if head else None
        raise InvalidInput(
            f"cannot fork {run_id} from {parent} at seq {fork.parent_seq}: the parent "
            + ("does not exist" if at is None else f"is at seq {at}"),
            field="parent_seq",
        )


class LeaseState:
    """A run's fence as its lease events leave it: the current lease, its holder, the
    highest lease ever granted, and the token digest a write must match (``digest_moved``
    once an event set or cleared it). A live write, an import and ``verify`` all move it
    with ``move``, so the three agree on what the log's lease events mean."""

    __slots__ = ("lease", "holder", "max_lease", "digest", "digest_moved")

    def __init__(self, lease: int | None, holder: str | None, max_lease: int) -> None:
        self.lease, self.holder, self.max_lease = lease, holder, max_lease
        self.digest: str | None = None
        self.digest_moved = False

    @classmethod
    def of(cls, head: Head | None, max_lease: int) -> LeaseState:
        return cls(head.lease if head else None, head.lease_holder if head else None, max_lease)

    def move(self, event: ev.Event) -> bool:
        """Apply one event; True when it was a grant (the caller may check it first with
        ``check_grant``)."""
        if isinstance(event, ev.LeaseGranted):
            self.lease, self.holder = event.lease, event.worker
            self.max_lease = max(self.max_lease, event.lease)
            self.digest, self.digest_moved = event.token_digest or None, True
            return True
        if isinstance(event, (ev.LeaseReleased, ev.LeaseRevoked)) and event.lease == self.lease:
            self.lease, self.holder = None, None
            self.digest, self.digest_moved = None, True
        return False

    def check_grant(self, run_id: str, event: ev.LeaseGranted) -> None:
        if event.lease <= self.max_lease:
            raise StaleLease(
                f"lease token {event.lease} is not above run {run_id}'s highest lease "
                f"{self.max_lease}; fencing tokens only grow, so an old token can never "
                "be granted again",
                lease=event.lease, current_lease=self.lease,
            )


class Stamped:
    """A batch stamped onto a run's head: per event (seq, tag, key, digest, payload,
    prev_hash, hash), the run's last hash after it, and its lease state."""

    __slots__ = ("events", "last_seq", "last_hash", "fence", "now", "lease", "actor", "size")

    def __init__(self) -> None:
        self.events: list[tuple[int, str, str | None, bytes | None, bytes, bytes, bytes]] = []


def stamp(run_id: str, head: Head | None, max_lease: int, batch: Sequence[ev.Event],
          encoded: list[tuple[str, bytes]], actor: str, lease: int | None, key: str | None,
          digest: bytes | None, now: int, parent_head: Callable[[str], Head | None]) -> Stamped:
    """Give a batch its seqs and per-run chain and move the fence with its lease events,
    refusing a grant that does not grow the fence and a fork that would loop or dangle.
    Only a batch's first event carries the idempotency key and digest."""
    out = Stamped()
    seq = head.last_seq if head else 0
    prev = head.last_hash if head else GENESIS_HASH
    fence = LeaseState.of(head, max_lease)
    for i, ((tag, payload), event) in enumerate(zip(encoded, batch)):
        seq += 1
        k = key if i == 0 else None
        h = chain_hash(prev, run_id, seq, tag, actor, lease, k, now, ev.SCHEMA_VERSION, payload)
        out.events.append((seq, tag, k, digest if (i == 0 and k) else None, payload, prev, h))
        prev = h
        if isinstance(event, ev.LeaseGranted):
            fence.check_grant(run_id, event)
        elif isinstance(event, ev.RunForked):
            check_fork(run_id, seq, event, parent_head)
        fence.move(event)
    out.last_seq, out.last_hash, out.fence = seq, prev, fence
    out.now, out.lease, out.actor, out.size = now, lease, actor, len(encoded)
    return out
