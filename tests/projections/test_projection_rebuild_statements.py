"""A rebuild writes each run into its empty shadow tables outright.

The shadow tables have no index on run_id until the swap, so a "replace this run's rows"
(DELETE ... WHERE run_id=?) in the batches would scan the whole shadow table once per run:
a rebuild quadratic in the number of runs. Only the swap, which rewrites the runs that
moved while the rebuild ran, replaces rows. Read from SQLite's own statement trace.
"""

from __future__ import annotations

from handoff import Ledger

from projection_support import BUILDER, dump, run_events


def _traced(lg: Ledger) -> list[str]:
    seen: list[str] = []
    lg.store.conn.set_trace_callback(seen.append)
    return seen


def test_batches_never_delete_from_a_shadow_table(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        for i in range(12):
            lg.store.append(f"r-{i:02d}", run_events(i, 12), actor=BUILDER)
        inline = dump(lg.store.path)
        seen = _traced(lg)
        lg.projector.rebuild(batch=5)
        lg.store.conn.set_trace_callback(None)
        deletes = [s for s in seen if s.lstrip().upper().startswith("DELETE")]
        # The rebuild may clear marks of writes that kept fewer views (views_unkept) once
        # every view is past them; a shadow table (name ending __new) it never deletes from.
        assert [s for s in deletes if "__new" in s] == []
        assert all("views_unkept" in s for s in deletes), deletes
        assert dump(lg.store.path) == inline


def test_the_swap_replaces_the_rows_of_runs_that_moved(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        for i in range(6):
            lg.store.append(f"r-{i:02d}", run_events(i, 12), actor=BUILDER)
        moved = []

        def between(done: int, total: int) -> None:
            if not moved:  # run r-01 (kind 1: lease released) takes a new lease mid-rebuild
                moved.append(lg.claim("r-01", "w9"))

        seen = _traced(lg)
        lg.projector.rebuild(batch=2, progress=between)
        lg.store.conn.set_trace_callback(None)
        deletes = [s for s in seen if s.lstrip().upper().startswith("DELETE")]
        deletes = [s for s in deletes if "views_unkept" not in s]  # marks cleared, as above
        assert deletes and all("__new" in s for s in deletes)
        assert lg.check() == []
        rows = dump(lg.store.path, ["owner_load"])["owner_load"]
        assert ("owner1", "r-01", moved[0].lease) in rows
