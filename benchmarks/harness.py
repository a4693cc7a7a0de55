"""The machinery every scenario shares: the registry, timing, and the report.

A scenario compares one *subject* side (handoff-ledger) with one *reference* side (raw
sqlite3 doing the same durable work) and any number of *peer* sides (other libraries,
optional: a peer whose modules are not importable is reported as "peer not installed").
Each side is a ``prepare`` function: it does its untimed setup in a fresh directory and
returns a :class:`Trial` whose ``run`` is the only thing timed.

Throughput is units (events, unless a scenario says otherwise) per second of ``run``.
The ratio is always ``handoff throughput / other side's throughput``: 0.80x means
handoff-ledger does the work at 80% of that side's speed, 1.20x means 20% faster.
Nothing here ever asserts a speed; a missed goal is reported, not raised.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

SUBJECT = "handoff-ledger"
RATIO_CONVENTION = (
    "ratio = handoff-ledger throughput / reference throughput "
    "(higher is better; 0.80x = 80% of the reference's speed)"
)


@dataclasses.dataclass
class Trial:
    """One prepared measurement: ``run`` is timed; ``check`` and ``close`` are not."""

    run: Callable[[], object]
    #: Called after timing to prove the work was really done (raises if not).
    check: Callable[[], object] | None = None
    close: Callable[[], object] | None = None


@dataclasses.dataclass
class Ctx:
    """What a side's ``prepare`` gets for one trial."""

    dir: Path  # fresh and empty; removed after the trial
    params: dict[str, Any]  # the scenario's full or quick parameters
    fixture: Any  # what the scenario's fixture built once (None without one)
    quick: bool


Prepare = Callable[[Ctx], Trial]


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    prepare: Prepare
    #: Modules that must be importable; a peer missing one is "peer not installed".
    requires: tuple[str, ...] = ()
    #: One line on what this side does differently, shown under the table.
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    area: str  # the module it comes from: store, reducers, projections, cli, ...
    title: str  # one line: what is measured
    measures: str  # a paragraph for --list and the docs
    full: dict[str, Any]  # parameters; "n" is the number of units one trial does
    quick: dict[str, Any]  # the same, seconds-long, for CI smoke runs
    subject: Side
    reference: Side
    peers: tuple[Side, ...] = ()
    #: Minimum acceptable ratio against ``reference`` (None: no goal set yet).
    goal: float | None = None
    unit: str = "events"
    #: Untimed, built once per scenario in its own directory and shared by all trials.
    fixture: Callable[[Path, dict[str, Any]], Any] | None = None
    #: Scenarios naming the same key (and the same parameters) share one fixture.
    fixture_key: str | None = None


REGISTRY: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    if scenario.name in REGISTRY:
        raise ValueError(f"benchmark scenario {scenario.name!r} is registered twice")
    REGISTRY[scenario.name] = scenario
    return scenario


def missing_modules(side: Side) -> list[str]:
    return [m for m in side.requires if importlib.util.find_spec(m) is None]


# --- running -------------------------------------------------------------------------


