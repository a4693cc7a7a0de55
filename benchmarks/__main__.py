"""``python -m benchmarks``: run the scenarios and print a table.

    python -m benchmarks                 # every scenario, 1 warm-up + 3 timed repeats
                                         # (slow scenarios fewer; see docs/performance.md)
    python -m benchmarks --quick         # seconds-long smoke run (CI); never judges speed
    python -m benchmarks --only append-single --repeat 5
    python -m benchmarks --only commands # one area
    python -m benchmarks --json          # machine-readable results on stdout
    python -m benchmarks --markdown --save results.json   # Markdown table, JSON kept too
    python -m benchmarks --from results.json --markdown    # the saved run's table again
    python -m benchmarks --only command-single --profile  # cProfile the handoff side
    python -m benchmarks --only command-single --profile --profiler pyinstrument

The exit status is 0 whatever the numbers are: a missed goal is reported, not failed.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import sqlite3
import sys
import tempfile
import time
from typing import Any

import msgspec

from . import load, postgres_server
from .common import DURABILITY
from .harness import (
    RATIO_CONVENTION,
    Runner,
    Scenario,
    ScenarioResult,
    filesystem_of,
    format_goals,
    format_markdown,
    format_metrics,
    format_notes,
    format_table,
    result_from_json,
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Throughput of handoff-ledger against raw sqlite3 doing the same durable work.",
    )
    p.add_argument("--quick", action="store_true",
                   help="small sizes, 1 repeat, no warm-up: a smoke run for CI (numbers are not measurements)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only this scenario or area (repeatable, or comma-separated)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="timed repeats per side (default 3, or the scenario's own count for slow "
                        "scenarios; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help="untimed warm-up trials per side (default 1, or the scenario's own; 0 with --quick)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of a table")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--save", metavar="FILE", help="also write the JSON results to FILE")
    p.add_argument("--from", dest="saved", metavar="FILE",
                   help="run nothing: print the report of a run saved with --save (with --markdown, "
                        "its table as Markdown)")
    p.add_argument("--dir", default=None,
                   help="where to put the scratch databases (default: the system temp dir)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--profile", action="store_true",
                   help="run the handoff-ledger side of each selected scenario once under a profiler "
                        "(in-process, also for sides that normally run in a child process)")
    p.add_argument("--profiler", choices=("cprofile", "pyinstrument"), default="cprofile",
                   help="which profiler --profile uses (pyinstrument must be installed)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        p.error("--warmup must be 0 or more")
    return args


def _select(registry: dict[str, Scenario], only: list[str] | None) -> list[Scenario]:
    if not only:
        return list(registry.values())
    wanted = [w.strip() for item in only for w in item.split(",") if w.strip()]
    chosen: list[Scenario] = []
    for w in wanted:
        hits = [s for s in registry.values() if s.name == w or s.area == w]
        if not hits:
            names = ", ".join(sorted(registry) + sorted({s.area for s in registry.values()}))
            raise SystemExit(f"no benchmark scenario or area named {w!r}; known: {names}")
        chosen.extend(s for s in hits if s not in chosen)
    return chosen


def _machine(args: argparse.Namespace, root: str) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "msgspec": msgspec.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "scratch_dir": root,
        "filesystem": filesystem_of(root),
        "durability": DURABILITY,
        "load_avg_1m_at_start": _load(),
    }


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _profile(scenarios: list[Scenario], args: argparse.Namespace) -> int:
    base = args.dir or tempfile.gettempdir()
    for sc in scenarios:
        with Runner(quick=args.quick, repeat=1, warmup=0, root=base) as runner:
            params = dict(sc.quick if args.quick else sc.full)
            fixture = runner._fixture(sc, params)
            ctx = runner._ctx(params, fixture)
            ctx.profiling = True
            ctx.dir.mkdir(parents=True)
            trial = sc.subject.prepare(ctx)
            if args.profiler == "pyinstrument":
                from pyinstrument import Profiler

                prof = Profiler(interval=0.0005)
                t0 = time.perf_counter()
                prof.start()
                try:
                    trial.run()
                finally:
                    prof.stop()
                elapsed = time.perf_counter() - t0
            else:
                cprof = cProfile.Profile()
                t0 = time.perf_counter()
                cprof.runcall(trial.run)
                elapsed = time.perf_counter() - t0
            if trial.close:
                trial.close()
            what = "operations" if sc.kind == "latency" else sc.unit
            print(f"== {sc.name}: {params['n']:,} {what} in {elapsed:.2f}s under {args.profiler} "
                  f"(profiling slows Python code, not SQLite)")
            if args.profiler == "pyinstrument":
                print(prof.output_text(unicode=False, color=False, show_all=False))
            else:
                stats = pstats.Stats(cprof, stream=sys.stdout)
                stats.sort_stats("tottime").print_stats(25)
                stats.sort_stats("cumulative").print_stats(25)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    registry = load()
    if args.list:
        for sc in registry.values():
            goals = "; ".join(g.text for g in sc.all_goals()) or "no goal"
            print(f"{sc.name:20} [{sc.area}] {sc.title} (goals: {goals})\n    {sc.measures}\n")
        return 0
    if args.saved:
        return _print_saved(args.saved, registry, markdown=args.markdown, as_json=args.json)
    scenarios = _select(registry, args.only)
    if args.profile:
        return _profile(scenarios, args)
    log = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    with Runner(quick=args.quick, repeat=args.repeat, warmup=args.warmup, root=args.dir, log=log) as runner:
        machine = _machine(args, str(runner.root))
        if machine["filesystem"] in ("tmpfs", "ramfs"):
            log(f"warning: {runner.root} is on {machine['filesystem']}, where fsync costs nothing; "
                "durable-commit numbers will flatter both sides (use --dir on a real disk)")
        if (machine["load_avg_1m_at_start"] or 0) > 0.5 * (machine["cpus"] or 1):
            log(f"warning: load average {machine['load_avg_1m_at_start']} on {machine['cpus']} CPUs: "
                "other work is running and the figures will be noisy")
        if any(sc.area == "postgres" or sc.name.startswith("pg-") for sc in scenarios):
            machine["postgresql"] = postgres_server.describe()
        results = [runner.run(sc) for sc in scenarios]
        machine["load_avg_1m_at_end"] = _load()
    total = time.perf_counter() - t0

    counts = {sc.name: runner.counts(sc) for sc in scenarios}
    report = {
        "mode": "quick" if args.quick else "full",
        "repeat": {name: c[0] for name, c in counts.items()},
        "warmup": {name: c[1] for name, c in counts.items()},
        "ratio": RATIO_CONVENTION,
        "machine": machine,
        "seconds": round(total, 1),
        "scenarios": [r.to_json() for r in results],
    }
    if args.save:
        with open(args.save, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_report(report, results, markdown=args.markdown)
    return 0


def _print_saved(path: str, registry: dict[str, Scenario], *, markdown: bool, as_json: bool) -> int:
    """Print a run saved with ``--save`` as the run itself printed it."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        saved = report["scenarios"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"cannot read the saved benchmark run {path}: {e}; "
                         "make one with: python -m benchmarks --save FILE") from None
    unknown = [s["scenario"] for s in saved if s["scenario"] not in registry]
    if unknown:
        raise SystemExit(f"{path} holds scenarios this checkout does not have: {', '.join(unknown)}")
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    results = [result_from_json(s, registry[s["scenario"]]) for s in saved]
    _print_report(report, results, markdown=markdown)
    return 0


