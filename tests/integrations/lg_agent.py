"""A LangGraph agent process for the crash and fencing tests.

``python -m tests.integrations.lg_agent DB RUN WORKER DIR MODE``

The graph: a fake model node (no network) asks for the ``write_report`` tool once, then
answers; the tool node appends a line to ``DIR/report.txt`` inside a side effect recorded
before it runs (``lease.effect``), and skips the write when the ledger shows that effect
settled ``done``. Modes:

- ``crash``: the tool writes, prints ``WROTE`` and hangs there, to be SIGKILLed mid-tool;
- ``resume``: settles what a dead worker left (``done`` if the file holds the line), then
  continues the thread from the ledger and prints ``RESULT`` and the messages;
- ``slow``: the model node, on its second call, prints ``WAITING`` and waits for
  ``DIR/go`` (bounded by the run's heartbeat timeout); whatever the ledger then refuses is
  printed as ``REFUSED <type>``.
"""

from __future__ import annotations

import json
import operator
import sys
import time
from pathlib import Path
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from handoff import Ledger
from handoff.integrations.langgraph import LedgerSaver
from handoff.ledger.errors import LedgerError

EFFECT = "tool:write_report"


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def build(lg: Ledger, run: str, lease, saver: LedgerSaver, where: Path, mode: str, timeout_s: float):
    calls = {"model": 0}

    def model(state: State) -> dict:
        calls["model"] += 1
        if mode == "slow" and calls["model"] == 2:
            print("WAITING", flush=True)
            deadline = time.monotonic() + timeout_s
            while not (where / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        if any(m.startswith("tool:") for m in state["messages"]):
            return {"messages": ["model: the report is written"]}
        return {"messages": ["model: call write_report"]}

    def tool(state: State) -> dict:
        if (EFFECT, "done") in lg.checkpoint(run).settled_effects:
            return {"messages": ["tool: already written"]}
        with lease.effect(EFFECT, "append a line to report.txt"):
            with open(where / "report.txt", "a") as f:
                f.write("the report\n")
            if mode == "crash":
                print("WROTE", flush=True)
                while True:  # killed here: written, not yet confirmed
                    time.sleep(0.05)
        return {"messages": ["tool: written"]}

    g = StateGraph(State)
    g.add_node("model", model)
    g.add_node("tool", tool)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tool" if s["messages"][-1].endswith("call write_report") else END)
    g.add_edge("tool", "model")
    return g.compile(checkpointer=saver)


def main(db: str, run: str, worker: str, where_: str, mode: str) -> None:
    where = Path(where_)
    with Ledger(db) as lg:
        timeout_s = lg.checkpoint(run).policy.heartbeat_timeout_s
        try:
            with lg.lease(run, worker=worker) as lease:
                for p in lg.status(run)["pending_effects"]:  # what a dead worker left: look at the world
                    written = (where / "report.txt").exists()
                    lease.confirm(p["key"], "done" if written else "absent", note="report.txt checked")
                saver = LedgerSaver(lg, lease=lease)
                graph = build(lg, run, lease, saver, where, mode, timeout_s)
                config = {"configurable": {"thread_id": run}}
                start = None if saver.get_tuple(config) is not None else {"messages": ["user: write the report"]}
                # "sync": each checkpoint is in the ledger before the next step starts, so a
                # kill loses no finished step (LangGraph's default saves in the background).
                out = graph.invoke(start, config, durability="sync")
                print("RESULT", json.dumps(out["messages"]), flush=True)
        except LedgerError as exc:
            import traceback

            traceback.print_exc()
            print("REFUSED", exc.type, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
