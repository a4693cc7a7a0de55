"""LangGraph: a graph whose state grows by one 1 KiB message a step, under four checkpointers.

``lg-graph-growing`` runs one ``StateGraph`` (a node appends a 1 KiB message to a list
channel and loops until the list holds ``n``) to completion: ``n`` steps, a checkpoint
each (and the task's writes), saved before the next step runs (``durability="sync"``). Subject: ``LedgerSaver`` on an SQLite ledger (WAL,
synchronous=FULL). Reference: LangGraph's ``SqliteSaver`` on a file, WAL and
synchronous=FULL (peers.py). ``pg-lg-graph-growing``: ``LedgerSaver`` on PostgreSQL
against LangGraph's ``PostgresSaver``, each in a schema of its own (``no server`` without one).

Besides steps per second each side reports the bytes it stored per step (what its tables
hold after the run: event payloads and values for the ledger; checkpoints, their
metadata, blobs and writes for LangGraph's savers), over all steps and over the last
quarter alone: flat bytes per step means the last quarter costs what the first did.
"""

from __future__ import annotations

import operator
import sqlite3
import time
from typing import Annotated, Any, TypedDict

from .common import SYNCHRONOUS
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register
from .peers import lg_saver
from .postgres_server import Schema, unavailable

AREA = "langgraph"
MESSAGE = "x" * 1024
LG_GRAPH = ("langgraph.graph",)
LG_PG = ("langgraph.checkpoint.postgres",)


class _State(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: Any, n: int) -> Any:
    from langgraph.graph import END, START, StateGraph

    def step(state: _State) -> dict[str, list[str]]:
        return {"messages": [MESSAGE]}

    g = StateGraph(_State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if len(s["messages"]) >= n else "step")
    return g.compile(checkpointer=saver)


