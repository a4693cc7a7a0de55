"""``handoff demo``: the story the ledger exists for, played with real processes.

Workers are real ``handoff run`` wrappers around ``python -c`` agents that report through
the Python API; the owner's steps are real ``handoff`` commands; the watchdog is the
library's ``watch_once``. Every failure is injected with a real signal. The ledger is
left behind for the reader to explore.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from . import render
from .facade import Ledger
from .watchdog import Action, watch_once

MARK = ".handoff-demo"
#: demo-report's heartbeat timeout: how soon the watchdog revokes worker-a's lease once it is killed.
HEARTBEAT_TIMEOUT = 1.5
#: demo-stuck's progress timeout: how soon its still progress is flagged.
PROGRESS_TIMEOUT = 2.0
#: demo-stuck's heartbeat timeout. Its story is the stall, never a revocation, so a busy
#: machine that delays worker-c's beats must not end its lease first; no wait depends on it.
STUCK_HEARTBEAT_TIMEOUT = 10.0
#: How often the demo's watchdog runs a pass while the story waits.
WATCH_INTERVAL = 0.25
#: A step that a timeout fires is given this many times (timeout + one watchdog interval),
#: and at least this many watchdog passes, before the demo calls it failed: a loaded machine
#: (the demo's own process starved included) makes the story slower, not wrong.
PATIENCE = 20
#: The steps that are the processes' own work (starting Python, writing a section, a
#: 'handoff' command) have no timeout to derive a wait from. A wait on a worker ends at once,
#: with its log, if the worker exits; together they may take this long, a bound that only
#: stops a demo whose worker hangs alive.
WORK_BUDGET_S = 600.0
#: How long a wrapper gives its agent after SIGTERM before SIGKILL (``handoff run --grace``).
STOP_GRACE = 5.0
REPORT, STUCK = "demo-report", "demo-stuck"


def fired_within(timeout_s: float) -> float:
    """How long the demo waits for something ``timeout_s`` after its cause to be acted on."""
    return PATIENCE * (timeout_s + WATCH_INTERVAL)


def longest_s() -> float:
    """The longest the demo can run before it stops itself: its work budget and the bound of
    each wait for a timeout to fire (the revocation, the stall flag, worker-c's stop)."""
    return WORK_BUDGET_S + sum(map(fired_within, (HEARTBEAT_TIMEOUT, PROGRESS_TIMEOUT, STOP_GRACE)))

_COMMON = r"""
import os, sys, time
from handoff import Ledger, LedgerError
run, lease = os.environ["HANDOFF_RUN"], os.environ["HANDOFF_LEASE"]  # the token claim printed
files = sys.argv[1]
lg = Ledger(os.environ["HANDOFF_DB"])
def put(name, text):
    tmp = os.path.join(files, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(files, name))
def wait(name):
    while not os.path.exists(os.path.join(files, name)):
        time.sleep(0.02)
report = os.path.join(files, "report.md")
"""

WORKER_A = _COMMON + r"""
lg.transition(run, lease, "planning")
lg.progress(run, lease, "plan_committed", "outline: summary, timeline, follow-ups")
lg.transition(run, lease, "executing")
with open(report, "w") as f:
    f.write("# Incident 4711: checkout latency\n\n## Summary\n"
            "p99 checkout latency rose from 300 ms to 4 s for 38 minutes after a cache node failed.\n")
lg.progress(run, lease, "tool_outcome", "section 1 of 3 (summary) drafted")
put("a.ready", str(os.getpid()))
wait("a.go")
try:
    lg.progress(run, lease, "tool_outcome", "section 2 of 3 (timeline) drafted")
    verdict = "ACCEPTED (the ledger should have refused it)"
except LedgerError as e:
    verdict = f"{e.type}: {e.message}"
put("a.result", verdict)
"""

WORKER_B = _COMMON + r"""
p = lg.status(run)
done = [r.event.detail for r in lg.log(run)
        if r.type == "progress_recorded" and r.event.kind == "tool_outcome"]
if p["state"] != "executing":
    lg.transition(run, lease, "executing")
lg.progress(run, lease, "note", f"resuming at progress_seq {p['progress_seq']} after: {done[-1]}")
put("b.ready", f"progress_seq {p['progress_seq']}; last recorded step: {done[-1]}")
wait("b.go")
with open(report, "a") as f:
    f.write("\n## Timeline\n08:02 cache node lost; 08:05 alert; 08:31 node replaced; 08:40 recovered.\n"
            "\n## Follow-ups\n- alert on cache node loss within 1 minute\n- rehearse node replacement\n")
lg.progress(run, lease, "tool_outcome", "sections 2-3 of 3 (timeline, follow-ups) drafted")
lg.transition(run, lease, "verifying")
lg.artifact(run, lease, report, kind="result")
text = open(report).read()
n = text.count("\n## ")
lg.progress(run, lease, "verifier_result", f"{n} of 3 sections present")
lg.evidence(run, "structure", "pass" if n == 3 else "fail", f"{n} of 3 sections, {len(text)} bytes", lease=lease)
lg.submit(run, lease, "incident report: summary by worker-a, timeline and follow-ups by worker-b")
"""

WORKER_C = _COMMON + r"""
lg.transition(run, lease, "planning")
lg.progress(run, lease, "plan_committed", "poll the vendor API until the export is ready")
lg.transition(run, lease, "executing")
put("c.ready", "1")
while True:  # busy, never advancing: retries are activity, not progress
    time.sleep(0.7)
    lg.progress(run, lease, "tool_retry", "vendor API answered 503; retrying")
"""


class DemoFailed(Exception):
    """A step of the story did not happen in time."""


class _Story:
    def __init__(self, db: str, quiet: bool, out: Callable[[str], None]) -> None:
        self.db = os.path.abspath(db)
        self.files = os.path.splitext(self.db)[0] + "-files"
        self.quiet = quiet
        self.out = out
        self.procs: list[subprocess.Popen[Any]] = []
        self.stopped: list[int] = []
        self.actions: list[Action] = []
        self.shown: set[int] = set()
        self.lg: Ledger | None = None
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
        self.env = env
        self.t0 = time.monotonic()
        self.work_until = self.t0 + WORK_BUDGET_S

    def work_left(self) -> float:
        return max(0.0, self.work_until - time.monotonic())

    # --- plumbing ------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        if not self.quiet:
            self.out(text)

    def step(self, text: str) -> None:
        self.say(f"\n[{time.monotonic() - self.t0:4.1f}s] {text}")

    def handoff(self, *args: str) -> list[str]:
        # -P: the current directory is not put on the child's path, so a checkout's own
        # handoff/ folder (the README runs the demo from one) cannot shadow the install.
        return [sys.executable, "-P", "-m", "handoff.cli", "--db", self.db, *args]

    def shell(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a real 'handoff' command and show it as a user would type it."""
        self.say("  $ handoff " + " ".join(_quote(a) for a in args))
        try:
            done = subprocess.run(self.handoff(*args), env=self.env, capture_output=True, text=True,
                                  timeout=self.work_left())
        except subprocess.TimeoutExpired:
            raise DemoFailed(f"'handoff {args[0]}' did not finish within the demo's {WORK_BUDGET_S:g}s "
                             "for its processes' own work") from None
        for line in (done.stdout + done.stderr).strip().splitlines():
            self.say("    " + line)
        if done.returncode:
            self.say(f"    (exit {done.returncode})")
        return done

    def spawn_worker(self, run: str, worker: str, snippet: str, heartbeat_timeout: float) -> subprocess.Popen[Any]:
        log = open(os.path.join(self.files, f"{worker}.log"), "w")
        proc = subprocess.Popen(
            # Beats five times per timeout: a loaded machine must not make a live worker look dead.
            self.handoff("run", "--run", run, "--worker", worker, "--heartbeat-every", str(heartbeat_timeout / 5),
                         "--grace", str(STOP_GRACE), "--", sys.executable, "-P", "-c", snippet, self.files),
            env=self.env, stdout=log, stderr=subprocess.STDOUT,
            # A process group of its own, the agent inside it: cleanup ends both, even where
            # the wrapper is gone or was never asked to stop its agent.
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def path(self, name: str) -> str:
        return os.path.join(self.files, name)

    def read(self, name: str) -> str:
        with open(self.path(name)) as f:
            return f.read()

    def watch_pass(self) -> None:
        assert self.lg is not None
        self.actions.extend(watch_once(self.lg, name="demo-watchdog", interval_s=WATCH_INTERVAL))

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float | None = None, *,
                 workers: tuple[tuple[str, subprocess.Popen[Any] | int], ...] = (), watch: bool = True) -> None:
        """Poll ``cond`` until it holds, for at most ``timeout`` seconds (None: what is left of
        the work budget), running a watchdog pass every ``WATCH_INTERVAL`` meanwhile (unless
        ``watch`` is false).

        ``workers`` are (name, wrapper process or agent pid) that ``cond`` waits on: if one of
        them has ended, ``cond`` can no longer come true, so the demo stops at once and says
        where that worker's output is, instead of waiting out the timeout.

        A wait that watches gives up only once the watchdog has also had ``PATIENCE`` passes:
        what it waits for is a pass's doing, and a starved demo makes fewer of them.
        """
        if timeout is None:
            deadline = self.work_until
            within = f"the demo's {WORK_BUDGET_S:g}s for its processes' own work"
        else:
            deadline = time.monotonic() + timeout
            within = f"{timeout:g}s"
        next_pass, passes = 0.0, 0
        while not cond():
            for name, proc in workers:
                if not _alive(proc):
                    if cond():  # it finished its step just before it ended
                        return
                    raise DemoFailed(f"{what} did not happen: {name} ended first; see {self.path(name + '.log')}")
            now = time.monotonic()
            if now > deadline and (not watch or timeout is None or passes >= PATIENCE):
                raise DemoFailed(f"{what} did not happen within {within}")
            if watch and now >= next_pass:
                self.watch_pass()
                passes += 1
                next_pass = now + WATCH_INTERVAL
            time.sleep(0.02)

    def show_actions(self, run: str) -> None:
        for i, a in enumerate(self.actions):
            if a.run_id == run and a.outcome == "committed" and i not in self.shown:
                self.shown.add(i)
                self.say(f"  watchdog: {a.line()}")

    def committed(self, run: str, action: str) -> bool:
        return any(a.run_id == run and a.action == action and a.outcome == "committed" for a in self.actions)

    def cleanup(self) -> None:
        for pid in self.stopped:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:  # the wrapper and its agent: killing the wrapper alone would leave the agent running
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.lg is not None:
            self.lg.close()

    # --- the story -------------------------------------------------------------------

    def fresh(self) -> None:
        """Start from an empty ledger, but never overwrite anything the demo did not make."""
        if os.path.exists(self.db):
            from handoff.ledger.errors import LedgerError

            try:
                with Ledger(self.db, create=False) as old:
                    foreign = [h.run_id for h in old.store.list_runs()
                               if not h.run_id.startswith(("demo-", "watcher:demo-"))]
            except LedgerError as exc:
                raise DemoFailed(f"{self.db} exists and is not a demo ledger ({exc.message}); pass another --db") from None
            if foreign:
                raise DemoFailed(f"{self.db} holds runs the demo did not write ({', '.join(foreign[:3])}); "
                                 "pass another --db")
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.db + suffix):
                    os.remove(self.db + suffix)
        if os.path.exists(self.files):
            if not os.path.exists(os.path.join(self.files, MARK)):
                raise DemoFailed(f"{self.files} exists and was not made by the demo; pass another --db")
            shutil.rmtree(self.files)
        os.makedirs(self.files)
        with open(os.path.join(self.files, MARK), "w") as f:
            f.write("files of 'handoff demo'; safe to delete\n")

    def play(self) -> None:
        self.fresh()
        self.lg = lg = Ledger(self.db)
        rel = os.path.relpath(self.db)
        shown_db = rel if not rel.startswith("..") else self.db
        self.say(f"handoff demo: a fresh ledger at {shown_db}, worker files in {os.path.relpath(self.files)}/")

        self.step("The contracts are written before any worker starts.")
        os.makedirs(self.path("outbox"))  # the report's target: the ledger delivers into it (file://)
        lg.open(run_id=REPORT, goal="Write the incident report for INC-4711", origin="pagerduty:INC-4711",
                target="file://" + self.path("outbox"), owner="alice", result_path=self.path("report.md"), require_review=True,
                heartbeat_timeout_s=HEARTBEAT_TIMEOUT, progress_timeout_s=60.0)
        lg.open(run_id=STUCK, goal="Export last quarter's invoices from the vendor", origin="ticket:FIN-88",
                target="mail:finance@example.com", owner="bob",
                heartbeat_timeout_s=STUCK_HEARTBEAT_TIMEOUT, progress_timeout_s=PROGRESS_TIMEOUT, retry_budget=3)
        for run in (REPORT, STUCK):
            p = lg.status(run)
            self.say(f"  {run}: {p['goal']!r}, owner {p['owner']} -> target {p['target']}"
                     + (", review required" if p["require_review"] else ""))
        self.say(f"  {REPORT}'s worker must beat every {HEARTBEAT_TIMEOUT:g}s; "
                 f"{STUCK} must show progress every {PROGRESS_TIMEOUT:g}s")

        self.step("worker-a claims demo-report and starts; worker-c claims demo-stuck.")
        wrapper_a = self.spawn_worker(REPORT, "worker-a", WORKER_A, HEARTBEAT_TIMEOUT)
        wrapper_c = self.spawn_worker(STUCK, "worker-c", WORKER_C, STUCK_HEARTBEAT_TIMEOUT)
        # No watchdog pass until both agents are at work: a slow start (Python importing on a
        # busy machine) is not the stall this story shows, and must not be judged as one.
        self.wait_for("worker-a's first section and worker-c's start",
                      lambda: os.path.exists(self.path("a.ready")) and os.path.exists(self.path("c.ready")),
                      workers=(("worker-a", wrapper_a), ("worker-c", wrapper_c)), watch=False)
        for rec in lg.log(REPORT):
            if rec.type in ("lease_granted", "progress_recorded"):
                self.say(f"  seq {rec.seq:<3} {rec.actor:<16} {render.summarize(rec.event)}")

        self.step("worker-a is killed mid-run: SIGKILL to its wrapper, so its heartbeats stop;")
        pid_a = int(self.read("a.ready"))
        wrapper_a.send_signal(signal.SIGKILL)
        wrapper_a.wait()
        os.kill(pid_a, signal.SIGSTOP)
        self.stopped.append(pid_a)
        self.say(f"  its agent process (pid {pid_a}) is frozen with SIGSTOP, still holding the token of lease 1 in memory.")

        self.step("The watchdog sees the heartbeat stop and revokes the lease.")
        self.wait_for("the watchdog's revocation", lambda: self.committed(REPORT, "revoke_lease"),
                      fired_within(HEARTBEAT_TIMEOUT))
        self.show_actions(REPORT)

        self.step("worker-b claims demo-report and continues from the recorded progress.")
        wrapper_b = self.spawn_worker(REPORT, "worker-b", WORKER_B, HEARTBEAT_TIMEOUT)
        self.wait_for("worker-b's claim", lambda: os.path.exists(self.path("b.ready")),
                      workers=(("worker-b", wrapper_b),))
        cp = lg.checkpoint(REPORT)
        self.say(f"  worker-b holds lease {cp.lease}; it resumes at {self.read('b.ready')}")

        self.step("worker-a is resumed (SIGCONT) and tries a late write with its lease 1 token:")
        with open(self.path("a.go"), "w"):
            pass
        os.kill(pid_a, signal.SIGCONT)
        self.wait_for("worker-a's late write", lambda: os.path.exists(self.path("a.result")),
                      workers=(("worker-a", pid_a),))
        self.stopped.remove(pid_a)
        verdict = self.read("a.result")
        self.say(f"  refused, and nothing was written: {verdict}")
        if not verdict.startswith("StaleLease"):
            raise DemoFailed(f"worker-a's late write was not refused: {verdict}")

        with open(self.path("b.go"), "w"):
            pass
        self.step("demo-stuck keeps heart-beating (and retrying) while its progress stays still:")
        self.wait_for("the stall flag", lambda: self.committed(STUCK, "mark_stalled"),
                      fired_within(PROGRESS_TIMEOUT), workers=(("worker-c", wrapper_c),))
        self.show_actions(STUCK)
        p = lg.status(STUCK)
        self.say(f"  status says: {p['health']['classification']}: {p['health']['reason']}")
        wrapper_c.send_signal(signal.SIGTERM)
        try:  # the wrapper waits STOP_GRACE for its agent, then kills it and records the end
            wrapper_c.wait(timeout=fired_within(STOP_GRACE))
        except subprocess.TimeoutExpired:
            raise DemoFailed(f"worker-c's wrapper did not stop within {fired_within(STOP_GRACE):g}s of SIGTERM; "
                             f"see {self.path('worker-c.log')}") from None
        self.say("  SIGTERM to worker-c's wrapper is forwarded to its agent; the end is recorded, the lease released.")
        lg.close_run(STUCK, "failed", "stalled: heartbeats but no progress; vendor export never became ready", by="bob")
        self.say("  bob closes demo-stuck as failed.")

        self.step("worker-b finishes: artifact recorded (the ledger measures it), checked, submitted.")
        self.wait_for("worker-b's submission", lambda: wrapper_b.poll() is not None)
        if wrapper_b.returncode != 0:
            raise DemoFailed(f"worker-b failed (exit {wrapper_b.returncode}); see {self.path('worker-b.log')}")
        p = lg.status(REPORT)
        art = p["artifacts"][-1]
        with open(art["path"], "rb") as f:
            data = f.read()
        sha = hashlib.sha256(data).hexdigest()
        ok = sha == art["sha256"] and len(data) == art["bytes"]
        self.say(f"  artifact {os.path.relpath(art['path'])}: {art['bytes']} bytes, sha256 {art['sha256'][:16]}... "
                 + ("matches the file on disk" if ok else "DOES NOT MATCH the file on disk"))
        if not ok:
            raise DemoFailed("the artifact changed after it was recorded")
        ev = p["evidence"][-1]
        self.say(f"  evidence {ev['kind']}: {ev['outcome']} ({ev['detail']}); state {p['state']}")

        self.step("The owner reviews; the ledger delivers once into the outbox; a retried delivery sends nothing.")
        self.shell("review", REPORT, "--by", "alice", "--approve", "--notes", "timeline checks out")
        self.shell("deliver", REPORT, "--by", "alice", "--delivery-key", "inc-4711-report", "--send")
        retry = self.shell("deliver", REPORT, "--by", "alice", "--delivery-key", "inc-4711-report", "--send")
        if retry.returncode != 0 or "nothing sent" not in retry.stdout:
            raise DemoFailed("the retried delivery was not a no-op")
        sent = len(os.listdir(self.path("outbox")))
        self.say(f"  the outbox holds {sent} file: delivered exactly once.")
        problems = lg.verify()
        self.say("  handoff verify: " + ("hash chain and projections intact" if not problems and not lg.check()
                                         else f"{len(problems)} problem(s)"))

    def finale(self) -> None:
        assert self.lg is not None
        lg = self.lg
        out = self.out
        for run in (REPORT, STUCK):
            out(f"\n=== final packet: {run} ===")
            out(render.format_packet(lg.status(run)))
        rows = render.log_rows(lg.log(REPORT))
        beats = [r for r in rows if r["type"] == "heartbeat_recorded"]
        out(f"\n=== timeline: {REPORT} ({len(beats)} heartbeats not shown) ===")
        out(render.format_log([r for r in rows if r["type"] != "heartbeat_recorded"]))
        revoked = next((r["seq"] for r in rows if r["type"] == "lease_revoked"), 1)
        rel = os.path.relpath(self.db)
        db = rel if not rel.startswith("..") else self.db
        out(f"\nDone in {time.monotonic() - self.t0:.1f}s. The ledger stays in {db}; explore it with:")
        out(f"  handoff --db {_quote(db)} status {REPORT}")
        out(f"  handoff --db {_quote(db)} log {REPORT} --no-heartbeats")
        out(f"  handoff --db {_quote(db)} replay {REPORT} --at {revoked}")
        out(f"  handoff --db {_quote(db)} log --since 1 --no-heartbeats      # every run, in the order written")
        # The story ends where an incident review starts: the report, drawn by the same
        # renderer as 'handoff report', in the demo's own folder.
        doc = lg.write_report(REPORT, self.path(f"{REPORT}.html"), db_hint=f"--db {_quote(db)} ")
        shown = os.path.relpath(doc["path"])
        out(f"\nThe incident report of {REPORT} is in {shown if not shown.startswith('..') else doc['path']} "
            f"({doc['bytes'] // 1024} KiB, one self-contained file): open it in a browser.")


def _alive(proc: subprocess.Popen[Any] | int) -> bool:
    """Is this child (a Popen) or process (a pid: an agent whose wrapper was killed) still running?"""
    if not isinstance(proc, int):
        return proc.poll() is None
    try:
        os.kill(proc, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an orphan nobody has reaped yet is a zombie: ended, though its pid answers
        with open(f"/proc/{proc}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def play(db: str = "handoff-demo.db", *, quiet: bool = False, out: Callable[[str], None] | None = None) -> int:
    """Play the demo into ``db``; return the exit code (0 when every step happened)."""
    def echo(text: str) -> None:
        print(text, flush=True)

    story = _Story(db, quiet, out or echo)
    try:
        story.play()
        story.finale()
        return 0
    except DemoFailed as exc:
        print(f"Error: the demo stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        story.cleanup()


__all__ = ["play", "longest_s", "DemoFailed"]
