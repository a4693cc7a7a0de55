"""The watchdog: classify every live run with the stall reducer and act within bounds.

Every observation and decision is a ledger event under a deterministic idempotency key,
so a watchdog killed mid-pass and restarted re-derives the same keys and the ledger
answers ``duplicate`` instead of acting twice. ``watch_once`` is the whole of one pass;
``handoff watch`` only loops over it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgspec

from handoff.ledger.errors import IdempotencyConflict, InvalidInput, LedgerError, Refused
from handoff.ledger.inputs import check_seconds
from handoff.ledger.store import WATCHER_PREFIX
from handoff.reducers import commands as C
from handoff.reducers.checkpoint import Checkpoint, iso
from handoff.reducers.stall import Health
from handoff.render import visible

from .facade import Ledger

#: classification -> what the watchdog does about it. Anything else: nothing.
ACTS_ON = ("unavailable", "stalled", "needs_reconciliation", "delivery_ambiguous")


class Action(msgspec.Struct, frozen=True):
    """One thing a pass did (or found already done) for one run."""

    run_id: str
    classification: str
    action: str  # revoke_lease, observe, mark_stalled, pause, reconcile, reconcile_delivery
    outcome: str  # committed, duplicate, skipped (the run moved on since it was classified), failed
    key: str
    progress_seq: int
    lease: int | None
    reason: str
    seq: int | None = None  # the run's seq of the recorded event, when committed

    def line(self) -> str:
        lease = "-" if self.lease is None else str(self.lease)
        failed = "FAILED " if self.outcome == "failed" else ""
        return visible(f"{self.run_id} {self.classification} -> {failed}{self.action} "
                       f"(lease {lease}, progress_seq {self.progress_seq}): {self.reason}")


def default_name() -> str:
    """A watcher's name when none is given: ``watchdog-<host>``. Its beats live in the stream
    ``watcher:<name>``, so the name keeps to the run-id alphabet."""
    import re
    import socket

    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname().split(".")[0])[:100].strip("-")
    return f"watchdog-{host or 'localhost'}"


def action_key(run_id: str, action: str, *parts: object) -> str:
    """The idempotency key of one watchdog decision: the same facts always give the same key."""
    key = ":".join(["watch", run_id, action, *("none" if p is None else str(p) for p in parts)])
    if len(key) <= 128:
        return key
    # Keys are capped at 128 characters; a long run id is folded into a digest.
    return f"watch:{hashlib.sha256(key.encode()).hexdigest()[:40]}:{action}"


def stall_window(cp: Checkpoint, now_us: int) -> int:
    """Which progress-timeout window the run's idleness is in (1 = first timeout passed).

    A stall that lasts is observed once per window, so the retry budget counts windows,
    not watchdog passes, and a restarted watchdog in the same window repeats nothing.
    """
    w = cp.watch
    since = w.lease_since_us or 0
    if w.last_progress is not None:
        since = max(since, w.last_progress.at_us)
    timeout_us = max(1, int(cp.policy.progress_timeout_s * 1_000_000))
    return max(1, (now_us - since) // timeout_us)


def _plan(cp: Checkpoint, h: Health, now_us: int) -> list[tuple[str, C.Command, str]]:
    """(action, command, key) for one classified run. Reasons hold no clock readings, so a
    retried command is byte-identical to the first and its key dedupes instead of conflicting."""
    run, pseq, lease, pol = cp.run_id, cp.progress_seq, cp.lease, cp.policy
    c = h.classification
    if c == "unavailable":
        why = (f"no heartbeat from {cp.worker} (lease {lease}) within the "
               f"{pol.heartbeat_timeout_s:g}s heartbeat timeout; lease revoked so another worker can claim")
        return [("revoke_lease", C.Recover("revoke_lease", c, pseq, why, lease=lease), action_key(run, "revoke_lease", pseq, lease))]
    if c == "stalled" and h.action == "pause":
        why = (f"progress_seq {pseq} stalled through {cp.watch.repeats} progress-timeout windows, "
               f"past the retry budget of {pol.retry_budget}")
        return [("pause", C.Recover("pause", c, pseq, why), action_key(run, "pause", pseq, lease))]
    if c == "stalled":
        window = stall_window(cp, now_us)
        last = cp.watch.last_progress.kind if cp.watch.last_progress else "none"
        why = (f"heartbeats continue but progress_seq {pseq} (last: {last}) has not moved "
               f"within the {pol.progress_timeout_s:g}s progress timeout")
        return [
            ("observe", C.Observe(c, pseq, f"{why} (window {window})"), action_key(run, "stalled", pseq, lease, window)),
            ("mark_stalled", C.Recover("mark_stalled", c, pseq, why), action_key(run, "mark_stalled", pseq, lease)),
        ]
    if c == "needs_reconciliation":
        keys = sorted(e.key for e in cp.pending_effects if e.lease != cp.lease or cp.lease is None)
        why = (f"side effect(s) {', '.join(keys)} have no recorded outcome and their worker lost the "
               "lease; find out what happened and record it with 'handoff effect-confirm' before any retry")
        digest = hashlib.sha256("\x00".join(keys).encode()).hexdigest()[:12]
        return [("reconcile", C.Recover("reconcile", c, pseq, why), action_key(run, "reconcile", pseq, digest))]
    if c == "delivery_ambiguous":
        pending = cp.delivery.pending
        at = pending.seq if pending else None
        why = (f"delivery {pending.key if pending else '?'} to {cp.target} has no outcome past the "
               f"{pol.delivery_timeout_s:g}s delivery timeout; check the target, then record "
               "'handoff delivered' or 'handoff delivery-failed'; never resend blindly")
        return [("reconcile_delivery", C.Recover("reconcile_delivery", c, pseq, why),
                 action_key(run, "reconcile_delivery", at))]
    return []


def _unchanged(action: str, seen: Checkpoint, now: Checkpoint) -> bool:
    """Does the run still stand where the pass classified it?

    A run the stall scan judged from its view row (a DueRun) is compared with the signals
    of that row: its packet, read after the scan, may already show the beat or the
    progress that would make the verdict wrong."""
    still = getattr(seen, "still_as_judged", None)
    if still is not None and not still(now, heartbeat=action == "revoke_lease"):
        return False
    same = now.lease == seen.lease and now.progress_seq == seen.progress_seq
    if action == "revoke_lease":
        # A beat since the classification means the worker is alive after all.
        same = same and now.watch.last_heartbeat_us == seen.watch.last_heartbeat_us
    return same


def _act(lg: Ledger, watcher: str, cp: Checkpoint, action: str, cmd: C.Command,
         key: str) -> tuple[str, int | None, str | None]:
    """Append one watchdog command only if the run still stands where it was classified.

    The guard runs inside the write transaction: if the worker beat, progressed or a new
    lease was granted since the classification, nothing is written ("skipped"). A used
    key answers "duplicate" before the guard is even asked. A refusal is "failed", with
    the reason as third item: it is never taken for a decision already made, except a key
    conflict with the same decision recorded by another watchdog (see ``_conflict``).
    """
    from handoff.ledger.store import Actor

    actor = Actor("watchdog", watcher)
    try:
        # The one write path: Ledger.execute, with the guard run inside its transaction.
        result = lg.execute(cp.run_id, cmd, actor=actor, key=key,
                            guard=lambda now: _unchanged(action, cp, now)).result
    except IdempotencyConflict as exc:
        return _conflict(lg, cp.run_id, key, cmd, exc)
    except Refused as exc:
        return "failed", None, f"refused: {exc.message}"
    if result.outcome == "unchanged":  # the guard found the run moved on: nothing written
        return "skipped", None, None
    if result.outcome == "duplicate":
        return "duplicate", result.first_seq, None
    return "committed", result.first_seq, None


def _conflict(lg: Ledger, run_id: str, key: str, cmd: C.Command,
              exc: IdempotencyConflict) -> tuple[str, int | None, str | None]:
    """The key holds other bytes. Only another watchdog recording the same kind of event
    (its own name makes the bytes differ) means the decision is made; anything else, such
    as an event a worker wrote under the key before such keys were reserved, is a failure
    to act, reported as one and never as done."""
    seq = exc.details.get("seq")
    want = "watchdog_observed" if isinstance(cmd, C.Observe) else "recovery_decided"
    rec = None
    if isinstance(seq, int):
        rec = next(iter(lg.store.read_run(run_id, after_seq=seq - 1, until_seq=seq)), None)
    if rec is not None and rec.actor.startswith("watchdog:") and rec.type == want:
        return "duplicate", seq, None
    by = rec.actor if rec is not None else "someone else"
    return "failed", None, (f"refused: key {key} already holds a {rec.type if rec else 'different'} "
                            f"event by {by} (seq {seq}); this decision was not recorded. Ask an operator "
                            "to act on the run by hand")


def _preview(lg: Ledger, watcher: str, cp: Checkpoint, action: str, cmd: C.Command,
             key: str) -> tuple[str, int | None, str | None]:
    """What ``_act`` would do, found by the same path, then rolled back: nothing is written.

    It runs the real transaction (the same key lookup, guard and decide) and aborts it
    once the events are decided, so its answer is the one a real pass would get at this
    moment. "would_commit": a real pass would record the action; "duplicate": already
    recorded under its key; "failed": a real pass would be refused (the reason says why,
    a key taken by another request included); "skipped": the run moved on.
    """
    from handoff.ledger.store import Actor

    actor = Actor("watchdog", watcher)
    try:
        seen = lg.preview(cp.run_id, cmd, actor=actor, key=key, guard=lambda now: _unchanged(action, cp, now))
    except IdempotencyConflict as exc:
        return _conflict(lg, cp.run_id, key, cmd, exc)
    except Refused as exc:
        return "failed", None, f"refused: {exc.message}"
    if seen.outcome == "would_commit":
        return "would_commit", None, None
    if seen.outcome == "duplicate" and seen.result is not None:
        return "duplicate", seen.result.first_seq, None
    return "skipped", None, None


class Sightings:
    """What one watcher process has seen, timed by its own monotonic clock.

    For each leased run it remembers when it first saw the current heartbeat value and the
    current progress_seq (both under the current lease). Only the values' identity is
    compared, never their timestamps, so a wall clock that jumps backward cannot make a
    silent or idle run look fresh. Lives in memory: a restarted watcher starts over and
    falls back on the ledger's timestamps alone, which is safe, only slower to notice.
    """

    def __init__(self) -> None:
        self._beat: dict[str, tuple[Any, float]] = {}
        self._progress: dict[str, tuple[Any, float]] = {}
        #: run -> (heartbeat timeout, progress timeout), learnt from its contract once.
        self.limits: dict[str, tuple[float, float]] = {}

    def sample(self, rows: list[tuple[str, int, int | None, int]], mono_s: float) -> None:
        live = set()
        for run_id, lease, beat_us, pseq in rows:
            live.add(run_id)
            for table, value in ((self._beat, (lease, beat_us)), (self._progress, (lease, pseq))):
                seen = table.get(run_id)
                if seen is None or seen[0] != value:
                    table[run_id] = (value, mono_s)
        for table in (self._beat, self._progress, self.limits):
            for run_id in list(table):
                if run_id not in live:
                    del table[run_id]

    def durations(self, run_id: str, mono_s: float) -> tuple[float | None, float | None]:
        """(silent_s, unchanged_s) for stall.classify, or None where never seen."""
        beat, prog = self._beat.get(run_id), self._progress.get(run_id)
        return (None if beat is None else mono_s - beat[1], None if prog is None else mono_s - prog[1])

    def overdue(self, mono_s: float, limits: dict[str, tuple[float, float]]) -> list[str]:
        """Runs whose heartbeat or progress stood still longer than their own timeouts.

        ``limits`` maps a run to (heartbeat timeout, progress timeout); unknown runs are
        returned too, so the caller can learn their policy.
        """
        out = []
        for run_id, (_, beat_at) in self._beat.items():
            limit = limits.get(run_id)
            prog_at = self._progress.get(run_id, (None, mono_s))[1]
            if limit is None or mono_s - beat_at > limit[0] or mono_s - prog_at > limit[1]:
                out.append(run_id)
        return sorted(out)


def watch_once(
    ledger: Ledger,
    *,
    name: str = "watchdog",
    now_us: int | None = None,
    interval_s: float = 5.0,
    on_action: Callable[[Action], None] | None = None,
    sightings: Sightings | None = None,
    mono_s: float | None = None,
    dry_run: bool = False,
) -> list[Action]:
    """One pass: beat, classify every run that may need attention at ``now_us``, act.

    Returns every action considered: ``committed`` (written now), ``duplicate`` (already
    written by an earlier pass: nothing written), ``skipped`` (the run moved on since it
    was classified: nothing written) or ``failed`` (the ledger refused it: nothing written,
    the reason says why). ``on_action`` sees each one as it is decided.
    Terminal runs are never touched: the stall reducer calls them silent.

    ``dry_run=True`` records nothing at all (no beat, no observation, no decision) and
    answers what a real pass would do now: ``would_commit`` where it would act, else
    ``duplicate``, ``conflict`` or ``skipped`` (see ``_preview``). Each action is judged
    against the ledger as it stands; of a run's two actions (observe, then mark_stalled)
    the first changes nothing the second is judged on, so the preview holds for both.
    """
    if not dry_run:
        ledger.watcher_beat(name, interval_s)
    now = ledger.clock() if now_us is None else now_us
    out: list[Action] = []
    for cp, health in _classified(ledger, now, sightings, mono_s):
        if health.classification not in ACTS_ON:
            continue
        for action, cmd, key in _plan(cp, health, now):
            outcome, seq, failure = (_preview if dry_run else _act)(ledger, name, cp, action, cmd, key)
            if failure is not None:
                reason = failure
            elif outcome == "skipped":
                reason = "the run moved on since it was classified; nothing done"
            else:
                reason = getattr(cmd, "reason", "")
            act = Action(cp.run_id, health.classification, action, outcome, key, cp.progress_seq,
                         cp.lease, reason, seq)
            out.append(act)
            if on_action is not None:
                on_action(act)
            if outcome in ("skipped", "failed"):
                break
    return out


def _classified(
    ledger: Ledger, now: int, sightings: Sightings | None, mono_s: float | None
) -> list[tuple[Checkpoint, Health]]:
    """The runs needing attention: the stall index's candidates, plus (with sightings)
    runs whose signals stood still by the watcher's own clock although timestamps say fresh."""
    from handoff.projections import queries
    from handoff.reducers.stall import classify

    found = ledger.stalls(now=now)
    if sightings is None:
        return found
    mono = time.monotonic() if mono_s is None else mono_s
    sightings.sample(queries.leased_signals(ledger.store), mono)
    seen = {cp.run_id for cp, _ in found}
    limits = sightings.limits
    for run_id in sightings.overdue(mono, limits):
        cp = queries.checkpoint(ledger.store, run_id)
        if cp is None or cp.terminal:
            continue
        limits[run_id] = (cp.policy.heartbeat_timeout_s, cp.policy.progress_timeout_s)
        if run_id in seen:
            continue
        silent_s, unchanged_s = sightings.durations(run_id, mono)
        health = classify(cp, now_us=now, silent_s=silent_s, unchanged_s=unchanged_s)
        if health.needs_attention:
            found.append((cp, health))
    return found


