"""Keeping the views: inline with every append, rebuilt from the log, checked against it.

A projection is a name, the rows it derives from a run's checkpoint (views.py), and the
tables that hold them. Inline upkeep happens inside the append's own write transaction,
with a tracking row (name, last position applied), so a reader never sees an event
without its projection or the reverse. The log stays the only truth: ``rebuild`` drops
and refolds, ``check`` compares, ``catch_up`` brings a late-added projection level.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

import msgspec

from ledger.errors import CorruptLedger, InvalidInput
from ledger.sqlite import SqliteStore, _explain
from reducers.checkpoint import AGGREGATE, Checkpoint

from . import views

Progress = Callable[[int, int], None] | None


class Projection(msgspec.Struct, frozen=True):
    """One named view: its tables' DDL (``{t}`` is the table name) and its row function."""

    name: str
    table: str
    columns: dict[str, str]
    pk: tuple[str, ...]
    indexes: tuple[str, ...]  # CREATE INDEX statements with {t} for the table, {i} for a prefix
    rows: Callable[[Checkpoint, int], list[dict[str, Any]]]
    many: bool = False  # rows per run may be 0..n (else exactly one, never deleted)
    #: Bumped when the rows a fold gives change for the same log; a ledger whose views
    #: were kept at another version has them refolded (by catch-up) on a writable open.
    version: int = 1


def _ck_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [views.checkpoint_row(cp, last_position)]


def _stall_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [views.stall_row(cp)]


def _delivery_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [views.delivery_row(cp)] if cp.opened else []


def _owner_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    owner, active = views.owner_active(cp)
    return [{"owner": owner, "run_id": cp.run_id, "lease": cp.lease}] if active else []


PROJECTIONS: tuple[Projection, ...] = (
    Projection(
        name="checkpoints",
        version=2,  # 2: the packet keeps the latest evidence record of each kind
        table="checkpoints",
        columns={
            "run_id": "TEXT NOT NULL", "state": "TEXT NOT NULL", "terminal": "INTEGER NOT NULL",
            "owner": "TEXT NOT NULL", "target": "TEXT NOT NULL", "worker": "TEXT", "lease": "INTEGER",
            "progress_seq": "INTEGER NOT NULL", "last_seq": "INTEGER NOT NULL",
            "last_position": "INTEGER NOT NULL", "updated_us": "INTEGER", "fork_parent": "TEXT",
            "packet": "BLOB NOT NULL",
        },
        pk=("run_id",),
        indexes=(
            "CREATE INDEX {i}_state ON {t}(state, run_id)",
            "CREATE INDEX {i}_owner ON {t}(owner, state)",
            "CREATE INDEX {i}_target ON {t}(target, state)",
            "CREATE INDEX {i}_live ON {t}(terminal, state, run_id)",
        ),
        rows=_ck_rows,
    ),
    Projection(
        name="stall_watch",
        table="stall_watch",
        columns={
            "run_id": "TEXT NOT NULL", "live": "INTEGER NOT NULL", "state": "TEXT NOT NULL",
            "lease": "INTEGER", "last_heartbeat_us": "INTEGER", "lease_since_us": "INTEGER",
            "progress_seq": "INTEGER NOT NULL", "last_progress_kind": "TEXT",
            "last_progress_us": "INTEGER", "retry_count": "INTEGER NOT NULL",
            "pending_effects": "INTEGER NOT NULL", "next_deadline_us": "INTEGER",
        },
        pk=("run_id",),
        # The stall scan is a range scan of this partial covering index and nothing else.
        indexes=(
            "CREATE INDEX {i}_due ON {t}(next_deadline_us, run_id) "
            "WHERE live = 1 AND next_deadline_us IS NOT NULL",
        ),
        rows=_stall_rows,
    ),
    Projection(
        name="deliveries",
        table="deliveries",
        columns={
            "run_id": "TEXT NOT NULL", "target": "TEXT NOT NULL", "status": "TEXT NOT NULL",
            "key": "TEXT", "receipt": "TEXT", "attempts": "INTEGER NOT NULL",
            "attempted_us": "INTEGER", "ambiguous_after_us": "INTEGER",
        },
        pk=("run_id", "target"),
        indexes=("CREATE INDEX {i}_status ON {t}(status, ambiguous_after_us)",),
        rows=_delivery_rows,
        many=True,
    ),
    Projection(
        name="owner_load",
        table="owner_load",
        columns={"owner": "TEXT NOT NULL", "run_id": "TEXT NOT NULL", "lease": "INTEGER"},
        pk=("owner", "run_id"),
        indexes=("CREATE INDEX {i}_run ON {t}(run_id)",),
        rows=_owner_rows,
        many=True,
    ),
)
BY_NAME = {p.name: p for p in PROJECTIONS}
TRACKING = "projection_positions"
VERSIONS = "projection_versions"
# Runs with events after a position, in the order they first appeared in the log (the
# order a full rebuild inserts them in), so new rows get rowids in creation order.
_RUNS_SINCE = (
    "SELECT run_id FROM heads WHERE run_id IN "
    "(SELECT run_id FROM events WHERE position > ?) ORDER BY first_position"
)


