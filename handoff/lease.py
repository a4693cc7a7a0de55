"""A lease held in a block, and the one implementation of heartbeating and self-fencing.

Every in-process worker needs the same three things around its work: a heartbeat that
keeps the lease while the work runs, a fence that stops the work before the watchdog
*could* give the lease away when no heartbeat can be recorded, and an ending that says
why the work stopped. ``handoff run`` (handoff/worker.py) needs them for a child
process; ``Ledger.lease()`` (``Lease`` here) and ``AsyncLedger.lease()``
(handoff/aio.py) for code in this process. All three use ``Fence``, so the interval, the
margin and the moment a lease counts as lost follow one rule.

The fence's clock is this process's monotonic clock, started when the last recorded
heartbeat (or the claim) was *sent*: the ledger stamped it no earlier, so the watchdog's
timeout cannot have started before it, whatever another host's clock says
(docs/reliability.md, "A worker cut off from the ledger").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from handoff.ledger.errors import InvalidInput, LeaseLost, LedgerError, StaleLease, StoreUnavailable, TerminalRun
from handoff.ledger.store import Actor, LeaseToken
from handoff.reducers import transitions as T

if TYPE_CHECKING:
    from .facade import Ledger, Outcome

#: States in which a non-advancing "note" is accepted from the lease holder.
NOTE_STATES = T.WORKING | {T.BLOCKED, T.UNKNOWN}
SUBMITTED = frozenset({T.READY_FOR_REVIEW, T.SUCCEEDED})
#: The longest text recorded about why work stopped (an exception's type and message, a
#: child's exit and the end of its stderr), after the sanitizer's detectors have run.
MAX_STOP_TEXT = 500


# --- the rule: how often to beat, how long to trust silence --------------------------


def heartbeat_interval(timeout_s: float, given: float | None = None) -> float:
    """Seconds between heartbeats: ``given``, else a third of the heartbeat timeout (at
    most 30 s, at least 50 ms), so two beats can be lost before the watchdog may act."""
    return given or max(0.05, min(timeout_s / 3, 30.0))


def fence_margin(timeout_s: float, given: float | None = None) -> float:
    """How long before the heartbeat timeout a silent worker stops: ``given``, else a
    quarter of the timeout (time for the work to be stopped before a revoke is possible)."""
    return timeout_s / 4 if given is None else given


def check_margin(margin: float | None, timeout: float, run: str) -> None:
    """A margin of the whole timeout or more would stop every worker at once."""
    if margin is not None and not 0 <= margin < timeout:
        raise InvalidInput(f"the fence margin ({margin:g}s) must be less than {run}'s heartbeat timeout "
                           f"({timeout:g}s): the work would be stopped before it could do anything. Give a "
                           "smaller --fence-margin (fence_margin_s=), or leave it out (a quarter of the timeout)",
                           field="fence_margin")


# --- the fence ---------------------------------------------------------------------------


class Fence:
    """Whether a worker still provably holds its lease; the one home of that judgement.

    ``beat()`` records one heartbeat; ``expired()`` trips the fence once no heartbeat was
    recorded for the heartbeat timeout less the margin; a heartbeat the ledger refuses
    (``StaleLease``, ``TerminalRun``) ends the lease. Either way the fence is ``gone``
    from then on, and ``on_lost`` (given at construction) is called once, from whichever
    thread found out. Drivers only call ``beat`` and ``expired`` on a schedule:
    ``BeatThreads`` for threads, handoff/aio.py for an event loop.
    """

    def __init__(self, lg: Ledger, run_id: str, token: LeaseToken, worker: str, *, timeout_s: float,
                 interval_s: float | None = None, margin_s: float | None = None, since: float | None = None,
                 on_lost: Callable[[Fence], None] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.lg, self.run_id, self.token, self.worker = lg, run_id, token, worker
        self.lease = token.lease  # the number, for what is said; the token only writes
        self.timeout_s = timeout_s
        self.interval_s = heartbeat_interval(timeout_s, interval_s)
        self.margin_s = fence_margin(timeout_s, margin_s)
        self.limit_s = timeout_s - self.margin_s
        #: Monotonic time the last recorded heartbeat (or the claim) was sent.
        self.last_ok = time.monotonic() if since is None else since
        self.on_lost = on_lost
        self.say = say or logging.getLogger("handoff.lease").warning
        self.lost = False  # the ledger said the lease ended (revoked, superseded, run closed)
        self.lost_reason = ""
        self.fenced = False  # no heartbeat recorded in time: the lease can no longer be proven
        self.silent_s = 0.0
        self.released_by_holder = False  # the holder gave the lease back itself
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    @property
    def gone(self) -> bool:
        """The lease is no longer this worker's to write with (lost, fenced or given back)."""
        return self.lost or self.fenced or self.released_by_holder

    def time_left(self) -> float:
        """Seconds until the fence trips unless a heartbeat is recorded first."""
        return self.limit_s - (time.monotonic() - self.last_ok)

    def expired(self) -> bool:
        """Trip the fence if its time is up; True once the lease is gone for any reason."""
        with self._lock:
            if self.gone:
                return True
            silent = time.monotonic() - self.last_ok
            if silent < self.limit_s:
                return False
            self.fenced, self.silent_s = True, silent
        self._tell()
        return True

    def beat(self) -> bool:
        """Record one heartbeat; False once beating should stop (the lease is gone)."""
        if self.gone:
            return False
        sent = time.monotonic()
        try:
            self.lg.heartbeat(self.run_id, self.token, worker=self.worker)
        except (StaleLease, TerminalRun) as exc:
            self.ended(exc)
            return False
        except LedgerError as exc:  # locked past the timeout, disk full: try again next beat
            if exc.message not in self._warned:
                self._warned.add(exc.message)
                self.say(f"heartbeat not recorded ({exc.message}); retrying")
            return True
        self.proven(sent)
        return not self.gone

    def proven(self, sent: float) -> None:
        """A heartbeat (or another write under the lease) sent at monotonic time ``sent``
        was recorded: the lease was this worker's then."""
        with self._lock:
            if not self.gone:  # a fence that tripped stays tripped: the work was stopped
                self.last_ok = max(self.last_ok, sent)

    def ended(self, exc: LedgerError) -> None:
        """The ledger refused this lease: say how it ended, and whether the holder did it."""
        how = self._how_lease_ended()
        with self._lock:
            if self.gone:
                return
            if how is not None and how[0] == "released" and how[1] == f"worker:{self.worker}":
                # The holder gave the lease back itself ('handoff release'): nothing was lost.
                self.released_by_holder = True
                return
            self.lost = True
            if how is None:
                self.lost_reason = exc.message
            else:
                kind, actor, reason = how
                self.lost_reason = f"lease {self.lease} was {kind} by {actor}" + (f": {reason}" if reason else "")
        self._tell()

    def error(self) -> LeaseLost:
        """The refusal every verb gives once the lease is gone."""
        if self.fenced:
            return LeaseLost(
                f"lease {self.lease} of run {self.run_id} can no longer be proven: no heartbeat could be "
                f"recorded for {self.silent_s:.2f}s (the limit is {self.limit_s:g}s, the heartbeat timeout "
                f"{self.timeout_s:g}s less a margin of {self.margin_s:g}s), so the watchdog may give it away. "
                "This worker stopped; nothing was written. Once the ledger answers, look at the run "
                "('handoff status') and claim it again only if it should still be yours",
                run_id=self.run_id, lease=self.lease, why="fenced", silent_s=round(self.silent_s, 3))
        if self.released_by_holder:
            return LeaseLost(
                f"lease {self.lease} of run {self.run_id} was given back by {self.worker} itself; nothing "
                "was written. Claim the run again to go on working on it",
                run_id=self.run_id, lease=self.lease, why="released")
        return LeaseLost(
            f"lease {self.lease} of run {self.run_id} is lost ({self.lost_reason}); this worker must stop "
            "acting, and nothing was written. Another worker may hold the run now: read 'handoff status' "
            "before claiming it again",
            run_id=self.run_id, lease=self.lease, why="lost")

    def _tell(self) -> None:
        if self.on_lost is not None:
            self.on_lost(self)

    def _how_lease_ended(self) -> tuple[str, str, str] | None:
        from handoff.ledger import events as ev

        found = None
        try:
            for rec in self.lg.log(self.run_id):
                e = rec.event
                if isinstance(e, (ev.LeaseReleased, ev.LeaseRevoked)) and e.lease == self.lease:
                    kind = "revoked" if isinstance(e, ev.LeaseRevoked) else "released"
                    found = (kind, rec.actor, e.reason)
        except LedgerError:
            return None
        return found


