"""The SQLite store's view store: projection tables in the same file as the log.

Part of the SQLite backend (with ledger/sqlite/store.py): the only place that turns the
neutral table specs and read vocabulary of ledger/views.py into SQLite's dialect. Every
method runs on the store's one connection under its lock; writes run inside a
transaction the store opened (``write_transaction``, or an append for inline upkeep).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput
from .schema import UNKEPT  # the file's table of writes that did not keep every projection
from ..views import NOT_NULL, ORDINAL, TRACKING, VERSIONS, Index, TableSpec, ViewStore

#: A tracking position meaning "never built over the log it has": catch-up folds from 0.
UNBUILT = -1

if TYPE_CHECKING:
    from .store import SqliteStore

_TYPES = {"text": "TEXT", "int": "INTEGER", "real": "REAL", "blob": "BLOB"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Keys per statement in get_many (under SQLite's default limit of bound parameters).
_MANY = 500


def _ident(name: str) -> str:
    if name == ORDINAL:
        return "rowid"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(f"{name!r} is not a view table or column name", field="view")
    return name


def _literal(value: Any) -> str:
    if value is NOT_NULL:
        return "IS NOT NULL"
    if value is None:
        return "IS NULL"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"= {int(value)}"
    raise InvalidInput(f"an index predicate holds whole numbers or NOT_NULL, not {value!r}", field="view")


def create_sql(spec: TableSpec, table: str) -> str:
    cols = ", ".join(f"{c.name} {_TYPES[c.type]}{'' if c.nullable else ' NOT NULL'}" for c in spec.columns)
    return f"CREATE TABLE {table} ({cols}, PRIMARY KEY ({', '.join(spec.pk)}))"


def index_sql(spec: TableSpec, ix: Index) -> str:
    t = spec.name
    sql = f"CREATE INDEX {t}_{ix.suffix} ON {t}({', '.join(ix.columns)})"
    if ix.where:
        sql += " WHERE " + " AND ".join(f"{c} {_literal(v)}" for c, v in ix.where)
    return sql


class Table:
    """One view table and the statements that keep it, built once per table:
    rebuilding the same SQL strings on every write was a tenth of a command's CPU."""

    __slots__ = ("delete_key", "delete_run", "npk", "order", "spec", "select_run",
                 "update", "upsert", "upsert_changed", "values")

    def __init__(self, spec: TableSpec, table: str) -> None:
        self.spec = spec
        cols = list(spec.column_names)
        rest = [c for c in cols if c not in spec.pk]
        # Columns a secondary index reads (its keys, its partial WHERE). An UPDATE that
        # sets one, even to its old value, deletes and reinserts that index's entry (a
        # dirty page per index), so the in-place update below leaves them out.
        words = spec.indexed_columns()
        keyed = [c for c in rest if c in words]
        free = [c for c in rest if c not in keyed]
        self.upsert = _upsert_sql(spec, table, cols, rest)
        # ... and the same, as a no-op when the stored row already holds these values.
        self.upsert_changed = self.upsert + (
            f" WHERE ({', '.join(rest)}) IS NOT ({', '.join('excluded.' + c for c in rest)})" if rest else ""
        )
        self.update = (
            f"UPDATE {table} SET {', '.join(f'{c}=:{c}' for c in free)} "
            f"WHERE {' AND '.join([*(f'{c}=:{c}' for c in spec.pk), *(f'{c} IS :{c}' for c in keyed)])} "
            f"AND ({', '.join(free)}) IS NOT ({', '.join(':' + c for c in free)})"
            if free else None
        )
        self.order = (*spec.pk, *rest)
        self.npk = len(spec.pk)
        get = itemgetter(*self.order)  # a row's values as the SELECT below returns them
        self.values = get if len(self.order) > 1 else lambda row: (get(row),)
        self.select_run = f"SELECT {', '.join(self.order)} FROM {table} WHERE run_id=?"
        self.delete_key = f"DELETE FROM {table} WHERE {' AND '.join(f'{c}=?' for c in spec.pk)}"
        self.delete_run = f"DELETE FROM {table} WHERE run_id=?"


def _upsert_sql(spec: TableSpec, table: str, cols: list[str], rest: list[str]) -> str:
    # An upsert, not INSERT OR REPLACE: REPLACE deletes and reinserts, giving the row a
    # new rowid, and "oldest first" is rowid order here. Updating in place keeps a run
    # where it was first inserted, inline and rebuilt alike.
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) "
        f"VALUES ({', '.join(':' + c for c in cols)}) "
        f"ON CONFLICT ({', '.join(spec.pk)}) DO "
        + (f"UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in rest)}" if rest else "NOTHING")
    )


