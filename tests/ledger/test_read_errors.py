"""A read that meets a broken database raises a typed error naming what it was reading.

The hot reads (a run's head, a page of a run, a view row) map driver errors in one call
(``FoldingStore._read``) rather than through the ``_reading`` context; these tests keep
that mapping honest on both backends: the table a read needs is renamed behind the
store's back, the read raises ``StoreUnavailable`` saying what it was doing, and once the
table is back the log reads as before.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest

from handoff.facade import Ledger
from handoff.ledger.errors import StoreUnavailable
from tests.pg import fresh_url


def _sqlite(tmp_path):
    path = str(tmp_path / "ledger.db")

    def rename(old: str, new: str) -> None:
        with closing(sqlite3.connect(path)) as c:
            c.execute(f"ALTER TABLE {old} RENAME TO {new}")
            c.commit()

    return path, rename


def _postgres(tmp_path):
    import psycopg

    url = fresh_url()

    def rename(old: str, new: str) -> None:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"ALTER TABLE {old} RENAME TO {new}")

    return url, rename


@pytest.mark.parametrize("make", [_sqlite, _postgres], ids=["sqlite", "postgres"])
def test_a_read_of_a_missing_table_is_a_typed_error_naming_the_read(make, tmp_path):
    address, rename = make(tmp_path)
    lg = Ledger(address)
    try:
        lg.open(run_id="r1", goal="g", target="file:out.txt", owner="o")
        before = [(r.seq, r.hash) for r in lg.store.read_run("r1")]
        head = lg.store.head("r1")

        rename("checkpoints", "checkpoints_away")
        with pytest.raises(StoreUnavailable, match="reading the views"):
            lg.status("r1")
        rename("checkpoints_away", "checkpoints")

        rename("heads", "heads_away")
        with pytest.raises(StoreUnavailable, match="reading a run's head"):
            lg.store.head("r1")
        rename("heads_away", "heads")

        rename("events", "events_away")
        with pytest.raises(StoreUnavailable, match="failed while reading on"):
            list(lg.store.read_run("r1"))
        rename("events_away", "events")

        assert [(r.seq, r.hash) for r in lg.store.read_run("r1")] == before
        assert lg.store.head("r1") == head
        assert lg.status("r1")["state"] == "queued"
    finally:
        lg.close()
