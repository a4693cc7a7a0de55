"""``handoff run``: hold a lease for a child process, heartbeat while it lives, say how it ended.

The child does the work and reports progress, artifacts and its result itself, through the
CLI or the Python API, with the run and lease handed to it in its environment. The wrapper
only proves liveness. If the lease is lost (revoked, superseded, the run closed) the
wrapper stops the child at once: a replaced worker must not go on acting on the world.

It also fences itself. A wrapper that cannot record heartbeats (the ledger is locked, the
network is cut) cannot learn that the watchdog gave its lease away; the only safe thing is
to stop the child before the watchdog *could* have done so. The deadline is measured on
the wrapper's own monotonic clock from the moment the last recorded heartbeat was sent,
which is never later than the moment the ledger stamped it, so no clock of another host
is trusted (docs/reliability.md, "A worker cut off from the ledger").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from handoff.ledger.errors import InvalidInput, LedgerError, StaleLease, TerminalRun, UnknownRun
from handoff.ledger.store import Actor, LeaseToken
from handoff.reducers import transitions as T

from .api import Ledger

#: States in which a non-advancing "note" is accepted from the lease holder.
_NOTE_STATES = T.WORKING | {T.BLOCKED, T.UNKNOWN}
_SUBMITTED = frozenset({T.READY_FOR_REVIEW, T.SUCCEEDED})

#: What ``handoff run`` exits with when it stopped its child because no heartbeat could be
#: recorded for the heartbeat timeout less the fence margin (EX_TEMPFAIL: try again later).
FENCED_EXIT = 75


class WorkerResult(msgspec.Struct):
    """How a wrapped child ended, and what the wrapper did about the lease."""

    run_id: str
    worker: str
    lease: int
    exit_code: int | None = None  # the child's exit status, when it exited
    signal: str | None = None  # the signal that ended it, when one did
    lease_lost: bool = False
    lost_reason: str = ""
    released: bool = False  # the wrapper (or the child itself) gave the lease back
    fenced: bool = False  # stopped because no heartbeat was recorded in time (exit FENCED_EXIT)
    silent_s: float | None = None  # when fenced: seconds since the last recorded heartbeat was sent
    recorded: str = ""  # what was written about the end: "progress note", "evidence", ""
    forwarded: list[str] = msgspec.field(default_factory=list)
    returncode: int = 0  # what ``handoff run`` exits with

    def describe(self) -> str:
        if self.signal:
            return f"was ended by signal {self.signal}"
        return f"exited with code {self.exit_code}"


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _foreground() -> bool:
    """Are we the terminal's foreground job? Then a SIGINT came from the keyboard and
    already reached the child, which shares our process group."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class _Beater(threading.Thread):
    """Heartbeats for the child until stopped; stops the child when the lease is lost."""

    def __init__(self, lg: Ledger, run_id: str, token: LeaseToken, worker: str, interval_s: float,
                 child: subprocess.Popen[Any], grace_s: float, say: Callable[[str], None]) -> None:
        super().__init__(name=f"handoff-heartbeat-{run_id}", daemon=True)
        self.lg, self.run_id, self.worker = lg, run_id, worker
        self.token, self.lease = token, token.lease  # the token writes; the number is what is said
        self.interval_s, self.child, self.grace_s, self.say = interval_s, child, grace_s, say
        self.stop = threading.Event()
        self.lost = False
        self.lost_reason = ""
        self.released_by_child = False
        self._warned: set[str] = set()
        #: Monotonic time the last recorded heartbeat (or the claim) was sent: the ledger
        #: stamped it no earlier, so the watchdog's timeout cannot have started before it.
        self.last_ok = time.monotonic()
        self.fenced = False
        self.silent_s = 0.0

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            sent = time.monotonic()
            try:
                self.lg.heartbeat(self.run_id, self.token, worker=self.worker)
                self.last_ok = sent
            except (StaleLease, TerminalRun) as exc:
                self._lease_ended(exc)
                return
            except LedgerError as exc:  # locked past the timeout, disk full: try again next beat
                if exc.message not in self._warned:
                    self._warned.add(exc.message)
                    self.say(f"heartbeat not recorded ({exc.message}); retrying")

    def _lease_ended(self, exc: LedgerError) -> None:
        how = self._how_lease_ended()
        if how is not None and how[0] == "released" and how[1] == f"worker:{self.worker}":
            # The child gave the lease back itself ('handoff release'): nothing was lost.
            self.released_by_child = True
            return
        self.lost = True
        if how is None:
            self.lost_reason = exc.message
        else:
            kind, actor, reason = how
            self.lost_reason = f"lease {self.lease} was {kind} by {actor}" + (f": {reason}" if reason else "")
        self.say(f"lost lease {self.lease} on {self.run_id} ({self.lost_reason}); stopping the child "
                 f"(SIGTERM, then SIGKILL after {self.grace_s:g}s)")
        self._stop_child()

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

    def _stop_child(self, grace_s: float | None = None) -> None:
        if self.child.poll() is not None:
            return
        try:
            self.child.terminate()
            self.child.wait(timeout=self.grace_s if grace_s is None else grace_s)
        except subprocess.TimeoutExpired:
            self.child.kill()
        except ProcessLookupError:
            pass