def _create_sql(p: Projection, table: str) -> str:
    cols = ", ".join(f"{c} {t}" for c, t in p.columns.items())
    return f"CREATE TABLE {table} ({cols}, PRIMARY KEY ({', '.join(p.pk)}))"


_WORD = re.compile(r"\w+")


class _Table:
    """One projection's table and the statements that keep it, built once per table:
    rebuilding the same SQL strings on every write was a tenth of a command's CPU."""

    __slots__ = ("delete_key", "delete_run", "npk", "order", "p", "select_run",
                 "update", "upsert", "upsert_changed", "values")

    def __init__(self, p: Projection, table: str) -> None:
        self.p = p
        cols = list(p.columns)
        rest = [c for c in cols if c not in p.pk]
        # Columns a secondary index reads (its keys, its partial WHERE). An UPDATE that
        # sets one, even to its old value, deletes and reinserts that index's entry (a
        # dirty page per index), so the in-place update below leaves them out. Matching
        # the DDL's words too eagerly or too sparingly costs pages, never correctness:
        # SQLite keeps every index right whatever an UPDATE sets.
        words = {w.lower() for ddl in p.indexes for w in _WORD.findall(ddl.format(t="", i=""))}
        keyed = [c for c in rest if c.lower() in words]
        free = [c for c in rest if c not in keyed]
        self.upsert = _upsert_sql(p, table, cols, rest)
        # ... and the same, as a no-op when the stored row already holds these values.
        self.upsert_changed = self.upsert + (
            f" WHERE ({', '.join(rest)}) IS NOT ({', '.join('excluded.' + c for c in rest)})" if rest else ""
        )
        self.update = (
            f"UPDATE {table} SET {', '.join(f'{c}=:{c}' for c in free)} "
            f"WHERE {' AND '.join([*(f'{c}=:{c}' for c in p.pk), *(f'{c} IS :{c}' for c in keyed)])} "
            f"AND ({', '.join(free)}) IS NOT ({', '.join(':' + c for c in free)})"
            if free else None
        )
        self.order = (*p.pk, *rest)
        self.npk = len(p.pk)
        get = itemgetter(*self.order)  # a row's values as the SELECT below returns them
        self.values = get if len(self.order) > 1 else lambda row: (get(row),)
        self.select_run = f"SELECT {', '.join(self.order)} FROM {table} WHERE run_id=?"
        self.delete_key = f"DELETE FROM {table} WHERE {' AND '.join(f'{c}=?' for c in p.pk)}"
        self.delete_run = f"DELETE FROM {table} WHERE run_id=?"


