"""A growing list stores one step's items a step: LedgerSaver on both backends.

A channel whose value is a list that grows (LangGraph's ``operator.add`` reducer) is
stored, from its second version on, as the items appended since the parent checkpoint;
the event names the parent's version it continues (``extends``). What must hold:

- every checkpoint reads back whole, in a new saver on a new connection, equal to the
  state the graph had at that step, and ``verify`` is clean;
- what the ledger stores per step stays flat as the state grows;
- a list whose earlier items changed in place is stored whole, never as a tail;
- pruning to the latest checkpoint keeps every value the latest is made of, and a copy of
  the pruned thread reads back whole;
- a malformed ``extends`` is refused with a typed error and writes nothing; a chain whose
  first value is not a list is reported as damage, never read back wrong.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.langgraph import LedgerSaver  # noqa: E402
from handoff.ledger.errors import CorruptLedger, InvalidInput  # noqa: E402

STEPS = 24
MESSAGE = "m" * 512


class _State(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: LedgerSaver, steps: int = STEPS, node: Any = None) -> Any:
    def step(state: _State) -> dict[str, list[str]]:
        return {"messages": [f"{len(state['messages']):04d}{MESSAGE}"]}

    g = StateGraph(_State)
    g.add_node("step", node or step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if len(s["messages"]) >= steps else "step")
    return g.compile(checkpointer=saver)


def _cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}, "recursion_limit": STEPS + 10}


def _stored(lg: Ledger, run: str) -> int:
    blobs = lg.values(run, lg.store.value_digests(run))
    return sum(len(b) for b in blobs.values())


def _saved(lg: Ledger, run: str) -> list:
    return [r.event for r in lg.log(run) if r.type == "graph_checkpoint_saved"]


def test_a_growing_list_is_stored_a_step_at_a_time_and_reads_back_whole(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        final = _graph(LedgerSaver(lg)).invoke({"messages": []}, _cfg("t-grow"), durability="sync")
        assert len(final["messages"]) == STEPS
        saved = _saved(lg, "t-grow")
        continued = [e for e in saved if isinstance(e.extends, dict) and "messages" in e.extends]
        assert len(continued) >= STEPS - 2, "every version after the first continues its parent's"
        content = sum(len(m) for m in final["messages"])
        # One message a step (its value as a tail, and the task's write of it, which is the
        # same bytes and so stored once): far under the whole state at every step.
        assert _stored(lg, "t-grow") < 2 * content
    with Ledger(db) as lg:  # a new saver on a new connection: nothing held in memory
        saver = LedgerSaver(lg)
        latest = saver.get_tuple({"configurable": {"thread_id": "t-grow"}})
        assert latest is not None and latest.checkpoint["channel_values"]["messages"] == final["messages"]
        for tup in saver.list({"configurable": {"thread_id": "t-grow"}}):
            got = tup.checkpoint["channel_values"].get("messages")
            if got is not None:  # the input checkpoint has no messages yet
                assert got == final["messages"][:len(got)]
                assert tup.metadata["step"] < 0 or len(got) == tup.metadata["step"]
        assert lg.verify() == []


def test_bytes_per_step_stay_flat_as_the_state_grows(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        graph = _graph(saver, steps=2 * STEPS)
        cfg = {"configurable": {"thread_id": "t-flat"}, "recursion_limit": 3 * STEPS}
        sizes = []
        for state in graph.stream({"messages": []}, cfg, stream_mode="values", durability="sync"):
            if len(state["messages"]) in (STEPS // 2, STEPS, 2 * STEPS):
                sizes.append(_stored(lg, "t-flat"))
        first_half = (sizes[1] - sizes[0]) / (STEPS // 2)
        second_half = (sizes[2] - sizes[1]) / STEPS
        # The state doubles between the two halves; what each step stores does not grow.
        assert second_half <= 1.25 * first_half, (first_half, second_half)


def test_a_list_changed_in_place_is_stored_whole(shared_backend):
    db = shared_backend.address()

    def rewrite(state: _State) -> dict[str, list[str]]:
        # The reducer adds, but the node returns a list whose first item differs: the new
        # value does not begin with the old one's items, so no tail can describe it.
        return {"messages": [f"{len(state['messages']):04d}{MESSAGE}"]}

    class _Replace(TypedDict):
        messages: Annotated[list[str], lambda old, new: [f"changed {len(old)}"] + old[1:] + new]

    g = StateGraph(_Replace)
    g.add_node("step", rewrite)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: END if len(s["messages"]) >= 6 else "step")
    with Ledger(db) as lg:
        final = g.compile(checkpointer=LedgerSaver(lg)).invoke({"messages": []}, _cfg("t-inplace"), durability="sync")
        assert final["messages"][0] == "changed 5"
        assert not any(isinstance(e.extends, dict) and e.extends for e in _saved(lg, "t-inplace"))
    with Ledger(db) as lg:
        latest = LedgerSaver(lg).get_tuple({"configurable": {"thread_id": "t-inplace"}})
        assert latest is not None and latest.checkpoint["channel_values"]["messages"] == final["messages"]


def test_pruning_keeps_what_the_latest_is_made_of_and_a_copy_reads_back_whole(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        final = _graph(saver).invoke({"messages": []}, _cfg("t-prune"), durability="sync")
        saver.prune(["t-prune"], strategy="keep_latest")
        assert len(list(saver.list({"configurable": {"thread_id": "t-prune"}}))) == 1
        assert lg.verify() == []
        saver.copy_thread("t-prune", "t-copy")
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        for thread in ("t-prune", "t-copy"):
            latest = saver.get_tuple({"configurable": {"thread_id": thread}})
            assert latest is not None and latest.checkpoint["channel_values"]["messages"] == final["messages"]
        # The copy's only checkpoint continues nothing it does not have: stored whole.
        (copied,) = _saved(lg, "t-copy")
        assert not (isinstance(copied.extends, dict) and copied.extends)
        assert lg.verify() == []


def _snapshot(lg: Ledger, run: str) -> tuple[list, dict]:
    return [(r.seq, r.type, r.payload) for r in lg.log(run)], lg.store.value_digests(run)


def test_a_malformed_extends_is_refused_and_writes_nothing(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        cfg = {"configurable": {"thread_id": "t-bad", "checkpoint_ns": ""}}
        first = saver.put(cfg, generate_checkpoint(channel_values={"messages": ["a"]},
                                                   channel_versions={"messages": "1"}),
                          generate_metadata(), {"messages": "1"})
        before = _snapshot(lg, "t-bad")
        call = dict(thread_id="t-bad", checkpoint_id="cp-2", checkpoint={"channel_versions": {"messages": "2"}},
                    metadata={}, values={"messages": "0" * 64})
        with pytest.raises(InvalidInput, match="extends names channel 'other'"):
            lg.save_graph_checkpoint("t-bad", **call, parent_id=first["configurable"]["checkpoint_id"],
                                     extends={"other": "1"})
        with pytest.raises(InvalidInput, match="extends needs parent_id"):
            lg.save_graph_checkpoint("t-bad", **call, extends={"messages": "1"})
        assert _snapshot(lg, "t-bad") == before


def test_a_chain_that_continues_a_value_that_is_no_list_is_damage(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        cfg = {"configurable": {"thread_id": "t-forged", "checkpoint_ns": ""}}
        first = saver.put(cfg, generate_checkpoint(channel_values={"messages": {"not": "a list"}},
                                                   channel_versions={"messages": "1"}),
                          generate_metadata(), {"messages": "1"})
        tail = b"msgpack\x00" + bytes([0x91, 0xA1]) + b"b"  # ["b"]
        from handoff.ledger.store import value_digest

        cp = generate_checkpoint(channel_values={}, channel_versions={"messages": "2"})
        (base,) = (r.event.values["messages"] for r in lg.log("t-forged") if r.type == "graph_checkpoint_saved")
        lg.save_graph_checkpoint("t-forged", thread_id="t-forged", checkpoint_id=cp["id"],
                                 checkpoint={k: v for k, v in cp.items() if k != "channel_values"},
                                 metadata={}, values={"messages": value_digest(tail)}, new_values=[tail],
                                 parent_id=first["configurable"]["checkpoint_id"], extends={"messages": "1"},
                                 bases={"messages": base})
        with pytest.raises(CorruptLedger, match="not a msgpack list"):
            LedgerSaver(lg).get_tuple({"configurable": {"thread_id": "t-forged", "checkpoint_id": cp["id"]}})
