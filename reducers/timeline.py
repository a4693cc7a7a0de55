"""A run's timeline and the packet as of every event: what an incident report draws.

A pure fold of a run's history (a fork's inherited prefix first, as every fold here),
stopped at a seq or a time, into lanes over wall-clock time, the checkpoint packet as it
stood right after each event, and the answers an incident review starts from, each
naming the events that prove it. No I/O and no clock: the end of the story ("now") is
the last event folded or the as-of time, and the watchers' beats, which live in streams
of their own, are handed in. handoff/report.py draws the result as HTML or Markdown.

Why a fold of its own and not the checkpoint alone: a lease span, a stall window or a
delivery attempt is a fact about an interval, and the checkpoint keeps only where
things stand. Each rule below reads the checkpoint before and after an event, so the
bands agree with the packet by construction (a blocker moves the state band because it
moves the checkpoint's state, not because this module knows the rule).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded

from . import checkpoint as ckp

#: Lanes in the order they are drawn: (id, title). Lease lanes, one per worker
#: (``lease:<worker>``), are drawn after ``state`` in the order workers first claimed.
LANES = (
    ("state", "state"),
    ("heartbeats", "heartbeats (liveness)"),
    ("progress", "progress"),
    ("watchdog", "watchdog"),
    ("blockers", "blockers"),
    ("effects", "side effects"),
    ("artifacts", "artifacts and evidence"),
    ("review", "result and review"),
    ("delivery", "delivery"),
)
#: At most this many events are kept with their whole record and packet: a run longer
#: than that keeps its heartbeats (and any events past the budget) as seq and time only,
#: so a report of 100,000 events stays a few megabytes.
FULL_RECORD_BUDGET = 3000
#: Every this many kept packets, one is kept whole; the others as the keys that changed.
KEYFRAME_EVERY = 100


class Item(msgspec.Struct, frozen=True, omit_defaults=True):
    """A span (``end_us`` set, or ``open``) or a mark (a point) in one lane."""

    lane: str
    kind: str
    seq: int
    start_us: int
    label: str = ""
    end_us: int | None = None
    end_seq: int | None = None
    open: bool = False


class Answer(msgspec.Struct, frozen=True):
    """One question of the summary, its answer, and the seqs of the events that prove it."""

    id: str
    question: str
    answer: str
    proof: tuple[int, ...] = ()


class Timeline(msgspec.Struct):
    run_id: str
    lanes: list[tuple[str, str]]
    items: list[Item]
    #: Every heartbeat of the run as drawn: (seq, µs). The renderer bins them.
    beats: list[tuple[int, int]]
    #: Events kept whole: their envelope, payload, hashes and one-line summary.
    records: list[dict[str, Any]]
    #: Events kept as seq, time, type, actor and lease only (heartbeats of a long run).
    compact: list[tuple[int, int, str, str, int | None]]
    #: One per kept record: a whole packet (keyframe) or the keys that changed since the
    #: previous kept record's packet, as {"delta": {...}}.
    packets: list[dict[str, Any]]
    answers: list[Answer]
    start_us: int
    end_us: int
    last_seq: int
    fork: dict[str, Any] | None
    final_packet: dict[str, Any]


def watchers_at(beats: dict[str, list[tuple[int, float]]], when_us: int) -> dict[str, tuple[int, float]]:
    """Each watcher's last beat at or before ``when_us`` (``beats`` sorted by time), in the
    shape ``checkpoint.packet`` takes: so a packet as of an event never claims a watcher
    that began later."""
    out: dict[str, tuple[int, float]] = {}
    for name, seq in beats.items():
        i = bisect.bisect_right(seq, (when_us, float("inf"))) - 1
        if i >= 0:
            out[name] = seq[i]
    return out


def delta(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys of ``after`` whose value differs from ``before``."""
    if before is None:
        return dict(after)
    return {k: v for k, v in after.items() if before.get(k) != v}


