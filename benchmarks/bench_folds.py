"""Fold scenarios: rebuild the state of one run from its log, at 100 and 10,000 events.

The handoff-ledger side is ``Ledger.checkpoint(run, at_seq=last)``, which replays the
run from the store (``store.fold(run, AGGREGATE, until_seq=...)``): read the rows in
pages, decode every payload, apply the checkpoint reducer. It is not the projection
lookup (that is ``status-lookup``). The raw reference reads the same payloads from a
lean (run_id, seq, payload) table, decodes them with msgspec into the same event types
and folds trivially (a count by type). eventsourcing's ``repository.get`` replays its
stored events into the aggregate; LangGraph's ``get_tuple`` reads the latest checkpoint,
a stored snapshot, so it does not fold at all and its time does not grow with the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from handoff.ledger import events as ev
from handoff.ledger.sqlite import SqliteStore

from . import peers
from .common import Clock, fill_round_robin, path_in, raw_connect, raw_decoder, run_events
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "folds"
_BATCH = 500


def _corpus(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    """One ledger (and the same events in a raw table, an eventsourcing store and a
    LangGraph saver) holding run-small, run-big and two more runs as large as run-big,
    written round-robin in 500-event batches so a run's rows are spread through the file."""
    sizes = {"run-small": params["small"], "run-big": params["big"],
             "run-other-1": params["big"], "run-other-2": params["big"]}
    bodies = {r: run_events(n, None, f"{r} ") for r, n in sizes.items()}
    ledger_path, raw_path = path_in(d, "ledger.db"), path_in(d, "raw.db")
    clock = Clock(1_700_000_000_000_000)
    store = SqliteStore(ledger_path, synchronous="NORMAL", clock=clock)
    conn = raw_connect(raw_path)
    conn.execute("PRAGMA synchronous=OFF")  # building the fixture only; never timed
    def tick() -> None:
        clock.now_us += 1_000_000

    try:
        fill_round_robin(store, conn, bodies, _BATCH, tick=tick)
    finally:
        store.close()
        conn.close()
    # Open it once as a Ledger so the projections exist and are caught up (untimed).
    from handoff.facade import Ledger

    Ledger(ledger_path).close()
    out: dict[str, Any] = {"ledger": ledger_path, "raw": raw_path, "sizes": sizes}
    if _installed("eventsourcing"):
        out["es"], out["es_ids"] = _es_corpus(d, bodies)
    if _installed("langgraph.checkpoint.sqlite"):
        out["lg"] = _lg_corpus(d, bodies)
    return out


def _installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _es_corpus(d: Path, bodies: dict[str, list[ev.Event]]) -> tuple[str, dict[str, Any]]:
    path = path_in(d, "es.db")
    app = peers.es_app(path)
    ids = {}
    try:
        for r in ("run-small", "run-big"):
            agg = peers.es_new_run()
            events = bodies[r]
            for i, e in enumerate(events[1:], 1):
                peers.es_apply(agg, e)
                if i % _BATCH == 0:
                    app.save(agg)
            app.save(agg)
            ids[r] = agg.id
    finally:
        app.close()
    return path, ids


def _lg_corpus(d: Path, bodies: dict[str, list[ev.Event]]) -> str:
    path = path_in(d, "lg.db")
    saver, conn = peers.lg_saver(path, synchronous="OFF")  # building the fixture only
    try:
        for r in ("run-small", "run-big"):
            state = peers.LgState()
            config = peers.lg_config(r)
            for e in bodies[r]:
                state.apply(e)
                ck, md, nv = state.graph_checkpoint()
                config = saver.put(config, ck, md, nv)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path


def _timed(n: int, op: Any) -> Measured:
    lat = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        op()
        lat.append(clock() - t0)
    return Measured(seconds=sum(lat), latencies=lat)


def _fold_handoff(which: str):
    def prepare(ctx: Ctx) -> Trial:
        from handoff.facade import Ledger

        lg = Ledger(ctx.fixture["ledger"])
        last = lg.store.head(which).last_seq  # type: ignore[union-attr]
        out: list[Any] = []

        def run() -> Measured:
            checkpoint = lg.checkpoint
            return _timed(ctx.params["n"], lambda: out.append(checkpoint(which, at_seq=last)))

        def check() -> None:
            cp = out[-1]
            if cp.last_seq != last or cp.last_seq != ctx.fixture["sizes"][which]:
                raise RuntimeError(f"the fold ended at seq {cp.last_seq}, not {last}")

        return Trial(run, check, lg.close)

    return prepare