def _print_report(report: dict[str, Any], results: list[ScenarioResult], *, markdown: bool) -> None:
    """The human report of one run: header, table, goals, side figures, notes."""
    machine, quick = report["machine"], report["mode"] == "quick"
    scenarios = [r.scenario for r in results]
    counts = {name: (report["repeat"][name], report["warmup"][name]) for name in report["repeat"]}
    total = report["seconds"]
    reps = sorted({c for c in counts.values()}, reverse=True)
    how = ", ".join(f"{r} timed repeat{'s' if r != 1 else ''} after {w} warm-up" for r, w in reps)
    mode = ("QUICK smoke run: tiny sizes, 1 repeat; these numbers are not measurements"
            if quick else f"full run: medians of {how} (per scenario, see --list)")
    print(f"handoff-ledger benchmarks, {mode}")
    print(f"machine: {machine['platform']}, {machine['cpus']} CPUs, Python {machine['python']}, "
          f"SQLite {machine['sqlite']}, msgspec {machine['msgspec']}; load average "
          f"{machine['load_avg_1m_at_start']} at start, {machine['load_avg_1m_at_end']} at end")
    print(f"durability: {DURABILITY} (scratch dir on {machine['filesystem']})")
    if machine.get("postgresql"):
        print(postgres_server.describe_line(machine["postgresql"]))
    units = "/".join(sorted({s.unit for s in scenarios if s.kind == "throughput"}))
    kinds = []
    if units:
        kinds.append(f"throughput in {units} per second (spread: min-max of the repeats)")
    if any(s.kind == "latency" for s in scenarios):
        kinds.append("latency rows: median time per operation (spread: p95)")
    print("; ".join(kinds + [RATIO_CONVENTION]))
    print()
    print(format_markdown(results, quick) if markdown else format_table(results, quick))
    goals = format_goals(results, quick)
    if goals:
        print("\ngoals:")
        print(goals)
    metrics = format_metrics(results)
    if metrics:
        print("\nmeasured beside the timing (median over repeats, worst in brackets):")
        print(metrics)
    print()
    print(format_notes(results))
    print(f"\ntotal {total:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