def watch_forever(
    ledger: Ledger,
    *,
    name: str = "watchdog",
    interval_s: float = 5.0,
    on_pass: Callable[[int, list[Action]], None] | None = None,
    on_action: Callable[[Action], None] | None = None,
    on_error: Callable[[LedgerError], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Pass after pass until ``should_stop``; a store error skips one pass, never the loop.

    The name and interval are checked before the first pass: a bad one would fail every
    pass alike (and a nan interval would never wait), so it is refused, not retried.
    """
    from handoff.ledger.inputs import check_run_id

    check_seconds(interval_s, "interval", high=1e7, low_open=True)
    if not isinstance(name, str):
        raise InvalidInput(f"watcher name must be text, got {type(name).__name__}", field="watcher")
    check_run_id(WATCHER_PREFIX + name, "watcher")
    sightings = Sightings()
    store = ledger.store
    while not should_stop():
        started = time.monotonic()
        now = ledger.clock()
        seen = -1  # unknown: the first wait below reads where the log ends
        try:
            seen = store.last_position()
            actions = watch_once(ledger, name=name, now_us=now, interval_s=interval_s, on_action=on_action,
                                 sightings=sightings, mono_s=started)
        except LedgerError as exc:
            if on_error is None:
                raise
            on_error(exc)
        else:
            if on_pass is not None:
                on_pass(now, actions)
        # Sleep until the interval is over, or wake early when new events arrive (a new
        # run, a claim, a close can move a deadline), but never pass more often than
        # once a second: the store's wait is LISTEN/NOTIFY on PostgreSQL, a poll here.
        deadline = started + interval_s
        soonest = started + min(interval_s, 1.0)
        while not should_stop() and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            try:
                last = store.wait_for_events(max(seen, 0), max(0.0, min(0.25, left)))
            except LedgerError:  # an unreachable store: the next pass reports it
                time.sleep(max(0.0, min(0.25, left)))
                continue
            if seen < 0:
                seen = last
            elif last > seen and time.monotonic() >= soonest:
                break


__all__ = ["Action", "Sightings", "action_key", "default_name", "stall_window", "watch_once", "watch_forever", "iso"]