def _upsert_sql(p: Projection, table: str, cols: list[str], rest: list[str]) -> str:
    # An upsert, not INSERT OR REPLACE: REPLACE deletes and reinserts, giving the row a
    # new rowid, and queries.runs lists "oldest first" by rowid. Updating in place keeps
    # a run where it was first inserted, inline and rebuilt alike.
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) "
        f"VALUES ({', '.join(':' + c for c in cols)}) "
        f"ON CONFLICT ({', '.join(p.pk)}) DO "
        + (f"UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in rest)}" if rest else "NOTHING")
    )


def _write(conn: sqlite3.Connection, t: _Table, cp: Checkpoint, last_position: int, *, fresh: bool = False) -> None:
    if not cp.opened:
        return  # a stream that is not a handoff run (a watcher's beats): no view rows
    rows = t.p.rows(cp, last_position)
    if fresh:
        _fill(conn, t, cp.run_id, rows)
    elif t.p.many:
        _sync_many(conn, t, cp.run_id, rows)
    else:
        for row in rows:
            _sync_one(conn, t, row)


def _fill(conn: sqlite3.Connection, t: _Table, run_id: str, rows: list[dict[str, Any]]) -> None:
    """A rebuild's new table: nearly every run is written once, so write it outright (the
    swap refolds the runs that moved meanwhile, hence the delete and the upsert)."""
    if t.p.many:
        conn.execute(t.delete_run, (run_id,))
    if rows:
        conn.executemany(t.upsert, rows)


def _sync_one(conn: sqlite3.Connection, t: _Table, row: dict[str, Any]) -> None:
    """Make the stored row equal ``row``, writing nothing if it already does.

    Compared with the table, never with a remembered state, so a row left stale by any
    other writer is rewritten. Most commands change a row's non-indexed columns only
    (a checkpoint's packet and positions): an in-place UPDATE of those leaves every
    secondary index untouched. A new row, or one whose indexed columns moved (a state
    change), takes the upsert, which keeps the row's rowid."""
    if t.update is None or not conn.execute(t.update, row).rowcount:
        conn.execute(t.upsert_changed, row)


def _sync_many(conn: sqlite3.Connection, t: _Table, run_id: str, rows: list[dict[str, Any]]) -> None:
    """Make a run's stored rows equal ``rows``: delete those that went away, write those
    that differ. Most commands change none of them, and reading the run's rows (cached
    pages) is much cheaper than rewriting them and their indexes."""
    stored = conn.execute(t.select_run, (run_id,)).fetchall()
    wants = [t.values(row) for row in rows]
    if stored == wants:
        return
    n = t.npk
    have = {r[:n]: r for r in stored}
    for key in have.keys() - {w[:n] for w in wants}:
        conn.execute(t.delete_key, key)
    for row, want in zip(rows, wants):
        old = have.get(want[:n])
        if old is None:
            conn.execute(t.upsert, row)
        elif old != want:
            _sync_one(conn, t, row)


def _named(names: Iterable[str] | None) -> list[Projection]:
    if names is None:
        return list(PROJECTIONS)
    out = []
    for n in names:
        if n not in BY_NAME:
            raise InvalidInput(
                f"no projection named {n!r}; the projections are {', '.join(BY_NAME)}", field="projection"
            )
        out.append(BY_NAME[n])
    return out


