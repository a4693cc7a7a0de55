"""The web view (``handoff serve``): the fleet page's server time, and the live feed's fan-out.

``serve-fleet-page`` renders the fleet page at 100,000 runs (quick: 2,000), the ledger of
the ``projections`` area (60% finished, 39% working, 1% stalled, judged at the fixture's
NOW), through the ASGI app in this process (Starlette's test client: the app's whole work,
no network): the first page, a page deep in the listing, an owner's filter, the first page
sorted by state and a page deep in the run-id order, in turn. The counts per health class
(the stall index) at the top are judged once per refresh period (5 s here) and reused
within it, as the server does (handoff/serve/app.py, ``Server.counts``). The
reference is the listing alone (``Ledger.runs_page(limit=100)`` with each run's health),
so the gap is the page's own cost.

``serve-sse-fanout`` starts a real ``handoff serve`` process, opens 50 (quick: 5) live
feeds of one run, and has a writer record steps on that run, each carrying the time it was
committed; the latency is from the commit to each client's receipt of that event.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any

from .bench_projections import _FLEET_FULL, _FLEET_QUICK, _NOW, _fleet
from .common import REPO, path_in
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "serve"


def _pages(params: dict[str, Any]) -> list[str]:
    deep = f"run-{params['runs'] // 2:06d}"
    return ["/", f"/?after={deep}", "/?owner=alice", "/?sort=state", f"/?sort=run&after={deep}"]


def _fleet_page(ctx: Ctx) -> Trial:
    from starlette.testclient import TestClient

    from handoff.serve import Config, make_app

    app = make_app(Config(db=ctx.fixture["ledger"], name="bench", clock=lambda: _NOW))
    client = TestClient(app, base_url="http://127.0.0.1:8766")
    client.__enter__()
    urls = _pages(ctx.params)
    sizes: list[int] = []

    def run() -> Measured:
        lat = []
        for i in range(ctx.params["n"]):
            t0 = time.perf_counter()
            r = client.get(urls[i % len(urls)])
            lat.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"the fleet page answered {r.status_code}: {r.text[:300]}")
            sizes.append(r.text.count('<tr data-run="'))
        return Measured(seconds=sum(lat), latencies=lat)

    def check() -> None:
        if not sizes or min(sizes) < 1:
            raise RuntimeError(f"a fleet page listed no run: {sizes[:10]}")

    return Trial(run, check, close=lambda: client.__exit__(None, None, None))


def _listing(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger
    from handoff.reducers import stall

    lg = Ledger(ctx.fixture["ledger"], clock=lambda: _NOW)
    deep = f"run-{ctx.params['runs'] // 2:06d}"
    calls = [dict(), dict(after=deep), dict(owner="alice")]

    def run() -> Measured:
        lat = []
        for i in range(ctx.params["n"]):
            t0 = time.perf_counter()
            page = lg.runs_page(limit=100, **calls[i % len(calls)])
            [stall.classify(cp, now_us=_NOW) for cp in page.items]
            lat.append(time.perf_counter() - t0)
        return Measured(seconds=sum(lat), latencies=lat)

    return Trial(run, close=lg.close)


register(
    Scenario(
        name="serve-fleet-page",
        area=AREA,
        title="the fleet page of handoff serve at 100,000 runs (server time)",
        measures=(
            "GET / (the first page), /?after=RUN (a page in the middle), /?owner=NAME, /?sort=state and "
            "/?sort=run&after=RUN in turn, through the ASGI app in-process, at 100,000 runs (quick: 2,000): "
            "100 rows with state, health, liveness and progress, and the counts per health class from the "
            "stall index (judged once per 5 s refresh period, as the server does). "
            "Reference: Ledger.runs_page(limit=100) and each row's health, without the page."
        ),
        full={"n": 60, **_FLEET_FULL},
        quick={"n": 6, **_FLEET_QUICK},
        subject=Side("handoff serve", _fleet_page, requires=("starlette", "httpx"),
                     note="the whole page through the app (Starlette TestClient)"),
        reference=Side("Ledger.runs_page only", _listing, note="the listing and its health, no HTML"),
        goals=(Goal("p95 under 300 ms", metric="p95_ms", max_value=300.0),),
        kind="latency",
        unit="pages",
        fixture=_fleet,
        fixture_key="fleet",
        repeat=1,
        warmup=1,
    )
)


# --- the live feed -----------------------------------------------------------------------


def _start(db: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "handoff.servecli", "--db", db, "--http", "127.0.0.1:0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    m = re.search(r"(http://\S+)/", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"handoff serve did not start: {line}{proc.stderr.read()[-500:]}")
    return proc, m.group(1)


async def _follow(base: str, run: str, after: int, want: int, got: list[float], ready: asyncio.Event,
                  opened: list[int], clients: int) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=60) as c, c.stream("GET", f"{base}/runs/{run}/feed?after={after}") as r:
        opened.append(1)
        if len(opened) == clients:
            ready.set()
        seen = 0
        async for line in r.aiter_lines():
            if line.startswith("data:") and '"progress_recorded"' in line:
                now = time.time()
                for row in json.loads(line[5:]):
                    m = re.search(r"sent=([0-9.]+)", row["summary"])
                    if m:
                        got.append(now - float(m.group(1)))
                        seen += 1
                if seen >= want:
                    return


def _fanout(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    db = path_in(ctx.dir, "feed.db")
    with Ledger(db, synchronous="NORMAL") as lg:
        run = lg.open(run_id="busy", goal="a busy run", target="chat:#ops", owner="bench", heartbeat_timeout_s=600)
        token = lg.claim(run, "w1")
        lg.transition(run, token, "planning")
        lg.transition(run, token, "executing")
        after = lg.checkpoint(run).last_seq
    proc, base = _start(db)
    clients, events, gap = ctx.params["clients"], ctx.params["events"], ctx.params["gap_s"]

    def write(ready: threading.Event) -> None:
        ready.wait(60)
        with Ledger(db, synchronous="NORMAL") as lg:
            for i in range(events):
                t0 = time.monotonic()
                lg.progress(run, token, "tool_outcome", f"step {i} sent={time.time():.6f}")
                time.sleep(max(0.0, gap - (time.monotonic() - t0)))

    def run_() -> Measured:
        got: list[float] = []

        async def main() -> None:
            ready = asyncio.Event()
            opened: list[int] = []
            go = threading.Event()
            tasks = [asyncio.create_task(_follow(base, run, after, events, got, ready, opened, clients))
                     for _ in range(clients)]
            await asyncio.wait_for(ready.wait(), 60)
            await asyncio.sleep(0.2)  # the feeds' catch-up reads are done: time only live events
            writer = threading.Thread(target=write, args=(go,))
            writer.start()
            go.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            writer.join()

        asyncio.run(main())
        if len(got) != clients * events:
            raise RuntimeError(f"{len(got)} receipts, expected {clients * events}")
        return Measured(seconds=sum(got), latencies=got)

    def close() -> None:
        proc.terminate()
        proc.wait(10)

    return Trial(run_, close=close)


def _one_client(ctx: Ctx) -> Trial:
    return _fanout(Ctx(ctx.dir, {**ctx.params, "clients": 1}, ctx.fixture, ctx.quick))


register(
    Scenario(
        name="serve-sse-fanout",
        area=AREA,
        title="handoff serve's live feed: 50 browsers following one busy run",
        measures=(
            "A real handoff serve process, 50 clients (quick: 5) on one run's live feed (SSE), a writer "
            "recording a step every 20 ms (200 steps; quick: 20); the latency is from each step's commit "
            "to its arrival at each client. SQLite: the server's one tail reader checks the last position "
            "every 50 ms and hands new events to every follower. Reference: one client."
        ),
        full={"n": 200, "clients": 50, "events": 200, "gap_s": 0.02},
        quick={"n": 20, "clients": 5, "events": 20, "gap_s": 0.02},
        subject=Side("handoff serve, 50 clients", _fanout, requires=("starlette", "httpx", "sse_starlette"),
                     note="one tail reader, events handed to every follower"),
        reference=Side("one client", _one_client, requires=("starlette", "httpx", "sse_starlette")),
        goals=(Goal("an event reaches every client within 1 s at p95", metric="p95_ms", max_value=1000.0),),
        kind="latency",
        unit="receipts",
        repeat=1,
        warmup=0,
    )
)