class BeatThreads:
    """Drives a ``Fence`` from two daemon threads: one heartbeats every interval, one trips
    the fence on time. Two, because a heartbeat stuck on a locked or unreachable ledger
    must not keep the fence from tripping."""

    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        self._stop = threading.Event()
        name = f"handoff-{fence.run_id}-lease-{fence.lease}"
        self._beater = threading.Thread(target=self._beat, name=f"{name}-heartbeat", daemon=True)
        self._watch = threading.Thread(target=self._fence, name=f"{name}-fence", daemon=True)

    def start(self) -> None:
        self._beater.start()
        self._watch.start()

    def stop(self, wait_s: float | None = None) -> None:
        """Stop both threads; wait for a beat in flight up to ``wait_s`` (None: for good)."""
        self._stop.set()
        self._watch.join()
        self._beater.join(timeout=wait_s)

    def _beat(self) -> None:
        while not self._stop.wait(self.fence.interval_s):
            if not self.fence.beat():
                return

    def _fence(self) -> None:
        while not self._stop.wait(max(self.fence.time_left(), 0.005)):
            if self.fence.expired():
                return


# --- how a worker's stop is recorded --------------------------------------------------


def bounded_text(text: str, lg: Ledger, run_id: str, limit: int = MAX_STOP_TEXT) -> str:
    """``text`` fit to be recorded: what the sanitizer's detectors (and the run's own
    patterns) find replaced by a stand-in that cannot be reversed, then cut to ``limit``
    characters (scrubbed whole first, so a cut never leaves half a key no detector knows).
    An exception message, a stderr line or a tool's arguments can hold a token; the log
    must never. The one scrub of free text a worker's side hands the ledger: the lease
    block, ``handoff run`` and the agent integrations (handoff/integrations/_agent_run.py)
    all call it."""
    from handoff.reducers import sanitize as sz

    patterns: tuple[str, ...] = ()
    try:
        patterns = tuple(lg.checkpoint(run_id).delivery.patterns)
    except LedgerError:
        pass
    text = sz.redact(text, os.urandom(16), patterns)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def record_end(lg: Ledger, run_id: str, token: LeaseToken, worker: str, text: str, *, failed: bool) -> str:
    """Record why a worker stopped and give its lease back; the one rule for ``handoff
    run``'s child and a ``lease()`` block. Returns what was recorded: ``"progress note"``
    while the run is being worked on, ``"evidence"`` (``worker_exit``, outcome ``fail``)
    for a failure after a submit, which holds delivery until someone looks, else
    ``"release reason"``; ``""`` when the lease had already ended (nothing written)."""
    cp = lg.checkpoint(run_id)
    if cp.lease != token.lease:
        return ""
    if cp.state in NOTE_STATES:
        lg.progress(run_id, token, "note", text, worker=worker)
        recorded = "progress note"
    elif failed and cp.state in SUBMITTED:
        lg.evidence(run_id, "worker_exit", "fail", text, lease=token, actor=Actor("worker", worker))
        recorded = "evidence"
    else:
        recorded = "release reason"  # queued (nothing started) or a clean end after submit
    lg.release(run_id, token, text, worker=worker)
    return recorded


