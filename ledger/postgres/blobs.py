"""Values beside the log in PostgreSQL: one table, a row per run and sha256.

The interface is ``EventStore.put_values`` and its siblings (ledger/store.py); this is
only its dialect, mixed into ``PostgresStore``. The owner creates the table with the
ledger (schema 6); writers may insert, read and delete rows, never update one (roles.py):
a value's name is its digest, so it is written once and never changed.

A put is one statement on the store's autocommit connection, so it commits on its own,
before the event that names the value is written (``values_join_writes`` is False): the
write path sends an event in one or two round trips (store.py, ``_write``), and holding
values in that transaction would add one. A put whose event is then refused (a stale
lease) leaves values nothing names; they are harmless, and ``verify`` reads only the
values events name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

TABLE = "run_values"
CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id text COLLATE \"C\" NOT NULL, sha256 text NOT NULL, "
          "value bytea NOT NULL, PRIMARY KEY (run_id, sha256))")


class PostgresValues:
    """``put_values``, ``get_values``, ``delete_values`` and ``value_digests`` for
    ``PostgresStore`` (which provides ``lock``, ``mapped``, ``ready`` and ``readonly``)."""

    values_join_writes = False
    lock: Any
    readonly: bool
    path: str

    def put_values(self, run_id: str, values: dict[str, bytes]) -> int:
        if not values:
            return 0
        self._writable("storing values")
        digests, blobs = list(values), list(values.values())
        with self.lock, self.mapped("storing values"):  # type: ignore[attr-defined]
            cur = self.ready().execute(  # type: ignore[attr-defined]
                f"INSERT INTO {TABLE} (run_id, sha256, value) SELECT %s, d, v FROM "
                "unnest(%s::text[], %s::bytea[]) AS t(d, v) ON CONFLICT DO NOTHING",
                (run_id, digests, blobs))
            return max(cur.rowcount, 0)

    def get_values(self, run_id: str, digests: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return {}
        with self.lock, self.mapped("reading values"):  # type: ignore[attr-defined]
            rows = self.ready().execute(  # type: ignore[attr-defined]
                f"SELECT sha256, value FROM {TABLE} WHERE run_id = %s AND sha256 = ANY(%s)",
                (run_id, wanted)).fetchall()
        return {d: bytes(v) for d, v in rows}

    def delete_values(self, run_id: str, digests: Iterable[str]) -> int:
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return 0
        self._writable("deleting values")
        with self.lock, self.mapped("deleting values"):  # type: ignore[attr-defined]
            cur = self.ready().execute(  # type: ignore[attr-defined]
                f"DELETE FROM {TABLE} WHERE run_id = %s AND sha256 = ANY(%s)", (run_id, wanted))
            return max(cur.rowcount, 0)

    def value_digests(self, run_id: str) -> dict[str, str]:
        # The server hashes the bytes: verify reads 64 characters per value, not the value.
        with self.lock, self.mapped("reading values"):  # type: ignore[attr-defined]
            rows = self.ready().execute(  # type: ignore[attr-defined]
                f"SELECT sha256, encode(sha256(value), 'hex') FROM {TABLE} WHERE run_id = %s", (run_id,)).fetchall()
        return dict(rows)

    def _writable(self, doing: str) -> None:
        if self.readonly:
            from ..errors import StoreUnavailable

            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