class SqliteViewStore(ViewStore):
    """View tables, tracking rows and reads on a SqliteStore's connection."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._tables: dict[str, Table] = {}
        self._specs: dict[str, TableSpec] = {}
        self._sql: dict[Any, str] = {}

    @property
    def conn(self) -> sqlite3.Connection:
        return self._store.conn

    # --- schema, tracking and versions ------------------------------------------------

    def _table_names(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def _outdated(self, views: Mapping[str, tuple[TableSpec, int]]) -> list[str]:
        """The projections whose kept rows were made by another version of their fold."""
        conn = self.conn
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (VERSIONS,)).fetchone():
            return list(views)
        kept = dict(conn.execute(f"SELECT name, version FROM {VERSIONS}"))
        return [n for n, (_, v) in views.items() if kept.get(n, 1) != v]

    def outdated(self, views: Mapping[str, tuple[TableSpec, int]]) -> list[str]:
        with self._store.lock:
            return self._outdated(views)

    def needs_prepare(self, views: Mapping[str, tuple[TableSpec, int]]) -> bool:
        with self._store.lock:
            existing = self._table_names()
            missing = [s for s, _ in views.values() if s.name not in existing]
            return not (TRACKING in existing and VERSIONS in existing and not missing
                        and not self._outdated(views))

    def prepare(self, views: Mapping[str, tuple[TableSpec, int]]) -> None:
        conn = self.conn
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TRACKING} (name TEXT PRIMARY KEY, position INTEGER NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {VERSIONS} (name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        existing = self._table_names()
        # A table made over a non-empty log was kept by none of its writes: UNBUILT, so
        # catch-up folds it from the start (inline writes no longer move tracking rows).
        start = UNBUILT if conn.execute("SELECT 1 FROM events LIMIT 1").fetchone() else 0
        for name, (spec, version) in views.items():
            if spec.name not in existing:
                conn.execute(create_sql(spec, spec.name))
                for ix in spec.indexes:
                    conn.execute(index_sql(spec, ix))
                conn.execute(f"INSERT OR REPLACE INTO {TRACKING} VALUES (?, ?)", (name, start))
                conn.execute(f"INSERT OR REPLACE INTO {VERSIONS} VALUES (?, ?)", (name, version))
        # Views kept by another version (or before versions were recorded, 1): back
        # to position 0, so the catch-up that follows refolds every run into rows
        # of this version, in its own transaction, however many processes open.
        # The table is made anew: another version may have other columns, and every row
        # is derived anyway.
        for name in self._outdated(views):
            spec = views[name][0]
            conn.execute(f"DROP TABLE IF EXISTS {_ident(spec.name)}")
            conn.execute(create_sql(spec, spec.name))
            for ix in spec.indexes:
                conn.execute(index_sql(spec, ix))
            conn.execute(f"UPDATE {TRACKING} SET position = ? WHERE name = ?", (UNBUILT, name))
            conn.execute(f"INSERT OR REPLACE INTO {VERSIONS} VALUES (?, ?)", (name, views[name][1]))

    def _effective(self) -> dict[str, tuple[int, bool]]:
        """{name: (position, behind?)}: how far each projection is current, and whether
        catch-up must refold it from there.

        A tracking row says where a catch-up or rebuild left the projection; every write
        since kept it unless a mark in views_unkept (ledger/sqlite/store.py) says the write did not:
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

    def positions(self) -> dict[str, int]:
        """Each projection's effective position: how far it is current (``_effective``)."""
        with self._store.lock:
            return {n: pos for n, (pos, _) in self._effective().items()}

    def lagging(self, names: Iterable[str], last_position: int) -> dict[str, int]:
        wanted = set(names)
        with self._store.lock:
            return {n: pos for n, (pos, behind) in self._effective().items() if n in wanted and behind}

    def table(self, spec: TableSpec) -> Table:
        t = self._tables.get(spec.name)
        if t is None or t.spec is not spec:
            t = self._tables[spec.name] = Table(spec, _ident(spec.name))
            self._specs[spec.name] = spec
        return t

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

    def fill(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]], *, many: bool) -> None:
        """A rebuild's new table: nearly every run is written once, so write it outright (the
        swap refolds the runs that moved meanwhile, hence the delete and the upsert)."""
        conn = self.conn
        if many:
            conn.execute(table.delete_run, (run_id,))
        if rows:
            conn.executemany(table.upsert, rows)

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

    def create_shadows(self, specs: Sequence[TableSpec]) -> list[Table]:
        conn = self.conn
        out = []
        for spec in specs:
            tmp = _ident(spec.name) + "__new"
            conn.execute(f"DROP TABLE IF EXISTS {tmp}")
            conn.execute(create_sql(spec, tmp))
            out.append(Table(spec, tmp))
        return out

    def shadow(self, spec: TableSpec) -> Table:
        """The handle of a shadow table ``create_shadows`` made (possibly in an earlier transaction)."""
        return Table(spec, _ident(spec.name) + "__new")

    def swap_in(self, views: Mapping[str, tuple[TableSpec, int]], position: int) -> dict[str, int]:
        conn = self.conn
        counts = {}
        for name, (spec, version) in views.items():
            conn.execute(f"DROP TABLE IF EXISTS {spec.name}")
            conn.execute(f"ALTER TABLE {spec.name}__new RENAME TO {spec.name}")
            for ix in spec.indexes:
                conn.execute(index_sql(spec, ix))
            conn.execute(f"INSERT OR REPLACE INTO {TRACKING} VALUES (?, ?)", (name, position))
            conn.execute(f"INSERT OR REPLACE INTO {VERSIONS} VALUES (?, ?)", (name, version))
            counts[name] = conn.execute(f"SELECT count(*) FROM {spec.name}").fetchone()[0]
        self._prune()
        return counts

    # --- reads ------------------------------------------------------------------------

    def _run(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        store = self._store
        with store.lock:
            try:
                return store.conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                from .driver import explain as _explain

                raise _explain(exc, "reading the views", store.path) from exc

    def get(self, table: str, key: Sequence[Any], columns: Sequence[str]) -> tuple[Any, ...] | None:
        ck = ("get", table, tuple(columns))
        sql = self._sql.get(ck)
        if sql is None:
            spec = self._specs.get(table)
            pk = spec.pk if spec is not None else ("run_id",)
            sql = self._sql[ck] = (
                f"SELECT {', '.join(map(_ident, columns))} FROM {_ident(table)} "
                f"WHERE {' AND '.join(f'{_ident(c)}=?' for c in pk)}"
            )
        rows = self._run(sql, tuple(key))
        return rows[0] if rows else None

    def get_many(self, table: str, keys: Iterable[Any], columns: Sequence[str]) -> dict[Any, tuple[Any, ...]]:
        spec = self._specs.get(table)
        pk = spec.pk if spec is not None else ("run_id",)
        if len(pk) != 1:
            raise InvalidInput(f"get_many needs a one-column primary key; {table} has {pk}", field="view")
        keys = list(keys)
        cols = ", ".join(map(_ident, (pk[0], *columns)))
        out: dict[Any, tuple[Any, ...]] = {}
        for i in range(0, len(keys), _MANY):
            chunk = keys[i:i + _MANY]
            sql = f"SELECT {cols} FROM {_ident(table)} WHERE {_ident(pk[0])} IN ({','.join('?' * len(chunk))})"
            for r in self._run(sql, chunk):
                out[r[0]] = r[1:]
        return out

    def _filters(self, where: Mapping[str, Any] | None, where_not: Mapping[str, Any] | None,
                 between: tuple[str, Any, Any] | None, args: list[Any]) -> list[str]:
        terms = []
        for c, v in (where or {}).items():
            c = _ident(c)
            if v is NOT_NULL or v is None or (isinstance(v, int) and not isinstance(v, bool)):
                # Whole numbers inline, so the planner can match a partial index's WHERE.
                terms.append(f"{c} {_literal(v)}")
            elif isinstance(v, tuple):
                terms.append(f"{c} IN ({', '.join('?' * len(v))})")
                args.extend(v)
            else:
                terms.append(f"{c}=?")
                args.append(v)
        for c, v in (where_not or {}).items():
            terms.append(f"{_ident(c)} IS NOT ?")
            args.append(v)
        if between is not None:
            c, low, high = between
            c = _ident(c)
            terms.append(f"{c} IS NOT NULL")
            if low is not None:
                terms.append(f"{c} >= ?")
                args.append(low)
            if high is not None:
                terms.append(f"{c} <= ?")
                args.append(high)
        return terms

    def _index_for(self, table: str, where: Mapping[str, Any] | None, between: tuple[str, Any, Any] | None) -> str:
        """``INDEXED BY`` a partial index when the filters select exactly its rows' range:
        the planner would not otherwise trust a partial index for a bound range."""
        spec = self._specs.get(table)
        if spec is None or between is None:
            return ""
        have = dict(where or {})
        have.setdefault(between[0], NOT_NULL)
        for ix in spec.indexes:
            if ix.where and ix.columns[0] == between[0] and all(
                have.get(c, _absent) == v or (v is NOT_NULL and c in have and have[c] is not None)
                for c, v in ix.where
            ):
                return f" INDEXED BY {spec.name}_{ix.suffix}"
        return ""

    def select(
        self,
        table: str,
        columns: Sequence[str],
        *,
        where: Mapping[str, Any] | None = None,
        where_not: Mapping[str, Any] | None = None,
        between: tuple[str, Any, Any] | None = None,
        order: Sequence[str] | None = None,
        after: Sequence[Any] | None = None,
        limit: int | None = None,
    ) -> list[tuple[Any, ...]]:
        sql, args = self._select_sql(table, columns, where, where_not, between, order, after, limit)
        return self._run(sql, args)

    def _select_sql(self, table: str, columns: Sequence[str], where: Mapping[str, Any] | None,
                    where_not: Mapping[str, Any] | None, between: tuple[str, Any, Any] | None,
                    order: Sequence[str] | None, after: Sequence[Any] | None,
                    limit: int | None) -> tuple[str, list[Any]]:
        args: list[Any] = []
        terms = self._filters(where, where_not, between, args)
        if after is not None:
            if not order:
                raise InvalidInput("a keyset cursor (after) needs an order", field="after")
            terms.append(f"({', '.join(map(_ident, order))}) > ({', '.join('?' * len(after))})")
            args.extend(after)
        sql = (f"SELECT {', '.join(map(_ident, columns))} FROM {_ident(table)}"
               + self._index_for(table, where, between))
        if terms:
            sql += " WHERE " + " AND ".join(terms)
        if order:
            sql += " ORDER BY " + ", ".join(map(_ident, order))
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return sql, args

    def select_joined(self, table: str, columns: Sequence[str], other: str, other_columns: Sequence[str],
                      *, key: str = "run_id", **filters: Any) -> list[tuple[Any, ...]]:
        # One statement: the selection as a subquery (keeping its partial index), joined to
        # the other table by primary key. The stall scan is this: two lookups cost a third more.
        self._check_key(other, key)
        inner, args = self._select_sql(table, (key, *columns), filters.get("where"), filters.get("where_not"),
                                       filters.get("between"), filters.get("order"), filters.get("after"),
                                       filters.get("limit"))
        picked = ", ".join([*(f"s.{_ident(c)}" for c in columns), *(f"o.{_ident(c)}" for c in other_columns)])
        sql = (f"SELECT {picked} FROM ({inner}) AS s JOIN {_ident(other)} AS o "
               f"ON o.{_ident(key)} = s.{_ident(key)}")
        if filters.get("order"):
            sql += " ORDER BY " + ", ".join(f"s.{_ident(c)}" for c in filters["order"])
        return self._run(sql, args)

    def _check_key(self, other: str, key: str) -> None:
        pk = self._specs[other].pk if other in self._specs else None
        if pk is not None and pk != (key,):
            raise InvalidInput(f"select_joined joins on the other table's primary key; {other} is keyed by "
                               f"{pk}, not ({key!r},)", field="view")

    def count(self, table: str, *, where: Mapping[str, Any] | None = None,
              where_not: Mapping[str, Any] | None = None, order: Sequence[str] | None = None,
              after: Sequence[Any] | None = None) -> int:
        args: list[Any] = []
        terms = self._filters(where, where_not, None, args)
        if after is not None:
            if not order:
                raise InvalidInput("a keyset cursor (after) needs an order", field="after")
            terms.append(f"({', '.join(map(_ident, order))}) > ({', '.join('?' * len(after))})")
            args.extend(after)
        sql = f"SELECT count(*) FROM {_ident(table)}" + (" WHERE " + " AND ".join(terms) if terms else "")
        return self._run(sql, args)[0][0]


_absent = object()
