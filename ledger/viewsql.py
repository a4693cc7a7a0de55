"""The SQL of the view tables, written once for every SQL backend.

ledger/view_tables.py says what a view table is in neutral words; this module turns those words
into SQL, given a ``Dialect``: the few things two engines spell differently (parameters,
type names, the ordinal column, null-safe comparison, how a list of values is bound, the
statements that swap a rebuilt table in, an index hint). ``SqlViewStore`` is the view
store both backends share; each keeps only its connection, tracking rows and upkeep.

The same table always gets the same statement text (a ``Table`` builds its statements
once, reads are cached by shape): PostgreSQL prepares a statement by its exact text.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar

from .errors import InvalidInput
from .view_tables import NOT_NULL, ORDINAL, TRACKING, VERSIONS, Index, TableSpec, ViewStore, Views

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: A rebuild's table beside the live one, until the swap puts it in its place.
SHADOW = "{}__new"


@dataclass(frozen=True)
class Dialect:
    """What one engine spells its own way; every statement is built from these."""

    #: A positional parameter ("?", "%s") and a named one, as a format (":{}", "%({})s").
    param: str
    named: str
    #: The neutral column types (ledger/view_tables.py) in this engine's words.
    types: Mapping[str, str]
    #: The column ``ORDINAL`` reads, and what CREATE TABLE adds for it ("" where the
    #: engine keeps a row's creation order by itself).
    ordinal: str
    ordinal_column: str
    #: Null-safe "differs" and "equals".
    distinct: str
    same: str
    #: Keys per statement in get_many; whether a list binds as one array parameter
    #: (``c = ANY(%s)``) rather than one parameter a value (``c IN (?, ?)``).
    batch: int
    arrays: bool
    #: What puts the shadow of table ``{t}`` in its place once ``{t}`` is dropped.
    swap: tuple[str, ...]
    #: Appended to ``FROM table`` to name a partial index (``{}``) the planner would not
    #: pick by itself for a bounded range; "" where the engine needs no hint.
    index_hint: str = ""

    def ident(self, name: str) -> str:
        """A view table or column name as it goes into SQL (ORDINAL as the engine's column);
        anything else is refused, since names are never bound as parameters."""
        if name == ORDINAL:
            return self.ordinal
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInput(f"{name!r} is not a view table or column name", field="view")
        return name

    def one_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column`` equals one of ``values``: the term and its arguments."""
        if self.arrays:
            return f"{column} = ANY({self.param})", [list(values)]
        return f"{column} IN ({', '.join([self.param] * len(values))})", list(values)

    def create_sql(self, spec: TableSpec, table: str) -> str:
        cols = ", ".join(f"{c.name} {self.types[c.type]}{'' if c.nullable else ' NOT NULL'}" for c in spec.columns)
        return f"CREATE TABLE {table} ({self.ordinal_column}{cols}, PRIMARY KEY ({', '.join(spec.pk)}))"


def literal(value: Any) -> str:
    """An index predicate's or a filter's constant term, written into the SQL text (not
    bound) so the planner can match a partial index's WHERE."""
    if value is NOT_NULL:
        return "IS NOT NULL"
    if value is None:
        return "IS NULL"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"= {int(value)}"
    raise InvalidInput(f"an index predicate holds whole numbers or NOT_NULL, not {value!r}", field="view")


def index_sql(spec: TableSpec, ix: Index) -> str:
    t = spec.name
    sql = f"CREATE INDEX {t}_{ix.suffix} ON {t} ({', '.join(ix.columns)})"
    if ix.where:
        sql += " WHERE " + " AND ".join(f"{c} {literal(v)}" for c, v in ix.where)
    return sql


class Table:
    """One view table and the statements that keep it, built once per table: rebuilding
    the same SQL strings on every write was a tenth of a command's CPU. Each backend's
    subclass names its ``dialect``."""

    dialect: ClassVar[Dialect]
    __slots__ = ("delete_key", "delete_run", "name", "npk", "order", "spec", "select_run",
                 "update", "upsert", "upsert_changed", "values")

    def __init__(self, spec: TableSpec, table: str) -> None:
        d = self.dialect
        p = d.named.format
        self.spec, self.name = spec, table
        cols = list(spec.column_names)
        rest = [c for c in cols if c not in spec.pk]
        # Columns a secondary index reads (its keys, its partial WHERE). An UPDATE that
        # sets one, even to its old value, rewrites that index's entry, so the in-place
        # update below leaves them out and matches them instead.
        words = spec.indexed_columns()
        keyed = [c for c in rest if c in words]
        free = [c for c in rest if c not in keyed]
        # An upsert, never delete-and-insert: a row updated in place keeps its ordinal,
        # so "oldest first" keeps a run where it was first inserted, inline and rebuilt alike.
        self.upsert = (
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(map(p, cols))}) "
            f"ON CONFLICT ({', '.join(spec.pk)}) DO "
            + (f"UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in rest)}" if rest else "NOTHING")
        )
        # ... and the same, as a no-op when the stored row already holds these values.
        self.upsert_changed = self.upsert + (
            f" WHERE ({', '.join(f'{table}.{c}' for c in rest)}) {d.distinct} "
            f"({', '.join('excluded.' + c for c in rest)})" if rest else ""
        )
        self.update = (
            f"UPDATE {table} SET {', '.join(f'{c}={p(c)}' for c in free)} "
            f"WHERE {' AND '.join([*(f'{c}={p(c)}' for c in spec.pk), *(f'{c} {d.same} {p(c)}' for c in keyed)])} "
            f"AND ({', '.join(free)}) {d.distinct} ({', '.join(map(p, free))})"
            if free else None
        )
        self.order = (*spec.pk, *rest)
        self.npk = len(spec.pk)
        get = itemgetter(*self.order)  # a row's values as select_run returns them
        self.values = get if len(self.order) > 1 else lambda row: (get(row),)
        self.select_run = f"SELECT {', '.join(self.order)} FROM {table} WHERE run_id={d.param}"
        self.delete_key = f"DELETE FROM {table} WHERE {' AND '.join(f'{c}={d.param}' for c in spec.pk)}"
        self.delete_run = f"DELETE FROM {table} WHERE run_id={d.param}"


