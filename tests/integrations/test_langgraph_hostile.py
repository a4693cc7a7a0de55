"""The LangGraph saver fed what a hostile or confused graph hands it, beyond the thread ids
of tests/integrations/test_langgraph_lease_erase.py: checkpoint ids and namespaces that
are not printable text (or not one line, or too long) are refused naming the field, on
reads and writes, and nothing is written; on each backend a saver's process can share."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.langgraph import LedgerSaver  # noqa: E402
from handoff.ledger.errors import InvalidInput  # noqa: E402

THREAD = "t-hostile"

#: (what the graph hands over as the checkpoint's id, why it is refused).
BAD_CHECKPOINT_IDS = ["cp\x00", "cp\u202e1", "cp\u2066", "cp\x1b[2J", "cp\x85", "cp\n2", "", "c" * 201]
BAD_NAMESPACES = ["ns\x00", "ns\u202e", "ns\x07", "\u2067ns", "ns\x9b"]


def _checkpoint(cid: str | None = None) -> dict:
    cp = generate_checkpoint(channel_values={"messages": ["a"]}, channel_versions={"messages": "0001"})
    if cid is not None:
        cp["id"] = cid
    return cp


def _refused(field: str, call) -> None:
    with pytest.raises(InvalidInput) as refused:
        call()
    assert refused.value.details["field"] == field, refused.value.message
    # The message names the character by its code point; it does not carry it.
    assert not any(c in refused.value.message for c in "\x00\u202e\u2066\u2067\x1b\x85\x07\x9b")


@pytest.mark.parametrize("cid", BAD_CHECKPOINT_IDS, ids=repr)
def test_a_checkpoint_id_that_is_not_one_printable_line_is_refused_naming_it(shared_backend, cid):
    with Ledger(shared_backend.address()) as lg:
        saver = LedgerSaver(lg)
        first = saver.put({"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}, _checkpoint(), {},
                          {"messages": "0001"})
        before = lg.store.ledger_head()
        _refused("checkpoint_id", lambda: saver.put(
            {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}, _checkpoint(cid), {}, {"messages": "0001"}))
        if cid and "\n" not in cid:  # see test_the_gaps_left_in_a_parent_id_a_namespace_and_metadata
            # A child naming it as its parent is refused too (the id is the parent's there).
            _refused("parent_id", lambda: saver.put(
                {"configurable": {"thread_id": THREAD, "checkpoint_ns": "", "checkpoint_id": cid}}, _checkpoint(),
                {}, {"messages": "0001"}))
        assert lg.store.ledger_head() == before
        # The thread still reads as it was saved.
        got = saver.get_tuple({"configurable": {"thread_id": THREAD}})
        assert got is not None and got.config["configurable"]["checkpoint_id"] == \
            first["configurable"]["checkpoint_id"]


@pytest.mark.parametrize("ns", BAD_NAMESPACES, ids=repr)
def test_a_namespace_holding_a_control_character_is_refused_naming_it(shared_backend, ns):
    with Ledger(shared_backend.address()) as lg:
        saver = LedgerSaver(lg)
        saver.put({"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}, _checkpoint(), {},
                  {"messages": "0001"})
        before = lg.store.ledger_head()
        _refused("namespace", lambda: saver.put(
            {"configurable": {"thread_id": THREAD, "checkpoint_ns": ns}}, _checkpoint(), {}, {"messages": "0001"}))
        assert lg.store.ledger_head() == before


#: A parent id or a namespace of several lines (a checkpoint id must be one), and a control
#: or bidirectional character inside the metadata, where no text of the ledger may hold one.
REFUSED = {
    "parent-id-of-two-lines": ("parent_id", {"checkpoint_id": "cp\n2"}, {}),
    "namespace-of-two-lines": ("namespace", {"checkpoint_ns": "ns\n2"}, {}),
    "bidi-in-a-metadata-value": ("metadata", {}, {"note": "ok \u202etxt.exe"}),
    "bidi-in-a-metadata-key": ("metadata", {}, {"k\u202e": 1}),
}


@pytest.mark.parametrize("gap", sorted(REFUSED))
def test_a_multiline_parent_id_or_namespace_or_a_control_in_metadata_is_refused(shared_backend, gap):
    field, conf, metadata = REFUSED[gap]
    with Ledger(shared_backend.address()) as lg:
        saver = LedgerSaver(lg)
        saver.put({"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}, _checkpoint(), {},
                  {"messages": "0001"})
        before = lg.store.ledger_head()
        try:
            _refused(field, lambda: saver.put({"configurable": {"thread_id": THREAD, "checkpoint_ns": "", **conf}},
                                              _checkpoint(), metadata, {"messages": "0001"}))
        finally:
            unchanged = lg.store.ledger_head() == before
        assert unchanged
