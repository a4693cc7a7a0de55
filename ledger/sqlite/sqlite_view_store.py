"""The SQLite store's view store: projection tables in the same file as the log.

Part of the SQLite backend (with ledger/sqlite/sqlite_store.py): SQLite's words for the view SQL
that ledger/viewsql.py builds, its tracking rows and marks, and its inline upkeep. Every
method runs on the store's one connection under its lock; writes run inside a
transaction the store opened (``write_transaction``, or an append for inline upkeep).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import viewsql
from .sqlite_schema import UNKEPT  # the file's table of writes that did not keep every projection
from ..view_tables import TRACKING, VERSIONS, Views

if TYPE_CHECKING:
    from ..store_core import Reading
    from .sqlite_store import SqliteStore

#: A tracking position meaning "never built over the log it has": catch-up folds from 0.
UNBUILT = -1

SQLITE = viewsql.Dialect(
    param="?", named=":{}", types={"text": "TEXT", "int": "INTEGER", "real": "REAL", "blob": "BLOB"},
    # Every table keeps its rows' creation order in its rowid: no column of its own.
    ordinal="rowid", ordinal_column="", distinct="IS NOT", same="IS",
    # Keys per statement in get_many, under SQLite's default limit of bound parameters.
    batch=500, arrays=False,
    swap=("ALTER TABLE {t}__new RENAME TO {t}",),
    # The planner would not otherwise trust a partial index for a bound range.
    index_hint=" INDEXED BY {}",
)


class Table(viewsql.Table):
    __slots__ = ()
    dialect = SQLITE


def _fetch(conn: sqlite3.Connection, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(sql, args).fetchall()


class SqliteViewStore(viewsql.SqlViewStore):
    """View tables, tracking rows and reads on a SqliteStore's connection."""

    table_class = Table
    _store: SqliteStore

    @property
    def conn(self) -> sqlite3.Connection:
        return self._store.conn

    def _exec(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, args)

    def _executemany(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.conn.executemany(sql, rows)

    def _reading(self) -> Reading:
        # The store's own context, for a few reads together; a single read takes _run.
        return self._store._reading("reading the views")

    def _run(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        store = self._store
        return store._read("reading the views", _fetch, store.conn, sql, args)

    # --- schema, tracking and versions ------------------------------------------------

    def _table_names(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _bookkeeping(self) -> None:
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {TRACKING} (name TEXT PRIMARY KEY, position INTEGER NOT NULL)")
        self.conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSIONS} (name TEXT PRIMARY KEY, version INTEGER NOT NULL)")

    def _track_new(self, name: str) -> None:
        # A table made over a non-empty log was kept by none of its writes: UNBUILT, so
        # catch-up folds it from the start (inline writes no longer move tracking rows).
        start = UNBUILT if self.conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() else 0
        self._track_at(name, start)

    def _track_unbuilt(self, name: str) -> None:
        self.conn.execute(f"UPDATE {TRACKING} SET position = ? WHERE name = ?", (UNBUILT, name))

    def _track_at(self, name: str, position: int) -> None:
        self.conn.execute(f"INSERT OR REPLACE INTO {TRACKING} VALUES (?, ?)", (name, position))


    def _effective(self) -> dict[str, tuple[int, bool]]:
        """{name: (position, behind?)}: how far each projection is current, and whether
        catch-up must refold it from there.

        A tracking row says where a catch-up or rebuild left the projection; every write
        since kept it unless a mark in views_unkept (ledger/sqlite/sqlite_store.py) says the write did not:
        the projection is current up to just before the first such mark, or to the log's
        end. A file of schema 1 read as it is (read-only, never upgraded) has no marks:
        there every inline write moved the rows, and a row behind the log's end is behind."""
        if not self._run("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (TRACKING,)):
            return {}  # no projection was ever prepared here: no positions, not a driver error
        tracking = self._run(f"SELECT name, position FROM {TRACKING}", ())
        last = self._run("SELECT coalesce(max(position), 0) FROM events", ())[0][0]
        marked = bool(self._run("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (UNKEPT,)))
        out = {}
        for name, pos in tracking:
            if pos < 0:
                out[name] = (0, True)
            elif not marked:
                out[name] = (pos, pos < last)
            else:
                first = self._run(
                    f"SELECT min(position) FROM {UNKEPT} WHERE position > ? "
                    "AND instr(',' || kept || ',', ?) = 0", (pos, f",{name},"))[0][0]
                out[name] = (max(pos, first - 1), True) if first is not None else (max(pos, last), False)
        return out

    # --- writing ----------------------------------------------------------------------

    def sync_one(self, table: Table, row: Mapping[str, Any]) -> None:
        """Make the stored row equal ``row``, writing nothing if it already does.

        Compared with the table, never with a remembered state, so a row left stale by any
        other writer is rewritten. Most commands change a row's non-indexed columns only
        (a checkpoint's packet and positions): an in-place UPDATE of those leaves every
        secondary index untouched. A new row, or one whose indexed columns moved (a state
        change), takes the upsert, which keeps the row's rowid."""
        conn = self.conn
        if table.update is None or not conn.execute(table.update, row).rowcount:
            conn.execute(table.upsert_changed, row)

    def sync_many(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Make a run's stored rows equal ``rows``: delete those that went away, write those
        that differ. Most commands change none of them, and reading the run's rows (cached
        pages) is much cheaper than rewriting them and their indexes."""
        conn = self.conn
        stored = conn.execute(table.select_run, (run_id,)).fetchall()
        wants = [table.values(row) for row in rows]
        if stored == wants:
            return
        n = table.npk
        have = {r[:n]: r for r in stored}
        for key in have.keys() - {w[:n] for w in wants}:
            conn.execute(table.delete_key, key)
        for row, want in zip(rows, wants):
            old = have.get(want[:n])
            if old is None:
                conn.execute(table.upsert, row)
            elif old != want:
                self.sync_one(table, row)

    def advance(self, names: Sequence[str], last_position: int, run_id: str) -> None:
        """Nothing to write when the store's hooks keep every projection: no mark says
        otherwise, so they are current (``_effective``). A hook that keeps some only names
        them on the mark its write made (the first hook to name any: another's views are
        then refolded by catch-up, never skipped)."""
        if self._store._keeps_views:
            return
        self.conn.execute(
            f"UPDATE {UNKEPT} SET kept = ? WHERE position = (SELECT max(position) FROM {UNKEPT}) AND kept = ''",
            (",".join(names),))

    def set_positions(self, positions: Mapping[str, int]) -> None:
        self.conn.executemany(
            f"UPDATE {TRACKING} SET position=? WHERE name=?", [(pos, n) for n, pos in positions.items()]
        )
        self._prune()

    def _prune(self) -> None:
        """Marks at or before every tracking position say nothing any more."""
        self.conn.execute(f"DELETE FROM {UNKEPT} WHERE position <= (SELECT min(position) FROM {TRACKING})")

    # --- rebuild ----------------------------------------------------------------------

    def swap_in(self, views: Views, position: int) -> dict[str, int]:
        counts = super().swap_in(views, position)
        self._prune()
        return counts
