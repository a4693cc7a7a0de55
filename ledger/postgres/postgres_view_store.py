"""The PostgreSQL store's view store: projection tables in the ledger's own database.

PostgreSQL's words for the view SQL that ledger/viewsql.py builds, its tracking rows and
its inline upkeep. ``ORDINAL`` is an identity column each table carries; an upsert updates
a row in place, so a row keeps its ordinal. The partial "due" index is a real partial
index. A rebuild fills shadow tables and swaps them in (drop, rename, index) inside one
transaction. Every method runs on the store's connection under its lock. A write's rows
go to the server with its batch and are kept by the table's sync function
(ledger/postgres/view_functions.py); a count a write's decision reads is counted again by the
server under the views lock (PostgresStore.view_read), so a decision that reads a view
(an owner's load) cannot race another write that changes it. Positions here are write ids (ledger/postgres/postgres_store.py): the tracking rows and a view row's
``last_position`` hold them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import viewsql
from ..errors import InvalidInput
from ..view_tables import TRACKING, VERSIONS, TableSpec, Views
from .view_functions import EXISTING, PREFIX, as_json, hexed, sync_function, views_function

if TYPE_CHECKING:
    from ..store_core import Reading
    from .postgres_store import PostgresStore

POSTGRES = viewsql.Dialect(
    param="%s", named="%({})s",
    # Text compares bytewise ("C"), as on SQLite, so orders and key ranges agree across backends.
    types={"text": 'text COLLATE "C"', "int": "bigint", "real": "double precision", "blob": "bytea"},
    ordinal="_ordinal", ordinal_column="_ordinal bigint GENERATED ALWAYS AS IDENTITY, ",
    distinct="IS DISTINCT FROM", same="IS NOT DISTINCT FROM", batch=1000, arrays=True,
    # The primary key's constraint keeps its name with the table's, as a new table's would.
    swap=("ALTER TABLE {t}__new RENAME TO {t}", "ALTER TABLE {t} RENAME CONSTRAINT {t}__new_pkey TO {t}_pkey"),
)


class Table(viewsql.Table):
    __slots__ = ()
    dialect = POSTGRES


def _row(r: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)


class PostgresViewStore(viewsql.SqlViewStore):
    """View tables, tracking rows and reads on a PostgresStore's connection."""

    table_class = Table
    _store: PostgresStore

    def _exec(self, sql: str, args: Any = ()) -> Any:
        return self._store.x(sql, args or None)

    def _executemany(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        with self._store.ready().cursor() as cur:
            cur.executemany(sql, rows)

    def _reading(self) -> Reading:
        return self._store._reading("reading the views")

    def _run(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        store = self._store
        with self._reading():
            if store.deciding:
                raise InvalidInput(
                    "a decision may count view rows (count) but not read them on PostgreSQL: a write "
                    "checks again under the views lock only what it counted", field="view")
            return [_row(r) for r in store.x(sql, args).fetchall()]

    def count(self, table: str, *, where: Mapping[str, Any] | None = None, where_not: Mapping[str, Any] | None = None,
              order: Sequence[str] | None = None, after: Sequence[Any] | None = None) -> int:
        store = self._store
        if not store.deciding:
            return super().count(table, where=where, where_not=where_not, order=order, after=after)
        # A count the write being decided depends on: handoff_append counts again, under
        # the views lock, by equal values only, and refuses the write if it changed.
        plain = (str, int, type(None))
        if order or after or any(not isinstance(v, plain) or isinstance(v, bool)
                                 for v in [*(where or {}).values(), *(where_not or {}).values()]):
            raise InvalidInput("a decision may count view rows by equal values only", field="view")
        ident = self._d.ident
        args: list[Any] = []
        terms = self._filters(where, where_not, None, args)
        sql = f"SELECT count(*) FROM {ident(table)}" + (" WHERE " + " AND ".join(terms) if terms else "")
        with self._reading():
            n = store.x(sql, args).fetchone()[0]
        store.view_read(ident(table), {ident(k): v for k, v in (where or {}).items()},
                        {ident(k): v for k, v in (where_not or {}).items()}, n)
        return int(n)

    # --- schema, tracking and versions ------------------------------------------------

    def _table_names(self) -> set[str]:
        return {r[0] for r in self._exec("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    def needs_prepare(self, views: Views) -> bool:
        if super().needs_prepare(views):
            return True
        with self._reading():  # (a ledger made before schema 6 has no sync functions yet)
            kept = {r[0] for r in self._exec(EXISTING).fetchall()}
        return any(spec.name not in kept for spec, _ in views.values())

    def prepare(self, views: Views) -> None:
        super().prepare(views)
        self._functions(spec for spec, _ in views.values())

    def _functions(self, specs: Iterable[TableSpec]) -> None:
        """Make each table's sync function, and handoff_views over every table that has one
        (the owner's, executable by nobody else)."""
        for spec in specs:
            name = self._d.ident(spec.name)
            self._exec(sync_function(spec, name))
            self._exec(f"REVOKE ALL ON FUNCTION {PREFIX}{name}(text, jsonb, boolean) FROM PUBLIC")
        self._exec(views_function(self._exec(EXISTING).fetchall()))

    def _bookkeeping(self) -> None:
        # id_mark: the last write id when the position was set (ledger/postgres/postgres_store.py: every
        # write below it had committed), the point from which lagging() looks for writes
        # that did not keep the views.
        self._exec(f"CREATE TABLE IF NOT EXISTS {TRACKING} (name text PRIMARY KEY, position bigint NOT NULL,"
               " id_mark bigint NOT NULL DEFAULT 0)")
        self._exec(f"CREATE TABLE IF NOT EXISTS {VERSIONS} (name text PRIMARY KEY, version bigint NOT NULL)")

    def _track_new(self, name: str) -> None:
        self._track_at(name, 0)  # built over an empty log, or marked unbuilt here
        self._exec(f"UPDATE {TRACKING} SET id_mark = -1 WHERE name = %s AND EXISTS (SELECT 1 FROM events)", (name,))

    def _track_unbuilt(self, name: str) -> None:
        self._exec(f"UPDATE {TRACKING} SET position = 0, id_mark = -1 WHERE name = %s", (name,))

    def _track_at(self, name: str, position: int) -> None:
        self._exec(f"INSERT INTO {TRACKING} (name, position, id_mark) VALUES (%s, %s, "
               "(SELECT coalesce(max(id), 0) FROM events)) ON CONFLICT (name) DO UPDATE SET "
               "position=excluded.position, id_mark=excluded.id_mark", (name, position))

    # --- writing ----------------------------------------------------------------------

    # Inside a write the rows go to the server with its batch (PostgresStore.view_rows),
    # kept by the table's sync function in the same call; in a transaction of the owner's
    # own (a catch-up), by calling that function directly.

    def sync_one(self, table: Table, row: Mapping[str, Any]) -> None:
        self._keep(table, row.get("run_id") or "", [hexed(dict(row))], False)

    def sync_many(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self._keep(table, run_id, [hexed(dict(r)) for r in rows], True)

    def _keep(self, table: Table, run_id: str, rows: list[dict[str, Any]], many: bool) -> None:
        if not self._store.view_rows(table.name, run_id, rows, many):
            self._exec(f"SELECT {PREFIX}{table.name}(%s, %s::jsonb, %s)", (run_id, as_json(rows), many))

    def advance(self, names: Sequence[str], last_position: int, run_id: str) -> None:
        """Nothing to write: a row every write moved would be one lock every commit on
        every host waits for. Each event says instead whether its write kept the views
        (``events.viewed``); a projection is behind only where one did not (lagging)."""

    def _effective(self) -> dict[str, tuple[int, bool]]:
        """{name: (position, behind?)}: behind when it was never built over a non-empty
        log, or when a write after its mark did not keep the views; otherwise current up
        to the ledger's last position."""
        x = self._exec
        if x("SELECT to_regclass(%s)", (TRACKING,)).fetchone()[0] is None:
            return {}  # no projection was ever prepared here: no positions, not a driver error
        tracking = {n: (p, m) for n, p, m in x(f"SELECT name, position, id_mark FROM {TRACKING}")}
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

    def set_positions(self, positions: Mapping[str, int]) -> None:
        for n, pos in positions.items():
            self._track_at(n, pos)

    # --- rebuild ----------------------------------------------------------------------

    def swap_in(self, views: Views, position: int) -> dict[str, int]:
        counts = super().swap_in(views, position)
        self._functions(spec for spec, _ in views.values())
        return counts
