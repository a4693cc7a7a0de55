"""Fleet scenarios (issue 44): what keeping N live runs alive costs, on SQLite
(``fleet-live``) and PostgreSQL (``pg-fleet-live``).

A fleet of N runs (10,000; quick: a few hundred), each opened, claimed and executing, is
driven in compressed time the way its workers and one watchdog would drive it at the
default policy: a heartbeat per run every 20 s (a third of the 60 s heartbeat timeout,
``handoff.lease``'s default period), so N/20 beats a second; a progress step every 10 s
from a busy tenth of the runs; and a watchdog pass (``handoff.watchdog.watch_once`` with
its ``Sightings``, what ``handoff watch`` does each interval) every 5 s, in a process of
its own, as a dry run (the same scan, nothing recorded: runs it would act on are
counted, so a driver that falls behind cannot shrink the fleet under the measurement).
Before that, every run beats once (untimed; see ``_prime``: the fleet is brought to the
steady state of workers that beat from their claim on). Then, flat out, the same process
beats round-robin as fast as it can: that rate is the timed figure (one process's
capacity). Last, a simulated hour on a few of the runs, under a settable clock: 180
beats each (the hour's worth at one per 20 s), and 360 steps for the busy ones, counting
the events written and the bytes stored per run-hour.

Why so: after issue 44 a heartbeat usually writes no event (it refreshes a liveness row
fenced by the lease token, without fsync) and only some beats are chained
(``heartbeat_recorded``); before it, every beat is a full durable command. The scenario
calls the public ``Ledger.heartbeat(run, token)`` and reads only what both versions
have (``Outcome.result.outcome``, ``store.head``), so it measures either.

Sides. handoff-ledger: this checkout, in a child process. Today's code: the same driver
against commit f43230d (the main before issue 44), unpacked once with ``git archive`` into
``~/.cache/handoff-bench/before-44-f43230d`` (``$HANDOFF_BENCH_CACHE`` or
``$XDG_CACHE_HOME`` move it) and imported from there (``PYTHONPATH``); without git or
that commit (a shallow clone) the side says why and the scenario goes on. The floor: one
raw ``UPDATE`` of a run's liveness row per beat, fenced by lease and token digest, one
statement and one commit each, at the durability the new heartbeat chooses (no fsync per
commit: SQLite WAL with ``synchronous=NORMAL``; PostgreSQL ``synchronous_commit=off``).

This file is also the children's program: ``python benchmarks/bench_fleet.py TASK JSON``
(tasks ``build``, ``drive``, ``watch``) imports only the standard library and whichever
``handoff`` its ``PYTHONPATH`` names, so one driver measures both versions alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__:  # imported as benchmarks.bench_fleet; run as a file, only the driver is used
    from .common import REPO, expect, path_in
    from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register
    from .postgres_server import Schema
    from .postgres_server import unavailable as pg_unavailable

AREA = "fleet"
BEFORE_COMMIT = "f43230d"
BEFORE = "handoff-ledger, every beat a command"
SCRIPT = Path(__file__).resolve()

#: The default policy the fleet runs under (ledger/events.py Policy, handoff/lease.py,
#: handoff watch --interval).
HEARTBEAT_TIMEOUT_S = 60.0
BEAT_EVERY_S = HEARTBEAT_TIMEOUT_S / 3
WATCH_INTERVAL_S = 5.0
#: An idle-but-alive worker makes no progress for long stretches; a day's progress
#: timeout keeps the watchdog from (rightly) calling such runs stalled, so its pass sees
#: a healthy fleet, which is what its steady cost is about.
PROGRESS_TIMEOUT_S = 86_400.0
BUSY_EVERY = 10  # one run in ten is busy...
STEP_EVERY_S = 10.0  # ...and records a step every 10 s
HOUR_S = 3600.0


# --- the children (no harness imports: this part runs against either handoff) ---------


def _check_code(code_root: str) -> None:
    """Refuse to measure a handoff other than the one asked for (an installed copy
    found before PYTHONPATH would make both sides measure the same code)."""
    import handoff

    got = os.path.realpath(handoff.__file__)
    if not got.startswith(os.path.realpath(code_root) + os.sep):
        raise SystemExit(f"bench_fleet child: imported handoff from {got}, expected it under {code_root}")


def _run_id(r: int) -> str:
    return f"fleet-{r:06d}"


def _build(args: dict[str, Any]) -> dict[str, Any]:
    """Open, claim and move N runs to executing, at the set-up address (no fsync per
    commit); write their tokens to ``args['tokens']``. Untimed set-up."""
    from handoff.facade import Ledger

    runs = args["runs"]
    tokens = []
    t0 = time.perf_counter()
    with Ledger(args["setup_url"]) as lg:
        for r in range(runs):
            run_id = _run_id(r)
            lg.open(goal="fleet benchmark run", target="file:out/result.json", owner=f"owner-{r:06d}",
                    run_id=run_id, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                    progress_timeout_s=PROGRESS_TIMEOUT_S)
            token = lg.claim(run_id, f"worker-{r:06d}")
            lg.transition(run_id, token, "planning", worker=f"worker-{r:06d}")
            lg.transition(run_id, token, "executing", worker=f"worker-{r:06d}")
            tokens.append(str(token))
    with open(args["tokens"], "w") as f:
        json.dump(tokens, f)
    return {"runs": runs, "seconds": time.perf_counter() - t0}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    v = sorted(xs)
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _watch(args: dict[str, Any]) -> dict[str, Any]:
    """A watchdog process: after "go" on stdin, one ``watch_once`` pass (with the
    ``Sightings`` that ``watch_forever`` keeps) at each interval, for ``duration_s``.

    Passes are dry runs: the same scan and classification, nothing recorded. A real
    watchdog would revoke the lease of a run whose driver fell behind (a side that
    cannot keep N runs beating, or a set-up slower than the heartbeat timeout), and the
    fleet would shrink under the measurement; instead, what it would have done is
    counted (``would_act``), and a healthy fleet gives 0."""
    from handoff.facade import Ledger
    from handoff.watchdog import Sightings, watch_once

    interval, duration = args["interval_s"], args["duration_s"]
    with Ledger(args["url"]) as lg:
        sightings = Sightings()
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        passes, cpus, would_act = [], [], 0
        k = 0
        while True:
            due = start + k * interval
            if due > start + duration:
                break
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # the watchdog's own schedule, not a guess at a race
            c0, t0 = time.process_time(), time.perf_counter()
            actions = watch_once(lg, name="bench-watchdog", interval_s=interval, sightings=sightings,
                                 dry_run=True)
            passes.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            would_act += sum(1 for a in actions if a.outcome == "would_commit")
            k += 1
    return {"passes": passes, "cpu": cpus, "would_act": would_act}


def _spawn_self(task: str, args: dict[str, Any], code_root: str, **popen: Any) -> subprocess.Popen:
    """Run this file as a child against the handoff under ``code_root``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = code_root
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # never write .pyc files into either checkout
    args = {**args, "code_root": code_root}
    return subprocess.Popen([sys.executable, str(SCRIPT), task, json.dumps(args)], env=env,
                            cwd=args.get("cwd") or None, **popen)