def _fold_raw(which: str):
    def prepare(ctx: Ctx) -> Trial:
        conn = raw_connect(ctx.fixture["raw"])
        out: list[int] = []

        def fold() -> None:
            decode = raw_decoder.decode
            counts: dict[type, int] = {}
            for (payload,) in conn.execute(
                "SELECT payload FROM events WHERE run_id=? ORDER BY seq", (which,)
            ).fetchall():
                t = type(decode(payload))
                counts[t] = counts.get(t, 0) + 1
            out.append(sum(counts.values()))

        def check() -> None:
            if out[-1] != ctx.fixture["sizes"][which]:
                raise RuntimeError(f"the raw fold saw {out[-1]} events")

        return Trial(lambda: _timed(ctx.params["n"], fold), check, conn.close)

    return prepare


def _fold_es(which: str):
    def prepare(ctx: Ctx) -> Trial:
        if "es" not in ctx.fixture:
            raise RuntimeError("the eventsourcing corpus was not built")
        app = peers.es_app(ctx.fixture["es"])
        agg_id = ctx.fixture["es_ids"][which]
        out: list[Any] = []

        def run() -> Measured:
            get = app.repository.get
            return _timed(ctx.params["n"], lambda: out.append(get(agg_id)))

        def check() -> None:
            if out[-1].version != ctx.fixture["sizes"][which]:
                raise RuntimeError(f"eventsourcing replayed to version {out[-1].version}")

        return Trial(run, check, app.close)

    return prepare


def _fold_lg(which: str):
    def prepare(ctx: Ctx) -> Trial:
        if "lg" not in ctx.fixture:
            raise RuntimeError("the LangGraph corpus was not built")
        saver, conn = peers.lg_saver(ctx.fixture["lg"])
        config = peers.lg_config(which)
        out: list[Any] = []

        def run() -> Measured:
            get = saver.get_tuple
            return _timed(ctx.params["n"], lambda: out.append(get(config)))

        def check() -> None:
            if out[-1].metadata["step"] != ctx.fixture["sizes"][which]:
                raise RuntimeError(f"LangGraph's latest checkpoint is step {out[-1].metadata['step']}")

        return Trial(run, check, conn.close)

    return prepare


_FULL = {"small": 100, "big": 10_000}
_QUICK = {"small": 100, "big": 2_000}

for _which, _label, _full_n, _quick_n in (
    ("run-small", "100", 300, 30),
    ("run-big", "10,000", 10, 3),
):
    register(
        Scenario(
            name=f"fold-{_label.replace(',', '')}",
            area=AREA,
            title=f"rebuild one run's state from its log ({_label} events)",
            measures=(
                f"Ledger.checkpoint(run, at_seq=last) on a run of {_label} events (quick: the "
                "big run has 2,000): read the run's rows, decode, apply the checkpoint reducer. "
                "The ledger holds it beside three other runs, written round-robin in 500-event "
                "batches. Reference: SELECT payload ... WHERE run_id=? ORDER BY seq from a lean "
                "raw table, msgspec decode into the same event types, count by type. Peers: "
                "eventsourcing repository.get (replays the aggregate's events); LangGraph "
                "get_tuple of the thread's latest checkpoint (a snapshot read, no fold). "
                "Time per fold: median and p95."
            ),
            full={"n": _full_n, **_FULL},
            quick={"n": _quick_n, **_QUICK},
            subject=Side("handoff-ledger", _fold_handoff(_which),
                         note="Ledger.checkpoint(run, at_seq=last): store.fold from the log"),
            reference=Side("raw sqlite3 + msgspec", _fold_raw(_which),
                           note="SELECT payload by run, msgspec decode, count by type"),
            peers=(
                Side("eventsourcing", _fold_es(_which), requires=peers.ES_REQUIRES,
                     note="Application.repository.get (no snapshots, no cache)"),
                Side("langgraph SqliteSaver", _fold_lg(_which), requires=peers.LG_REQUIRES,
                     note="get_tuple of the latest checkpoint: a snapshot, not a fold"),
            ),
            goals=(
                Goal("within 1.5x of raw read + decode + count (>= 0.67x)", min_ratio=1 / 1.5),
                Goal("at least 10x faster than eventsourcing repository.get", min_ratio=10.0,
                     against="eventsourcing"),
            ),
            kind="latency",
            unit="folds",
            fixture=_corpus,
            fixture_key="folds-corpus",
        )
    )
