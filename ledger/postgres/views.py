"""The PostgreSQL store's view store: projection tables in the ledger's own database.

PostgreSQL's words for the view SQL that ledger/viewsql.py builds, its tracking rows and
its inline upkeep. ``ORDINAL`` is an identity column each table carries; an upsert updates
a row in place, so a row keeps its ordinal. The partial "due" index is a real partial
index. A rebuild fills shadow tables and swaps them in (drop, rename, index) inside one
transaction. Every method runs on the store's connection under its lock; writes run
inside a transaction the store opened. A view read inside a write transaction first takes
the ledger's views lock exclusively (every write that keeps views holds it shared), so a
decision that reads a view (an owner's load) cannot race another write that changes it.
Positions here are write ids (ledger/postgres/store.py): the tracking rows and a view row's
``last_position`` hold them.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .. import viewsql
from ..errors import StoreUnavailable
from ..views import TRACKING, VERSIONS, TableSpec, Views

if TYPE_CHECKING:
    from .store import PostgresStore

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
    __slots__ = ("_others",)
    dialect = POSTGRES

    def __init__(self, spec: TableSpec, table: str) -> None:
        super().__init__(spec, table)
        self._others: dict[int, str] = {}

    def delete_others(self, n: int) -> str:
        """DELETE a run's rows but these ``n`` keys (sync_many), kept for the few counts a
        run's rows come in, so each count has one text."""
        sql = self._others.get(n)
        if sql is None:
            one = "(" + ", ".join(["%s"] * self.npk) + ")"
            sql = f"DELETE FROM {self.name} WHERE run_id=%s AND ({', '.join(self.spec.pk)}) NOT IN ({', '.join([one] * n)})"
            if n <= 8:
                self._others[n] = sql
        return sql


def _row(r: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)


class PostgresViewStore(viewsql.SqlViewStore):
    """View tables, tracking rows and reads on a PostgresStore's connection."""

    table_class = Table
    _store: PostgresStore

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store)
        #: {(table, run): the values of the run's rows} as this store's last committed write
        #: left them, and what the write being gathered sends (``settled`` moves them over).
        #: A guessed write (ledger/postgres/store.py, _guess) sends no statement for rows that are
        #: equal: the guess commits only where the run's head is the one this store's last
        #: write left, so no write has changed the run since, and view rows are a function
        #: of the run's events (a rebuild or a catch-up elsewhere writes the same values).
        self._sent: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
        self._pending: dict[tuple[str, str], Any] = {}

    def _unchanged(self, key: tuple[str, str], values: Any) -> bool:
        """Whether the write being gathered may leave these rows alone (and note them)."""
        store = self._store
        if store.gather is None:  # outside a write's message (catch-up, rebuild): forget them
            self._sent.pop(key, None)
            return False
        if store.fast and self._sent.get(key) == values:
            return True
        self._pending[key] = values
        return False

    def settled(self, committed: bool) -> None:
        """The gathered write committed (its rows are what the run's rows are now), or did
        not (forget them: the server's rows are not known)."""
        pending, self._pending = self._pending, {}
        sent = self._sent
        for key, values in pending.items():
            if committed:
                sent[key] = values
                sent.move_to_end(key)
            else:
                sent.pop(key, None)
        while len(sent) > 8192:
            sent.popitem(last=False)

    def forget(self) -> None:
        self._sent.clear()
        self._pending.clear()

    def _exec(self, sql: str, args: Any = ()) -> Any:
        return self._store.x(sql, args or None)

    def _executemany(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        with self._store.ready().cursor() as cur:
            cur.executemany(sql, rows)

    @contextmanager
    def _reading(self) -> Iterator[None]:
        with self._store.lock, self._store.mapped("reading the views"):
            yield

    def _run(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        store = self._store
        with self._reading():
            if store.writing and not store.exclusive:
                store.lock_views()
            return [_row(r) for r in store.x(sql, args).fetchall()]

    # --- schema, tracking and versions ------------------------------------------------

    def _table_names(self) -> set[str]:
        return {r[0] for r in self._exec("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    def prepare(self, views: Views) -> None:
        self.forget()  # the tables are made anew: no row is known
        super().prepare(views)

    def _bookkeeping(self) -> None:
        # id_mark: the last write id when the position was set (ledger/postgres/store.py: every
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

    # Inside a write these statements are pipelined with the append (its second round
    # trip): none of them reads a result, so none costs a round trip of its own. A row
    # that did not change is left alone (the WHERE of upsert_changed).

    def sync_one(self, table: Table, row: Mapping[str, Any]) -> None:
        run_id = row.get("run_id")
        if isinstance(run_id, str) and self._unchanged((table.name, run_id), tuple(table.values(row))):
            return
        self._exec(table.upsert_changed, row)

    def sync_many(self, table: Table, run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if self._unchanged((table.name, run_id), tuple(tuple(table.values(row)) for row in rows)):
            return
        n = table.npk
        keys = [tuple(table.values(row))[:n] for row in rows]
        if keys:
            self._exec(table.delete_others(len(keys)), [run_id, *(v for k in keys for v in k)])
        else:
            self._exec(table.delete_run, (run_id,))
        for row in rows:
            self._exec(table.upsert_changed, row)

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

    def create_shadows(self, specs: Sequence[TableSpec]) -> list[viewsql.Table]:
        self.forget()  # the tables are made anew: no row is known
        from .store import rebuild_refusal

        why = rebuild_refusal(self._store)
        if why is not None:  # a writer or auditor role: typed, before any psycopg error
            raise StoreUnavailable(why)
        return super().create_shadows(specs)

    def swap_in(self, views: Views, position: int) -> dict[str, int]:
        self.forget()  # the tables are made anew: no row is known
        return super().swap_in(views, position)
