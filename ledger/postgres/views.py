"""The PostgreSQL store's view store: projection tables in the ledger's own database.

The neutral table specs and read vocabulary of ledger/views.py in PostgreSQL's dialect.
``ORDINAL`` is an identity column each table carries; an upsert updates a row in place,
so a row keeps its ordinal. The partial "due" index is a real partial index. A rebuild
fills shadow tables and swaps them in (drop, rename, index) inside one transaction.
Every method runs on the store's connection under its lock; writes run inside a
transaction the store opened. A view read inside a write transaction first takes the
ledger's views lock exclusively (every write that keeps views holds it shared), so a
decision that reads a view (an owner's load) cannot race another write that changes it.
Positions here are write ids (ledger/postgres/store.py): the tracking rows and a view row's
``last_position`` hold them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput, StoreUnavailable
from .sync import EXISTING, PREFIX, as_json, sync_function, views_function
from ..views import NOT_NULL, ORDINAL, TRACKING, VERSIONS, Index, TableSpec, ViewStore

if TYPE_CHECKING:
    from .store import PostgresStore

#: Text compares bytewise ("C"), as on SQLite, so orders and key ranges agree across backends.
_TYPES = {"text": 'text COLLATE "C"', "int": "bigint", "real": "double precision", "blob": "bytea"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MANY = 1000


def _ident(name: str) -> str:
    if name == ORDINAL:
        return "_ordinal"
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
    return (f"CREATE TABLE {table} (_ordinal bigint GENERATED ALWAYS AS IDENTITY, {cols}, "
            f"PRIMARY KEY ({', '.join(spec.pk)}))")


def index_sql(spec: TableSpec, ix: Index) -> str:
    t = spec.name
    sql = f"CREATE INDEX {t}_{ix.suffix} ON {t} ({', '.join(ix.columns)})"
    if ix.where:
        sql += " WHERE " + " AND ".join(f"{c} {_literal(v)}" for c, v in ix.where)
    return sql


class Table:
    """One view table and the statements that fill it outside a write (a rebuild's shadow
    table, a catch-up), built once. A write keeps it through its sync function."""

    __slots__ = ("delete_run", "name", "spec", "upsert")

    def __init__(self, spec: TableSpec, table: str) -> None:
        self.spec = spec
        self.name = table
        cols = list(spec.column_names)
        rest = [c for c in cols if c not in spec.pk]
        self.upsert = (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(f'%({c})s' for c in cols)}) "
            f"ON CONFLICT ({', '.join(spec.pk)}) DO "
            + (f"UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in rest)}" if rest else "NOTHING")
        )
        self.delete_run = f"DELETE FROM {table} WHERE run_id=%s"


def _row(r: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)


class PostgresViewStore(ViewStore):
    """View tables, tracking rows and reads on a PostgresStore's connection."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._tables: dict[str, Table] = {}
        self._specs: dict[str, TableSpec] = {}

    def x(self, sql: str, args: Any = None) -> Any:
        return self._store.x(sql, args)

    # --- schema, tracking and versions ------------------------------------------------

    def _table_names(self) -> set[str]:
        return {r[0] for r in self.x("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    def _outdated(self, views: Mapping[str, tuple[TableSpec, int]]) -> list[str]:
        if VERSIONS not in self._table_names():
            return list(views)
        kept = dict(self.x(f"SELECT name, version FROM {VERSIONS}").fetchall())
        return [n for n, (_, v) in views.items() if kept.get(n, 1) != v]

    def outdated(self, views: Mapping[str, tuple[TableSpec, int]]) -> list[str]:
        with self._store.lock, self._store.mapped("reading the views"):
            return self._outdated(views)

    def needs_prepare(self, views: Mapping[str, tuple[TableSpec, int]]) -> bool:
        with self._store.lock, self._store.mapped("reading the views"):
            existing = self._table_names()
            kept = {r[0] for r in self.x(EXISTING).fetchall()}
            missing = [s for s, _ in views.values() if s.name not in existing or s.name not in kept]
            return not (TRACKING in existing and VERSIONS in existing and not missing
                        and not self._outdated(views))

    def prepare(self, views: Mapping[str, tuple[TableSpec, int]]) -> None:
        x = self.x
        # id_mark: the last write id when the position was set (ledger/postgres/store.py: every
        # write below it had committed), the point from which lagging() looks for writes
        # that did not keep the views.
        x(f"CREATE TABLE IF NOT EXISTS {TRACKING} (name text PRIMARY KEY, position bigint NOT NULL,"
          " id_mark bigint NOT NULL DEFAULT 0)")
        x(f"CREATE TABLE IF NOT EXISTS {VERSIONS} (name text PRIMARY KEY, version bigint NOT NULL)")
        existing = self._table_names()
        for name, (spec, version) in views.items():
            if spec.name not in existing:
                x(create_sql(spec, spec.name))
                for ix in spec.indexes:
                    x(index_sql(spec, ix))
                self._put(TRACKING, name, 0)  # built over an empty log, or marked unbuilt below
                x(f"UPDATE {TRACKING} SET id_mark = -1 WHERE name = %s AND EXISTS (SELECT 1 FROM events)",
                  (name,))
                self._put(VERSIONS, name, version)
        for name in self._outdated(views):  # made anew: another version may have other columns
            spec = views[name][0]
            x(f"DROP TABLE IF EXISTS {_ident(spec.name)}")
            x(create_sql(spec, spec.name))
            for ix in spec.indexes:
                x(index_sql(spec, ix))
            x(f"UPDATE {TRACKING} SET position = 0, id_mark = -1 WHERE name = %s", (name,))
            self._put(VERSIONS, name, views[name][1])
        self._functions(spec for spec, _ in views.values())

    def _put(self, table: str, name: str, value: int) -> None:
        if table == TRACKING:
            self.x(f"INSERT INTO {TRACKING} (name, position, id_mark) VALUES (%s, %s, "
                    "(SELECT coalesce(max(id), 0) FROM events)) ON CONFLICT (name) DO UPDATE SET "
                    "position=excluded.position, id_mark=excluded.id_mark", (name, value))
            return
        self.x(f"INSERT INTO {table} VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET version=excluded.version",
                (name, value))

    def positions(self) -> dict[str, int]:
        with self._store.lock, self._store.mapped("reading the views"):
            # A ledger no projection was ever prepared in has no tracking table: no
            # positions, not a driver error (the interface promises typed errors only).
            return {n: pos for n, (pos, _) in self._effective(self._tracking()).items()}

    def _tracking(self) -> dict[str, tuple[int, int]]:
        if self.x("SELECT to_regclass(%s)", (TRACKING,)).fetchone()[0] is None:
            return {}
        return {n: (p, m) for n, p, m in self.x(f"SELECT name, position, id_mark FROM {TRACKING}")}

    def table(self, spec: TableSpec) -> Table:
        t = self._tables.get(spec.name)
        if t is None or t.spec is not spec:
            t = self._tables[spec.name] = Table(spec, _ident(spec.name))
            self._specs[spec.name] = spec
        return t

    # --- writing ----------------------------------------------------------------------

    # Inside a write the rows go to the server with its batch (PostgresStore.view_rows),
    # kept by the table's sync function (ledger/postgres/sync.py) in the same call; in a
    # transaction of the owner's own (catch-up), by calling that function directly.

    def sync_one(self, table: Table, row: Mapping[str, Any]) -> None:
        self._keep(table, row.get("run_id") or "", [dict(row)], False)

    def sync_many(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self._keep(table, run_id, [dict(r) for r in rows], True)

    def _keep(self, table: Table, run_id: str, rows: list[dict[str, Any]], many: bool) -> None:
        if not self._store.view_rows(table.name, run_id, rows, many):
            self.x(f"SELECT {PREFIX}{table.name}(%s, %s::jsonb, %s)", (run_id, as_json(rows), many))

    def _functions(self, specs: Iterable[TableSpec]) -> None:
        """Make each table's sync function, and handoff_views over every table that has one
        (the owner's, executable by nobody else)."""
        for spec in specs:
            name = _ident(spec.name)
            self.x(sync_function(spec, name))
            self.x(f"REVOKE ALL ON FUNCTION {PREFIX}{name}(text, jsonb, boolean) FROM PUBLIC")
        self.x(views_function(r[0] for r in self.x(EXISTING).fetchall()))

    def fill(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]], *, many: bool) -> None:
        if many:
            self.x(table.delete_run, (run_id,))
        if rows:
            with self._store.ready().cursor() as cur:
                cur.executemany(table.upsert, rows)

    def advance(self, names: Sequence[str], last_position: int, run_id: str) -> None:
        """Nothing to write: a row every write moved would be one lock every commit on
        every host waits for. Each event says instead whether its write kept the views
        (``events.viewed``); a projection is behind only where one did not (lagging)."""

    def _effective(self, tracking: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, bool]]:
        """{name: (position, behind?)}: behind when it was never built over a non-empty
        log, or when a write after its mark did not keep the views; otherwise current up
        to the ledger's last position."""
        x = self.x
        last = x("SELECT position FROM ledger_tail").fetchone()[0]
        out = {}
        for name, (pos, mark) in tracking.items():
            if mark < 0:  # never built over the events it has now
                out[name] = (pos, True)
                continue
            # Current up to just before the first event written without views since the mark.
            first = x("SELECT min(coalesce(o.position, %s)) FROM events e LEFT JOIN ledger_order o "
                      "ON o.event_id = e.id WHERE NOT e.viewed AND e.id > %s", (last + 1, mark)).fetchone()[0]
            out[name] = (max(pos, first - 1), True) if first is not None else (max(pos, last), False)
        return out

    def lagging(self, names: Iterable[str], last_position: int) -> dict[str, int]:
        wanted = set(names)
        with self._store.lock, self._store.mapped("reading the views"):
            tracking = self._tracking()
            return {n: pos for n, (pos, behind) in self._effective(tracking).items() if n in wanted and behind}

    def set_positions(self, positions: Mapping[str, int]) -> None:
        for n, pos in positions.items():
            self._put(TRACKING, n, pos)

    # --- rebuild ----------------------------------------------------------------------

    def create_shadows(self, specs: Sequence[TableSpec]) -> list[Table]:
        from .store import rebuild_refusal

        why = rebuild_refusal(self._store)
        if why is not None:  # a writer or auditor role: typed, before any psycopg error
            raise StoreUnavailable(why)
        out = []
        for spec in specs:
            tmp = _ident(spec.name) + "__new"
            self.x(f"DROP TABLE IF EXISTS {tmp}")
            self.x(create_sql(spec, tmp))
            out.append(Table(spec, tmp))
        return out

    def shadow(self, spec: TableSpec) -> Table:
        return Table(spec, _ident(spec.name) + "__new")

    def swap_in(self, views: Mapping[str, tuple[TableSpec, int]], position: int) -> dict[str, int]:
        counts = {}
        for name, (spec, version) in views.items():
            t = _ident(spec.name)
            self.x(f"DROP TABLE IF EXISTS {t}")
            self.x(f"ALTER TABLE {t}__new RENAME TO {t}")
            self.x(f"ALTER TABLE {t} RENAME CONSTRAINT {t}__new_pkey TO {t}_pkey")
            for ix in spec.indexes:
                self.x(index_sql(spec, ix))
            self._put(TRACKING, name, position)
            self._put(VERSIONS, name, version)
            counts[name] = self.x(f"SELECT count(*) FROM {t}").fetchone()[0]
        self._functions(spec for spec, _ in views.values())
        return counts

    # --- reads ------------------------------------------------------------------------

    def _run(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        store = self._store
        with store.lock, store.mapped("reading the views"):
            if store.deciding:
                raise InvalidInput(
                    "a decision may count view rows (count) but not read them on PostgreSQL: a write "
                    "checks again under the views lock only what it counted", field="view")
            return [_row(r) for r in store.x(sql, args).fetchall()]

    def _pk(self, table: str) -> tuple[str, ...]:
        spec = self._specs.get(table)
        return spec.pk if spec is not None else ("run_id",)

    def get(self, table: str, key: Sequence[Any], columns: Sequence[str]) -> tuple[Any, ...] | None:
        sql = (f"SELECT {', '.join(map(_ident, columns))} FROM {_ident(table)} "
               f"WHERE {' AND '.join(f'{_ident(c)}=%s' for c in self._pk(table))}")
        rows = self._run(sql, tuple(key))
        return rows[0] if rows else None

    def get_many(self, table: str, keys: Iterable[Any], columns: Sequence[str]) -> dict[Any, tuple[Any, ...]]:
        pk = self._pk(table)
        if len(pk) != 1:
            raise InvalidInput(f"get_many needs a one-column primary key; {table} has {pk}", field="view")
        keys = list(keys)
        cols = ", ".join(map(_ident, (pk[0], *columns)))
        out: dict[Any, tuple[Any, ...]] = {}
        for i in range(0, len(keys), _MANY):
            chunk = keys[i:i + _MANY]
            for r in self._run(f"SELECT {cols} FROM {_ident(table)} WHERE {_ident(pk[0])} = ANY(%s)", (chunk,)):
                out[r[0]] = r[1:]
        return out

    def _filters(self, where: Mapping[str, Any] | None, where_not: Mapping[str, Any] | None,
                 between: tuple[str, Any, Any] | None, args: list[Any]) -> list[str]:
        terms = []
        for c, v in (where or {}).items():
            c = _ident(c)
            if v is NOT_NULL or v is None or (isinstance(v, int) and not isinstance(v, bool)):
                terms.append(f"{c} {_literal(v)}")
            elif isinstance(v, tuple):
                terms.append(f"{c} = ANY(%s)")
                args.append(list(v))
            else:
                terms.append(f"{c}=%s")
                args.append(v)
        for c, v in (where_not or {}).items():
            terms.append(f"{_ident(c)} IS DISTINCT FROM %s")
            args.append(v)
        if between is not None:
            c, low, high = between
            c = _ident(c)
            terms.append(f"{c} IS NOT NULL")
            if low is not None:
                terms.append(f"{c} >= %s")
                args.append(low)
            if high is not None:
                terms.append(f"{c} <= %s")
                args.append(high)
        return terms

    def _keyset(self, order: Sequence[str] | None, after: Sequence[Any] | None, terms: list[str],
                args: list[Any]) -> None:
        if after is None:
            return
        if not order:
            raise InvalidInput("a keyset cursor (after) needs an order", field="after")
        cols = list(map(_ident, order))
        if len(cols) == 1:
            terms.append(f"{cols[0]} > %s")
        else:
            terms.append(f"({', '.join(cols)}) > ({', '.join(['%s'] * len(after))})")
        args.extend(after)

    def select(self, table: str, columns: Sequence[str], *, where: Mapping[str, Any] | None = None,
               where_not: Mapping[str, Any] | None = None, between: tuple[str, Any, Any] | None = None,
               order: Sequence[str] | None = None, after: Sequence[Any] | None = None,
               limit: int | None = None) -> list[tuple[Any, ...]]:
        args: list[Any] = []
        terms = self._filters(where, where_not, between, args)
        self._keyset(order, after, terms, args)
        sql = f"SELECT {', '.join(map(_ident, columns))} FROM {_ident(table)}"
        if terms:
            sql += " WHERE " + " AND ".join(terms)
        if order:
            sql += " ORDER BY " + ", ".join(map(_ident, order))
        if limit is not None:
            sql += " LIMIT %s"
            args.append(limit)
        return self._run(sql, args)

    def count(self, table: str, *, where: Mapping[str, Any] | None = None,
              where_not: Mapping[str, Any] | None = None, order: Sequence[str] | None = None,
              after: Sequence[Any] | None = None) -> int:
        args: list[Any] = []
        terms = self._filters(where, where_not, None, args)
        self._keyset(order, after, terms, args)
        sql = f"SELECT count(*) FROM {_ident(table)}" + (" WHERE " + " AND ".join(terms) if terms else "")
        store = self._store
        if not store.deciding:
            return self._run(sql, args)[0][0]
        # A count the write being decided depends on: handoff_append counts again, under
        # the views lock, by equal values only, and refuses the write if it changed.
        plain = (str, int, type(None))
        if order or after or any(not isinstance(v, plain) or isinstance(v, bool)
                                 for v in [*(where or {}).values(), *(where_not or {}).values()]):
            raise InvalidInput("a decision may count view rows by equal values only", field="view")
        with store.lock, store.mapped("reading the views"):
            n = store.x(sql, args).fetchone()[0]
        store.view_read(_ident(table), {_ident(k): v for k, v in (where or {}).items()},
                        {_ident(k): v for k, v in (where_not or {}).items()}, n)
        return n
