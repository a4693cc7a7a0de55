"""After any generated history the views equal a fresh fold of the log, and rebuilding
them from position 0 gives the same rows byte for byte (rebuilding twice changes nothing).

Rebuilds also happen mid-history, so inline upkeep is exercised on rebuilt tables too.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from handoff.projections import engine

from projection_machine import LedgerCommands
from projection_support import FULL, dump, leftover_tables, schema_objects


class RebuildEqualsInline(LedgerCommands):
    def __init__(self) -> None:
        super().__init__()
        self.indexes = schema_objects(self.path)

    def assert_rebuild_changes_nothing(self, name: str | None = None) -> None:
        before = dump(self.path)
        counts = self.lg.rebuild(name)
        after = dump(self.path)
        assert after == before
        assert schema_objects(self.path) == self.indexes  # every index is back
        assert leftover_tables(self.path) == []
        for p in engine.PROJECTIONS:
            if name in (None, p.name):
                assert counts[p.name] == len(after[p.table])
        assert self.lg.check() == []

    @invariant()
    def views_equal_a_fresh_fold(self) -> None:
        assert self.lg.check() == []

    @rule(name=st.sampled_from([None, *(p.name for p in engine.PROJECTIONS)]))
    def rebuild_midway(self, name: str | None) -> None:
        self.assert_rebuild_changes_nothing(name)

    @rule(data=st.data(), writes=st.integers(1, 6))
    def rebuild_while_commands_land(self, data: st.DataObject, writes: int) -> None:
        """Commands between the rebuild's batches: the swap must fold them in."""
        left = [writes]

        def between_batches(done: int, total: int) -> None:
            if left[0] > 0:
                left[0] -= 1
                if data.draw(st.booleans(), label="new run") and len(self.runs) < 8:
                    self.open_run("bob", "mail:b", False, 60.0, 300.0, 600.0, 10)
                else:
                    i = data.draw(st.integers(0, len(self.runs) - 1), label="run")
                    self.happy_step(self.runs[i], data)

        self.lg.projector.rebuild(batch=1, progress=between_batches)
        assert leftover_tables(self.path) == []
        assert self.lg.check() == []
        self.assert_rebuild_changes_nothing()

    def teardown(self) -> None:
        try:
            self.assert_rebuild_changes_nothing()
            self.assert_rebuild_changes_nothing()  # and once more: a rebuild is a fixed point
        finally:
            super().teardown()


RebuildEqualsInline.TestCase.settings = settings(
    max_examples=150 if FULL else 25,
    stateful_step_count=60 if FULL else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestRebuildEqualsInline = RebuildEqualsInline.TestCase
