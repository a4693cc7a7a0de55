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

import collections
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
from handoff.ledger.store import LeaseToken

from .facade import Ledger
from .lease import NOTE_STATES, BeatThreads, Fence, bounded_text, check_margin, fence_margin, heartbeat_interval, record_end

#: How much of a failed child's stderr is recorded with its exit: its last lines, at most
#: this many characters (then bounded again, with the exit status, by ``lease.MAX_STOP_TEXT``).
TAIL_LINES = 5
TAIL_CHARS = 400

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


def _stop_child(child: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, then SIGKILL once ``grace_s`` has passed."""
    if child.poll() is not None:
        return
    try:
        child.terminate()
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
    except ProcessLookupError:
        pass


class _StderrTail(threading.Thread):
    """Passes the child's stderr through to ours as it comes and keeps its last lines, so a
    crash is recorded with what the child said last (``TAIL_LINES``, at most ``TAIL_CHARS``)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(name="handoff-run-stderr", daemon=True)
        self.stream = stream
        self.lines: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES + 1)

    def run(self) -> None:
        out = getattr(sys.stderr, "buffer", None)
        partial = b""
        while chunk := self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536):
            try:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    os.write(2, chunk)
            except (OSError, ValueError):
                out = None  # our stderr is gone: keep reading so the child never blocks on a full pipe
            parts = (partial + chunk).split(b"\n")
            partial = parts.pop()[-TAIL_CHARS:]
            self.lines.extend(p[-TAIL_CHARS:] for p in parts)
        if partial:
            self.lines.append(partial)

    def tail(self) -> str:
        kept = [line.decode("utf-8", "replace").rstrip() for line in self.lines if line.strip()][-TAIL_LINES:]
        text = " | ".join(kept)
        return text if len(text) <= TAIL_CHARS else "…" + text[-(TAIL_CHARS - 1):]


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
    forwarded to it. Its stderr is passed through, and the last lines kept. When it ends,
    the wrapper records how (a progress ``note`` while the run is being worked on, else
    ``worker_exit`` evidence; a failure with the end of its stderr, sanitized) and
    releases the lease. When the lease is lost it stops the child and writes nothing: a
    fenced worker's word is void.

    Self-fencing (``handoff.lease.Fence``, the rule every in-process lease follows too):
    when no heartbeat has been recorded for the run's heartbeat timeout less
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
        check_margin(fence_margin_s, timeout, run_id or "the new run")
        if run_id is None:
            run_id = lg.open(**(open_kwargs or {}))
            say(f"opened run {run_id}")
        claimed_at = time.monotonic()
        token = lg.claim(run_id, worker)
        lease = token.lease  # the number, for what the wrapper says; the token goes only to the child
        cp = lg.checkpoint(run_id)
        timeout = cp.policy.heartbeat_timeout_s
        interval = heartbeat_interval(timeout, heartbeat_s)
        margin = fence_margin(timeout, fence_margin_s)
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
            child = subprocess.Popen(list(argv), env=env, stderr=subprocess.PIPE)
        except OSError as exc:
            lg.release(run_id, token, f"could not start {argv[0]}: {exc.strerror}", worker=worker)
            result.released = True
            result.exit_code = 127 if isinstance(exc, FileNotFoundError) else 126
            result.returncode = result.exit_code
            say(f"cannot start {argv[0]!r}: {exc.strerror}; lease {lease} released")
            return result
        stderr = _StderrTail(child.stderr)
        stderr.start()

        def stop_child(fence: Fence) -> None:
            if fence.fenced:
                grace = min(grace_s, fence.margin_s / 2)
                say(f"no heartbeat recorded on {run_id} for {fence.silent_s:.2f}s (limit {fence.limit_s:g}s): "
                    f"the watchdog may soon give lease {lease} away, so the child is stopped now "
                    f"(SIGTERM, then SIGKILL after {grace:g}s)")
                _stop_child(child, grace)
            elif fence.lost:
                say(f"lost lease {lease} on {run_id} ({fence.lost_reason}); stopping the child "
                    f"(SIGTERM, then SIGKILL after {grace_s:g}s)")
                _stop_child(child, grace_s)

        fence = Fence(lg, run_id, token, worker, timeout_s=timeout, interval_s=heartbeat_s, margin_s=fence_margin_s,
                      since=claimed_at, on_lost=stop_child, say=say)
        beating = BeatThreads(fence)

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
        beating.start()
        try:
            rc = _wait(child)
        finally:
            # A beat stuck on an unreachable ledger must not keep the wrapper: the fence
            # path below waits for the ledger on its own terms.
            beating.stop(wait_s=0.1 if fence.fenced else None)
            for sig, old in handlers.items():
                signal.signal(sig, old)
        stderr.join(timeout=1.0)  # a grandchild may hold the pipe open: what came is enough

        if rc < 0:
            result.signal = _signame(-rc)
        else:
            result.exit_code = rc
        if fence.fenced:
            result.fenced, result.silent_s = True, round(fence.silent_s, 3)
            result.returncode = FENCED_EXIT
            _record_fence(lg, result, token, max(2 * timeout, 2.0), interval, say)
            return result
        if fence.lost:
            result.lease_lost, result.lost_reason = True, fence.lost_reason
            result.returncode = 1
            say(f"the child {result.describe()} after the lease was lost; nothing more recorded")
            return result
        result.returncode = rc if rc >= 0 else 128 - rc
        _record_end(lg, result, token, fence.released_by_holder, stderr.tail() if rc != 0 else "", say)
        return result


def _wait(child: subprocess.Popen[Any]) -> int:
    """The child's exit status; a short timeout keeps signal handlers running promptly."""
    while True:
        try:
            return child.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass


def _record_fence(lg: Ledger, result: WorkerResult, token: LeaseToken, wait_s: float,
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
            if cp.state in NOTE_STATES:
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


def _record_end(lg: Ledger, result: WorkerResult, token: LeaseToken, released_by_child: bool, tail: str,
                say: Callable[[str], None]) -> None:
    run_id, lease, worker = result.run_id, result.lease, result.worker
    text = f"child {result.describe()}"
    if result.forwarded:
        text += f" (after {', '.join(result.forwarded)} was forwarded to it)"
    said = text
    if tail:
        text = bounded_text(f"{text}; its stderr ended with: {tail}", lg, run_id)
    try:
        if released_by_child:
            result.released = True
            say(f"the {said}; the lease was already given back")
            return
        result.recorded = record_end(lg, run_id, token, worker, text, failed=result.exit_code != 0)
        if not result.recorded:
            say(f"the {said}; the lease was already given back")
            return
        result.released = True
        say(f"the {said}; recorded as {result.recorded} and lease {lease} released")
    except LedgerError as exc:
        say(f"the {said}; could not record it ({exc.message})")


__all__ = ["FENCED_EXIT", "WorkerResult", "run_wrapped"]