@dataclasses.dataclass
class SideResult:
    name: str
    role: Literal["subject", "reference", "peer"]
    status: Literal["ok", "peer not installed", "failed"]
    samples: list[float]  # units per second, one per timed repeat
    missing: list[str]
    note: str
    error: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def min(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def max(self) -> float | None:
        return max(self.samples) if self.samples else None


@dataclasses.dataclass
class ScenarioResult:
    scenario: Scenario
    params: dict[str, Any]
    sides: list[SideResult]
    seconds: float  # wall time of the whole scenario, setup included

    @property
    def subject(self) -> SideResult:
        return self.sides[0]

    def ratio(self, other: SideResult) -> float | None:
        s, o = self.subject.median, other.median
        if s is None or o is None or o == 0:
            return None
        return s / o

    @property
    def goal_met(self) -> bool | None:
        goal = self.scenario.goal
        r = self.ratio(self.sides[1])
        if goal is None or r is None:
            return None
        return r >= goal

    def to_json(self) -> dict[str, Any]:
        sc = self.scenario
        return {
            "scenario": sc.name,
            "area": sc.area,
            "title": sc.title,
            "unit": sc.unit,
            "n": self.params["n"],
            "params": self.params,
            "goal": sc.goal,
            "ratio": self.ratio(self.sides[1]),
            "goal_met": self.goal_met,
            "seconds": round(self.seconds, 3),
            "sides": [
                {
                    "name": s.name,
                    "role": s.role,
                    "status": s.status,
                    "missing": s.missing,
                    "error": s.error,
                    "note": s.note,
                    "samples_per_s": [round(x, 1) for x in s.samples],
                    "median_per_s": s.median,
                    "min_per_s": s.min,
                    "max_per_s": s.max,
                    "ratio": self.ratio(s) if s.role != "subject" else None,
                }
                for s in self.sides
            ],
        }


def _time_trial(side: Side, ctx: Ctx) -> float:
    """Seconds ``run`` took, in a fresh directory that is removed afterwards."""
    ctx.dir.mkdir(parents=True)
    try:
        trial = side.prepare(ctx)
        try:
            gc.collect()
            t0 = time.perf_counter()
            trial.run()
            elapsed = time.perf_counter() - t0
            if trial.check is not None:
                trial.check()
        finally:
            if trial.close is not None:
                trial.close()
    finally:
        shutil.rmtree(ctx.dir, ignore_errors=True)
    return elapsed


class Runner:
    """Runs scenarios under one scratch directory, sharing fixtures between them."""

    def __init__(
        self,
        *,
        quick: bool,
        repeat: int,
        warmup: int,
        root: str | None = None,
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.quick = quick
        self.repeat = repeat
        self.warmup = warmup
        self.log = log
        self.root = Path(tempfile.mkdtemp(prefix="handoff-bench-", dir=root))
        self._fixtures: dict[tuple[str, str], Any] = {}
        self._trials = 0

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _fixture(self, sc: Scenario, params: dict[str, Any]) -> Any:
        if sc.fixture is None:
            return None
        # "n" is how much one trial does, not what the fixture holds.
        key = (sc.fixture_key or sc.name, repr(sorted((k, v) for k, v in params.items() if k != "n")))
        if key not in self._fixtures:
            d = self.root / f"fixture-{len(self._fixtures)}"
            d.mkdir()
            t0 = time.perf_counter()
            self._fixtures[key] = sc.fixture(d, params)
            self.log(f"  fixture for {sc.name} built in {time.perf_counter() - t0:.1f}s")
        return self._fixtures[key]

    def _ctx(self, params: dict[str, Any], fixture: Any) -> Ctx:
        self._trials += 1
        return Ctx(self.root / f"trial-{self._trials}", params, fixture, self.quick)

    def run(self, sc: Scenario) -> ScenarioResult:
        t_start = time.perf_counter()
        params = dict(sc.quick if self.quick else sc.full)
        n = params["n"]
        self.log(f"{sc.name}: {sc.title}")
        fixture = self._fixture(sc, params)
        sides: list[tuple[Side, SideResult]] = []
        for side, role in [(sc.subject, "subject"), (sc.reference, "reference")] + [
            (p, "peer") for p in sc.peers
        ]:
            missing = missing_modules(side)
            status = "peer not installed" if missing else "ok"
            sides.append((side, SideResult(side.name, role, status, [], missing, side.note)))  # type: ignore[arg-type]
        active = [(s, r) for s, r in sides if r.status == "ok"]
        for i in range(self.warmup + self.repeat):
            # Alternate the order so slow drift (page cache, thermal, other load)
            # lands on every side alike.
            order = active if i % 2 == 0 else active[::-1]
            for side, res in order:
                if res.status != "ok":
                    continue
                try:
                    secs = _time_trial(side, self._ctx(params, fixture))
                except Exception as exc:  # report and go on: one broken peer must not stop CI
                    if res.role == "subject" or res.role == "reference":
                        raise
                    res.status, res.error = "failed", f"{type(exc).__name__}: {exc}"
                    self.log(f"  {side.name} failed: {res.error}")
                    continue
                if i >= self.warmup:
                    res.samples.append(n / secs)
                label = "warm-up" if i < self.warmup else f"repeat {i - self.warmup + 1}"
                self.log(f"  {label:9} {side.name:28} {n / secs:>12,.0f} {sc.unit}/s")
        return ScenarioResult(sc, params, [r for _, r in sides], time.perf_counter() - t_start)


# --- reporting -----------------------------------------------------------------------


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _span(r: SideResult) -> str:
    return "-" if not r.samples else f"{_rate(r.min)}-{_rate(r.max)}"


def _rows(results: Sequence[ScenarioResult], quick: bool) -> list[list[str]]:
    rows = []
    for res in results:
        sc = res.scenario
        subj = res.subject
        for other in res.sides[1:]:
            first = other is res.sides[1]
            ratio = res.ratio(other)
            if other.status != "ok":
                status = other.status if not other.error else f"failed: {other.error[:60]}"
                rows.append(
                    [sc.name if first else "", "", "", other.name, status, "", "", "", ""]
                )
                continue
            goal = verdict = ""
            if first:
                goal = f">= {sc.goal:.2f}x" if sc.goal is not None else "(none)"
                met = res.goal_met
                verdict = "" if met is None else ("met" if met else "MISSED")
                if quick and met is not None:
                    verdict = "(smoke)"
            rows.append(
                [
                    sc.name if first else "",
                    _rate(subj.median) if first else "",
                    _span(subj) if first else "",
                    other.name,
                    _rate(other.median),
                    _span(other),
                    "-" if ratio is None else f"{ratio:.2f}x",
                    goal,
                    verdict,
                ]
            )
    return rows


HEADERS = [
    "scenario",
    "handoff median/s",
    "handoff min-max",
    "reference",
    "ref median/s",
    "ref min-max",
    "ratio",
    "goal",
    "result",
]


def format_table(results: Sequence[ScenarioResult], quick: bool) -> str:
    rows = _rows(results, quick)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]
    right = {1, 2, 4, 5, 6}

    def line(cells: list[str]) -> str:
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            out.append(c.rjust(w) if i in right else c.ljust(w))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(HEADERS), sep, *(line(r) for r in rows)])


def format_markdown(results: Sequence[ScenarioResult], quick: bool) -> str:
    rows = _rows(results, quick)
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(
        "---:" if i in {1, 2, 4, 5, 6} else "---" for i in range(len(HEADERS))
    ) + "|"]
    for r in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


def format_notes(results: Sequence[ScenarioResult]) -> str:
    lines = []
    for res in results:
        sc = res.scenario
        n = res.params["n"]
        lines.append(f"{sc.name}: {sc.title} [{n:,} {sc.unit} per trial, {res.seconds:.0f}s]")
        for s in res.sides:
            if s.note:
                lines.append(f"    {s.name}: {s.note}")
            if s.missing:
                lines.append(
                    f"    {s.name}: peer not installed (missing {', '.join(s.missing)}; "
                    "pip install -e '.[bench]')"
                )
    return "\n".join(lines)


def filesystem_of(path: str) -> str:
    """Best effort: the filesystem type holding ``path`` (Linux /proc/mounts)."""
    try:
        best, kind = "", "unknown"
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, kind = mnt, parts[2]
        return kind
    except OSError:
        return "unknown"