def run_wrapped(
    db: str,
    argv: Sequence[str],
    *,
    worker: str,
    run_id: str | None = None,
    open_kwargs: dict[str, Any] | None = None,
    heartbeat_s: float | None = None,
    grace_s: float = 5.0,
    busy_timeout_s: float = 5.0,
    fence_margin_s: float | None = None,
    say: Callable[[str], None] | None = None,
) -> WorkerResult:
    """Open (or join) a run, claim it, run ``argv`` as a child and heartbeat while it lives.

    The child gets ``HANDOFF_DB``, ``HANDOFF_RUN``, ``HANDOFF_LEASE`` and
    ``HANDOFF_WORKER`` in its environment. SIGINT and SIGTERM sent to the wrapper are
    forwarded to it. When it ends, the wrapper records how (a progress ``note`` while the
    run is being worked on, else ``worker_exit`` evidence) and releases the lease. When the
    lease is lost it stops the child and writes nothing: a fenced worker's word is void.

    Self-fencing: when no heartbeat has been recorded for the run's heartbeat timeout less
    ``fence_margin_s`` (default: a quarter of the timeout), by the wrapper's own monotonic
    clock, the child is stopped (SIGTERM, then SIGKILL after the grace, cut to half the
    margin so it is dead before the watchdog may revoke). The wrapper then waits up to
    twice the heartbeat timeout for the ledger to answer, records the stop (a progress
    ``note`` and a release) if the lease is still its own, and returns ``FENCED_EXIT``.
    """
    say = say or (lambda msg: print(f"handoff run: {msg}", file=sys.stderr, flush=True))
    if not argv:
        raise InvalidInput("give the command to run after '--', e.g. handoff run ... -- python agent.py",
                           field="cmd")
    if fence_margin_s is not None and not fence_margin_s >= 0:
        raise InvalidInput(f"the fence margin must be 0 seconds or more, got {fence_margin_s!r}",
                           field="fence_margin")
    if "://" not in db:
        db = os.path.abspath(db)
    with Ledger(db, busy_timeout_s=busy_timeout_s, create=run_id is None) as lg:
        # The margin is checked against the run's heartbeat timeout before anything is written.
        from handoff.ledger.events import Policy

        timeout = ((open_kwargs or {}).get("heartbeat_timeout_s", Policy().heartbeat_timeout_s) if run_id is None
                   else lg.checkpoint(run_id).policy.heartbeat_timeout_s)
        _check_margin(fence_margin_s, timeout, run_id or "the new run")
        if run_id is None:
            run_id = lg.open(**(open_kwargs or {}))
            say(f"opened run {run_id}")
        claimed_at = time.monotonic()
        token = lg.claim(run_id, worker)
        lease = token.lease  # the number, for what the wrapper says; the token goes only to the child
        cp = lg.checkpoint(run_id)
        timeout = cp.policy.heartbeat_timeout_s
        interval = heartbeat_s or max(0.05, min(timeout / 3, 30.0))
        margin = timeout / 4 if fence_margin_s is None else fence_margin_s
        say(f"{worker} holds lease {lease} on {run_id}; heartbeat every {interval:g}s; the child is "
            f"stopped if no heartbeat is recorded for {timeout - margin:g}s")
        result = WorkerResult(run_id=run_id, worker=worker, lease=lease)
        env = dict(os.environ, HANDOFF_DB=db, HANDOFF_RUN=run_id, HANDOFF_LEASE=str(token), HANDOFF_WORKER=worker)
        # The child reports through 'handoff ...': make sure this installation's is found.
        bindir = os.path.dirname(sys.executable)
        path = env.get("PATH", "")
        if bindir not in path.split(os.pathsep):
            env["PATH"] = bindir + (os.pathsep + path if path else "")
        try:
            child = subprocess.Popen(list(argv), env=env)
        except OSError as exc:
            lg.release(run_id, token, f"could not start {argv[0]}: {exc.strerror}", worker=worker)
            result.released = True
            result.exit_code = 127 if isinstance(exc, FileNotFoundError) else 126
            result.returncode = result.exit_code
            say(f"cannot start {argv[0]!r}: {exc.strerror}; lease {lease} released")
            return result

        beater = _Beater(lg, run_id, token, worker, interval, child, grace_s, say)
        beater.last_ok = claimed_at

        def forward(signum: int, frame: Any) -> None:
            if signum == signal.SIGINT and _foreground():
                return  # the keyboard's SIGINT reached the child directly
            if child.poll() is None:
                try:
                    child.send_signal(signum)
                    result.forwarded.append(_signame(signum))
                except ProcessLookupError:
                    pass

        handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                handlers[sig] = signal.signal(sig, forward)
        beater.start()
        try:
            rc = _wait_or_fence(child, beater, timeout - margin, margin, grace_s, say)
        finally:
            beater.stop.set()
            # A beat stuck on an unreachable ledger must not keep the wrapper: the fence
            # path below waits for the ledger on its own terms.
            beater.join(timeout=None if not beater.fenced else 0.1)
            for sig, old in handlers.items():
                signal.signal(sig, old)

        if rc < 0:
            result.signal = _signame(-rc)
        else:
            result.exit_code = rc
        if beater.fenced:
            result.fenced, result.silent_s = True, round(beater.silent_s, 3)
            result.returncode = FENCED_EXIT
            _record_fence(lg, result, token, beater, max(2 * timeout, 2.0), interval, say)
            return result
        if beater.lost:
            result.lease_lost, result.lost_reason = True, beater.lost_reason
            result.returncode = 1
            say(f"the child {result.describe()} after the lease was lost; nothing more recorded")
            return result
        result.returncode = rc if rc >= 0 else 128 - rc
        _record_end(lg, result, token, beater.released_by_child, say)
        return result


