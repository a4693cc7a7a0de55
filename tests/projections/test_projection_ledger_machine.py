"""handoff.testing.LedgerMachine (the shared stateful machine, with its model of the
rules, racing writers on a second connection and forks) plus the projections' invariants:
after every step the views equal a fresh fold of the log, a rebuild at any point gives
the same rows byte for byte, and at the end rebuilding twice changes nothing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from handoff.projections import engine
from handoff.testing import LedgerMachine

from projection_support import FULL, dump, leftover_tables, schema_objects


class LedgerMachineWithViews(LedgerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = self.ledger.store.path
        self.indexes = schema_objects(self.path)

    def rebuild_changes_nothing(self, name: str | None = None) -> None:
        before = dump(self.path)
        self.ledger.rebuild(name)
        assert dump(self.path) == before
        assert schema_objects(self.path) == self.indexes
        assert leftover_tables(self.path) == []

    @invariant()
    def views_equal_a_fresh_fold(self) -> None:
        assert self.ledger.check() == []

    @rule(name=st.sampled_from([None, *(p.name for p in engine.PROJECTIONS)]))
    def rebuild(self, name: str | None) -> None:
        self.rebuild_changes_nothing(name)

    def teardown(self) -> None:
        try:
            self.rebuild_changes_nothing()
            self.rebuild_changes_nothing()
            assert self.ledger.check() == []
        finally:
            super().teardown()


LedgerMachineWithViews.TestCase.settings = settings(
    max_examples=100 if FULL else 12,
    stateful_step_count=40 if FULL else 20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestLedgerMachineWithViews = LedgerMachineWithViews.TestCase
