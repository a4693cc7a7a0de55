"""Values beside the log in the SQLite file: one table, a row per run and sha256.

The interface is ``EventStore.put_values`` and its siblings (ledger/store.py); this is
only its dialect, mixed into ``SqliteStore``. A value is written once (``INSERT OR
IGNORE``): its name is its digest, so a second write of it can only be the same bytes.
Inside an ``execute`` (the store's one connection already in its write transaction) a
put joins that transaction, so a graph checkpoint's values and its event commit or roll
back together, and ``require_values`` checks there, under the write lock, that the values
the write continues or names again are stored and not erased.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from typing import Any

from ..verify import not_stored
from .driver import explain

TABLE = "run_values"
#: Made with the ledger and added to an older file by its first writable open
#: (ledger/sqlite/sqlite_schema.py): an additive table, so the file schema version stays.
CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id TEXT NOT NULL, sha256 TEXT NOT NULL, "
          "value BLOB NOT NULL, PRIMARY KEY (run_id, sha256))")
#: The run's erasures found without reading its other events: every write that continues
#: a value checks them (require_values), so the check costs the erasures, not the run's length.
ERASURES_INDEX = "CREATE INDEX IF NOT EXISTS events_erasures ON events(run_id) WHERE type = 'values_erased'"
_EXISTS = f"SELECT 1 FROM sqlite_master WHERE type='table' AND name='{TABLE}'"
#: Digests per statement: well under SQLite's limit of bound parameters.
_CHUNK = 500


def _chunks(digests: Iterable[str]) -> list[list[str]]:
    items = list(digests)
    return [items[i:i + _CHUNK] for i in range(0, len(items), _CHUNK)]


def _as_bytes(v: Any) -> bytes:
    # A row edited behind the store may hold text or a number: its bytes then hash to
    # another digest, which verify reports as a changed value.
    return v if isinstance(v, bytes) else str(v).encode()


class SqliteValues:
    """``put_values``, ``get_values``, ``delete_values`` and ``value_digests`` for
    ``SqliteStore`` (which provides ``conn``, ``lock``, ``write_transaction``, ``path``)."""

    values_join_writes = True
    conn: sqlite3.Connection
    path: str
    lock: Any

    def _has_values_table(self) -> bool:
        # A file opened read-only before its first writable open since the table came.
        return self.conn.execute(_EXISTS).fetchone() is not None

    def put_values(self, run_id: str, values: dict[str, bytes]) -> int:
        if not values:
            return 0
        rows = [(run_id, d, v) for d, v in values.items()]
        with self.lock:
            if self.conn.in_transaction:  # the write this put is part of (an execute's decide)
                return self._insert_values(rows)
            with self.write_transaction("storing values"):  # type: ignore[attr-defined]
                return self._insert_values(rows)

    def _insert_values(self, rows: list[tuple[str, str, bytes]]) -> int:
        try:
            before = self.conn.total_changes
            self.conn.executemany(f"INSERT OR IGNORE INTO {TABLE} (run_id, sha256, value) VALUES (?, ?, ?)", rows)
            return self.conn.total_changes - before
        except sqlite3.Error as exc:
            raise explain(exc, "storing values", self.path) from exc

    def require_values(self, run_id: str, digests: Iterable[str]) -> None:
        """Refuse (ValueNotStored) the write being decided unless each value is stored and no
        recorded ``values_erased`` event of the run names it: read in that write's own
        transaction, so no erasure can come between the check and the write."""
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return
        with self.lock:
            try:
                if not self._has_values_table():
                    raise not_stored(run_id, wanted[0])
                stored: set[str] = set()
                for part in _chunks(wanted):
                    stored.update(d for (d,) in self.conn.execute(
                        f"SELECT sha256 FROM {TABLE} WHERE run_id = ? AND sha256 IN ({','.join('?' * len(part))})",
                        (run_id, *part)))
                erasures = [_as_bytes(p) for (p,) in self.conn.execute(
                    "SELECT payload FROM events WHERE run_id = ? AND type = 'values_erased'", (run_id,))]
            except sqlite3.Error as exc:
                raise explain(exc, "checking values", self.path) from exc
        for d in wanted:
            if d not in stored or any(d.encode() in p for p in erasures):
                raise not_stored(run_id, d)

    def get_values(self, run_id: str, digests: Iterable[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        with self.lock:
            try:
                if not self._has_values_table():
                    return out
                for batch in _chunks(dict.fromkeys(digests)):
                    marks = ",".join("?" * len(batch))
                    for d, v in self.conn.execute(
                            f"SELECT sha256, value FROM {TABLE} WHERE run_id = ? AND sha256 IN ({marks})",
                            (run_id, *batch)):
                        out[d] = _as_bytes(v)
            except sqlite3.Error as exc:
                raise explain(exc, "reading values", self.path) from exc
        return out

    def delete_values(self, run_id: str, digests: Iterable[str]) -> int:
        batches = list(_chunks(dict.fromkeys(digests)))
        if not batches:
            return 0
        with self.write_transaction("deleting values"):  # type: ignore[attr-defined]
            before = self.conn.total_changes
            for batch in batches:
                marks = ",".join("?" * len(batch))
                # Only what a recorded erasure of the run names (its digests are in its payload),
                # and that no graph event after it names again: a checkpoint saved between the
                # record and the deletion keeps the value it stored.
                self.conn.execute(
                    f"DELETE FROM {TABLE} WHERE run_id = ? AND sha256 IN ({marks}) AND EXISTS (SELECT 1 FROM "
                    "events e WHERE e.run_id = ? AND e.type = 'values_erased' "
                    f"AND instr(e.payload, CAST({TABLE}.sha256 AS BLOB)) > 0 AND NOT EXISTS (SELECT 1 FROM events g "
                    "WHERE g.run_id = e.run_id AND g.seq > e.seq "
                    "AND g.type IN ('graph_checkpoint_saved', 'graph_writes_saved') "
                    f"AND instr(g.payload, CAST({TABLE}.sha256 AS BLOB)) > 0))", (run_id, *batch, run_id))
            return self.conn.total_changes - before

    def value_digests(self, run_id: str) -> dict[str, str]:
        with self.lock:
            try:
                if not self._has_values_table():
                    return {}
                rows = self.conn.execute(f"SELECT sha256, value FROM {TABLE} WHERE run_id = ?", (run_id,)).fetchall()
            except sqlite3.Error as exc:
                raise explain(exc, "reading values", self.path) from exc
        return {d: hashlib.sha256(_as_bytes(v)).hexdigest() for d, v in rows}