def _check_margin(margin: float | None, timeout: float, run: str) -> None:
    if margin is not None and not 0 <= margin < timeout:
        raise InvalidInput(f"the fence margin ({margin:g}s) must be less than {run}'s heartbeat timeout "
                           f"({timeout:g}s): the child would be stopped before it could do anything. Give a "
                           "smaller --fence-margin, or leave it out (a quarter of the timeout)",
                           field="fence_margin")


def _wait_or_fence(child: subprocess.Popen[Any], beater: _Beater, limit_s: float, margin_s: float,
                   grace_s: float, say: Callable[[str], None]) -> int:
    """Wait for the child; stop it once no heartbeat was recorded for ``limit_s``."""
    while True:
        try:
            return child.wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            pass
        if beater.lost or beater.fenced:
            continue  # the child is being stopped; wait for it
        silent = time.monotonic() - beater.last_ok
        if silent >= limit_s:
            beater.fenced, beater.silent_s = True, silent
            grace = min(grace_s, margin_s / 2)
            say(f"no heartbeat recorded on {beater.run_id} for {silent:.2f}s (limit {limit_s:g}s): the "
                f"watchdog may soon give lease {beater.lease} away, so the child is stopped now "
                f"(SIGTERM, then SIGKILL after {grace:g}s)")
            beater._stop_child(grace)


