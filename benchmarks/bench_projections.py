"""Projection scenarios: a full rebuild from a large log (time and peak memory, at N and
2N events), and the two reads that must never replay a log: one run's status among
100,000 runs and the stall scan over them.

The logs are built once per harness run, fast: the bare SqliteStore (synchronous=NORMAL,
since building a fixture is never timed) appends each run's events in two large batches,
round-robin over the runs, with a settable clock; then opening a Ledger catches the
projections up. The 2N log is a copy of the N log extended by as many runs again.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor

from .common import RAW_SCHEMA, WORKER, Clock, path_in, reap, run_events, spawn, templates
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "projections"
_T0 = 1_700_000_000_000_000  # µs; the fixtures' clocks start here
_ENDINGS = (None, "delivered", "cancelled")

# --- the big log --------------------------------------------------------------------

#: Logs built in this process, by (runs, per_run): the 2N log starts from a copy of N.
_LOGS: dict[tuple[int, int], dict[str, Any]] = {}
#: Peak RSS (MB) of each rebuild child, by (runs, per_run), for the 2N growth figure.
_PEAKS: dict[tuple[int, int], list[float]] = {}


def _append_runs(path: str, first: int, last: int, per_run: int) -> None:
    clock = Clock(_T0 + first * 1000)
    store = SqliteStore(path, synchronous="NORMAL", clock=clock)
    try:
        bodies = {r: run_events(per_run, _ENDINGS[r % 3], f"r{r} ") for r in range(first, last)}
        half = (per_run + 1) // 2
        for start in (0, half):
            for r in range(first, last):
                chunk = bodies[r][start : start + half]
                if chunk:
                    clock.now_us += 1000
                    store.append(f"run-{r:06d}", chunk, actor=WORKER)
        store.wal_checkpoint()
    finally:
        store.close()


def _raw_copy(path: str, raw: str, after_position: int) -> None:
    """The same events in a lean (run_id, seq, payload) table, in log order."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ATTACH DATABASE ? AS raw", (raw,))
        conn.execute(RAW_SCHEMA.replace("TABLE IF NOT EXISTS events", "TABLE IF NOT EXISTS raw.events"))
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO raw.events (run_id, seq, payload) SELECT run_id, seq, payload "
            "FROM main.events WHERE position > ? ORDER BY position", (after_position,)
        )
        conn.execute("COMMIT")
        conn.execute("DETACH DATABASE raw")
    finally:
        conn.close()