class SqlViewStore(ViewStore):
    """The view store of an SQL backend: schema, rebuild and reads built here from the
    dialect; the backend brings its connection (``_exec``, ``_run``, ``_reading``), its
    tracking rows (``_table_names``, ``_bookkeeping``, ``_track_*``, ``_effective``) and
    its inline upkeep (``sync_one``, ``sync_many``, ``advance``, ``set_positions``)."""

    table_class: ClassVar[type[Table]]

    def __init__(self, store: Any) -> None:
        self._store = store
        self._d = self.table_class.dialect
        self._tables: dict[str, Table] = {}
        self._specs: dict[str, TableSpec] = {}
        self._sql: dict[Any, str] = {}

    # --- what the backend brings ------------------------------------------------------

    @abc.abstractmethod
    def _exec(self, sql: str, args: Any = ()) -> Any:
        """Run one statement inside the store's transaction; the driver's cursor."""

    @abc.abstractmethod
    def _executemany(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None: ...

    @abc.abstractmethod
    def _run(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """A read, under the store's lock, its driver errors mapped to typed ones."""

    @abc.abstractmethod
    def _reading(self) -> AbstractContextManager[Any]:
        """The store's lock, with driver errors mapped to typed ones, for a few reads."""

    @abc.abstractmethod
    def _table_names(self) -> set[str]: ...

    @abc.abstractmethod
    def _bookkeeping(self) -> None:
        """Create the tracking and versions tables if missing."""

    @abc.abstractmethod
    def _track_new(self, name: str) -> None:
        """The tracking row of a view whose table was just made: current over an empty
        log, refolded from the start by catch-up otherwise."""

    @abc.abstractmethod
    def _track_unbuilt(self, name: str) -> None:
        """Mark a view whose table was made anew (another version) for a refold from 0."""

    @abc.abstractmethod
    def _track_at(self, name: str, position: int) -> None:
        """Set (or add) a view's tracking row at ``position``."""

    @abc.abstractmethod
    def _effective(self) -> dict[str, tuple[int, bool]]:
        """{name: (position, behind?)}: how far each view is current, and whether catch-up
        must refold it from there."""

    # --- schema, tracking and versions ------------------------------------------------

    def _outdated(self, views: Views) -> list[str]:
        if VERSIONS not in self._table_names():
            return list(views)
        kept = dict(self._exec(f"SELECT name, version FROM {VERSIONS}").fetchall())
        return [n for n, (_, v) in views.items() if kept.get(n, 1) != v]

    def outdated(self, views: Views) -> list[str]:
        with self._reading():
            return self._outdated(views)

    def needs_prepare(self, views: Views) -> bool:
        with self._reading():
            existing = self._table_names()
            missing = [s for s, _ in views.values() if s.name not in existing]
            return not (TRACKING in existing and VERSIONS in existing and not missing
                        and not self._outdated(views))

    def prepare(self, views: Views) -> None:
        self._bookkeeping()
        existing = self._table_names()
        for name, (spec, version) in views.items():
            if spec.name not in existing:
                self._make(spec)
                self._track_new(name)
                self._put_version(name, version)
        # Views kept by another version (or before versions were recorded, 1): made anew,
        # since another version may have other columns and every row is derived anyway,
        # and refolded by the catch-up that follows, in its own transaction.
        for name in self._outdated(views):
            spec = views[name][0]
            self._exec(f"DROP TABLE IF EXISTS {self._d.ident(spec.name)}")
            self._make(spec)
            self._track_unbuilt(name)
            self._put_version(name, views[name][1])

    def _make(self, spec: TableSpec) -> None:
        self._exec(self._d.create_sql(spec, spec.name))
        for ix in spec.indexes:
            self._exec(index_sql(spec, ix))

    def _put_version(self, name: str, version: int) -> None:
        p = self._d.param
        self._exec(f"INSERT INTO {VERSIONS} (name, version) VALUES ({p}, {p}) "
                   "ON CONFLICT (name) DO UPDATE SET version=excluded.version", (name, version))

    def positions(self) -> dict[str, int]:
        """Each view's effective position: how far it is current. A ledger no projection
        was ever prepared in has none (not a driver error)."""
        with self._reading():
            return {n: pos for n, (pos, _) in self._effective().items()}

    def lagging(self, names: Iterable[str], last_position: int) -> dict[str, int]:
        wanted = set(names)
        with self._reading():
            return {n: pos for n, (pos, behind) in self._effective().items() if n in wanted and behind}

    def table(self, spec: TableSpec) -> Table:
        t = self._tables.get(spec.name)
        if t is None or t.spec is not spec:
            t = self._tables[spec.name] = self.table_class(spec, self._d.ident(spec.name))
            self._specs[spec.name] = spec
        return t

    def fill(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]], *, many: bool) -> None:
        """A rebuild's new table: nearly every run is written once, so write it outright (the
        swap refolds the runs that moved meanwhile, hence the delete and the upsert)."""
        if many:
            self._exec(table.delete_run, (run_id,))
        if rows:
            self._executemany(table.upsert, rows)

    # --- rebuild ----------------------------------------------------------------------

    def create_shadows(self, specs: Sequence[TableSpec]) -> list[Table]:
        out = []
        for spec in specs:
            tmp = SHADOW.format(self._d.ident(spec.name))
            self._exec(f"DROP TABLE IF EXISTS {tmp}")
            self._exec(self._d.create_sql(spec, tmp))
            out.append(self.table_class(spec, tmp))
        return out

    def shadow(self, spec: TableSpec) -> Table:
        return self.table_class(spec, SHADOW.format(self._d.ident(spec.name)))

    def swap_in(self, views: Views, position: int) -> dict[str, int]:
        counts = {}
        for name, (spec, version) in views.items():
            t = self._d.ident(spec.name)
            self._exec(f"DROP TABLE IF EXISTS {t}")
            for sql in self._d.swap:
                self._exec(sql.format(t=t))
            for ix in spec.indexes:
                self._exec(index_sql(spec, ix))
            self._track_at(name, position)
            self._put_version(name, version)
            counts[name] = self._exec(f"SELECT count(*) FROM {t}").fetchone()[0]
        return counts

    # --- reads ------------------------------------------------------------------------

    def _pk(self, table: str) -> tuple[str, ...]:
        spec = self._specs.get(table)
        return spec.pk if spec is not None else ("run_id",)

    def get(self, table: str, key: Sequence[Any], columns: Sequence[str]) -> tuple[Any, ...] | None:
        ck = ("get", table, tuple(columns))
        sql = self._sql.get(ck)
        if sql is None:
            ident = self._d.ident
            sql = self._sql[ck] = (
                f"SELECT {', '.join(map(ident, columns))} FROM {ident(table)} "
                f"WHERE {' AND '.join(f'{ident(c)}={self._d.param}' for c in self._pk(table))}"
            )
        rows = self._run(sql, tuple(key))
        return rows[0] if rows else None

    def get_many(self, table: str, keys: Iterable[Any], columns: Sequence[str]) -> dict[Any, tuple[Any, ...]]:
        d = self._d
        pk = self._pk(table)
        if len(pk) != 1:
            raise InvalidInput(f"get_many needs a one-column primary key; {table} has {pk}", field="view")
        keys = list(keys)
        head = f"SELECT {', '.join(map(d.ident, (pk[0], *columns)))} FROM {d.ident(table)} WHERE "
        out: dict[Any, tuple[Any, ...]] = {}
        for i in range(0, len(keys), d.batch):
            term, args = d.one_of(d.ident(pk[0]), keys[i:i + d.batch])
            for r in self._run(head + term, args):
                out[r[0]] = r[1:]
        return out

    def _filters(self, where: Mapping[str, Any] | None, where_not: Mapping[str, Any] | None,
                 between: tuple[str, Any, Any] | None, args: list[Any]) -> list[str]:
        d = self._d
        terms = []
        for c, v in (where or {}).items():
            c = d.ident(c)
            if v is NOT_NULL or v is None or (isinstance(v, int) and not isinstance(v, bool)):
                terms.append(f"{c} {literal(v)}")  # inline, so a partial index's WHERE matches
            elif isinstance(v, tuple):
                term, more = d.one_of(c, v)
                terms.append(term)
                args.extend(more)
            else:
                terms.append(f"{c}={d.param}")
                args.append(v)
        for c, v in (where_not or {}).items():
            terms.append(f"{d.ident(c)} {d.distinct} {d.param}")
            args.append(v)
        if between is not None:
            c, low, high = between
            c = d.ident(c)
            terms.append(f"{c} IS NOT NULL")
            for op, bound in ((">=", low), ("<=", high)):
                if bound is not None:
                    terms.append(f"{c} {op} {d.param}")
                    args.append(bound)
        return terms

    def _keyset(self, order: Sequence[str] | None, after: Sequence[Any] | None, terms: list[str],
                args: list[Any]) -> None:
        if after is None:
            return
        if not order:
            raise InvalidInput("a keyset cursor (after) needs an order", field="after")
        terms.append(f"({', '.join(map(self._d.ident, order))}) > ({', '.join([self._d.param] * len(after))})")
        args.extend(after)

    def _index_for(self, table: str, where: Mapping[str, Any] | None, between: tuple[str, Any, Any] | None) -> str:
        """The dialect's hint naming a partial index when the filters select exactly its
        rows' range: a planner may not otherwise trust a partial index for a bound range."""
        spec = self._specs.get(table)
        if not self._d.index_hint or spec is None or between is None:
            return ""
        have = dict(where or {})
        have.setdefault(between[0], NOT_NULL)
        for ix in spec.indexes:
            if ix.where and ix.columns[0] == between[0] and all(
                have.get(c, _absent) == v or (v is NOT_NULL and c in have and have[c] is not None)
                for c, v in ix.where
            ):
                return self._d.index_hint.format(f"{spec.name}_{ix.suffix}")
        return ""

    def _select_sql(self, table: str, columns: Sequence[str], where: Mapping[str, Any] | None = None,
                    where_not: Mapping[str, Any] | None = None, between: tuple[str, Any, Any] | None = None,
                    order: Sequence[str] | None = None, after: Sequence[Any] | None = None,
                    limit: int | None = None) -> tuple[str, list[Any]]:
        ident = self._d.ident
        args: list[Any] = []
        terms = self._filters(where, where_not, between, args)
        self._keyset(order, after, terms, args)
        sql = f"SELECT {', '.join(map(ident, columns))} FROM {ident(table)}" + self._index_for(table, where, between)
        if terms:
            sql += " WHERE " + " AND ".join(terms)
        if order:
            sql += " ORDER BY " + ", ".join(map(ident, order))
        if limit is not None:
            sql += f" LIMIT {self._d.param}"
            args.append(limit)
        return sql, args

    def select(self, table: str, columns: Sequence[str], **filters: Any) -> list[tuple[Any, ...]]:
        return self._run(*self._select_sql(table, columns, **filters))

    def select_joined(self, table: str, columns: Sequence[str], other: str, other_columns: Sequence[str],
                      *, key: str = "run_id", **filters: Any) -> list[tuple[Any, ...]]:
        # One statement: the selection as a subquery (keeping its partial index), joined to
        # the other table by primary key. The stall scan is this: two lookups cost a third more.
        ident = self._d.ident
        pk = self._specs[other].pk if other in self._specs else None
        if pk is not None and pk != (key,):
            raise InvalidInput(f"select_joined joins on the other table's primary key; {other} is keyed by "
                               f"{pk}, not ({key!r},)", field="view")
        # Each column once (PostgreSQL refuses a name the subquery holds twice), with the
        # order's, which the outer ORDER BY reads.
        order = filters.get("order") or ()
        inner, args = self._select_sql(table, tuple(dict.fromkeys((key, *columns, *order))), **filters)
        picked = ", ".join([*(f"s.{ident(c)}" for c in columns), *(f"o.{ident(c)}" for c in other_columns)])
        sql = f"SELECT {picked} FROM ({inner}) AS s JOIN {ident(other)} AS o ON o.{ident(key)} = s.{ident(key)}"
        if order:
            sql += " ORDER BY " + ", ".join(f"s.{ident(c)}" for c in order)
        return self._run(sql, args)

    def count(self, table: str, *, where: Mapping[str, Any] | None = None, where_not: Mapping[str, Any] | None = None,
              order: Sequence[str] | None = None, after: Sequence[Any] | None = None) -> int:
        args: list[Any] = []
        terms = self._filters(where, where_not, None, args)
        self._keyset(order, after, terms, args)
        sql = f"SELECT count(*) FROM {self._d.ident(table)}" + (" WHERE " + " AND ".join(terms) if terms else "")
        return self._run(sql, args)[0][0]


_absent = object()
