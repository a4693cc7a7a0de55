"""The machinery every scenario shares: the registry, timing, and the report.

A scenario compares one *subject* side (handoff-ledger) with one *reference* side (raw
sqlite3 doing the same durable work) and any number of *peer* sides (other libraries,
optional: a peer whose modules are not importable is reported as "peer not installed").
Each side is a ``prepare`` function: it does its untimed setup in a fresh directory and
returns a :class:`Trial` whose ``run`` is the only thing timed.

Throughput is units (events, unless a scenario says otherwise) per second of ``run``.
The ratio is always ``handoff throughput / other side's throughput``: 0.80x means
handoff-ledger does the work at 80% of that side's speed, 1.20x means 20% faster.
Latency scenarios report the median and p95 of per-operation times instead, and their
ratio is ``other side's median latency / handoff's`` (still: higher is better).
Goals are ratios against a named side or ceilings on a measured figure (p95 latency,
peak RSS, lock errors). Nothing here ever asserts a speed; a missed goal is reported,
not raised.
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
    "ratio = handoff-ledger throughput / the other side's throughput, or for latency rows "
    "the other side's median time / handoff-ledger's (higher is better; 0.80x = 80% of "
    "the other side's speed)"
)


@dataclasses.dataclass
class Measured:
    """What ``Trial.run`` may return when it measures more than its own wall time.

    ``seconds`` replaces the harness's timing of ``run`` (a side whose work happens in a
    child process times only that work, not the child's start-up); ``latencies`` are
    per-operation seconds (latency scenarios report their median and p95);
    ``metrics`` are other figures of the trial, such as a child's peak RSS in MB or the
    number of lock errors that reached a caller.
    """

    seconds: float | None = None
    latencies: list[float] | None = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Trial:
    """One prepared measurement: ``run`` is timed; ``check`` and ``close`` are not.

    ``run`` may return a :class:`Measured` to report its own timing, per-operation
    latencies or extra metrics.
    """

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
    #: True under ``--profile``: a side that normally works in a child process works
    #: in-process instead, so the profiler sees it.
    profiling: bool = False


Prepare = Callable[[Ctx], Trial]


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    prepare: Prepare
    #: Modules that must be importable; a peer missing one is "peer not installed".
    requires: tuple[str, ...] = ()
    #: One line on what this side does differently, shown under the table.
    note: str = ""
    #: Says why this side cannot run here (e.g. "no server"), or None when it can; the
    #: report shows the reason in place of its figures and the run goes on.
    unavailable: Callable[[], str | None] | None = None


@dataclasses.dataclass(frozen=True)
class Goal:
    """One target a scenario is judged against, reported as met or MISSED with the figure.

    Either a ratio goal (``min_ratio``: subject / ``against``, where ``against`` names a
    side; None means the scenario's reference) or a ceiling on a measured figure of the
    subject side (``metric`` <= ``max_value``; the worst trial counts). For latency
    scenarios the metrics ``p50_ms`` and ``p95_ms`` exist on every side.
    """

    text: str  # how the docs state it: "at least 0.8x raw sqlite3"
    min_ratio: float | None = None
    against: str | None = None
    metric: str | None = None
    max_value: float | None = None
    side: str | None = None  # whose metric (default: the subject)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    area: str  # the module it comes from, bench_<area>.py: store, commands, projections, cli, ...
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
    #: "throughput" (units per second of ``run``) or "latency" (per-operation time:
    #: median and p95 of the latencies ``run`` reports; ratios compare medians).
    kind: Literal["throughput", "latency"] = "throughput"
    #: More goals than ``goal`` (ratios against peers, ceilings on metrics).
    goals: tuple[Goal, ...] = ()
    #: Timed repeats / warm-ups for a full run when the command line does not say
    #: (slow scenarios use fewer); --quick always uses 1 and 0.
    repeat: int | None = None
    warmup: int | None = None

    def all_goals(self) -> list[Goal]:
        out = []
        if self.goal is not None:
            out.append(Goal(f"at least {self.goal:.2f}x {self.reference.name}", min_ratio=self.goal))
        return out + list(self.goals)


REGISTRY: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    if scenario.name in REGISTRY:
        raise ValueError(f"benchmark scenario {scenario.name!r} is registered twice")
    REGISTRY[scenario.name] = scenario
    return scenario


def missing_modules(side: Side) -> list[str]:
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a dotted name whose parent package is missing
            return True

    return [m for m in side.requires if absent(m)]


# --- running -------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not xs:
        return None
    v = sorted(xs)
    k = (len(v) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


@dataclasses.dataclass
class SideResult:
    name: str
    role: Literal["subject", "reference", "peer"]
    status: str  # "ok", "peer not installed", "failed", or a side's own reason ("no server")
    samples: list[float]  # units per second, one per timed repeat
    missing: list[str]
    note: str
    error: str = ""
    #: Per-operation seconds, pooled over the timed repeats (latency scenarios).
    latencies: list[float] = dataclasses.field(default_factory=list)
    #: Other figures, one value per timed repeat (``Measured.metrics``).
    metrics: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    #: Percentile -> seconds, for a result read back from a saved run, whose JSON keeps
    #: the median and p95 but not every latency.
    percentiles: dict[float, float] = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def min(self) -> float | None:
        return min(self.samples) if self.samples else None

    @property
    def max(self) -> float | None:
        return max(self.samples) if self.samples else None

    def latency(self, q: float) -> float | None:
        """The q-th percentile of the per-operation latencies, in seconds."""
        if not self.latencies:
            return self.percentiles.get(q)
        return percentile(self.latencies, q)

    def metric(self, name: str) -> float | None:
        """A metric's worst (largest) value over the timed repeats; p50_ms and p95_ms
        come from the pooled latencies."""
        if name in ("p50_ms", "p95_ms", "p99_ms"):
            v = self.latency(float(name[1:3]))
            return None if v is None else v * 1e3
        vals = self.metrics.get(name)
        return max(vals) if vals else None


@dataclasses.dataclass
class GoalResult:
    goal: Goal
    value: float | None  # the ratio, or the metric
    met: bool | None

    def describe(self, kind: str) -> str:
        """The figure, and how far it is from the goal when missed."""
        g, v = self.goal, self.value
        if v is None:
            return "not measured"
        if g.min_ratio is not None:
            fig = _ratio(v)
            if self.met is False:
                fig += f"; needs {g.min_ratio / v:.2f}x faster" if v > 0 else ""
            return fig
        fig = _metric_text(g.metric or "", v)
        if self.met is False and g.max_value:
            fig += f"; {v / g.max_value:.1f}x over" if v > g.max_value else ""
        return fig


def _metric_text(name: str, v: float) -> str:
    if name.endswith("_ms"):
        return _ms(v / 1e3)
    if name.endswith("_mb"):
        return f"{v:,.1f} MB"
    if name.endswith("_pct"):
        return f"{v:+.1f}%"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.3g}"


@dataclasses.dataclass
class ScenarioResult:
    scenario: Scenario
    params: dict[str, Any]
    sides: list[SideResult]
    seconds: float  # wall time of the whole scenario, setup included

    @property
    def subject(self) -> SideResult:
        return self.sides[0]

    def side(self, name: str | None) -> SideResult | None:
        if name is None:
            return self.sides[1]
        return next((s for s in self.sides if s.name == name), None)

    def ratio(self, other: SideResult) -> float | None:
        """Subject over other, higher is better: throughput ratio, or for latency
        scenarios the other side's median latency over the subject's."""
        if self.scenario.kind == "latency":
            s, o = self.subject.latency(50), other.latency(50)
            if s is None or o is None or s == 0:
                return None
            return o / s
        s, o = self.subject.median, other.median
        if s is None or o is None or o == 0:
            return None
        return s / o

    def goal_results(self) -> list[GoalResult]:
        out = []
        for g in self.scenario.all_goals():
            if g.min_ratio is not None:
                other = self.side(g.against)
                r = None if other is None or other.status != "ok" else self.ratio(other)
                out.append(GoalResult(g, r, None if r is None else r >= g.min_ratio))
            else:
                who = self.side(g.side) if g.side else self.subject
                v = None if who is None or g.metric is None else who.metric(g.metric)
                met = None if v is None or g.max_value is None else v <= g.max_value
                out.append(GoalResult(g, v, met))
        return out

    @property
    def goal_met(self) -> bool | None:
        """The scenario's main goal (``goal``, against the reference)."""
        goal = self.scenario.goal
        r = self.ratio(self.sides[1])
        if goal is None or r is None:
            return None
        return r >= goal

    def to_json(self) -> dict[str, Any]:
        sc = self.scenario
        lat = sc.kind == "latency"
        return {
            "scenario": sc.name,
            "area": sc.area,
            "title": sc.title,
            "kind": sc.kind,
            "unit": sc.unit,
            "n": self.params["n"],
            "params": self.params,
            "goal": sc.goal,
            "ratio": self.ratio(self.sides[1]),
            "goal_met": self.goal_met,
            "goals": [
                {"text": gr.goal.text, "value": gr.value, "met": gr.met,
                 "figure": gr.describe(sc.kind)}
                for gr in self.goal_results()
            ],
            "seconds": round(self.seconds, 3),
            "sides": [
                {
                    "name": s.name,
                    "role": s.role,
                    "status": s.status,
                    "missing": s.missing,
                    "error": s.error,
                    "note": s.note,
                    "samples_per_s": s.samples,
                    "median_per_s": s.median,
                    "min_per_s": s.min,
                    "max_per_s": s.max,
                    **(
                        {"p50_ms": s.metric("p50_ms"), "p95_ms": s.metric("p95_ms"),
                         "operations": len(s.latencies)}
                        if lat else {}
                    ),
                    "metrics": s.metrics,
                    "ratio": self.ratio(s) if s.role != "subject" else None,
                }
                for s in self.sides
            ],
        }


def result_from_json(saved: dict[str, Any], scenario: Scenario) -> ScenarioResult:
    """A scenario's result as :meth:`ScenarioResult.to_json` saved it, so a saved run prints
    the same table as the live one (``python -m benchmarks --from FILE``). Its goals are
    the scenario's as the code states them now."""
    lat = scenario.kind == "latency"
    sides = [
        SideResult(
            name=s["name"], role=s["role"], status=s["status"], samples=list(s["samples_per_s"]),
            missing=list(s["missing"]), note=s["note"], error=s["error"],
            metrics={k: list(v) for k, v in s["metrics"].items()},
            percentiles={q: s[f"p{q}_ms"] / 1e3 for q in (50, 95)
                         if lat and s.get(f"p{q}_ms") is not None},
        )
        for s in saved["sides"]
    ]
    return ScenarioResult(scenario, dict(saved["params"]), sides, saved["seconds"])


def _time_trial(side: Side, ctx: Ctx) -> tuple[float, Measured | None]:
    """Seconds ``run`` took (or reported), in a fresh directory removed afterwards."""
    ctx.dir.mkdir(parents=True)
    try:
        trial = side.prepare(ctx)
        try:
            gc.collect()
            t0 = time.perf_counter()
            out = trial.run()
            elapsed = time.perf_counter() - t0
            if trial.check is not None:
                trial.check()
        finally:
            if trial.close is not None:
                trial.close()
    finally:
        shutil.rmtree(ctx.dir, ignore_errors=True)
    measured = out if isinstance(out, Measured) else None
    if measured is not None and measured.seconds is not None:
        elapsed = measured.seconds
    return elapsed, measured


class Runner:
    """Runs scenarios under one scratch directory, sharing fixtures between them.

    ``repeat`` / ``warmup`` of None mean: 1 and 0 with ``quick``, else the scenario's
    own counts, else 3 and 1.
    """

    def __init__(
        self,
        *,
        quick: bool,
        repeat: int | None,
        warmup: int | None,
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

    def counts(self, sc: Scenario) -> tuple[int, int]:
        """(timed repeats, warm-ups) for this scenario."""
        if self.repeat is not None:
            repeat = self.repeat
        elif self.quick:
            repeat = 1
        else:
            repeat = sc.repeat or 3
        if self.warmup is not None:
            warmup = self.warmup
        elif self.quick:
            warmup = 0
        else:
            warmup = sc.warmup if sc.warmup is not None else 1
        return repeat, warmup

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
        repeat, warmup = self.counts(sc)
        self.log(f"{sc.name}: {sc.title}")
        fixture = self._fixture(sc, params)
        sides: list[tuple[Side, SideResult]] = []
        for side, role in [(sc.subject, "subject"), (sc.reference, "reference")] + [
            (p, "peer") for p in sc.peers
        ]:
            missing = missing_modules(side)
            status = "peer not installed" if missing else "ok"
            if not missing and side.unavailable is not None:
                status = side.unavailable() or "ok"
            sides.append((side, SideResult(side.name, role, status, [], missing, side.note)))  # type: ignore[arg-type]
        active = [(s, r) for s, r in sides if r.status == "ok"]
        for i in range(warmup + repeat):
            # Alternate the order so slow drift (page cache, thermal, other load)
            # lands on every side alike.
            order = active if i % 2 == 0 else active[::-1]
            for side, res in order:
                if res.status != "ok":
                    continue
                try:
                    secs, measured = _time_trial(side, self._ctx(params, fixture))
                except Exception as exc:  # report and go on: one broken peer must not stop CI
                    if res.role == "subject" or res.role == "reference":
                        raise
                    res.status, res.error = "failed", f"{type(exc).__name__}: {exc}"
                    self.log(f"  {side.name} failed: {res.error}")
                    continue
                timed = i >= warmup
                # A latency side may stop early on a time budget: count what it did.
                done = len(measured.latencies) if measured is not None and measured.latencies else n
                if timed:
                    res.samples.append(done / secs)
                    if measured is not None:
                        res.latencies.extend(measured.latencies or ())
                        for k, v in measured.metrics.items():
                            res.metrics.setdefault(k, []).append(v)
                label = "warm-up" if not timed else f"repeat {i - warmup + 1}"
                extra = ""
                if measured is not None and measured.latencies:
                    extra = (f"  median {_ms(percentile(measured.latencies, 50))}, "
                             f"p95 {_ms(percentile(measured.latencies, 95))}")
                if measured is not None and measured.metrics:
                    extra += "  " + ", ".join(
                        f"{k} {_metric_text(k, v)}" for k, v in measured.metrics.items()
                    )
                self.log(f"  {label:9} {side.name:30} {done / secs:>12,.0f} {sc.unit}/s{extra}")
        return ScenarioResult(sc, params, [r for _, r in sides], time.perf_counter() - t_start)


# --- reporting -----------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    if ms >= 1000:
        return f"{ms / 1e3:.2f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms:.3f} ms"


def _ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.3f}x" if r < 0.1 else f"{r:.2f}x"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _value(sc: Scenario, r: SideResult) -> str:
    if sc.kind == "latency":
        return _ms(r.latency(50))
    return "-" if r.median is None else f"{_rate(r.median)}/s"


def _spread(sc: Scenario, r: SideResult) -> str:
    if sc.kind == "latency":
        p95 = r.latency(95)
        return "-" if p95 is None else f"p95 {_ms(p95)}"
    return "-" if not r.samples else f"{_rate(r.min)}-{_rate(r.max)}"


def _rows(results: Sequence[ScenarioResult], quick: bool) -> list[list[str]]:
    rows = []
    for res in results:
        sc = res.scenario
        subj = res.subject
        verdicts = res.goal_results()
        for other in res.sides[1:]:
            first = other is res.sides[1]
            ratio = res.ratio(other)
            if other.status != "ok":
                status = other.status if not other.error else f"failed: {other.error[:60]}"
                # A subject that could not run says why (e.g. "no server") in its own cell.
                mine_cell = subj.status if first and subj.status != "ok" else ""
                rows.append(
                    [sc.name if first else "", mine_cell, "", other.name, status, "", "", "", ""]
                )
                continue
            mine = [
                gr for gr in verdicts
                if gr.goal.min_ratio is not None and (gr.goal.against or res.sides[1].name) == other.name
            ]
            goal = " ".join(f">= {gr.goal.min_ratio:.2f}x" for gr in mine)
            if first and not mine:
                goal = "(none)" if not verdicts else ""
            verdict = " ".join(
                "" if gr.met is None else ("(smoke)" if quick else ("met" if gr.met else "MISSED"))
                for gr in mine
            ).strip()
            rows.append(
                [
                    sc.name if first else "",
                    _value(sc, subj) if first else "",
                    _spread(sc, subj) if first else "",
                    other.name,
                    _value(sc, other),
                    _spread(sc, other),
                    _ratio(ratio),
                    goal,
                    verdict,
                ]
            )
    return rows


HEADERS = [
    "scenario",
    "handoff-ledger",
    "spread",
    "compared with",
    "its figure",
    "its spread",
    "ratio",
    "goal",
    "result",
]
_RIGHT = {1, 2, 4, 5, 6}


def format_table(results: Sequence[ScenarioResult], quick: bool) -> str:
    rows = _rows(results, quick)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]

    def line(cells: list[str]) -> str:
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            out.append(c.rjust(w) if i in _RIGHT else c.ljust(w))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(HEADERS), sep, *(line(r) for r in rows)])