def _run(graph: Any, n: int, stored: Any) -> Any:
    """Stream the graph to its end, timing the steps only; measure what is stored at three
    quarters and at the end (outside the timing)."""
    config = {"configurable": {"thread_id": "bench-thread"}, "recursion_limit": n + 10}
    quarter = max(1, n // 4)
    seconds, at_3q, steps = 0.0, None, 0
    # durability="sync": each step's checkpoint is stored before the next step runs (the
    # default saves in the background and may still be writing when a step is reported).
    it = iter(graph.stream({"messages": []}, config, stream_mode="values", durability="sync"))
    while True:
        t0 = time.perf_counter()
        try:
            state = next(it)
        except StopIteration:
            seconds += time.perf_counter() - t0
            break
        seconds += time.perf_counter() - t0
        steps = len(state["messages"])
        if steps == n - quarter and at_3q is None:
            at_3q = stored()
    total = stored()
    if steps != n:
        raise RuntimeError(f"the graph ran {steps} steps, not {n}")
    return Measured(seconds=seconds, metrics={
        "ms_per_step": seconds * 1000 / n,
        "bytes_per_step": total / n,
        "bytes_per_step_last_quarter": (total - (at_3q or 0)) / quarter,
    })


def _sqlite_sizes(conn: sqlite3.Connection, lock: Any, queries: tuple[str, ...]) -> Any:
    """What the tables hold, read on the writer's own connection (a second connection to
    the WAL file may read an older snapshot while the writer holds its read mark)."""
    def stored() -> int:
        with lock:
            return sum(conn.execute(q).fetchone()[0] or 0 for q in queries)
    return stored


def _pg_sizes(schema: Schema, queries: tuple[str, ...]) -> Any:
    def stored() -> int:
        with schema.connect(autocommit=True) as conn:
            return sum(conn.execute(q).fetchone()[0] or 0 for q in queries)
    return stored


LEDGER_SQLITE = ("SELECT sum(length(payload)) FROM events", "SELECT sum(length(value)) FROM run_values")
LEDGER_PG = ("SELECT sum(length(payload)) FROM events", "SELECT sum(length(value)) FROM run_values")
LG_SQLITE = ("SELECT sum(length(checkpoint) + length(metadata)) FROM checkpoints",
             "SELECT sum(length(value)) FROM writes")
LG_PG_SIZES = ("SELECT sum(pg_column_size(checkpoint) + pg_column_size(metadata)) FROM checkpoints",
               "SELECT sum(length(blob)) FROM checkpoint_blobs",
               "SELECT sum(length(blob)) FROM checkpoint_writes")


def _ledger_sqlite(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger
    from handoff.integrations.langgraph import LedgerSaver

    path = str(ctx.dir / "ledger.db")
    lg = Ledger(path, synchronous=SYNCHRONOUS)
    graph = _graph(LedgerSaver(lg), ctx.params["n"])
    sizes = _sqlite_sizes(lg.store.conn, lg.store.lock, LEDGER_SQLITE)
    return Trial(lambda: _run(graph, ctx.params["n"], sizes), close=lg.close)


def _sqlite_saver(ctx: Ctx) -> Trial:
    path = str(ctx.dir / "lg.db")
    saver, conn = lg_saver(path)
    graph = _graph(saver, ctx.params["n"])
    sizes = _sqlite_sizes(conn, saver.lock, LG_SQLITE)
    return Trial(lambda: _run(graph, ctx.params["n"], sizes), close=conn.close)


def _ledger_pg(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger
    from handoff.integrations.langgraph import LedgerSaver

    schema = Schema("lg")
    lg = Ledger(schema.url)
    graph = _graph(LedgerSaver(lg), ctx.params["n"])

    def close() -> None:
        lg.close()
        schema.drop()
    return Trial(lambda: _run(graph, ctx.params["n"], _pg_sizes(schema, LEDGER_PG)), close=close)


def _postgres_saver(ctx: Ctx) -> Trial:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    schema = Schema("lgpg")
    conn = schema.connect(autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(conn)
    saver.setup()
    graph = _graph(saver, ctx.params["n"])

    def close() -> None:
        conn.close()
        schema.drop()
    return Trial(lambda: _run(graph, ctx.params["n"], _pg_sizes(schema, LG_PG_SIZES)), close=close)


def _pg_side(name: str, prepare: Any, *, requires: tuple[str, ...], note: str) -> Side:
    return Side(name, prepare, requires=requires, note=note, unavailable=unavailable)


MEASURES = (
    "graph.stream of a StateGraph whose one node appends a 1 KiB message to a list channel "
    "(operator.add) until it holds n; each step saves the task's writes and a checkpoint before "
    "the next step runs. Metrics: ms per step, bytes stored per step, and bytes per step over the "
    "last quarter (flat when the state's growth does not make each step write more). "
)

register(Scenario(
    name="lg-graph-growing",
    area=AREA,
    title="LangGraph: a graph whose state grows 1 KiB a step, n steps, one checkpoint each (SQLite)",
    measures=MEASURES + (
        "Subject: handoff's LedgerSaver on an SQLite ledger. Reference: LangGraph's SqliteSaver, "
        "which stores every channel's value in every checkpoint."
    ),
    full={"n": 200},
    quick={"n": 12},
    subject=Side("LedgerSaver (SQLite)", _ledger_sqlite, requires=LG_GRAPH,
                 note="handoff-ledger on a file, WAL + synchronous=FULL; values once per version"),
    reference=Side("LangGraph SqliteSaver", _sqlite_saver, requires=LG_GRAPH + ("langgraph.checkpoint.sqlite",),
                   note="WAL + synchronous=FULL; the whole state in every checkpoint"),
    goals=(Goal("at least 1.0x SqliteSaver per step", min_ratio=1.0),),
    unit="steps",
    repeat=3,
    warmup=1,
))

register(Scenario(
    name="pg-lg-graph-growing",
    area=AREA,
    title="LangGraph: the same graph on PostgreSQL",
    measures=MEASURES + (
        "Subject: LedgerSaver on a PostgreSQL ledger. Reference: LangGraph's PostgresSaver (a blob "
        "per channel version), each in a schema of its own; 'no server' without one."
    ),
    full={"n": 200},
    quick={"n": 12},
    subject=_pg_side("LedgerSaver (PostgreSQL)", _ledger_pg, requires=LG_GRAPH + ("psycopg",),
                     note="handoff-ledger on PostgreSQL; values once per version"),
    reference=_pg_side("LangGraph PostgresSaver", _postgres_saver, requires=LG_GRAPH + LG_PG,
                       note="autocommit connection, a blob per channel version"),
    goals=(Goal("at least 1.0x PostgresSaver per step", min_ratio=1.0),),
    unit="steps",
    repeat=3,
    warmup=1,
))