def _big_log(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    from handoff.facade import Ledger

    runs, per_run = params["runs"], params["per_run"]
    path, raw = path_in(d, "ledger.db"), path_in(d, "raw.db")
    half = _LOGS.get((runs // 2, per_run)) if runs % 2 == 0 else None
    if half is not None and Path(half["ledger"]).exists():
        shutil.copyfile(half["ledger"], path)
        shutil.copyfile(half["raw"], raw)
        first, after = runs // 2, half["events"]
    else:
        first, after = 0, 0
    _append_runs(path, first, runs, per_run)
    _raw_copy(path, raw, after)
    t0 = time.perf_counter()
    Ledger(path).close()  # catch the projections up: a valid ledger to rebuild
    out = {"ledger": path, "raw": raw, "events": runs * per_run, "runs": runs,
           "catch_up_s": time.perf_counter() - t0}
    _LOGS[(runs, per_run)] = out
    return out


def _rebuild_handoff(ctx: Ctx) -> Trial:
    key = (ctx.params["runs"], ctx.params["per_run"])
    runs = ctx.params["runs"]
    out: dict[str, Any] = {}

    def run() -> Measured:
        if ctx.profiling:  # in-process, so the profiler sees it
            from handoff.facade import Ledger

            with Ledger(ctx.fixture["ledger"]) as lg:
                t0 = time.perf_counter()
                out["counts"] = lg.rebuild()
                return Measured(seconds=time.perf_counter() - t0)
        report = reap(spawn("rebuild", {"db": ctx.fixture["ledger"]}))
        peak = report["peak_rss_mb"]
        out["counts"] = report["counts"]
        _PEAKS.setdefault(key, []).append(peak)
        metrics = {"peak_rss_mb": peak, "rss_before_rebuild_mb": report["rss_before_mb"]}
        base = _PEAKS.get((runs // 2, ctx.params["per_run"]))
        if base and runs % 2 == 0:
            metrics["rss_growth_vs_half_pct"] = 100.0 * (peak - statistics.median(base)) / statistics.median(base)
        return Measured(seconds=report["seconds"], metrics=metrics)

    def check() -> None:
        if out["counts"].get("checkpoints") != runs:
            raise RuntimeError(f"the rebuild wrote {out['counts']} rows, expected {runs} checkpoints")

    return Trial(run, check)


def _rebuild_raw(ctx: Ctx) -> Trial:
    out: dict[str, Any] = {}

    def run() -> Measured:
        if ctx.profiling:
            from .child import raw_fold

            rep = raw_fold({"db": ctx.fixture["raw"]})
            out["events"] = rep["events"]
            return Measured(seconds=rep["seconds"])
        report = reap(spawn("raw-fold", {"db": ctx.fixture["raw"]}))
        out["events"] = report["events"]
        return Measured(seconds=report["seconds"], metrics={"peak_rss_mb": report["peak_rss_mb"]})

    def check() -> None:
        if out["events"] != ctx.fixture["events"]:
            raise RuntimeError(f"the raw fold read {out['events']} events")

    return Trial(run, check)


_REBUILD_MEASURES = (
    "Ledger.rebuild(): drop and refold all four projections (checkpoints, stall_watch, "
    "deliveries, owner_load) from position 0, run by run in transactions of 500 runs, "
    "then swap the new tables in, in a child process whose peak RSS (VmHWM, the "
    "high-water mark of its own memory map) is reported; the timed part excludes the "
    "child's start-up. The log: {runs} "
    "runs x 100 events (opening, working body of progress, heartbeats, evidence and "
    "artifacts, and a delivered or cancelled ending for two thirds of them), appended "
    "in two batches per run, round-robin. Reference: a child reading the same payloads "
    "from a lean raw table in log order, msgspec-decoding each into the event types and "
    "counting by type."
)

for _name, _runs, _qruns, _goals, _repeat in (
    ("projection-rebuild", 10_000, 200, (), 3),
    ("projection-rebuild-2x", 20_000, 400, (
        Goal("peak RSS grows at most 10% when the log doubles", metric="rss_growth_vs_half_pct",
             max_value=10.0),
    ), 1),
):
    register(
        Scenario(
            name=_name,
            area=AREA,
            title=f"full projection rebuild from a {_runs * 100:,}-event log ({_runs:,} runs)",
            measures=_REBUILD_MEASURES.format(runs=f"{_runs:,} (quick: {_qruns})"),
            full={"n": _runs * 100, "runs": _runs, "per_run": 100},
            quick={"n": _qruns * 100, "runs": _qruns, "per_run": 100},
            subject=Side("handoff-ledger", _rebuild_handoff,
                         note="Ledger.rebuild() in a child process (its peak RSS: VmHWM)"),
            reference=Side("raw sqlite3 + msgspec", _rebuild_raw,
                           note="child: SELECT payload in rowid order, msgspec decode, count by type"),
            goal=0.5,
            goals=(Goal("peak RSS at most 150 MB", metric="peak_rss_mb", max_value=150.0), *_goals),
            fixture=_big_log,
            fixture_key="big-log",
            repeat=_repeat,
            warmup=0,  # building the fixture (catch-up) already read the whole log once
        )
    )


# --- 100,000 runs: status lookup and stall scan ---------------------------------------------
#
# 60% of the runs are finished (delivered or cancelled), 39% are being worked on with a
# fresh heartbeat and fresh progress, and 1% have a lease whose worker went silent an
# hour ago: those, and only those, are what the stall scan must return at NOW. One
# watchdog stream beats every 10 s, so each status reports real watcher coverage.

_NOW = _T0 + 10 * 86_400 * 1_000_000


def _fleet(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    from handoff.facade import Ledger

    runs = params["runs"]
    stalled_every = params["stalled_every"]
    t = templates()
    start = list(t["start"])
    live_body = start + [ev.HeartbeatRecorded(), ev.ProgressRecorded(kind="tool_outcome", detail="ran the tool")]
    delivered = start + list(t["delivered"])
    cancelled = start + list(t["cancelled"])
    path = path_in(d, "ledger.db")
    clock = Clock(_T0)
    store = SqliteStore(path, synchronous="NORMAL", clock=clock)
    kinds = {"live": 0, "stalled": 0, "terminal": 0}
    try:
        for r in range(runs):
            run_id = f"run-{r:06d}"
            if r % stalled_every == stalled_every // 2:
                clock.now_us, events, k = _NOW - 3_600_000_000, live_body, "stalled"
            elif r % 10 < 6:
                clock.now_us, events, k = _T0 + r * 1000, (delivered if r % 2 else cancelled), "terminal"
            else:
                clock.now_us, events, k = _NOW - 10_000_000, live_body, "live"
            store.append(run_id, events, actor=WORKER)
            kinds[k] += 1
        # A watchdog that beats every 10 s, so status reports real coverage.
        for i in range(3):
            clock.now_us = _NOW - (3 - i) * 10_000_000
            beat = ev.WatchdogObserved(watcher="wd-1", classification="alive", progress_seq=0, interval_s=10.0)
            store.append("watcher:wd-1", [beat], actor=Actor("watchdog", "wd-1"))
        store.wal_checkpoint()
    finally:
        store.close()
    Ledger(path).close()  # builds the projections (catch-up), untimed
    rng = random.Random(7)
    lookups = [f"run-{rng.randrange(runs):06d}" for _ in range(5_000)]
    return {"ledger": path, "kinds": kinds, "lookups": lookups}


def _time_ops(params: dict[str, Any], op: Any, items: list[Any]) -> Measured:
    """Up to n operations, stopping early past the time budget (at least 20 done)."""
    n, budget = params["n"], params.get("budget_s", 10.0)
    lat: list[float] = []
    clock = time.perf_counter
    deadline = clock() + budget
    for i in range(n):
        item = items[i % len(items)]
        t0 = clock()
        op(item)
        t1 = clock()
        lat.append(t1 - t0)
        if t1 > deadline and i >= 19:
            break
    return Measured(seconds=sum(lat), latencies=lat)


def _status_handoff(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    lg = Ledger(ctx.fixture["ledger"])
    seen: list[Any] = []

    def run() -> Measured:
        status = lg.status
        return _time_ops(ctx.params, lambda r: seen.append(status(r, now=_NOW)["state"]), ctx.fixture["lookups"])

    def check() -> None:
        if not seen or any(s not in ("executing", "delivered", "cancelled") for s in seen):
            raise RuntimeError(f"unexpected states in status lookups: {set(seen)}")

    return Trial(run, check, lg.close)


def _status_view(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger
    from handoff.projections import queries
    from handoff.reducers.checkpoint import packet

    lg = Ledger(ctx.fixture["ledger"])
    seen: list[Any] = []

    def run() -> Measured:
        store = lg.store

        def op(r: str) -> None:
            seen.append(packet(queries.checkpoint(store, r), now_us=_NOW)["state"])  # type: ignore[arg-type]

        return _time_ops(ctx.params, op, ctx.fixture["lookups"])

    def check() -> None:
        if not seen:
            raise RuntimeError("no lookups were made")

    return Trial(run, check, lg.close)


def _status_raw(ctx: Ctx) -> Trial:
    conn = sqlite3.connect(ctx.fixture["ledger"], isolation_level=None)
    decode = msgspec.msgpack.decode
    seen: list[Any] = []

    def run() -> Measured:
        execute = conn.execute

        def op(r: str) -> None:
            seen.append(decode(execute("SELECT packet FROM checkpoints WHERE run_id=?", (r,)).fetchone()[0]))

        return _time_ops(ctx.params, op, ctx.fixture["lookups"])

    def check() -> None:
        if not seen or "state" not in seen[0]:
            raise RuntimeError("the raw lookup decoded no packet")

    return Trial(run, check, conn.close)


_FLEET_FULL = {"runs": 100_000, "stalled_every": 100}
_FLEET_QUICK = {"runs": 2_000, "stalled_every": 100}

register(
    Scenario(
        name="status-lookup",
        area=AREA,
        title="one run's status among 100,000 runs (Ledger.status)",
        measures=(
            "Ledger.status(run, now=NOW) for runs picked at random among 100,000 (quick: "
            "2,000): the checkpoints view's primary-key lookup, one packet decode, the "
            "packet with health, delivery status and watcher coverage. 60% of the runs are "
            "finished, 39% working, 1% stalled. Reference: the same primary-key SELECT and a "
            "msgspec msgpack decode of the stored packet into a dict. A second handoff-ledger "
            "row times queries.checkpoint + packet without the watcher-coverage lookup."
        ),
        full={"n": 2_000, "budget_s": 5.0, **_FLEET_FULL},
        quick={"n": 200, "budget_s": 2.0, **_FLEET_QUICK},
        subject=Side("handoff-ledger", _status_handoff, note="Ledger.status(run, now=NOW)"),
        reference=Side("raw sqlite3 + msgspec", _status_raw,
                       note="SELECT packet FROM checkpoints WHERE run_id=?; msgpack decode"),
        peers=(
            Side("handoff-ledger, view only", _status_view,
                 note="queries.checkpoint + reducers.checkpoint.packet, no watchers() lookup"),
        ),
        goals=(
            Goal("median well under 1 ms (at most 0.5 ms)", metric="p50_ms", max_value=0.5),
            Goal("p95 under 1 ms", metric="p95_ms", max_value=1.0),
        ),
        kind="latency",
        unit="lookups",
        fixture=_fleet,
        fixture_key="fleet",
    )
)


def _stalls_handoff(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    lg = Ledger(ctx.fixture["ledger"])
    found: list[int] = []

    def run() -> Measured:
        stalls = lg.stalls
        return _time_ops(ctx.params, lambda _: found.append(len(stalls(now=_NOW))), [None])

    def check() -> None:
        want = ctx.fixture["kinds"]["stalled"]
        if found[-1] != want:
            raise RuntimeError(f"the stall scan found {found[-1]} runs, expected {want}")

    return Trial(run, check, lg.close)


def _stalls_index(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger
    from handoff.projections import queries

    lg = Ledger(ctx.fixture["ledger"])
    found: list[int] = []

    def run() -> Measured:
        store = lg.store
        return _time_ops(ctx.params, lambda _: found.append(len(queries.due_run_ids(store, _NOW))), [None])

    def check() -> None:
        if found[-1] != ctx.fixture["kinds"]["stalled"]:
            raise RuntimeError(f"due_run_ids found {found[-1]} runs")

    return Trial(run, check, lg.close)


def _stalls_raw(ctx: Ctx) -> Trial:
    conn = sqlite3.connect(ctx.fixture["ledger"], isolation_level=None)
    decode = msgspec.msgpack.decode
    found: list[int] = []
    sql = (
        "SELECT c.packet FROM stall_watch s JOIN checkpoints c ON c.run_id = s.run_id "
        "WHERE s.live = 1 AND s.next_deadline_us IS NOT NULL AND s.next_deadline_us <= ?"
    )

    def run() -> Measured:
        execute = conn.execute
        return _time_ops(
            ctx.params, lambda _: found.append(len([decode(p) for (p,) in execute(sql, (_NOW,))])), [None]
        )

    def check() -> None:
        if found[-1] != ctx.fixture["kinds"]["stalled"]:
            raise RuntimeError(f"the raw scan found {found[-1]} runs")

    return Trial(run, check, conn.close)


register(
    Scenario(
        name="stall-scan",
        area=AREA,
        title="stall scan over 100,000 runs, 1% stalled (Ledger.stalls)",
        measures=(
            "Ledger.stalls(now=NOW) over the same 100,000 runs (quick: 2,000): a range scan "
            "of the stall_watch partial index for deadlines at or before NOW, which holds the "
            "liveness signals; each due run is judged from them (progress columns read by key "
            "for live workers, a packet only where a verdict needs it; results are lazy "
            "DueRuns, packets decoded when opened). 1% of the runs (1,000) have a worker "
            "silent for an hour and are returned. Reference: one SQL join of the index range "
            "with the checkpoints view and a msgpack decode of each packet. A second "
            "handoff-ledger row times the index scan alone (queries.due_run_ids)."
        ),
        full={"n": 60, "budget_s": 8.0, **_FLEET_FULL},
        quick={"n": 10, "budget_s": 2.0, **_FLEET_QUICK},
        subject=Side("handoff-ledger", _stalls_handoff, note="Ledger.stalls(now=NOW)"),
        reference=Side("raw sqlite3 + msgspec", _stalls_raw,
                       note="one JOIN of the due index range with the packets; msgpack decode"),
        peers=(
            Side("handoff-ledger, index only", _stalls_index,
                 note="projections.queries.due_run_ids: the index range scan, no packets"),
        ),
        goals=(Goal("p95 at most 2 ms", metric="p95_ms", max_value=2.0),),
        kind="latency",
        unit="scans",
        fixture=_fleet,
        fixture_key="fleet",
    )
)