class Projector:
    """Attaches the projections to a SqliteStore and keeps them inline with every append."""

    def __init__(self, store: SqliteStore, names: Iterable[str] | None = None) -> None:
        self.store = store
        self.projections = _named(names)
        self._tables = [_Table(p, p.table) for p in self.projections]
        names_sql = ",".join(f":n{i}" for i in range(len(self.projections)))
        self._names = {f"n{i}": p.name for i, p in enumerate(self.projections)}
        self._advance = (
            f"UPDATE {TRACKING} SET position=:last WHERE name IN ({names_sql}) "
            f"AND NOT EXISTS (SELECT 1 FROM events WHERE position > {TRACKING}.position "
            f"AND position <= :last AND run_id != :run)"
        )
        self._ensure_tables()
        store.attach(AGGREGATE, self._inline)
        if not store.readonly:
            self.catch_up()

    # --- tables --------------------------------------------------------------------

    def _ensure_tables(self) -> None:
        store = self.store
        conn = store._conn
        existing = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = [p for p in self.projections if p.table not in existing]
        if TRACKING in existing and VERSIONS in existing and not missing and not self._outdated():
            return
        if store.readonly:
            return  # a read-only open answers from the views as they are
        with store._lock:
            store._begin("creating projection tables")
            ok = False
            try:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {TRACKING} (name TEXT PRIMARY KEY, position INTEGER NOT NULL)"
                )
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {VERSIONS} (name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
                )
                existing = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                for p in self.projections:
                    if p.table not in existing:
                        conn.execute(_create_sql(p, p.table))
                        for ddl in p.indexes:
                            conn.execute(ddl.format(t=p.table, i=p.table))
                        conn.execute(f"INSERT OR REPLACE INTO {TRACKING} VALUES (?, 0)", (p.name,))
                        conn.execute(f"INSERT OR REPLACE INTO {VERSIONS} VALUES (?, ?)", (p.name, p.version))
                # Views kept by another version (or before versions were recorded, 1): back
                # to position 0, so the catch-up that follows refolds every run into rows
                # of this version, in its own transaction, however many processes open.
                for p in self._outdated():
                    conn.execute(f"UPDATE {TRACKING} SET position = 0 WHERE name = ?", (p.name,))
                    conn.execute(f"INSERT OR REPLACE INTO {VERSIONS} VALUES (?, ?)", (p.name, p.version))
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, "creating projection tables", store.path) from exc
            finally:
                store._finish(ok, "creating projection tables")

    # --- inline ----------------------------------------------------------------------

    def _inline(self, conn: sqlite3.Connection, run_id: str, cp: Checkpoint, last_position: int) -> None:
        """Called by the store inside the append's write transaction."""
        for t in self._tables:
            _write(conn, t, cp, last_position)
        # Advance a tracking row only over this run's events. If another run's events
        # landed after it (appended by a store without this projector: a bare SqliteStore,
        # an older version), they were never applied; moving past them would hide them
        # from catch_up for good, so the row stays put and the next catch_up refolds them.
        conn.execute(self._advance, {"last": last_position, "run": run_id, **self._names})

    def _outdated(self) -> list[Projection]:
        """The projections whose kept rows were made by another version of their fold."""
        conn = self.store._conn
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (VERSIONS,)).fetchone():
            return list(self.projections)
        kept = dict(conn.execute(f"SELECT name, version FROM {VERSIONS}"))
        return [p for p in self.projections if kept.get(p.name, 1) != p.version]

    def positions(self) -> dict[str, int]:
        with self.store._lock:
            return dict(self.store._conn.execute(f"SELECT name, position FROM {TRACKING}"))

    # --- catch-up --------------------------------------------------------------------

    def catch_up(self, *, progress: Progress = None) -> int:
        """Bring any projection whose tracking position lags the log up to date.

        Returns how many runs were refolded. Safe to call at any time.
        """
        store = self.store
        refolded = 0
        with store._lock:
            last = store.last_position()
            behind = {n: pos for n, pos in self.positions().items() if n in {p.name for p in self.projections} and pos < last}
            if not behind:
                return 0
            since = min(behind.values())
            lagging = [t for t in self._tables if t.p.name in behind]
            store._begin("catching up projections")
            ok = False
            try:
                runs = [r[0] for r in store._conn.execute(_RUNS_SINCE, (since,))]
                for i, run_id in enumerate(runs):
                    head = store._head_locked(run_id)[0]
                    cp = store._state_locked(run_id, AGGREGATE, head)
                    for t in lagging:
                        _write(store._conn, t, cp, head.last_position)  # type: ignore[union-attr]
                    refolded += 1
                    if progress and i % 1000 == 0:
                        progress(i, len(runs))
                store._conn.executemany(
                    f"UPDATE {TRACKING} SET position=? WHERE name=?", [(last, t.p.name) for t in lagging]
                )
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, "catching up projections", store.path) from exc
            finally:
                store._finish(ok, "catching up projections")
        return refolded

    # --- rebuild -----------------------------------------------------------------------

    def rebuild(self, names: Iterable[str] | None = None, *, batch: int = 500, progress: Progress = None) -> dict[str, int]:
        """Drop and refold the named projections (all by default) from position 0.

        Builds into fresh ``*__new`` tables, one run at a time and in batches (memory stays
        flat in the size of the log), then swaps them in with one transaction. A rebuild
        killed midway leaves the old tables untouched; the next one starts over.
        Returns {projection: rows written}.
        """
        store = self.store
        chosen = _named(names)
        conn = store._conn
        tmp = {p.name: p.table + "__new" for p in chosen}
        fresh = [_Table(p, tmp[p.name]) for p in chosen]

        def txn(doing: str, fn: Callable[[], Any]) -> Any:
            with store._lock:
                store._begin(doing)
                ok = False
                try:
                    out = fn()
                    ok = True
                    return out
                except sqlite3.Error as exc:
                    raise _explain(exc, doing, store.path) from exc
                finally:
                    store._finish(ok, doing)

        def prepare() -> int:
            for p in chosen:
                conn.execute(f"DROP TABLE IF EXISTS {tmp[p.name]}")
                conn.execute(_create_sql(p, tmp[p.name]))
            return store.last_position()

        start = txn("preparing a rebuild", prepare)
        with store._lock:  # the runs this walk will fold: those begun by ``start``
            total = conn.execute("SELECT count(*) FROM heads WHERE first_position <= ?", (start,)).fetchone()[0]
        counts = {p.name: 0 for p in chosen}

        def fold_and_write(run_ids: list[str]) -> None:
            for run_id in run_ids:
                head = store._head_locked(run_id)[0]
                if head is None:
                    continue
                cp = store.fold(run_id, AGGREGATE)
                for t in fresh:
                    _write(conn, t, cp, head.last_position, fresh=True)

        # Heads are read a page at a time and runs folded in batches: memory stays flat in
        # the number of runs as well as in the number of events.
        done = 0

        def flush(chunk: list[str]) -> None:
            nonlocal done
            txn("rebuilding projections", lambda: fold_and_write(chunk))
            done += len(chunk)
            if progress:
                progress(min(done, total), total)

        chunk: list[str] = []
        for head in store.list_runs():
            if head.first_position > start:
                break  # runs begun since the rebuild started: the swap folds those
            chunk.append(head.run_id)
            if len(chunk) == batch:
                flush(chunk)
                chunk = []
        if chunk:
            flush(chunk)

        def swap() -> None:
            late = [r[0] for r in conn.execute(_RUNS_SINCE, (start,))]
            fold_and_write(late)
            last = store.last_position()
            for p in chosen:
                conn.execute(f"DROP TABLE IF EXISTS {p.table}")
                conn.execute(f"ALTER TABLE {tmp[p.name]} RENAME TO {p.table}")
                for ddl in p.indexes:
                    conn.execute(ddl.format(t=p.table, i=p.table))
                conn.execute(f"INSERT OR REPLACE INTO {TRACKING} VALUES (?, ?)", (p.name, last))
                conn.execute(f"INSERT OR REPLACE INTO {VERSIONS} VALUES (?, ?)", (p.name, p.version))
                counts[p.name] = conn.execute(f"SELECT count(*) FROM {p.table}").fetchone()[0]

        txn("swapping in rebuilt projections", swap)
        return counts

    # --- check -------------------------------------------------------------------------

    def check(self, names: Iterable[str] | None = None, *, progress: Progress = None) -> list[dict[str, Any]]:
        """Compare every kept row with a fresh fold of the log; return each difference.

        A difference is {projection, run_id, column, kept, folded}; kept or folded is
        None where a whole row is missing on that side. Differences come projection by
        projection, runs in order of first appearance, then the kept rows nothing folds
        to (in table order). Runs are walked a page at a time, each folded once and
        compared with its own rows: memory stays flat however large the views are.
        """
        store = self.store
        chosen = list({p.name: p for p in _named(names)}.values())  # each view once, in the order named
        found: dict[str, list[dict[str, Any]]] = {p.name: [] for p in chosen}
        # Kept rows no fold accounts for, with their rowids, reported last in table order.
        extra: dict[str, list[tuple[int, str]]] = {p.name: [] for p in chosen}
        selects = {
            p.name: f"SELECT rowid, {', '.join(p.columns)} FROM {p.table} WHERE run_id=?" for p in chosen
        }
        with store._lock:
            conn = store._conn
            began = not conn.in_transaction
            if began:
                conn.execute("BEGIN")  # one snapshot for the whole walk
            try:
                total = store.count_runs()
                for i, head in enumerate(store.list_runs()):
                    run_id = head.run_id
                    if progress and i % 1000 == 0:
                        progress(i, total)
                    try:
                        cp = store.fold(run_id, AGGREGATE)
                    except CorruptLedger as exc:
                        # The log itself is damaged here: say so, per run, and go on.
                        for p in chosen:
                            found[p.name].append(dict(projection=p.name, run_id=run_id, column=None,
                                                      kept=None, folded=f"unfoldable: {exc.message}"))
                        continue
                    if not cp.opened:
                        # A watcher's stream: no row may name it.
                        for p in chosen:
                            extra[p.name].extend((r[0], run_id) for r in conn.execute(selects[p.name], (run_id,)))
                        continue
                    for p in chosen:
                        _compare(conn, p, selects[p.name], cp, head.last_position, found[p.name], extra[p.name])
                for p in chosen:  # rows naming a run the log does not hold
                    extra[p.name].extend(conn.execute(
                        f"SELECT rowid, run_id FROM {p.table} AS t "
                        "WHERE NOT EXISTS (SELECT 1 FROM heads AS h WHERE h.run_id = t.run_id)"
                    ))
            finally:
                if began and conn.in_transaction:
                    conn.execute("ROLLBACK")
        diffs: list[dict[str, Any]] = []
        for p in chosen:
            diffs.extend(found[p.name])
            diffs.extend(
                dict(projection=p.name, run_id=run_id, column=None, kept="row", folded=None)
                for _, run_id in sorted(extra[p.name])
            )
        return diffs


def _compare(
    conn: sqlite3.Connection, p: Projection, select: str, cp: Checkpoint, last_position: int,
    found: list[dict[str, Any]], extra: list[tuple[int, str]],
) -> None:
    """One run's kept rows of one view against the rows its fold gives."""
    cols = list(p.columns)
    kept = {}
    for rowid, *values in conn.execute(select, (cp.run_id,)):
        row = dict(zip(cols, values))
        kept[tuple(row[k] for k in p.pk)] = (rowid, row)
    for row in p.rows(cp, last_position):
        have = kept.pop(tuple(row[k] for k in p.pk), None)
        if have is None:
            found.append(dict(projection=p.name, run_id=cp.run_id, column=None, kept=None, folded="row"))
            continue
        for c in cols:
            if have[1][c] != row[c]:
                found.append(dict(projection=p.name, run_id=cp.run_id, column=c,
                                  kept=_show(have[1][c]), folded=_show(row[c])))
    extra.extend((rowid, cp.run_id) for rowid, _ in kept.values())


def _show(v: Any) -> Any:
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return v
