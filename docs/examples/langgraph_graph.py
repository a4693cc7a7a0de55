# langgraph_graph.py: a LangGraph graph whose thread is a handoff run, written under a lease.
import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from handoff import Ledger
from handoff.integrations.langgraph import LedgerSaver


class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def model(state: State) -> dict:  # a stand-in for your model call
    done = any(m.startswith("tool:") for m in state["messages"])
    return {"messages": ["model: done" if done else "model: call post"]}


def tool(state: State) -> dict:
    return {"messages": ["tool: posted"]}


g = StateGraph(State)
g.add_node("model", model)
g.add_node("tool", tool)
g.add_edge(START, "model")
g.add_conditional_edges("model", lambda s: "tool" if s["messages"][-1] == "model: call post" else END)
g.add_edge("tool", "model")

with Ledger("handoff.db") as lg:
    run = lg.open(goal="Post the summary", target="chat:#ops", owner="alice", run_id="thread-1",
                  progress_kinds={"executing": ["graph_step"]})
    with lg.lease(run, worker="agent-1") as lease:  # heartbeats; fenced writes
        graph = g.compile(checkpointer=LedgerSaver(lg, lease=lease))
        out = graph.invoke({"messages": ["user: post it"]}, {"configurable": {"thread_id": run}})
    print(out["messages"][-1])                          # model: done
    print(lg.status(run)["last_progress"]["kind"])     # graph_step
    print(lg.verify() == [])                            # True
