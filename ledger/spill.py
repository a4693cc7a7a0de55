"""A bounded place for partial folds that do not fit in memory: a private temporary file.

A one-pass rebuild (projections/rebuild.py) meets every run of the log at once when
their events are interleaved; it keeps a bounded number of folds in memory and puts the
others here, encoded, until their run's events come round again. The file is SQLite's
private temporary database (``connect("")``): unlinked as soon as it is opened, so a
killed rebuild leaves nothing behind, and its page cache is small and fixed, so memory
stays flat however many runs the log holds. It is not the ledger and holds no truth.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

#: Pages of the spill file held in memory (KiB, SQLite's negative cache_size).
_CACHE_KIB = 2048


class Spill:
    """Entries by run id: (first position, last position, blob or None), read back in
    order of first position (the order the runs began in)."""

    def __init__(self) -> None:
        self._conn = sqlite3.connect("", isolation_level=None)
        self._conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        self._conn.execute("PRAGMA journal_mode=OFF")
        self._conn.execute("PRAGMA synchronous=OFF")
        # first position is unique per run: it is the rowid, so reading in order is a scan.
        self._conn.execute(
            "CREATE TABLE spill (first INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, "
            "last INTEGER NOT NULL, blob BLOB)"
        )
        self._conn.execute("BEGIN")

    def get(self, run_id: str) -> tuple[int, int, bytes | None] | None:
        return self._conn.execute(
            "SELECT first, last, blob FROM spill WHERE run_id=?", (run_id,)
        ).fetchone()

    def put_many(self, entries: list[tuple[int, str, int, bytes | None]]) -> None:
        """(first, run_id, last, blob) each; replaces what a run had."""
        self._conn.executemany("INSERT OR REPLACE INTO spill VALUES (?,?,?,?)", entries)

    def in_order(self, page: int = 500) -> Iterator[tuple[str, int, bytes | None]]:
        """(run_id, last position, blob) by first position, a page at a time."""
        after = -1
        while True:
            rows = self._conn.execute(
                "SELECT first, run_id, last, blob FROM spill WHERE first>? ORDER BY first LIMIT ?",
                (after, page),
            ).fetchall()
            for _, run_id, last, blob in rows:
                yield run_id, last, blob
            if len(rows) < page:
                return
            after = rows[-1][0]

    def close(self) -> None:
        self._conn.close()