def _stored_bytes(url: str) -> int:
    """What the ledger holds on disk: for SQLite, the used pages of every database file
    beside it (WAL frames included, free pages not); for PostgreSQL, the total size of
    the relations in the session's schema (indexes and TOAST included)."""
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'm')").fetchone()
        return int(row[0])
    import sqlite3

    total = 0
    d = Path(url).parent
    for p in sorted(d.iterdir()):
        if p.name.endswith(("-wal", "-shm", "-journal")) or not p.is_file():
            continue
        with open(p, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                continue
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            size = conn.execute("PRAGMA page_size").fetchone()[0]
        finally:
            conn.close()
        total += (pages - free) * size
    return total


class _Clock:
    """A settable clock (µs) for the simulated hour."""

    def __init__(self, now_us: int) -> None:
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us


def _hour(args: dict[str, Any], tokens: list[str], busy: bool) -> dict[str, float]:
    """One simulated hour on ``hour_runs`` runs: a beat every 20 s (180), and for busy
    runs a step every 10 s (360), under a clock moved by hand. Returns events and bytes
    per run-hour. Each run first beats once at the hour's start, unmeasured, as a worker
    that has been beating all along has."""
    from handoff.facade import Ledger
    from handoff.ledger.store import now_us

    m = args["hour_runs"]
    first = m if busy else 0
    runs = [(_run_id(r), tokens[r]) for r in range(first, first + m)]
    clock = _Clock(max(now_us(), args.get("clock_from_us", 0)) + 1_000_000)
    with Ledger(args["hour_url"], clock=clock) as lg:
        for run_id, token in runs:
            lg.heartbeat(run_id, token)
        before_seq = {run_id: lg.store.head(run_id).last_seq for run_id, _ in runs}
        before_bytes = _stored_bytes(args["url"])
        start = clock.now_us
        ticks = int(HOUR_S / STEP_EVERY_S)  # 10 s ticks: 360
        per_beat = int(BEAT_EVERY_S / STEP_EVERY_S)  # a beat every second tick
        for t in range(1, ticks + 1):
            clock.now_us = start + int(t * STEP_EVERY_S * 1e6)
            for run_id, token in runs:
                if busy:
                    lg.progress(run_id, token, "tool_outcome", f"hour step {t}: ran the tool")
                if t % per_beat == 0:
                    lg.heartbeat(run_id, token)
        events = sum(lg.store.head(run_id).last_seq - before_seq[run_id] for run_id, _ in runs)
        grown = _stored_bytes(args["url"]) - before_bytes
        args["clock_from_us"] = clock.now_us
    return {"events": events / m, "bytes": grown / m}


def _prime(heartbeat: Any, ids: list[str], tokens: list[str]) -> tuple[list[int], dict[str, float]]:
    """Every run beats once, and none falls silent for longer than a beat period while
    the others get theirs; returns the order the runs were last beaten in (oldest
    first, the order the paced cycle then follows) and what the prime's first beats cost.

    Why: a fleet's runs were claimed minutes before (set-up), so each one's first beat
    follows a long silence and writes a chained event. Beaten once in turn, the first
    runs would be silent again for as long as the whole prime took, which on a slow
    backend exceeds half the heartbeat timeout: their next beats would be chained too,
    and the fleet would never reach the steady state a real one is in (a worker beats
    from its claim on). So runs already primed are beaten again when a beat period has
    passed, as their workers would. Code that writes every beat anyway (today's) gains
    nothing from that, and is left to the single pass: the first re-beat that writes an
    event stops the upkeep."""
    from collections import deque

    clock = time.perf_counter
    live: deque[tuple[float, int]] = deque()  # (last beat, run), oldest first
    upkeep = True
    first_s = 0.0
    written = 0
    for r in range(len(ids)):
        t0 = clock()
        written += heartbeat(ids[r], tokens[r]).result.outcome == "committed"
        t1 = clock()
        first_s += t1 - t0
        live.append((t1, r))
        # At most one round of upkeep per new run, so the prime ends even when the
        # backend cannot keep every run fresh.
        for _ in range(len(live)):
            if not upkeep or t1 - live[0][0] <= BEAT_EVERY_S:
                break
            _, q = live.popleft()
            if heartbeat(ids[q], tokens[q]).result.outcome == "committed":
                upkeep = False
            t1 = clock()
            live.append((t1, q))
    n = len(ids)
    return [r for _, r in live], {"first_beat_ms": first_s / n * 1e3, "first_chained_pct": 100.0 * written / n}


def _drive(args: dict[str, Any]) -> dict[str, Any]:
    """The fleet, as docs/performance.md and this module's docstring describe: prime,
    paced (with a watchdog process), flat out (timed), simulated hour."""
    from handoff.facade import Ledger
    from handoff.ledger.errors import LedgerError

    with open(args["tokens"]) as f:
        tokens: list[str] = json.load(f)
    runs = len(tokens)
    ids = [_run_id(r) for r in range(runs)]
    out: dict[str, Any] = {}
    lg = Ledger(args["url"])
    try:
        heartbeat, progress = lg.heartbeat, lg.progress
        # 1. Prime, untimed: every worker beats once, as a live worker just has.
        order, primed = _prime(heartbeat, ids, tokens)
        out["prime"] = primed

        # 2. Paced: the fleet's own rate, a watchdog process beside it.
        paced_s = args["paced_s"]
        beat_gap = BEAT_EVERY_S / runs
        busy = list(range(0, runs, BUSY_EVERY))
        step_gap = STEP_EVERY_S / len(busy)
        ops: list[tuple[float, int, int]] = []  # (due, 0 beat / 1 step, run)
        n_beats = int(paced_s / beat_gap)
        ops.extend((i * beat_gap, 0, order[i % runs]) for i in range(n_beats))
        ops.extend((i * step_gap, 1, busy[i % len(busy)]) for i in range(int(paced_s / step_gap)))
        ops.sort()
        watcher = _spawn_self("watch", {"url": args["url"], "interval_s": args["watch_interval_s"],
                                        "duration_s": paced_s},
                              args["code_root"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert watcher.stdout is not None and watcher.stdin is not None
        if watcher.stdout.readline().strip() != "ready":
            watcher.wait()
            raise SystemExit(f"the watchdog child exited with {watcher.returncode} before it was ready")
        watcher.stdin.write("go\n")
        watcher.stdin.flush()
        cpu = {0: 0.0, 1: 0.0}
        count = {0: 0, 1: 0}
        refused = 0
        behind = 0.0
        tt, clock = time.thread_time, time.perf_counter
        start = clock()
        try:
            for due, kind, r in ops:
                late = clock() - start - due
                if late < 0:
                    time.sleep(-late)  # keeping to the fleet's schedule
                else:
                    behind = max(behind, late)
                c0 = tt()
                try:
                    if kind == 0:
                        heartbeat(ids[r], tokens[r])
                    else:
                        progress(ids[r], tokens[r], "tool_outcome", f"step at {due:.3f}s: ran the tool")
                except LedgerError:
                    refused += 1
                cpu[kind] += tt() - c0
                count[kind] += 1
        except BaseException:
            watcher.kill()  # a failed drive leaves no watchdog behind
            watcher.wait()
            raise
        paced_wall = clock() - start
        # The watchdog ends on its own schedule (paced_s); a minute past it, it is stuck.
        wout = watcher.communicate(timeout=paced_s + 60)[0]
        if watcher.returncode != 0 or not wout.strip():
            raise SystemExit(f"the watchdog child exited with {watcher.returncode} (its error is above)")
        wreport = json.loads(wout.strip().splitlines()[-1])
        passes = wreport["passes"]
        out["paced"] = {
            "beats": count[0], "steps": count[1], "refused": refused, "wall_s": paced_wall,
            "due_s": paced_s, "behind_s": behind,
            "cpu_us_per_beat": cpu[0] / max(1, count[0]) * 1e6,
            "cpu_us_per_step": cpu[1] / max(1, count[1]) * 1e6,
            "scan_first_s": passes[0] if passes else None,
            # A watchdog keeps its Sightings for its life: passes after the first are its
            # steady state (the first also learns every run's policy).
            "scan_p50_s": _pct(passes[1:] or passes, 50), "scan_p95_s": _pct(passes[1:] or passes, 95),
            "scan_passes": len(passes), "watchdog_would_act": wreport["would_act"],
        }

        # 3. Flat out, timed: round-robin beats, at most n or budget_s.
        meter = None
        if args.get("pg_db_url"):
            meter = _cpu_meter(args["pg_db_url"])
        n, budget = args["n"], args["budget_s"]
        lat: list[float] = []
        written = 0
        refused = 0
        if meter is not None:
            meter.start()
        c0 = time.process_time()
        t_start = clock()
        deadline = t_start + budget
        for i in range(n):
            r = order[(n_beats + i) % runs]  # on from where the paced cycle stopped
            t0 = clock()
            try:
                o = heartbeat(ids[r], tokens[r])
                written += o.result.outcome == "committed"
            except LedgerError:
                refused += 1
            t1 = clock()
            lat.append(t1 - t0)
            if t1 > deadline and i >= 19:
                break
        flat_wall = clock() - t_start
        flat_cpu = time.process_time() - c0
        done = len(lat)
        out["flat"] = {
            "beats": done, "seconds": sum(lat), "wall_s": flat_wall, "refused": refused,
            "cpu_us_per_beat": flat_cpu / done * 1e6, "chained_pct": 100.0 * written / done,
            "latencies": lat,
        }
        if meter is not None:
            server = meter.stop(done).get("server_cpu_us")
            meter.close()
            if server is not None:
                out["flat"]["server_cpu_us_per_beat"] = server
    finally:
        lg.close()

    # 4. The simulated hour: events and bytes per run-hour, idle and busy.
    if args["hour_runs"]:
        out["idle_hour"] = _hour(args, tokens, busy=False)
        out["busy_hour"] = _hour(args, tokens, busy=True)
    return out


def _cpu_meter(db_url: str) -> Any:
    """benchmarks/postgres_server.CpuMeter, loaded from its file (this child runs without
    the benchmarks package): the backends' CPU time, read from /proc."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_pg_server", SCRIPT.with_name("postgres_server.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CpuMeter(db_url)


def _child_main(argv: list[str]) -> int:
    task, args = argv[0], json.loads(argv[1])
    _check_code(args["code_root"])
    report = {"build": _build, "drive": _drive, "watch": _watch}[task](args)
    print(json.dumps(report), flush=True)
    return 0


# --- today's code: a checkout of f43230d, unpacked once ----------------------------------


def _cache_root() -> Path:
    base = os.environ.get("HANDOFF_BENCH_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "handoff-bench"


_BEFORE: dict[str, Any] = {}


def before_checkout() -> tuple[str | None, str | None]:
    """(directory holding f43230d's tree, None) or (None, why it cannot be had).

    ``git archive`` of the commit, unpacked beside its final name and renamed into place,
    so a run killed half-way leaves no half tree behind to be taken for a whole one. Read
    only: nothing in the repository (index, worktrees, refs) is touched."""
    if "result" in _BEFORE:
        return _BEFORE["result"]
    import shutil
    import tarfile
    import tempfile

    dest = _cache_root() / f"before-44-{BEFORE_COMMIT}"
    result: tuple[str | None, str | None]
    if (dest / "handoff" / "__init__.py").is_file():
        result = (str(dest), None)
    elif shutil.which("git") is None:
        result = (None, "git not found: cannot check out today's code")
    else:
        ok = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{BEFORE_COMMIT}^{{commit}}"],
                            capture_output=True)
        if ok.returncode != 0:
            result = (None, f"commit {BEFORE_COMMIT} not in this clone (shallow?): today's code not measured")
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".before-44-", dir=dest.parent))
            try:
                with tempfile.TemporaryFile() as tar:
                    subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", BEFORE_COMMIT],
                                   stdout=tar, check=True)
                    tar.seek(0)
                    with tarfile.open(fileobj=tar) as tf:
                        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                            tf.extractall(tmp, filter="data")
                        else:
                            tf.extractall(tmp)
                try:
                    tmp.rename(dest)
                except OSError:  # another run put it there first
                    shutil.rmtree(tmp, ignore_errors=True)
                result = (str(dest), None)
            except (OSError, subprocess.CalledProcessError, tarfile.TarError) as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                result = (None, f"could not unpack {BEFORE_COMMIT}: {exc}")
    _BEFORE["result"] = result
    return result


def _before_unavailable() -> str | None:
    return before_checkout()[1]


# --- the sides (parent) --------------------------------------------------------------------


def _run_child(task: str, args: dict[str, Any], code_root: str) -> dict[str, Any]:
    proc = _spawn_self(task, args, code_root, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench_fleet child {task} ({code_root}) exited with {proc.returncode}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"bench_fleet child {task} ({code_root}) printed no report")
    return json.loads(lines[-1])


def _figures(rep: dict[str, Any]) -> dict[str, float]:
    """The metrics a handoff side reports, from its driver's JSON."""
    p, f = rep["paced"], rep["flat"]
    m: dict[str, float] = {
        "cpu_us_per_beat": f["cpu_us_per_beat"],
        "beats_chained_pct": f["chained_pct"],
        "paced_cpu_us_per_beat": p["cpu_us_per_beat"],
        "paced_cpu_us_per_step": p["cpu_us_per_step"],
        "paced_behind_ms": p["behind_s"] * 1e3,
        "paced_refused": p["refused"],
        "watchdog_would_act": p["watchdog_would_act"],
    }
    if "prime" in rep:  # a beat after a long silence: the chained path's cost
        m["first_beat_ms"] = rep["prime"]["first_beat_ms"]
    if "server_cpu_us_per_beat" in f:
        m["server_cpu_us_per_beat"] = f["server_cpu_us_per_beat"]
    for k in ("scan_first", "scan_p50", "scan_p95"):
        if p[f"{k}_s"] is not None:
            m[f"{k}_ms"] = p[f"{k}_s"] * 1e3
    for kind in ("idle", "busy"):
        h = rep.get(f"{kind}_hour")
        if h:
            m[f"events_per_{kind}_run_hour"] = h["events"]
            m[f"bytes_per_{kind}_run_hour"] = round(h["bytes"])
    return m


def _drive_args(ctx: Ctx, url: str, hour_url: str, tokens: str, code_root: str, **more: Any) -> dict[str, Any]:
    p = ctx.params
    return {"url": url, "hour_url": hour_url, "tokens": tokens, "code_root": code_root, "n": p["n"],
            "budget_s": p["budget_s"], "paced_s": p["paced_s"], "watch_interval_s": p["watch_interval_s"],
            "hour_runs": p["hour_runs"], "cwd": str(ctx.dir), **more}


def _handoff_trial(ctx: Ctx, args: dict[str, Any], code_root: str, close: Any = None) -> Trial:
    out: dict[str, Any] = {}

    def run() -> Measured:
        if ctx.profiling and code_root == str(REPO):
            # In-process, so the profiler sees it; the paced phase (mostly waiting) and the
            # simulated hour are left out, so the profile is the prime and the flat-out beats.
            rep = _drive({**args, "paced_s": 0.0, "hour_runs": 0})
        else:
            rep = _run_child("drive", args, code_root)
        out.update(rep)
        flat = rep["flat"]
        return Measured(seconds=flat["seconds"], latencies=flat["latencies"], metrics=_figures(rep))

    def check() -> None:
        flat = out["flat"]
        expect("refused flat-out beats", flat["refused"], 0)
        if flat["beats"] < 20:
            raise RuntimeError(f"only {flat['beats']} flat-out beats were made")
        if out["paced"]["beats"] == 0:
            raise RuntimeError("the paced phase made no beats")

    return Trial(run, check, close)


# SQLite ------------------------------------------------------------------------------------


def _sqlite_fleets(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Build the fleet once per code version (this checkout, and f43230d when it can be
    had): trials copy it. Built at synchronous=NORMAL, untimed."""
    fleets: dict[str, Any] = {}
    roots = {"subject": str(REPO)}
    before, _why = before_checkout()
    if before is not None:
        roots["before"] = before
    for side, root in roots.items():
        sd = d / side / "db"
        sd.mkdir(parents=True)
        db = sd / "ledger.db"
        tokens = d / side / "tokens.json"
        _run_child("build", {"setup_url": f"sqlite:///{db}?synchronous=NORMAL", "runs": params["runs"],
                             "tokens": str(tokens), "code_root": root}, root)
        fleets[side] = {"dir": str(sd), "tokens": str(tokens), "root": root}
    return fleets


def _sqlite_handoff(which: str):
    def prepare(ctx: Ctx) -> Trial:
        import shutil

        fleet = ctx.fixture[which]
        d = ctx.dir / "db"
        shutil.copytree(fleet["dir"], d)
        db = d / "ledger.db"
        args = _drive_args(ctx, str(db), f"sqlite:///{db}?synchronous=NORMAL", fleet["tokens"], fleet["root"])
        return _handoff_trial(ctx, args, fleet["root"])

    return prepare


_RAW_SCHEMA = ("CREATE TABLE liveness (run_id TEXT PRIMARY KEY, lease INTEGER NOT NULL, "
               "token_digest BLOB NOT NULL, beat_us INTEGER NOT NULL, beats INTEGER NOT NULL)")
_RAW_UPDATE = ("UPDATE liveness SET beat_us = ?, beats = beats + 1 "
               "WHERE run_id = ? AND lease = ? AND token_digest = ?")


def _raw_rows(runs: int) -> list[tuple[str, int, bytes, int, int]]:
    import hashlib

    return [(_run_id(r), 1, hashlib.sha256(f"secret-{r}".encode()).digest(), 0, 0) for r in range(runs)]


def _raw_loop(execute: Any, sql: str, rows: list[tuple[str, int, bytes, int, int]],
              params: dict[str, Any]) -> Measured:
    """Round-robin UPDATEs, at most n or budget_s (as the handoff sides' flat-out part)."""
    n, budget, runs = params["n"], params["budget_s"], len(rows)
    lat: list[float] = []
    clock = time.perf_counter
    c0 = time.process_time()
    deadline = clock() + budget
    for i in range(n):
        run_id, lease, digest, _, _ = rows[i % runs]
        t0 = clock()
        execute(sql, (time.time_ns() // 1000, run_id, lease, digest))
        t1 = clock()
        lat.append(t1 - t0)
        if t1 > deadline and i >= 19:
            break
    cpu = (time.process_time() - c0) / len(lat) * 1e6
    return Measured(seconds=sum(lat), latencies=lat, metrics={"cpu_us_per_beat": cpu})


def _sqlite_raw(ctx: Ctx) -> Trial:
    import sqlite3

    conn = sqlite3.connect(path_in(ctx.dir, "raw.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(_RAW_SCHEMA)
    rows = _raw_rows(ctx.params["runs"])
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO liveness VALUES (?, ?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    if conn.execute("PRAGMA synchronous").fetchone()[0] != 1:  # 1 == NORMAL
        raise RuntimeError("the raw reference is not at synchronous=NORMAL")
    done: dict[str, int] = {}

    def run() -> Measured:
        m = _raw_loop(conn.execute, _RAW_UPDATE, rows, ctx.params)
        done["n"] = len(m.latencies or ())
        return m

    def check() -> None:
        expect("beats recorded", conn.execute("SELECT sum(beats) FROM liveness").fetchone()[0], done["n"])

    return Trial(run, check, conn.close)


# PostgreSQL --------------------------------------------------------------------------------


def _pg_setup_url(schema: Schema) -> str:
    """The schema's address with no flush per commit: for set-up and the simulated hour
    (untimed), never for the timed part."""
    import urllib.parse

    return f"{schema.db_url}?options=" + urllib.parse.quote(
        f"-csearch_path={schema.name} -csynchronous_commit=off")


def _pg_handoff(which: str):
    def prepare(ctx: Ctx) -> Trial:
        root = str(REPO) if which == "subject" else before_checkout()[0]
        assert root is not None  # the side is unavailable otherwise
        schema = Schema("fleet")
        try:
            tokens = str(ctx.dir / "tokens.json")
            setup = _pg_setup_url(schema)
            _run_child("build", {"setup_url": setup, "runs": ctx.params["runs"], "tokens": tokens,
                                 "code_root": root}, root)
            args = _drive_args(ctx, schema.url, setup, tokens, root, pg_db_url=schema.db_url)
        except BaseException:
            schema.drop()
            raise
        return _handoff_trial(ctx, args, root, schema.drop)

    return prepare


def _pg_raw(ctx: Ctx) -> Trial:
    schema = Schema("fleetraw")
    conn = schema.connect(autocommit=True)
    conn.execute("SET synchronous_commit = off")
    conn.execute(_RAW_SCHEMA.replace("BLOB", "bytea").replace("INTEGER", "bigint"))
    rows = _raw_rows(ctx.params["runs"])
    with conn.transaction():
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO liveness VALUES (%s, %s, %s, %s, %s)", rows)
    done: dict[str, int] = {}
    sql = _RAW_UPDATE.replace("?", "%s")

    def run() -> Measured:
        m = _raw_loop(conn.execute, sql, rows, ctx.params)
        done["n"] = len(m.latencies or ())
        return m

    def check() -> None:
        expect("beats recorded", conn.execute("SELECT sum(beats) FROM liveness").fetchone()[0], done["n"])

    def close() -> None:
        conn.close()
        schema.drop()

    return Trial(run, check, close)


def _pg_before_unavailable() -> str | None:
    return pg_unavailable() or _before_unavailable()


# --- registration --------------------------------------------------------------------------

_MEASURES = (
    "{runs} live runs (opened, claimed, executing; one owner each; set up without fsync, "
    "untimed) driven in compressed time: every run beats once (untimed), then for {paced} "
    "the fleet's own load (a beat per run every 20 s, so runs/20 beats a second; a step "
    "every 10 s from one run in ten) with a watchdog process running watch_once (with "
    "Sightings, as 'handoff watch' does; a dry run, counting the runs it would act on) every "
    "{interval}; the driver's CPU per beat and per "
    "step (thread CPU time) and the watchdog pass's time (first pass, then p50/p95 of the "
    "rest) are reported. Timed: Ledger.heartbeat(run, token) round-robin, flat out, one "
    "process, up to {n} beats or {budget}: beats per second, CPU per beat (process time{pg_cpu}), "
    "share of beats that wrote an event. Then a simulated hour under a settable clock on "
    "{hour} idle and {hour} busy runs: 180 beats each (busy: and 360 steps); events and "
    "bytes stored per run-hour{bytes_how}. Sides: this checkout and f43230d (today's "
    "heartbeat, a durable command), each in a child process, and the floor: one raw UPDATE "
    "of a liveness row per beat, fenced by lease and token digest, one commit each, {raw}."
)


def _scenario(name: str, *, pg: bool) -> None:
    full = {"n": 30_000, "budget_s": 10.0, "runs": 10_000, "paced_s": 20.0,
            "watch_interval_s": WATCH_INTERVAL_S, "hour_runs": 20}
    quick = {"n": 400, "budget_s": 2.0, "runs": 200, "paced_s": 2.0, "watch_interval_s": 0.5, "hour_runs": 3}
    raw_how = ("psycopg autocommit, SET synchronous_commit = off" if pg
               else "sqlite3 autocommit, WAL, synchronous=NORMAL")
    what = "PostgreSQL" if pg else "SQLite"
    if pg:
        subject = Side("handoff-ledger", _pg_handoff("subject"), unavailable=pg_unavailable,
                       note="this checkout, child process; Ledger('postgresql://...') at the server's durability")
        reference = Side("raw psycopg UPDATE", _pg_raw, unavailable=pg_unavailable,
                         note="one autocommit UPDATE per beat, synchronous_commit=off (no flush per commit)")
        before = Side(BEFORE, _pg_handoff("before"), unavailable=_pg_before_unavailable,
                      note=f"git archive {BEFORE_COMMIT} (cached under {_cache_root()}), same driver")
    else:
        subject = Side("handoff-ledger", _sqlite_handoff("subject"),
                       note="this checkout, child process; Ledger(path): its own durability per write")
        reference = Side("raw sqlite3 UPDATE", _sqlite_raw,
                         note="one autocommit UPDATE per beat, WAL, synchronous=NORMAL (no fsync per commit)")
        before = Side(BEFORE, _sqlite_handoff("before"), unavailable=_before_unavailable,
                      note=f"git archive {BEFORE_COMMIT} (cached under {_cache_root()}), same driver")
    register(Scenario(
        name=name,
        area=AREA,
        title=f"{what}: keeping 10,000 live runs alive (heartbeats flat out, paced fleet, watchdog pass, run-hour)",
        measures=_MEASURES.format(
            runs="10,000 (quick: 200)", paced="20 s (quick: 2 s)", interval="5 s (quick: 0.5 s)",
            n="30,000 (quick: 400)", budget="10 s (quick: 2 s)", hour="20 (quick: 3)", raw=raw_how,
            pg_cpu=", and the server backends' CPU per beat when the server is on this machine" if pg else "",
            bytes_how=(" (the schema's relations, pg_total_relation_size)" if pg
                       else " (used pages of the ledger's database files)")),
        full=full,
        quick=quick,
        subject=subject,
        reference=reference,
        peers=(before,),
        unit="beats",
        goals=(
            Goal(f"beats at least 5x today's heartbeat command ({BEFORE_COMMIT})", min_ratio=5.0, against=BEFORE),
            Goal("at most 10 events per idle run-hour", metric="events_per_idle_run_hour", max_value=10.0),
            Goal("watchdog pass p95 under its 5 s interval at 10,000 runs", metric="scan_p95_ms",
                 max_value=WATCH_INTERVAL_S * 1e3),
        ),
        fixture=None if pg else _sqlite_fleets,
        fixture_key=None if pg else "fleet-live",
        repeat=1 if pg else 2,
        warmup=0,
    ))


if __package__:
    _scenario("fleet-live", pg=False)
    _scenario("pg-fleet-live", pg=True)

if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