def undelta(packets: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The whole packets back from ``Timeline.packets`` (what the report's script does)."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for p in packets:
        current = {**current, **p["delta"]} if "delta" in p else dict(p)
        out.append(current)
    return out


def record_doc(rec: Recorded, event: ev.Event, summary: str) -> dict[str, Any]:
    """An event's whole record, as the report shows it on selection."""
    return {
        "seq": rec.seq, "position": rec.position, "at": ckp.iso(rec.recorded_us), "at_us": rec.recorded_us,
        "type": rec.type, "actor": rec.actor, "lease": rec.lease, "key": rec.idempotency_key,
        "schema_version": rec.schema_version, "prev_hash": rec.prev_hash.hex(), "hash": rec.hash.hex(),
        "summary": summary, "data": msgspec.to_builtins(event),
    }


class _Builder:
    """The fold's mutable state: open spans by what closes them."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.items: list[Item] = []
        self.workers: list[str] = []
        self.open: dict[tuple[str, Any], tuple[int, Item]] = {}  # what -> (index in items, item)
        self.state_seq = 0  # where the current state band began
        self.proof: dict[str, list[int]] = {"owner": [], "lease": [], "watchdog": [], "stall": [],
                                            "delivered": [], "attempts": []}
        self.stall_progress: int | None = None
        self.stall_flagged: list[int] = []
        self.confirmations = 0
        self.recoveries: list[tuple[int, str, str]] = []
        self.progress_seq = 0  # the run's own event that last advanced progress (a fork's may be its origin's)
        self.observations = 0

    # --- spans --------------------------------------------------------------------

    def mark(self, lane: str, kind: str, rec: Recorded, label: str) -> None:
        self.items.append(Item(lane, kind, rec.seq, rec.recorded_us, label))

    def begin(self, what: tuple[str, Any], lane: str, kind: str, seq: int, at_us: int, label: str) -> None:
        self.items.append(Item(lane, kind, seq, at_us, label, open=True))
        self.open[what] = (len(self.items) - 1, self.items[-1])

    def end(self, what: tuple[str, Any], rec: Recorded, kind: str | None = None, label: str | None = None) -> bool:
        found = self.open.pop(what, None)
        if found is None:
            return False
        i, item = found
        self.items[i] = msgspec.structs.replace(
            item, end_us=rec.recorded_us, end_seq=rec.seq, open=False,
            kind=kind or item.kind, label=item.label if label is None else label)
        return True

    # --- the rules: one event, with the checkpoint before and after it ------------

    def add(self, rec: Recorded, e: ev.Event, before: ckp.Checkpoint, after: ckp.Checkpoint, summary: str) -> None:
        if before.state != after.state or rec.type == "handoff_opened" or ("state", None) not in self.open:
            self.end(("state", None), rec)
            self.begin(("state", None), "state", f"state-{after.state}", rec.seq, rec.recorded_us, after.state)
            self.state_seq = rec.seq
        if after.watch.last_progress is not before.watch.last_progress:
            self.progress_seq = rec.seq
        match e:
            case ev.HandoffOpened():
                self.proof["owner"] = [rec.seq]
            case ev.RunForked():
                self.proof["owner"] = [rec.seq]
                self.mark("state", "fork", rec, summary)
            case ev.LeaseGranted():
                for what in [w for w in self.open if w[0] == "lease"]:
                    self.end(what, rec, kind="lease-superseded", label=f"lease {what[1]} superseded")
                lane = f"lease:{e.worker}"
                if e.worker not in self.workers:
                    self.workers.append(e.worker)
                self.begin(("lease", e.lease), lane, "lease-held", rec.seq, rec.recorded_us, f"lease {e.lease}")
                self.proof["lease"] = [rec.seq]
            case ev.LeaseReleased() | ev.LeaseRevoked():
                kind = "lease-revoked" if isinstance(e, ev.LeaseRevoked) else "lease-released"
                # The reason goes on the span: why a worker stopped (a child's exit and the
                # end of its stderr, an exception) is read where its lease ends.
                label = f"lease {e.lease} {kind[6:]}" + (f": {e.reason}" if e.reason else "")
                if self.end(("lease", e.lease), rec, kind=kind, label=label):
                    self.proof["lease"] = [*self.proof["lease"][:1], rec.seq]
                for what in [w for w in self.open if w[0] == "unavailable"]:
                    self.end(what, rec)
                for eff in before.pending_effects:  # a side effect whose lease ended: outcome unknown
                    if eff.lease == e.lease and ("effect", eff.key) in self.open:
                        self.mark("effects", "effect-unknown", rec, f"{eff.key}: outcome unknown (lease {e.lease} ended)")
            case ev.HeartbeatRecorded():
                pass  # kept in Timeline.beats
            case ev.ProgressRecorded():
                self.mark("progress", "progress" if e.advances else "activity", rec, summary)
            case ev.WatchdogObserved():
                self.observations += 1
                self.mark("watchdog", f"observed-{e.classification}", rec, summary)
                self.judged(rec, e.classification, before)
            case ev.RecoveryDecided():
                self.recoveries.append((rec.seq, e.action, e.classification))
                self.proof["watchdog"].append(rec.seq)
                self.mark("watchdog", f"action-{e.action}", rec, summary)
                self.judged(rec, e.classification, before)
            case ev.BlockerRaised():
                self.begin(("blocker", e.blocker_id), "blockers", "blocker", rec.seq, rec.recorded_us, summary)
            case ev.BlockerCleared():
                self.end(("blocker", e.blocker_id), rec, label=None)
            case ev.SideEffectStarted():
                self.begin(("effect", e.key), "effects", "effect-pending", rec.seq, rec.recorded_us, summary)
            case ev.SideEffectConfirmed():
                self.end(("effect", e.key), rec, kind=f"effect-{e.outcome}")
            case ev.ReconciliationRecorded():
                self.end(("effect", e.key), rec, kind="effect-reconciled")
                self.mark("effects", "effect-reconciled", rec, summary)
            case ev.ArtifactRecorded():
                self.mark("artifacts", "artifact" if e.exists else "artifact-missing", rec, summary)
            case ev.ArtifactWithdrawn():
                self.mark("artifacts", "artifact-withdrawn", rec, summary)
            case ev.EvidenceRecorded():
                self.mark("artifacts", f"evidence-{e.outcome}", rec, summary)
            case ev.ResultSubmitted():
                self.mark("review", "submitted", rec, summary)
            case ev.ReviewDecided():
                self.mark("review", "approved" if e.approved else "rejected", rec, summary)
            case ev.AuthorityTransferred():
                self.mark("review", "transferred", rec, summary)
            case ev.DeliveryAttempted():
                self.proof["attempts"].append(rec.seq)
                self.begin(("delivery", e.key), "delivery", "delivery-attempted", rec.seq, rec.recorded_us, summary)
            case ev.DeliveryConfirmed():
                self.confirmations += 1
                self.proof["delivered"].append(rec.seq)
                self.end(("delivery", e.key), rec, kind="delivery-confirmed")
                self.mark("delivery", "delivered", rec, summary)
            case ev.DeliveryFailed():
                self.end(("delivery", e.key), rec, kind="delivery-failed")
            case ev.RunClosed():
                self.mark("state", "closed", rec, summary)
        # A stall window ends when progress moves again or the run stops being worked on.
        if ("stalled", None) in self.open and (
                after.progress_seq != self.stall_progress or after.terminal or after.lease is None):
            self.end(("stalled", None), rec)
            self.stall_progress = None
        if after.terminal:  # a lease's release follows in the same batch and closes its span
            for what in [w for w in self.open if w[0] == "unavailable"]:
                self.end(what, rec)

    def judged(self, rec: Recorded, classification: str, before: ckp.Checkpoint) -> None:
        """A watchdog judgement opens the window it names, from when the signal stopped."""
        w = before.watch
        if classification == "stalled":
            self.proof["stall"].append(rec.seq)
            if ("stalled", None) not in self.open:
                since = max(w.lease_since_us or 0, w.last_progress.at_us if w.last_progress else 0) or rec.recorded_us
                self.begin(("stalled", None), "watchdog", "window-stalled", rec.seq, since,
                           f"stalled: progress_seq {w.progress_seq} not moving (judged at seq {rec.seq})")
                self.stall_progress = before.progress_seq
                self.stall_flagged = []
            self.stall_flagged.append(rec.seq)
        elif classification == "unavailable" and ("unavailable", None) not in self.open:
            since = w.last_heartbeat_us or w.lease_since_us or rec.recorded_us
            self.begin(("unavailable", None), "watchdog", "window-unavailable", rec.seq, since,
                       f"unavailable: no heartbeat from {before.worker} (judged at seq {rec.seq})")


def build(
    history: Iterable[Recorded],
    run_id: str,
    *,
    summarize: Any,
    last_seq: int,
    at_seq: int | None = None,
    as_of_us: int | None = None,
    watcher_beats: dict[str, list[tuple[int, float]]] | None = None,
) -> Timeline:
    """Fold ``history`` (``EventStore.history(run_id)``) into a Timeline.

    ``last_seq`` is the run's own last seq (its head): it decides, before the fold,
    whether every event can be kept whole (``FULL_RECORD_BUDGET``). ``at_seq`` or
    ``as_of_us`` stop the fold as the ledger stood then. ``summarize(event)`` gives an
    event's one line (handoff.render.summarize; passed in, as it sits in a layer above).
    """
    beats_by = watcher_beats or {}
    b = _Builder(run_id)
    cp = ckp.initial(run_id)
    beats: list[tuple[int, int]] = []
    records: list[dict[str, Any]] = []
    compact: list[tuple[int, int, str, str, int | None]] = []
    packets: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    drawn = min(last_seq, at_seq) if at_seq is not None else last_seq
    keep_all = drawn <= FULL_RECORD_BUDGET
    start_us: int | None = None
    end_us = 0
    fork: dict[str, Any] | None = None
    pending: list[Recorded] = []  # heartbeats kept compact, folded together before the next event
    for rec in history:
        own = rec.run_id == run_id
        if own and ((at_seq is not None and rec.seq > at_seq) or (as_of_us is not None and rec.recorded_us > as_of_us)):
            break
        if own:
            if start_us is None:
                start_us = rec.recorded_us
            end_us = max(end_us, rec.recorded_us)
            if rec.type == "heartbeat_recorded":
                beats.append((rec.seq, rec.recorded_us))
                if not keep_all:
                    # A heartbeat changes no band, span or answer; folding a long run of
                    # them with one draft (evolve_all) instead of one copy each is what
                    # keeps a 100,000-event report near the cost of a plain fold.
                    pending.append(rec)
                    compact.append((rec.seq, rec.recorded_us, rec.type, rec.actor, rec.lease))
                    continue
        if pending:
            cp = ckp.evolve_all(cp, pending)
            pending.clear()
        e = rec.event
        before, cp = cp, ckp.evolve(cp, rec, e)
        if not own:
            continue  # a fork's inherited prefix: folded, drawn in its own run's report
        if isinstance(e, ev.RunForked):
            fork = {"parent": e.parent, "parent_seq": e.parent_seq, "seq": rec.seq}
        summary = summarize(e)
        b.add(rec, e, before, cp, summary)
        whole = keep_all or (not isinstance(e, ev.HeartbeatRecorded) and len(records) < FULL_RECORD_BUDGET)
        if not whole:
            compact.append((rec.seq, rec.recorded_us, rec.type, rec.actor, rec.lease))
            continue
        records.append(record_doc(rec, e, summary))
        p = ckp.packet(cp, now_us=rec.recorded_us, watchers=watchers_at(beats_by, rec.recorded_us))
        packets.append(p if len(packets) % KEYFRAME_EVERY == 0 else {"delta": delta(previous, p)})
        previous = p
    if pending:
        cp = ckp.evolve_all(cp, pending)
    if start_us is None:
        raise ValueError(f"run {run_id} has no events to draw at that point")
    if as_of_us is not None:
        end_us = max(end_us, as_of_us)
    final = ckp.packet(cp, now_us=end_us, watchers=watchers_at(beats_by, end_us))
    lanes = [LANES[0], *((f"lease:{w}", f"lease {w}") for w in b.workers), *LANES[1:]]
    return Timeline(
        run_id=run_id, lanes=lanes, items=b.items, beats=beats, records=records, compact=compact,
        packets=packets, answers=answers(b, cp, final, end_us), start_us=start_us, end_us=end_us,
        last_seq=cp.last_seq, fork=fork, final_packet=final,
    )


def _ago(us: int) -> str:
    s = us / 1e6
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def answers(b: _Builder, cp: ckp.Checkpoint, p: dict[str, Any], end_us: int) -> list[Answer]:
    """The summary: each question an incident review asks first, answered from the fold."""
    out = []
    state = cp.state + (f" ({cp.closed_reason})" if cp.closed_reason else "")
    out.append(Answer("state", "What state is the run in?", state, (b.state_seq,) if b.state_seq else ()))
    out.append(Answer("contract", "Who owns it, and where must the result be seen?",
                      f"owner {cp.owner}, target {cp.target}", tuple(b.proof["owner"])))
    if cp.lease is not None:
        lease = f"{cp.worker} holds lease {cp.lease}"
    else:
        lease = "nobody: no lease is held" + (f" (the last one, {cp.max_lease}, ended)" if cp.max_lease else "")
    out.append(Answer("lease", "Who holds the lease?", lease, tuple(b.proof["lease"])))
    lp = cp.watch.last_progress
    if lp is None:
        progress = "none recorded"
        proof: tuple[int, ...] = ()
    else:
        progress = (f"{lp.kind} (progress_seq {lp.seq}) at {ckp.iso(lp.at_us, ms=True)}, "
                    f"{_ago(end_us - lp.at_us)} before the end of the log")
        proof = (b.progress_seq,) if b.progress_seq and lp.event_seq == b.progress_seq else ()
    out.append(Answer("progress", "When was the last progress?", progress, proof))
    stall_open = ("stalled", None) in b.open
    if stall_open:
        since = b.open[("stalled", None)][1].start_us
        stalled = (f"stalled since {ckp.iso(since, ms=True)} ({_ago(end_us - since)}): progress_seq "
                   f"{cp.progress_seq} has not moved while the run was worked on")
    elif p["health"]["classification"] == "stalled":
        stalled = f"stalled at the end of the log, not yet judged by a watchdog: {p['health']['reason']}"
    else:
        earlier = sum(1 for i in b.items if i.kind == "window-stalled")
        stalled = "not stalled at the end of the log" + (
            f" (stalled {earlier} time{'s' if earlier != 1 else ''} before)" if earlier else "")
    out.append(Answer("stalled", "Is it stalled, and since when?", stalled,
                      tuple(b.stall_flagged if stall_open else b.proof["stall"][-3:])))
    if b.recoveries:
        did = "; ".join(f"{a} ({c}) at seq {s}" for s, a, c in b.recoveries)
    else:
        did = "no recovery action"
    did += f"; {b.observations} observation{'s' if b.observations != 1 else ''} recorded"
    out.append(Answer("watchdog", "What did the watchdog do?", did, tuple(b.proof["watchdog"])))
    d = cp.delivery
    if d.confirmed_key is not None:
        once = "exactly once" if b.confirmations == 1 else f"{b.confirmations} confirmations (MORE THAN ONCE)"
        delivered = (f"yes, to {d.target or cp.target} under key {d.confirmed_key}, receipt {d.receipt!r}: {once} "
                     f"({len(d.attempts)} attempt key{'s' if len(d.attempts) != 1 else ''}; a retry with the same "
                     "key writes nothing)")
    else:
        delivered = f"no: {p['delivery']['status']} ({p['delivery']['detail']})"
    out.append(Answer("delivered", "Was the result delivered, where, with what receipt, exactly once?", delivered,
                      tuple(b.proof["attempts"] + b.proof["delivered"])))
    return out

