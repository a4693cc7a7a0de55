"""Stall detection: liveness (heartbeats) and advancement (progress_seq) as two signals.

The fold tracks both; ``classify`` judges them against a policy at a ``now`` the caller
passes in. Advancement is read from the progress sequence only: a heartbeat-only loop,
a clock that jumps back, a replayed event or the watchdog's own acts never bump it (who may
advance it: reducers/transitions.py, ``advances``). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from msgspec import UNSET
from msgspec.structs import replace

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded

from . import transitions as T
from .delivery import status as delivery_status
from .subfold import SubFold


class LastProgress(msgspec.Struct, frozen=True):
    seq: int
    kind: str
    at_us: int
    event_seq: int


class Watch(msgspec.Struct, frozen=True):
    """What the watchdog needs, folded from the log."""

    progress_seq: int = 0
    last_progress: LastProgress | None = None
    last_heartbeat_us: int | None = None
    lease_since_us: int | None = None
    #: Consecutive "stalled" observations that saw the same progress_seq.
    repeats: int = 0
    watcher: str | None = None
    watcher_seen_us: int | None = None


#: Every classification ``classify`` gives, and so the only ones an observation or a
#: recovery decision may record: decide refuses any other (on append and on import), so
#: what a report, a terminal or a redacted export shows as a classification is one of
#: these words. tests/delivery/test_redact_allowlist.py reads this module's ``Health(...)``
#: calls to keep the set whole; docs/cli.md lists them under ``health.classification``.
CLASSIFICATIONS = frozenset({
    "healthy", "unavailable", "stalled", "blocked", "unclaimed", "needs_reconciliation", "needs_worker",
    "delivery_ambiguous", "awaiting_owner", "delivering", "silent", "unopened",
})


class Health(msgspec.Struct, frozen=True):
    classification: str
    reason: str
    action: str
    needs_attention: bool


def initial() -> Watch:
    return Watch()


def _granted(w: Watch, rec: Recorded, e: ev.LeaseGranted) -> Watch:
    return replace(w, lease_since_us=rec.recorded_us, last_heartbeat_us=rec.recorded_us, repeats=0)


def _lease_ended(w: Watch, rec: Recorded, e: ev.LeaseRevoked | ev.LeaseReleased) -> Watch:
    return replace(w, lease_since_us=None)


def _observed(w: Watch, rec: Recorded, e: ev.WatchdogObserved) -> Watch:
    # Count consecutive "stalled" sightings of the same progress_seq; any other resets.
    repeats = w.repeats
    if e.classification == "stalled":
        repeats = repeats + 1 if (e.progress_seq == w.progress_seq) else 0
    return replace(w, repeats=repeats, watcher=e.watcher, watcher_seen_us=rec.recorded_us,
                   last_heartbeat_us=_seen_beat(w, rec, e))


def _seen_beat(w: Watch, rec: Recorded, e: ev.WatchdogObserved | ev.RecoveryDecided) -> int | None:
    """The last heartbeat once a watchdog recorded seeing ``e.beat_us`` (a beat kept beside
    the log): the log then knows the worker was alive then. Only a beat the decision could
    have seen counts: of the current lease (not before its grant) and not after the
    decision itself, so no event (appended by a role, or imported) can date a beat ahead."""
    beat, since = w.last_heartbeat_us, w.lease_since_us
    seen = e.beat_us
    if seen is UNSET or since is None or not since <= seen <= rec.recorded_us:
        return beat
    return seen if beat is None or seen > beat else beat


def _recovery(w: Watch, rec: Recorded, e: ev.RecoveryDecided) -> Watch:
    return replace(w, repeats=0 if e.action == "pause" else w.repeats, last_heartbeat_us=_seen_beat(w, rec, e))


def _forked(w: Watch, rec: Recorded, e: ev.RunForked) -> Watch:
    # Timers and watchers belong to the parent; the child's clocks start at the fork.
    return replace(
        w, last_heartbeat_us=None, lease_since_us=None, repeats=0, watcher=None, watcher_seen_us=None,
    )


#: What the events that do not advance do to the watch; any other event leaves it alone.
_RULES: dict[type[ev.Event], Callable[[Watch, Recorded, Any], Watch]] = {
    ev.LeaseGranted: _granted,
    ev.LeaseRevoked: _lease_ended,
    ev.LeaseReleased: _lease_ended,
    ev.WatchdogObserved: _observed,
    ev.RecoveryDecided: _recovery,
    ev.RunForked: _forked,
}


def _beat(w: Watch, rec: Recorded, e: ev.HeartbeatRecorded) -> Watch:
    return replace(w, last_heartbeat_us=rec.recorded_us)


def _advanced(w: Watch, rec: Recorded, kind: str) -> Watch:
    seq = w.progress_seq + 1
    return replace(
        w,
        progress_seq=seq,
        last_progress=LastProgress(seq, kind, rec.recorded_us, rec.seq),
        repeats=0,
    )


def _kind(rec: Recorded) -> str:
    """The kind of actor that recorded ``rec`` (its envelope says ``kind:name``)."""
    return rec.actor.partition(":")[0]


def _progress(w: Watch, rec: Recorded, e: ev.ProgressRecorded) -> Watch:
    # Whether a progress record advances is its own flag; a note (advances=False) does not.
    if e.advances and T.advances("progress_recorded", _kind(rec)):
        return _advanced(w, rec, e.kind)
    return w


def _state_changed(w: Watch, rec: Recorded, e: ev.StateChanged) -> Watch:
    if T.advances("state_changed", _kind(rec), (e.from_state, e.to_state)):
        return _advanced(w, rec, f"state:{e.to_state}")
    return w


def _advancing(tag: str) -> Callable[[Watch, Recorded, Any], Watch]:
    """The rule of another advancing type: its progress kind is its tag. (A progress record's
    kind is its own; a state change's is ``state:<to>``.)"""

    def rule(w: Watch, rec: Recorded, e: ev.Event) -> Watch:
        return _advanced(w, rec, tag) if T.advances(tag, _kind(rec)) else w

    return rule


def rule_for(cls: type[ev.Event]) -> Callable[[Watch, Recorded, Any], Watch] | None:
    """What an event of this type does to the watch, or None when it leaves it alone.

    Decided once per type (a fold looks it up per event): heartbeats move the liveness
    clock, advancing events the progress token (when ``transitions.advances`` says their
    actor and move count; progress records by their flag too), and the events of
    ``_RULES`` the lease and watcher fields."""
    if cls is ev.HeartbeatRecorded:
        return _beat
    if cls is ev.ProgressRecorded:
        return _progress
    if cls is ev.StateChanged:
        return _state_changed
    if ev.tag_of_type(cls) in T.ADVANCING_EVENTS:
        return _advancing(ev.tag_of_type(cls))
    return _RULES.get(cls)


_FOLD = SubFold(initial, rule_for)
#: ``evolve(w, rec, event)`` applies one event (``w`` itself when it changes nothing the
#: watch holds); ``fold(records)`` folds a run's watch alone.
evolve, fold = _FOLD.evolve, _FOLD.fold


_DELIVERING = frozenset((T.READY_FOR_REVIEW, T.SUCCEEDED))


def classify(
    cp,
    *,
    now_us: int,
    policy: ev.Policy | None = None,
    silent_s: float | None = None,
    unchanged_s: float | None = None,
) -> Health:
    """Judge one run's checkpoint at ``now_us``; return a classification and one bounded action.

    Ages are read from the store's timestamps, which a wall clock that jumps backward can
    make look fresh. A watcher that keeps its own monotonic record passes it in:
    ``silent_s``, how long it has seen the run's last seq unchanged under this lease (no
    event at all, heartbeats included), and ``unchanged_s``, how long it has seen the same
    progress_seq. The larger of the two measures wins, so a stall is never hidden by a clock.

    ``cp`` is a reducers.checkpoint.Checkpoint. The order of the checks is the order of
    precedence: a finished run is silent; a named blocker is not a stall; an unknown side
    effect must be reconciled before any liveness judgement leads to a retry.
    """
    policy = policy or cp.policy
    state = cp.state
    if not cp.opened:
        return Health("unopened", "no contract has been written for this run", "open", True)
    if state in T.TERMINAL:
        return Health("silent", f"the run ended as {state}; monitors stay quiet", "none", False)
    if state == T.BLOCKED:
        open_ = cp.blockers[-1] if cp.blockers else None
        why = f"{open_.reason}; next: {open_.next_action}" if open_ else "blocked"
        return Health("blocked", why, "none", False)
    lost = [e for e in cp.pending_effects if e.lease != cp.lease or cp.lease is None] if cp.pending_effects else ()
    if lost or state == T.UNKNOWN:
        return _unknown_outcome(cp, lost)
    # Only an attempt that awaits its outcome can be ambiguous, and only a finished result
    # is judged by its delivery: a run at work is spared the delivery fold (the stall scan
    # classifies every due run).
    if cp.delivery.pending is not None or state in _DELIVERING:
        dstatus, dwhy = delivery_status(
            cp.delivery, ready=cp.delivery_ready, now_us=now_us, timeout_s=policy.delivery_timeout_s
        )
        if dstatus == "ambiguous":
            return Health("delivery_ambiguous", dwhy, "reconcile_delivery", True)
    if state == T.READY_FOR_REVIEW:
        return Health("awaiting_owner", "the result waits for the owner's review", "none", False)
    if state == T.SUCCEEDED:
        if dstatus == "attempted":
            return Health("delivering", dwhy, "none", False)
        return Health("awaiting_owner", f"the result waits for delivery ({dstatus})", "none", False)
    return judge(*signals(cp, policy), now_us, silent_s, unchanged_s)


def _unknown_outcome(cp, lost) -> Health:
    """What a run with a side effect of unknown outcome (or in ``unknown``) needs next, named
    for who holds it: a hint to "claim" a run whose lease is held would only be refused."""
    holder = None if cp.lease is None else f"worker {cp.worker} (lease {cp.lease})"
    # Only a move out of unknown continues the work; elsewhere the holder goes on as it was.
    then = ("" if cp.state != T.UNKNOWN
            else f"; then {holder} moves the run on ('handoff transition' to executing or verifying)" if holder
            else "; then a worker claims the run ('handoff claim') and moves it to executing or verifying")
    if lost:
        keys = ", ".join(e.key for e in lost)
        return Health(
            "needs_reconciliation",
            f"side effect(s) {keys} started under a lost lease have no recorded outcome: find out what "
            f"happened and record it ('handoff effect-confirm RUN --effect-key KEY --outcome done|absent'){then}",
            "reconcile", True,
        )
    if holder:
        return Health(
            "needs_worker",
            f"side effects are reconciled; {holder} holds the run and moves it on ('handoff transition' "
            "to executing or verifying)",
            "transition", True,
        )
    return Health(
        "needs_worker",
        "side effects are reconciled; a worker claims the run ('handoff claim'), then moves it to "
        "executing or verifying ('handoff transition')",
        "claim", True,
    )


def needs_packet(cp) -> bool:
    """Whether ``classify``'s verdict on ``cp`` needs more than the few signals ``judge``
    reads: the checks that come before the lease (an unopened, finished or blocked run, a
    side effect or a state of unknown outcome, a delivery) read the rest of the packet.
    The stall view keeps this beside the signals, so the stall scan judges a run from its
    view row alone unless it says so (projections/view_rows.py, stall_row)."""
    return (not cp.opened or cp.state in T.TERMINAL or cp.state in _NEEDS_PACKET or bool(cp.pending_effects)
            or cp.delivery.pending is not None)


_NEEDS_PACKET = frozenset((T.BLOCKED, T.UNKNOWN, T.READY_FOR_REVIEW, T.SUCCEEDED))


#: What ``judge`` reads, as two tuples: the liveness signals, which move when a worker
#: claims, beats or leaves, and the progress signals, which move with every progress. The
#: stall view keeps both as columns of these names (``repeats`` as ``retry_count``), and
#: its due index holds the first: the scan judges liveness from the index alone and reads
#: the progress columns only of the runs whose worker is alive (a progress command
#: leaves the index alone).
LIVENESS = ("state", "lease", "worker", "last_heartbeat_us", "lease_since_us", "heartbeat_timeout_s")
PROGRESS = ("progress_seq", "last_progress_kind", "last_progress_us", "repeats", "progress_timeout_s",
            "retry_budget")


def signals(cp, policy: ev.Policy | None = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A checkpoint's ``LIVENESS`` and ``PROGRESS`` signals (``policy``: another than its own)."""
    w: Watch = cp.watch
    last = w.last_progress
    pol = policy or cp.policy
    return ((cp.state, cp.lease, cp.worker, w.last_heartbeat_us, w.lease_since_us, pol.heartbeat_timeout_s),
            (w.progress_seq, None if last is None else last.kind, None if last is None else last.at_us, w.repeats,
             pol.progress_timeout_s, pol.retry_budget))


def judge(live: Sequence[Any], progress: Sequence[Any], now_us: int, silent_s: float | None = None,
          unchanged_s: float | None = None) -> Health:
    """The last checks of ``classify``, from the run's signals alone: who holds the run,
    whether its worker beats (``judge_liveness``), whether its progress moves
    (``judge_progress``). The one home of these rules: ``classify`` ends here, and the stall
    scan calls the two steps with a view row's columns for the runs ``needs_packet`` leaves
    to it, so neither decodes a packet for them."""
    h = judge_liveness(live, now_us, silent_s)
    return h if h is not None else judge_progress(live, progress, now_us, unchanged_s)


def judge_liveness(live: Sequence[Any], now_us: int, silent_s: float | None = None) -> Health | None:
    """A verdict from ``LIVENESS`` alone (no worker, or a silent one), or None: the worker
    is alive and progress decides. ``live`` may hold more after its ``LIVENESS`` (a view
    row); indexes, not unpacking, and comparisons, not max(): the scan runs this for
    every due run."""
    lease = live[1]
    if lease is None:
        return Health("unclaimed", "no worker holds the run", "claim", live[0] != T.QUEUED)
    beat = live[3]
    if beat is None:
        beat = live[4]
    if beat is not None:
        beat_age = (now_us - beat) / 1e6
        floor = silent_s or 0.0
        if beat_age < floor:
            beat_age = floor
        if not beat_age > live[5]:
            return None
    age = "never" if beat is None else f"{beat_age:.0f}s ago"
    return Health(
        "unavailable",
        f"worker {live[2]} (lease {lease}) last beat {age}, over the {live[5]:g}s heartbeat timeout",
        "revoke_lease", True,
    )


def judge_progress(live: Sequence[Any], progress: Sequence[Any], now_us: int,
                   unchanged_s: float | None = None) -> Health:
    """The verdict on a run whose worker is alive (``judge_liveness`` gave None): stalled
    once its progress has stood still past the progress timeout, else healthy."""
    progress_seq, kind, last_at, repeats, progress_timeout_s = progress[:5]
    since = live[4] or 0
    if last_at is not None and last_at > since:
        since = last_at
    idle = (now_us - since) / 1e6
    floor = unchanged_s or 0.0
    if idle < floor:
        idle = floor
    if idle > progress_timeout_s:
        retry_budget = progress[5]
        if repeats >= retry_budget:
            return Health(
                "stalled",
                f"progress_seq {progress_seq} seen stalled {repeats} times, past the retry "
                f"budget of {retry_budget}",
                "pause", True,
            )
        return Health(
            "stalled",
            f"heartbeats continue but progress_seq {progress_seq} (last: {kind if kind is not None else 'none'}) "
            f"has not moved for {idle:.0f}s, over the {progress_timeout_s:g}s progress timeout",
            "mark_stalled", True,
        )
    return Health("healthy", f"progress_seq {progress_seq}, worker {live[2]} beating", "none", False)
