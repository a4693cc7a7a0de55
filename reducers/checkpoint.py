"""The checkpoint packet: everything the next actor needs to continue a run safely.

A pure fold of the run's events (with a fork's inherited prefix first). ``fold`` with
``until_seq`` gives the packet as it stood at that seq, which is what replay and audit
read. Pure: no I/O, no clock; ``packet`` takes ``now`` for the judgements that need one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.store import Aggregate, Recorded, Step

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


class SideEffect(msgspec.Struct, frozen=True):
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
    #: The contract's own progress kinds by working state (transitions.progress_kinds_in).
    progress_kinds: dict[str, tuple[str, ...]] = {}
    worker: str | None = None
    lease: int | None = None
    max_lease: int = 0
    blockers: tuple[Blocker, ...] = ()
    blockers_raised: int = 0
    artifacts: tuple[Artifact, ...] = ()
    evidence: tuple[Evidence, ...] = ()  # the latest record of each kind, as artifacts by path
    pending_effects: tuple[SideEffect, ...] = ()
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
        # The latest outcome of each kind. A fold keeps one record per kind, but a packet
        # kept by an older version may still list every record, in order.
        latest = {e.kind: e.outcome for e in self.evidence}
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


# --- the rules -------------------------------------------------------------------------
#
# Each rule applies one event type to a mutable draft of the checkpoint. A fold thaws one
# draft, applies every event and freezes once, instead of copying a 31-field frozen
# struct per event; ``evolve`` is the same rules for one event (thaw, apply, freeze), so
# there is one statement of each rule whichever way a caller folds.


class _Draft:
    """A Checkpoint being folded: the same fields, writable; evidence and artifacts kept in
    dicts (by kind, by path) so that recording one costs O(1), not a copy. Its fields live
    in a plain ``__dict__``: thawing and freezing are then one C call each."""


def _thaw(cp: Checkpoint) -> _Draft:
    d = _Draft()
    d.__dict__ = msgspec.structs.asdict(cp)
    d.evidence = {e.kind: e for e in cp.evidence}
    d.artifacts = {a.path: a for a in cp.artifacts}
    return d


def _freeze(d: _Draft) -> Checkpoint:
    fields = dict(d.__dict__)
    fields["evidence"] = tuple(d.evidence.values())
    fields["artifacts"] = tuple(d.artifacts.values())
    return Checkpoint(**fields)


Rule = Callable[[_Draft, Any, Any], None]
_RULES: dict[type[ev.Event], Rule] = {}


def _on(*types: type[ev.Event]) -> Callable[[Rule], Rule]:
    def register(rule: Rule) -> Rule:
        for t in types:
            _RULES[t] = rule
        return rule

    return register


@_on(ev.HandoffOpened)
def _opened(d: _Draft, rec: Any, e: ev.HandoffOpened) -> None:
    d.opened = True
    d.goal, d.origin, d.target, d.owner = e.goal, e.origin, e.target, e.owner
    d.result_path, d.stop_rules, d.require_review, d.policy = (
        e.result_path, e.stop_rules, e.require_review, e.policy,
    )
    d.progress_kinds = ev.declared_kinds(e)
    d.opened_us = rec.recorded_us
    d.state = T.QUEUED


@_on(ev.LeaseGranted)
def _granted(d: _Draft, rec: Any, e: ev.LeaseGranted) -> None:
    d.worker, d.lease = e.worker, e.lease
    d.max_lease = max(d.max_lease, e.lease)


@_on(ev.LeaseReleased, ev.LeaseRevoked)
def _lease_ended(d: _Draft, rec: Any, e: ev.LeaseReleased | ev.LeaseRevoked) -> None:
    # Only the lease it names: a late release of a superseded lease changes nothing.
    if e.lease == d.lease:
        d.lease = d.worker = None


@_on(ev.AuthorityTransferred)
def _transferred(d: _Draft, rec: Any, e: ev.AuthorityTransferred) -> None:
    d.authority = d.authority + ((e.action, e.to),)


@_on(ev.StateChanged)
def _moved(d: _Draft, rec: Any, e: ev.StateChanged) -> None:
    d.state = e.to_state


@_on(ev.ArtifactRecorded)
def _artifact(d: _Draft, rec: Any, e: ev.ArtifactRecorded) -> None:
    # The latest record of a path replaces the earlier one and moves to the end.
    d.artifacts.pop(e.path, None)
    d.artifacts[e.path] = Artifact(e.path, e.kind, e.bytes, e.sha256, e.exists, rec.seq)


@_on(ev.ArtifactWithdrawn)
def _artifact_withdrawn(d: _Draft, rec: Any, e: ev.ArtifactWithdrawn) -> None:
    # It stops counting (submit's evidence check no longer sees it); the log keeps both.
    d.artifacts.pop(e.path, None)


@_on(ev.EvidenceRecorded)
def _evidence(d: _Draft, rec: Any, e: ev.EvidenceRecorded) -> None:
    # The latest record of a kind replaces the earlier one and moves to the end, as an
    # artifact's does: the packet says where each check stands, the log keeps every run
    # of it. So the packet, and what each command rewrites, stays small in a long run.
    d.evidence.pop(e.kind, None)
    d.evidence[e.kind] = Evidence(e.kind, e.outcome, e.detail, rec.seq)


@_on(ev.BlockerRaised)
def _blocked(d: _Draft, rec: Any, e: ev.BlockerRaised) -> None:
    # The state to return to is the one before the first open blocker.
    prior = d.blockers[0].prior_state if d.blockers else d.state
    d.blockers = d.blockers + (Blocker(e.blocker_id, e.reason, e.next_action, rec.seq, prior),)
    d.blockers_raised = max(d.blockers_raised, e.blocker_id)


@_on(ev.BlockerCleared)
def _unblocked(d: _Draft, rec: Any, e: ev.BlockerCleared) -> None:
    d.blockers = tuple(b for b in d.blockers if b.id != e.blocker_id)


@_on(ev.SideEffectStarted)
def _effect_started(d: _Draft, rec: Any, e: ev.SideEffectStarted) -> None:
    d.pending_effects = d.pending_effects + (SideEffect(e.key, e.what, d.lease, rec.seq),)


@_on(ev.SideEffectConfirmed, ev.ReconciliationRecorded)
def _effect_settled(d: _Draft, rec: Any, e: ev.SideEffectConfirmed | ev.ReconciliationRecorded) -> None:
    d.pending_effects = tuple(x for x in d.pending_effects if x.key != e.key)
    d.settled_effects = d.settled_effects + ((e.key, e.outcome),)


@_on(ev.ResultSubmitted)
def _submitted(d: _Draft, rec: Any, e: ev.ResultSubmitted) -> None:
    d.result = Result(e.summary, e.artifacts, rec.seq)
    d.review = None  # a new result needs a new review


@_on(ev.ReviewDecided)
def _reviewed(d: _Draft, rec: Any, e: ev.ReviewDecided) -> None:
    d.review = Review(e.by, e.approved, e.notes, rec.seq)


@_on(ev.RunClosed)
def _closed(d: _Draft, rec: Any, e: ev.RunClosed) -> None:
    d.disposition, d.closed_reason = e.disposition, e.reason


@_on(ev.RunForked)
def _forked(d: _Draft, rec: Any, e: ev.RunForked) -> None:
    # The child inherits the parent's history but none of its leases or granted authority.
    d.fork_parent, d.fork_seq = e.parent, e.parent_seq
    d.lease = d.worker = None
    d.authority = ()


#: Per event type, the three folds' rules for it: (checkpoint rule, delivery rule, watch
#: rule), None where that fold ignores the type. Looked up once per event instead of three
#: times; the rules themselves are stated once, in this module, delivery.py and stall.py.
Plan = tuple[Rule | None, Callable[..., Any] | None, Callable[..., Any] | None]
_PLANS: dict[type[ev.Event], Plan] = {
    cls: (_RULES.get(cls), dl.rule_for(cls), st.rule_for(cls)) for cls in ev.EVENT_TYPES.values()
}


def _apply(d: _Draft, rec: Any, event: ev.Event) -> None:
    rule, drule, wrule = _PLANS[type(event)]
    if rule is not None:
        rule(d, rec, event)
    if drule is not None:
        d.delivery = drule(d.delivery, rec, event)
    if wrule is not None:
        d.watch = wrule(d.watch, rec, event)
    if rec.run_id == d.run_id:  # a fork's inherited prefix leaves the child's seq alone
        d.last_seq = rec.seq
    d.last_event_us = rec.recorded_us


def evolve(cp: Checkpoint, rec: Recorded | Step, event: ev.Event | None = None) -> Checkpoint:
    """Apply one stored event. ``event`` may be passed when already decoded."""
    if event is None:
        event = rec.event  # CorruptLedger, naming the position, if the payload is damaged
    d = _thaw(cp)
    _apply(d, rec, event)
    return _freeze(d)


def evolve_all(cp: Checkpoint, records: Iterable[Recorded | Step], *, until_seq: int | None = None) -> Checkpoint:
    """Apply many events with one draft; ``until_seq`` stops before the run's own later seqs.

    ``_apply`` written out in the loop, with the draft's fields in locals between events:
    the per-event cost of a fold is this loop (a rebuild runs it for every event)."""
    d = _thaw(cp)
    run_id = cp.run_id
    plans = _PLANS
    delivery, watch = d.delivery, d.watch
    last_seq, last_us = d.last_seq, d.last_event_us
    for rec in records:
        if until_seq is not None and rec.seq > until_seq and rec.run_id == run_id:
            break
        event = rec.event
        rule, drule, wrule = plans[type(event)]
        if rule is not None:
            d.delivery, d.watch = delivery, watch  # a checkpoint rule may read them
            rule(d, rec, event)
            delivery, watch = d.delivery, d.watch
        if drule is not None:
            delivery = drule(delivery, rec, event)
        if wrule is not None:
            watch = wrule(watch, rec, event)
        if rec.run_id == run_id:  # a fork's inherited prefix leaves the child's seq alone
            last_seq = rec.seq
        last_us = rec.recorded_us
    d.delivery, d.watch, d.last_seq, d.last_event_us = delivery, watch, last_seq, last_us
    return _freeze(d)


def fold(records: Iterable[Recorded | Step], run_id: str | None = None, *, until_seq: int | None = None) -> Checkpoint:
    """Fold a run's history (parent prefix first for a fork). ``until_seq`` bounds the run's own seq."""
    it = iter(records)
    if not run_id:
        first = next(it, None)
        if first is None:
            raise ValueError("fold needs a run_id when there are no events")
        it = itertools.chain((first,), it)
        run_id = first.run_id
    return evolve_all(initial(run_id), it, until_seq=until_seq)


class CheckpointAggregate(Aggregate[Checkpoint]):
    """The checkpoint fold, in the shape the store can run inside a write transaction."""

    lean = True  # the rules read only run_id, seq, type, recorded_us and the event

    def initial(self, run_id: str) -> Checkpoint:
        return initial(run_id)

    def evolve(self, state: Checkpoint, recorded: Recorded | Step) -> Checkpoint:
        return evolve(state, recorded)

    def evolve_all(self, state: Checkpoint, records: Iterable[Recorded | Step]) -> Checkpoint:
        return evolve_all(state, records)


AGGREGATE = CheckpointAggregate()


# --- the packet as people and programs read it -------------------------------------


def iso(us: int | None, *, ms: bool = False) -> str | None:
    """µs since 1970 as ISO 8601 UTC with a Z: ``2026-05-01T12:00:00.123456Z``, always six
    digits of fraction (three with ``ms``). The one formatter of times: packets, the log,
    the CLI and the demo all print through it, so one instant always reads the same.

    Exact integer arithmetic: ``us / 1e6`` as a float would round the last µs of year 9999
    into year 10000."""
    if us is None:
        return None
    try:
        dt = _EPOCH + timedelta(microseconds=us)
    except OverflowError:
        # A time outside years 1-9999 has no ISO form; imports refuse one, but a file
        # written by other means may hold one, and a packet must still print.
        return f"{us}us-since-1970"
    return dt.isoformat(timespec="milliseconds" if ms else "microseconds").replace("+00:00", "Z")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


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
            "key": cp.delivery.latest_key,
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
