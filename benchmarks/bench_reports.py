"""Report scenarios: an incident report of a long run, against folding the same run.

The handoff-ledger side is ``Ledger.write_report(run)`` without a path: read the run's
history, fold it into lanes, answers and the packets after each kept event
(reducers/timeline.py), and draw the self-contained HTML (handoff/report.py). The
reference is ``Ledger.checkpoint(run, at_seq=last)`` on the same run: the plain fold from
the log that any replay pays, so the ratio says what drawing costs on top of reading.
The run is what the issue names: 100,000 events, mostly heartbeats, a progress event
every thousand, written in batches a minute apart.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from handoff.ledger import events as ev
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor, LeaseToken, lease_digest

from .common import Clock, path_in
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "reports"
RUN = "long"


def _long_run(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    path = path_in(d, "ledger.db")
    clock = Clock(1_700_000_000_000_000)
    store = SqliteStore(path, synchronous="NORMAL", clock=clock)
    worker = Actor("worker", "w1")
    token = LeaseToken("1." + "benchmark-secret" * 2)
    try:
        store.append(RUN, [ev.HandoffOpened(goal="Watch the vendor export", target="chat:#ops", owner="o"),
                           ev.LeaseGranted(worker="w1", lease=1, token_digest=lease_digest(token.secret))],
                     actor=Actor("owner", "o"))
        store.append(RUN, [ev.StateChanged(from_state="queued", to_state="executing")], actor=worker, lease=token)
        for i in range(params["events"] // 1000):
            clock.now_us += 60_000_000
            store.append(RUN, [ev.HeartbeatRecorded()] * 999 + [ev.ProgressRecorded(kind="tool_outcome",
                                                                                     detail=f"batch {i}")],
                         actor=worker, lease=token)
    finally:
        store.close()
    from handoff.facade import Ledger

    Ledger(path).close()  # projections caught up, untimed
    return {"ledger": path, "events": 3 + params["events"] // 1000 * 1000}


def _timed(n: int, op: Any) -> Measured:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        op()
        lat.append(time.perf_counter() - t0)
    return Measured(seconds=sum(lat), latencies=lat)


def _report(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    lg = Ledger(ctx.fixture["ledger"])
    out: list[dict[str, Any]] = []

    def run() -> Measured:
        m = _timed(ctx.params["n"], lambda: out.append(lg.write_report(RUN)))
        m.metrics["file_mb"] = out[-1]["bytes"] / 1e6
        return m

    def check() -> None:
        if out[-1]["last_seq"] != ctx.fixture["events"] or not out[-1]["text"].startswith("<!DOCTYPE html>"):
            raise RuntimeError(f"the report ended at seq {out[-1]['last_seq']}")

    return Trial(run, check, lg.close)


def _fold(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    lg = Ledger(ctx.fixture["ledger"])
    out: list[Any] = []
    last = ctx.fixture["events"]

    def check() -> None:
        if out[-1].last_seq != last:
            raise RuntimeError(f"the fold ended at seq {out[-1].last_seq}")

    return Trial(lambda: _timed(ctx.params["n"], lambda: out.append(lg.checkpoint(RUN, at_seq=last))),
                 check, lg.close)


register(
    Scenario(
        name="report-100000",
        area=AREA,
        title="an incident report of a 100,000-event run (mostly heartbeats)",
        measures=(
            "Ledger.write_report(run) without a path, on a run of 100,003 events (quick: 5,003): 999 "
            "heartbeats and one progress event per minute. Reads the history, folds lanes, answers "
            "and the packets after the events kept whole, draws the HTML with the heartbeat lane "
            "binned. Reference: Ledger.checkpoint(run, at_seq=last), the plain fold from the log. "
            "Time per report: median and p95; file_mb is the size of the HTML."
        ),
        full={"n": 3, "events": 100_000},
        quick={"n": 1, "events": 5_000},
        subject=Side("handoff-ledger", _report, note="Ledger.write_report(run): history, fold, HTML"),
        reference=Side("checkpoint fold", _fold, note="Ledger.checkpoint(run, at_seq=last): store.fold"),
        goals=(
            Goal("the file stays under 5 MB", metric="file_mb", max_value=5.0),
            Goal("within 5x of folding the run (>= 0.20x)", min_ratio=0.2),
        ),
        kind="latency",
        unit="reports",
        fixture=_long_run,
        fixture_key="report-long-run",
        repeat=3,
        warmup=1,
    )
)