def _record_fence(lg: Ledger, result: WorkerResult, token: LeaseToken, beater: _Beater, wait_s: float,
                  interval_s: float, say: Callable[[str], None]) -> None:
    """After a fence: once the ledger answers, record why the child was stopped and give the
    lease back, if it is still ours; if the watchdog took it meanwhile, record nothing."""
    run_id, worker = result.run_id, result.worker
    text = (f"child stopped by the wrapper ({result.describe()}): no heartbeat could be recorded for "
            f"{result.silent_s:g}s, so it could no longer prove it held lease {result.lease}")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cp = lg.checkpoint(run_id)
            if cp.lease != result.lease or cp.terminal:
                result.lease_lost, result.lost_reason = True, f"lease {result.lease} ended while the ledger was out of reach"
                say(f"the ledger answers again: {result.lost_reason}; nothing recorded (exit {FENCED_EXIT})")
                return
            if cp.state in _NOTE_STATES:
                lg.progress(run_id, token, "note", text, worker=worker)
                result.recorded = "progress note"
            else:
                result.recorded = "release reason"
            lg.release(run_id, token, text, worker=worker)
            result.released = True
            say(f"the ledger answers again: recorded as {result.recorded} and lease {result.lease} "
                f"released (exit {FENCED_EXIT})")
            return
        except (StaleLease, TerminalRun, UnknownRun) as exc:
            result.lease_lost, result.lost_reason = True, exc.message
            say(f"the ledger answers again: {exc.message}; nothing recorded (exit {FENCED_EXIT})")
            return
        except LedgerError as exc:
            if time.monotonic() >= deadline:
                say(f"the ledger did not answer within {wait_s:g}s after the fence ({exc.message}); "
                    f"nothing recorded (exit {FENCED_EXIT})")
                return
            time.sleep(interval_s)


def _record_end(lg: Ledger, result: WorkerResult, token: str, released_by_child: bool,
                say: Callable[[str], None]) -> None:
    run_id, lease, worker = result.run_id, result.lease, result.worker
    text = f"child {result.describe()}"
    if result.forwarded:
        text += f" (after {', '.join(result.forwarded)} was forwarded to it)"
    try:
        cp = lg.checkpoint(run_id)
        if released_by_child or cp.lease != lease:
            result.released = released_by_child
            say(f"the {text}; the lease was already given back")
            return
        if cp.state in _NOTE_STATES:
            lg.progress(run_id, token, "note", text, worker=worker)
            result.recorded = "progress note"
        elif result.exit_code != 0 and cp.state in _SUBMITTED:
            # A worker that fails after submitting puts its result in doubt: "fail" evidence
            # holds delivery until someone looks (a later pass of worker_exit clears it).
            lg.evidence(run_id, "worker_exit", "fail", text, lease=token, actor=Actor("worker", worker))
            result.recorded = "evidence"
        else:
            # Queued (nothing started) or a clean exit after submit: the release says it.
            result.recorded = "release reason"
        lg.release(run_id, token, text, worker=worker)
        result.released = True
        say(f"the {text}; recorded as {result.recorded} and lease {lease} released")
    except (StaleLease, TerminalRun) as exc:
        say(f"the {text}; could not record it ({exc.message})")
    except LedgerError as exc:
        say(f"the {text}; could not record it ({exc.message})")


__all__ = ["WorkerResult", "run_wrapped"]