def format_markdown(results: Sequence[ScenarioResult], quick: bool) -> str:
    rows = _rows(results, quick)
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(
        "---:" if i in _RIGHT else "---" for i in range(len(HEADERS))
    ) + "|"]
    for r in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


def format_goals(results: Sequence[ScenarioResult], quick: bool) -> str:
    """Every goal with its figure: met, MISSED (and by how much), or not measured."""
    lines = []
    for res in results:
        for gr in res.goal_results():
            if gr.met is None:
                verdict = "not measured"
            elif quick:
                verdict = "(smoke: not judged)"
            else:
                verdict = "met" if gr.met else "MISSED"
            lines.append(
                f"  {res.scenario.name:22} {gr.goal.text:56} {gr.describe(res.scenario.kind):30} {verdict}"
            )
    return "\n".join(lines)


def format_metrics(results: Sequence[ScenarioResult]) -> str:
    """Figures measured beside the timing (peak RSS, lock errors, ...), per side."""
    lines = []
    for res in results:
        for s in res.sides:
            if not s.metrics:
                continue
            parts = []
            for k, vals in s.metrics.items():
                med = statistics.median(vals)
                txt = _metric_text(k, med)
                if len(vals) > 1 and max(vals) != med:
                    txt += f" (worst {_metric_text(k, max(vals))})"
                parts.append(f"{k} {txt}")
            lines.append(f"  {res.scenario.name:22} {s.name:32} " + ", ".join(parts))
    return "\n".join(lines)


def format_notes(results: Sequence[ScenarioResult]) -> str:
    lines = []
    for res in results:
        sc = res.scenario
        n = res.params["n"]
        what = "operations" if sc.kind == "latency" else sc.unit
        lines.append(f"{sc.name}: {sc.title} [{n:,} {what} per trial, {res.seconds:.0f}s]")
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