# --- the block ---------------------------------------------------------------------------


class EffectHandle:
    """A side effect inside ``lease.effect(key, what)``: say its outcome with ``done`` or
    ``absent``; leaving the block normally says ``done``."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.outcome: str | None = None
        self.note = ""

    def done(self, note: str = "") -> None:
        self.outcome, self.note = "done", note

    def absent(self, note: str = "") -> None:
        """It did not happen (and will not): the run can go on without reconciling it."""
        self.outcome, self.note = "absent", note


class LeaseCore:
    """What the sync and async blocks share: the state of the block, the checks every verb
    makes before and after it writes, and the ending's text. No I/O of its own."""

    def __init__(self, run_id: str, worker: str, token: str | None, heartbeat_s: float | None,
                 fence_margin_s: float | None) -> None:
        if not isinstance(worker, str) or not worker:
            raise InvalidInput("worker must be a non-empty name, e.g. worker=\"agent-1\"", field="worker")
        if heartbeat_s is not None and not (isinstance(heartbeat_s, (int, float)) and heartbeat_s > 0):
            raise InvalidInput(f"heartbeat_s must be a number of seconds above 0, got {heartbeat_s!r}",
                               field="heartbeat_s")
        if fence_margin_s is not None and not (isinstance(fence_margin_s, (int, float)) and fence_margin_s >= 0):
            raise InvalidInput(f"the fence margin must be 0 seconds or more, got {fence_margin_s!r}",
                               field="fence_margin")
        self.run_id, self.worker = run_id, worker
        self.given = None if token is None else LeaseToken.parse(token)
        self.heartbeat_s, self.fence_margin_s = heartbeat_s, fence_margin_s
        self.state = "new"  # new -> held -> ended
        self.fence: Fence | None = None

    @property
    def token(self) -> LeaseToken:
        self.check()
        assert self.fence is not None
        return self.fence.token

    @property
    def number(self) -> int:
        """The lease number (what status shows); never the token."""
        if self.fence is None:
            raise self._not_held()
        return self.fence.lease

    def enter(self) -> None:
        if self.state != "new":
            raise InvalidInput(
                f"this lease block on run {self.run_id} was already entered; a lease() block holds one "
                "lease once. Call lease() again for a new block", field="lease")
        self.state = "entering"

    def check(self) -> None:
        """Before and after every verb: refuse once the lease is gone or the block is over."""
        if self.state != "held" or self.fence is None:
            raise self._not_held()
        if self.fence.expired():
            raise self.fence.error()

    def retry_in(self) -> float:
        """How long to wait before retrying a write the store could not take (locked, out
        of reach: nothing written): a heartbeat interval, never past the fence."""
        assert self.fence is not None
        return max(0.005, min(self.fence.interval_s, self.fence.time_left()))

    def _not_held(self) -> LedgerError:
        if self.fence is not None and self.fence.gone:
            return self.fence.error()
        when = "has not been entered" if self.state in ("new", "entering") else "has ended"
        return InvalidInput(f"the lease block on run {self.run_id} {when}; its verbs work only inside "
                            "'with lg.lease(...) as lease:' (or 'async with')", field="lease")

    def stop_text(self, exc: BaseException) -> str:
        message = str(exc).strip()
        return f"{self.worker} stopped: {type(exc).__name__}" + (f": {message}" if message else "")

    # --- the verbs, as calls on a Ledger (one mapping for the sync and async blocks) ---

    # --- generated from handoff/operations.py (LeaseCore verbs): python -m handoff.codegen --write ---
    def heartbeat(self, *, attrs: Mapping[str, Any] | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.heartbeat(self.run_id, t, attrs=attrs, worker=self.worker)

    def transition(self, to: str, *, reason: str = "", key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.transition(self.run_id, t, to, reason=reason, key=key, worker=self.worker)

    def progress(self, kind: str, detail: str = "", *, attrs: Mapping[str, Any] | None = None,
                 key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.progress(self.run_id, t, kind, detail, attrs=attrs, key=key, worker=self.worker)

    def artifact(self, path: str, *, kind: str = "result", root: str | None = None,
                 max_bytes: int | str | None = None, attrs: Mapping[str, Any] | None = None,
                 key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.artifact(self.run_id, t, path, kind=kind, root=root, max_bytes=max_bytes,
                                      attrs=attrs, key=key, worker=self.worker)

    def evidence(self, kind: str, outcome: str, detail: str = "", *, attrs: Mapping[str, Any] | None = None,
                 key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.evidence(self.run_id, kind, outcome, detail, attrs=attrs, key=key, lease=t,
                                      actor=Actor("worker", self.worker))

    def block(self, reason: str, next_action: str, *, key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.block(self.run_id, reason, next_action, key=key, lease=t, actor=Actor("worker",
                                   self.worker))

    def unblock(self, resolution: str, *, blocker_id: int | None = None,
                key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.unblock(self.run_id, resolution, blocker_id=blocker_id, key=key, lease=t,
                                     actor=Actor("worker", self.worker))

    def confirm(self, effect_key: str, outcome: str, *, note: str = "",
                attrs: Mapping[str, Any] | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.effect_confirm(self.run_id, effect_key, outcome, note=note, attrs=attrs, lease=t,
                                            actor=Actor("worker", self.worker))

    def submit(self, summary: str = "", *, key: str | None = None) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.submit(self.run_id, t, summary, key=key, worker=self.worker)

    def effect_outcome(self, effect_key: str) -> Callable[[Ledger], dict[str, Any]]:
        self.check()
        return lambda lg: lg.effect_outcome(self.run_id, effect_key)
    # --- end of generated code (LeaseCore verbs) ---

    def effect_start(self, effect_key: str, what: str, **kw: Any) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.effect_start(self.run_id, t, effect_key, what, worker=self.worker, **kw)

    def effect_confirm(self, fx: EffectHandle) -> Callable[[Ledger], Outcome]:
        t = self.token
        return lambda lg: lg.effect_confirm(
            self.run_id, fx.key, fx.outcome or "done", note=bounded_text(fx.note, lg, self.run_id) if fx.note else "",
            lease=t, actor=Actor("worker", self.worker))

    def end(self, lg: Ledger, exc: BaseException | None) -> None:
        """The block's end, with the fence stopped: release, or record why the work stopped
        and release; nothing once the lease is gone (``LeaseLost`` if the block did not raise)."""
        fence = self.fence
        assert fence is not None
        self.state = "ended"
        if fence.gone:
            if exc is None:
                raise fence.error()
            return  # a lost lease's worker writes nothing more
        if exc is None:
            lg.release(self.run_id, fence.token, f"{self.worker} finished its lease block", worker=self.worker)
            return
        try:
            record_end(lg, self.run_id, fence.token, self.worker, bounded_text(self.stop_text(exc), lg, self.run_id),
                       failed=True)
        except LedgerError as failed:
            exc.add_note(f"handoff: the stop could not be recorded ({failed.message}); the watchdog will "
                         "revoke the lease once its heartbeat timeout passes")


class HeldLease:
    """What a held lease shows of its ``LeaseCore``, the same for ``Lease`` and the async
    ``AsyncLease`` (handoff/aio.py)."""

    core: LeaseCore

    run_id = property(lambda self: self.core.run_id)
    worker = property(lambda self: self.core.worker)
    number = property(lambda self: self.core.number)

    @property
    def fence(self) -> Fence | None:
        return self.core.fence

    @property
    def token(self) -> LeaseToken:
        """The lease token, for a child process or a tool that writes itself."""
        return self.core.token


class Lease(HeldLease):
    """``with lg.lease(run_id, worker="agent-1") as lease:``: hold a lease for a block.

    On entry it claims the run (or adopts ``token=``, a token claimed elsewhere such as
    ``$HANDOFF_LEASE``, proving it with a heartbeat), then heartbeats from a background
    thread at the run's interval (``heartbeat_interval``). Inside, the verbs need no
    token. Leaving the block normally releases the lease; leaving it by an exception
    (KeyboardInterrupt included) records why the work stopped, bounded and sanitized, as
    ``handoff run`` does for a child that failed, then releases. Once the lease is lost
    (the ledger refused it, or no heartbeat could be recorded for the heartbeat timeout
    less the fence margin), ``on_lost(lease)`` is called once from a background thread,
    every later verb raises ``LeaseLost`` without writing, and the block's end writes
    nothing (and raises ``LeaseLost`` if the block itself did not raise).
    """

    def __init__(self, lg: Ledger, run_id: str, *, worker: str, token: str | None = None,
                 heartbeat_s: float | None = None, fence_margin_s: float | None = None,
                 on_lost: Callable[[Lease], None] | None = None, key: str | None = None) -> None:
        self.lg = lg
        self.core = LeaseCore(run_id, worker, token, heartbeat_s, fence_margin_s)
        self.on_lost, self.key = on_lost, key
        self._threads: BeatThreads | None = None

    def __enter__(self) -> Lease:
        core = self.core
        core.enter()
        try:
            core.fence = start(self.lg, core, self.key, self._lost)
        except BaseException:
            core.state = "new"
            raise
        core.state = "held"
        self._threads = BeatThreads(core.fence)
        self._threads.start()
        return self

    def _lost(self, fence: Fence) -> None:
        if self.on_lost is not None:
            self.on_lost(self)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        fence = self.core.fence
        assert fence is not None and self._threads is not None
        fence.expired()  # a fence due now trips before anything is recorded
        self._threads.stop(wait_s=0 if fence.gone else None)
        self.core.end(self.lg, exc)

    # --- the verbs: each checked before it writes and after it returns ----------------

    def _do(self, call: Callable[[Ledger], Outcome]) -> Outcome:
        core = self.core
        while True:
            core.check()
            try:
                out = call(self.lg)
                break
            except (StaleLease, TerminalRun) as exc:
                assert core.fence is not None
                core.fence.ended(exc)
                raise core.fence.error() from exc
            except StoreUnavailable:
                time.sleep(core.retry_in())  # nothing was written: wait while the lease can be proven
        core.check()  # a write that waited past the fence must not let the work go on
        return out

    # --- generated from handoff/operations.py (Lease verbs): python -m handoff.codegen --write ---
    def heartbeat(self, *, attrs: Mapping[str, Any] | None = None) -> Outcome:
        """Say the lease holder is alive. Heartbeats are liveness, never progress.

        Most beats write no event: the run's liveness, kept beside the log,
        moves (outcome unchanged). The log records a beat that ends a silence
        longer than half the heartbeat timeout, carries other attrs than the
        last, or is the first in 15 minutes. It takes no key: a heartbeat
        changes no authority, and a repeated one only says again that the holder
        is alive, which is what a retry means.
        """
        return self._do(self.core.heartbeat(attrs=attrs))

    def transition(self, to: str, *, reason: str = "", key: str | None = None) -> Outcome:
        """Move the run through its lifecycle (queued -> planning -> executing ->
        verifying)."""
        return self._do(self.core.transition(to, reason=reason, key=key))

    def progress(self, kind: str, detail: str = "", *, attrs: Mapping[str, Any] | None = None,
                 key: str | None = None) -> Outcome:
        """Record a step. Only the state's progress kinds advance progress_seq.

        With a key, a retried report writes nothing new.
        """
        return self._do(self.core.progress(kind, detail, attrs=attrs, key=key))

    def artifact(self, path: str, *, kind: str = "result", root: str | None = None,
                 max_bytes: int | str | None = None, attrs: Mapping[str, Any] | None = None,
                 key: str | None = None) -> Outcome:
        """Measure a file (regular files only, at most max_bytes) and record it as an
        artifact."""
        return self._do(self.core.artifact(path, kind=kind, root=root, max_bytes=max_bytes, attrs=attrs,
                                           key=key))

    def evidence(self, kind: str, outcome: str, detail: str = "", *, attrs: Mapping[str, Any] | None = None,
                 key: str | None = None) -> Outcome:
        """Record a check that was run and how it came out. Delivery needs a pass and no
        fail."""
        return self._do(self.core.evidence(kind, outcome, detail, attrs=attrs, key=key))

    def block(self, reason: str, next_action: str, *, key: str | None = None) -> Outcome:
        """Record a named blocker and the next action; the run waits in 'blocked'.

        A blocked run is not a stall: the watchdog leaves it alone.
        """
        return self._do(self.core.block(reason, next_action, key=key))

    def unblock(self, resolution: str, *, blocker_id: int | None = None, key: str | None = None) -> Outcome:
        """Clear blockers; the run returns to the state it was blocked from."""
        return self._do(self.core.unblock(resolution, blocker_id=blocker_id, key=key))

    def confirm(self, effect_key: str, outcome: str, *, note: str = "",
                attrs: Mapping[str, Any] | None = None) -> Outcome:
        """Record a side effect's outcome: done, or absent (it did not happen).

        A reconciliation after a lost worker: look at the world, then say what
        happened.
        """
        return self._do(self.core.confirm(effect_key, outcome, note=note, attrs=attrs))

    def submit(self, summary: str = "", *, key: str | None = None) -> Outcome:
        """Submit the result: the run moves to review (or succeeds when the contract needs
        none)."""
        return self._do(self.core.submit(summary, key=key))

    def effect_outcome(self, effect_key: str) -> dict[str, Any]:
        """What the ledger knows of a side effect's key: settled (and how), pending, or
        none.

        A resumed step asks before it starts a side effect again: settled means
        skip it, pending means look at the world and confirm first, none means
        start it.
        """
        return self._do(self.core.effect_outcome(effect_key))
    # --- end of generated code (Lease verbs) ---

    @contextmanager
    def effect(self, effect_key: str, what: str, **kw: Any) -> Iterator[EffectHandle]:
        """Record the side effect's start, run the block, then its outcome: ``done`` when
        the block ends normally (or as ``fx.done()``/``fx.absent()`` said). An exception
        leaves the outcome unknown (the world may have changed before it was raised) and
        the run needs reconciling, unless ``fx.absent(why)`` was said first."""
        self._do(self.core.effect_start(effect_key, what, **kw))
        fx = EffectHandle(effect_key)
        try:
            yield fx
        except BaseException:
            if fx.outcome == "absent":
                self._do(self.core.effect_confirm(fx))
            raise
        self._do(self.core.effect_confirm(fx))


def start(lg: Ledger, core: LeaseCore, key: str | None, on_lost: Callable[[Fence], None]) -> Fence:
    """Claim (or prove the adopted token with a heartbeat) and make the lease's fence."""
    run_id, worker = core.run_id, core.worker
    timeout = lg.checkpoint(run_id).policy.heartbeat_timeout_s
    check_margin(core.fence_margin_s, timeout, run_id)
    since = time.monotonic()
    if core.given is None:
        token = lg.claim(run_id, worker, key=key)
    else:
        token = core.given
        lg.heartbeat(run_id, token, worker=worker)  # StaleLease for a token that is not this run's lease
    timeout = lg.checkpoint(run_id).policy.heartbeat_timeout_s
    return Fence(lg, run_id, token, worker, timeout_s=timeout, interval_s=core.heartbeat_s,
                 margin_s=core.fence_margin_s, since=since, on_lost=on_lost)


__all__ = ["EffectHandle", "Fence", "Lease", "LeaseCore", "BeatThreads", "heartbeat_interval", "fence_margin",
           "record_end", "bounded_text", "MAX_STOP_TEXT"]
