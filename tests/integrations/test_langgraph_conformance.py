"""LangGraph's own checkpointer conformance suite over ``LedgerSaver``, on every backend.

``validate()`` runs the suite's 81 tests in eight capabilities (put, put_writes,
get_tuple, list, delete_thread, and the extended copy_thread, delete_for_runs, prune);
the test fails if any capability fails or is not detected. The saver is made fresh per
capability on a fresh ledger of the backend, as the suite asks.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.langgraph import LedgerSaver  # noqa: E402


def test_every_capability_passes(backend):
    ledgers: list[Ledger] = []

    @checkpointer_test(name=f"LedgerSaver[{backend.name}]")
    async def saver():
        lg = Ledger(store=backend.new_store())
        ledgers.append(lg)
        yield LedgerSaver(lg)

    report = asyncio.run(validate(saver))
    results = report.results
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    failing = {name: (r.detected, r.passed, r.failures) for name, r in results.items()
               if not (r.detected and r.passed)}
    assert failing == {}, failing
    assert sum(r.tests_passed for r in results.values()) == 81
    for lg in ledgers:  # every deletion was recorded first: the ledgers verify clean
        assert lg.verify() == []
