"""The checkpoint packet: everything the next actor needs to continue a run safely.

A pure fold of the run's events (with a fork's inherited prefix first). ``fold`` with
``until_seq`` gives the packet as it stood at that seq, which is what replay and audit
read. Pure: no I/O, no clock; ``packet`` takes ``now`` for the judgements that need one.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import msgspec
from msgspec.structs import replace

from ledger import events as ev
from ledger.store import Aggregate, Recorded

from . import delivery as dl
from . import stall as st
from . import transitions as T


class Blocker(msgspec.Struct, frozen=True):
    id: int
    reason: str
    next_action: str
    seq: int
    prior_state: str


class Artifact(msgspec.Struct, frozen=True):
    path: str
    kind: str
    bytes: int
    sha256: str
    exists: bool
    seq: int

    @property
    def substantive(self) -> bool:
        return self.exists and self.bytes > 0


class Evidence(msgspec.Struct, frozen=True):
    kind: str
    outcome: str
    detail: str
    seq: int


class Effect(msgspec.Struct, frozen=True):
    key: str
    what: str
    lease: int | None
    seq: int


class Review(msgspec.Struct, frozen=True):
    by: str
    approved: bool
    notes: str
    seq: int


class Result(msgspec.Struct, frozen=True):
    summary: str
    artifacts: tuple[str, ...]
    seq: int


class Checkpoint(msgspec.Struct, frozen=True):
    run_id: str
    opened: bool = False
    state: str = T.QUEUED
    goal: str = ""
    origin: str = ""
    target: str = ""
    owner: str = ""
    result_path: str | None = None
    stop_rules: tuple[str, ...] = ()
    require_review: bool = False
    policy: ev.Policy = ev.Policy()
    worker: str | None = None
    lease: int | None = None
    max_lease: int = 0
    blockers: tuple[Blocker, ...] = ()
    blockers_raised: int = 0
    artifacts: tuple[Artifact, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    pending_effects: tuple[Effect, ...] = ()
    settled_effects: tuple[tuple[str, str], ...] = ()
    result: Result | None = None
    review: Review | None = None
    authority: tuple[tuple[str, str], ...] = ()
    delivery: dl.Delivery = dl.Delivery()
    watch: st.Watch = st.Watch()
    fork_parent: str | None = None
    fork_seq: int | None = None
    disposition: str | None = None
    closed_reason: str = ""
    opened_us: int | None = None
    last_seq: int = 0
    last_event_us: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in T.TERMINAL

    @property
    def progress_seq(self) -> int:
        return self.watch.progress_seq

    @property
    def evidence_ok(self) -> bool:
        """At least one check passed and the latest outcome of every kind is not a failure."""
        latest: dict[str, str] = {}
        for e in self.evidence:
            latest[e.kind] = e.outcome
        return "pass" in latest.values() and "fail" not in latest.values()

    @property
    def delivery_ready(self) -> bool:
        reviewed = (not self.require_review) or (self.review is not None and self.review.approved)
        return self.state == T.SUCCEEDED and self.result is not None and self.evidence_ok and reviewed

    def may(self, action: str, name: str) -> bool:
        """Whether ``name`` holds a transferred authority for an owner-only action."""
        return (action, name) in self.authority


def initial(run_id: str) -> Checkpoint:
    return Checkpoint(run_id=run_id)


def evolve(cp: Checkpoint, rec: Recorded, event: ev.Event | None = None) -> Checkpoint:
    """Apply one stored event. ``event`` may be passed when already decoded."""
    if event is None:
        event = rec.event  # CorruptLedger, naming the position, if the payload is damaged
    changes: dict[str, Any] = {}
    match event:
        case ev.HandoffOpened():
            changes = dict(
                opened=True, goal=event.goal, origin=event.origin, target=event.target,
                owner=event.owner, result_path=event.result_path, stop_rules=event.stop_rules,
                require_review=event.require_review, policy=event.policy,
                opened_us=rec.recorded_us, state=T.QUEUED,
            )
        case ev.LeaseGranted(worker=worker, lease=lease):
            changes = dict(worker=worker, lease=lease, max_lease=max(cp.max_lease, lease))
        case ev.LeaseReleased(lease=lease) | ev.LeaseRevoked(lease=lease):
            if lease == cp.lease:
                changes = dict(lease=None, worker=None)
        case ev.AuthorityTransferred(action=action, to=to):
            changes = dict(authority=cp.authority + ((action, to),))
        case ev.StateChanged(to_state=to):
            changes = dict(state=to)
        case ev.ArtifactRecorded():
            art = Artifact(event.path, event.kind, event.bytes, event.sha256, event.exists, rec.seq)
            kept = tuple(a for a in cp.artifacts if a.path != event.path)
            changes = dict(artifacts=kept + (art,))
        case ev.EvidenceRecorded(kind=kind, outcome=outcome, detail=detail):
            changes = dict(evidence=cp.evidence + (Evidence(kind, outcome, detail, rec.seq),))
        case ev.BlockerRaised(blocker_id=bid, reason=reason, next_action=nxt):
            prior = cp.blockers[0].prior_state if cp.blockers else cp.state
            changes = dict(
                blockers=cp.blockers + (Blocker(bid, reason, nxt, rec.seq, prior),),
                blockers_raised=max(cp.blockers_raised, bid),
            )
        case ev.BlockerCleared(blocker_id=bid):
            changes = dict(blockers=tuple(b for b in cp.blockers if b.id != bid))
        case ev.SideEffectStarted(key=key, what=what):
            changes = dict(pending_effects=cp.pending_effects + (Effect(key, what, cp.lease, rec.seq),))
        case ev.SideEffectConfirmed(key=key, outcome=outcome) | ev.ReconciliationRecorded(
            key=key, outcome=outcome
        ):
            changes = dict(
                pending_effects=tuple(e for e in cp.pending_effects if e.key != key),
                settled_effects=cp.settled_effects + ((key, outcome),),
            )
        case ev.ResultSubmitted(summary=summary, artifacts=arts):
            changes = dict(result=Result(summary, arts, rec.seq), review=None)
        case ev.ReviewDecided(by=by, approved=approved, notes=notes):
            changes = dict(review=Review(by, approved, notes, rec.seq))
        case ev.RunClosed(disposition=disp, reason=reason):
            changes = dict(disposition=disp, closed_reason=reason)
        case ev.RunForked(parent=parent, parent_seq=pseq):
            changes = dict(
                fork_parent=parent, fork_seq=pseq, lease=None, worker=None, authority=(),
            )
    d = dl.evolve(cp.delivery, rec, event)
    if d is not cp.delivery:
        changes["delivery"] = d
    w = st.evolve(cp.watch, rec, event)
    if w is not cp.watch:
        changes["watch"] = w
    if rec.run_id == cp.run_id:
        changes["last_seq"] = rec.seq
    changes["last_event_us"] = rec.recorded_us
    return replace(cp, **changes)


def fold(records: Iterable[Recorded], run_id: str | None = None, *, until_seq: int | None = None) -> Checkpoint:
    """Fold a run's history (parent prefix first for a fork). ``until_seq`` bounds the run's own seq."""
    cp: Checkpoint | None = initial(run_id) if run_id else None
    for rec in records:
        if cp is None:
            cp = initial(rec.run_id)
        if until_seq is not None and rec.run_id == cp.run_id and rec.seq > until_seq:
            break
        cp = evolve(cp, rec)
    if cp is None:
        raise ValueError("fold needs a run_id when there are no events")
    return cp


class CheckpointAggregate(Aggregate[Checkpoint]):
    """The checkpoint fold, in the shape the store can run inside a write transaction."""

    def initial(self, run_id: str) -> Checkpoint:
        return initial(run_id)

    def evolve(self, state: Checkpoint, recorded: Recorded) -> Checkpoint:
        return evolve(state, recorded)


AGGREGATE = CheckpointAggregate()


# --- the packet as people and programs read it -------------------------------------


def iso(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def packet(
    cp: Checkpoint,
    *,
    now_us: int,
    watchers: dict[str, tuple[int, float]] | None = None,
) -> dict[str, Any]:
    """The checkpoint packet as a JSON-ready dict (its shape is documented in docs/cli.md).

    ``watchers`` maps a watcher's name to (last beat µs, interval s); with it, ``monitored``
    says truthfully whether a live watcher covers this run right now.
    """
    health = st.classify(cp, now_us=now_us)
    dstatus, dwhy = dl.status(
        cp.delivery, ready=cp.delivery_ready, now_us=now_us, timeout_s=cp.policy.delivery_timeout_s
    )
    w = cp.watch
    return {
        "run_id": cp.run_id,
        "state": cp.state,
        "terminal": cp.terminal,
        "disposition": cp.disposition or (cp.state if cp.state == T.DELIVERED else None),
        "goal": cp.goal,
        "origin": cp.origin,
        "target": cp.target,
        "owner": cp.owner,
        "result_path": cp.result_path,
        "require_review": cp.require_review,
        "worker": cp.worker,
        "lease": cp.lease,
        "progress_seq": w.progress_seq,
        "last_progress": None
        if w.last_progress is None
        else {"seq": w.last_progress.seq, "kind": w.last_progress.kind, "at": iso(w.last_progress.at_us),
              "event_seq": w.last_progress.event_seq},
        "last_heartbeat_at": iso(w.last_heartbeat_us),
        "blockers": [{"id": b.id, "reason": b.reason, "next_action": b.next_action, "seq": b.seq} for b in cp.blockers],
        "artifacts": [
            {"path": a.path, "kind": a.kind, "bytes": a.bytes, "sha256": a.sha256, "exists": a.exists, "seq": a.seq}
            for a in cp.artifacts
        ],
        "evidence": [{"kind": e.kind, "outcome": e.outcome, "detail": e.detail, "seq": e.seq} for e in cp.evidence],
        "pending_effects": [{"key": e.key, "what": e.what, "lease": e.lease, "seq": e.seq} for e in cp.pending_effects],
        "result": None if cp.result is None else {"summary": cp.result.summary, "artifacts": list(cp.result.artifacts), "seq": cp.result.seq},
        "review": None if cp.review is None else {"by": cp.review.by, "approved": cp.review.approved, "notes": cp.review.notes, "seq": cp.review.seq},
        "delivery": {
            "status": dstatus,
            "detail": dwhy,
            "target": cp.delivery.target,
            "key": cp.delivery.confirmed_key or (cp.delivery.attempts[-1].key if cp.delivery.attempts else None),
            "receipt": cp.delivery.receipt,
            "attempts": len(cp.delivery.attempts),
        },
        "health": {"classification": health.classification, "reason": health.reason, "action": health.action,
                   "needs_attention": health.needs_attention},
        "monitored": coverage(cp, watchers or {}, now_us),
        "fork_parent": cp.fork_parent,
        "fork_seq": cp.fork_seq,
        "last_seq": cp.last_seq,
        "opened_at": iso(cp.opened_us),
        "updated_at": iso(cp.last_event_us),
    }


def coverage(cp: Checkpoint, watchers: dict[str, tuple[int, float]], now_us: int) -> dict[str, Any]:
    """Is a live watcher really looking at this run? Only if one beat within 3 intervals."""
    live = {
        name: beat for name, (beat, interval) in watchers.items()
        if interval > 0 and (now_us - beat) / 1e6 <= 3 * interval
    }
    return {
        "covered": bool(live) and not cp.terminal,
        "watchers": sorted(live),
        "last_observed_at": iso(cp.watch.watcher_seen_us),
        "last_observed_by": cp.watch.watcher,
    }
