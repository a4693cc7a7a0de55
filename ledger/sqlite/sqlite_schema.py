"""The SQLite file's layout and its life: the statements that make it, the checks an open
makes of it, and the upgrades an older file gets.

One home for what the store, its views and its checks compare a file against: the
append-only triggers (``verify`` and ``doctor`` report one dropped or rewritten), the
table of writes that did not keep every projection, and the heads index.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import NotALedger, SchemaTooNew
from ..store import FORMAT_NAME, Problem, meta_schema_version
from .sqlite_values import CREATE as VALUES_TABLE
from .sqlite_values import ERASURES_INDEX
from .driver import explain
from .opening import unreadable_schema

if TYPE_CHECKING:
    from .sqlite_store import SqliteStore

#: Layout version of the file itself (tables, indexes, triggers). 2: the views_unkept
#: table (writes that did not keep every projection inline), and inline writes no longer
#: move the tracking rows; a file of schema 1 is upgraded by its first writable open.
STORE_SCHEMA_VERSION = 2
#: Each write that did not keep every projection inline (a bare store, a projector of some
#: views only, an older tool) records its first position here, with the projections it did
#: keep (comma-separated; '' for none). A projection is current up to the log's end but
#: for the first such write after its tracking position that did not keep it: so a write
#: that keeps them all, the usual one, writes no tracking row (SqliteViewStore.lagging).
UNKEPT = "views_unkept"
CREATE_UNKEPT = f"CREATE TABLE IF NOT EXISTS {UNKEPT} (position INTEGER PRIMARY KEY, kept TEXT NOT NULL)"
# Written only once projection tables exist: before that, a view made later is built
# from the whole log anyway (its tracking row starts unbuilt), so nothing need be marked.
MARK_UNKEPT = (
    f"INSERT INTO {UNKEPT} (position, kept) SELECT ?, '' "
    "WHERE EXISTS (SELECT 1 FROM sqlite_master WHERE type='table' AND name='projection_positions')"
)
# Runs in the order they first appeared, a page at a time: list_runs and a rebuild walk
# every run without holding them all in memory. A run's first position never changes,
# so head updates never touch this index; only a run's first append adds an entry.
HEADS_FIRST = "CREATE INDEX IF NOT EXISTS heads_first ON heads(first_position)"
#: Each run's liveness beside the log (``ledger.store.Liveness``): one row a beat rewrites in
#: place, so an alive worker's beats neither grow the file nor touch the chains. Additive:
#: a file made before it gets the table at its next writable open, its version unchanged.
LIVENESS_TABLE = (
    "CREATE TABLE IF NOT EXISTS liveness (run_id TEXT PRIMARY KEY, lease INTEGER NOT NULL, "
    "beat_us INTEGER NOT NULL, beats INTEGER NOT NULL, logged_us INTEGER NOT NULL, attrs BLOB NOT NULL, "
    "quiet_us INTEGER NOT NULL)"
)
#: The triggers that make the events table append-only, exactly as created. verify and
#: doctor compare the file's triggers with these: one dropped or rewritten is reported.
APPEND_ONLY_TRIGGERS = {
    "events_no_update": (
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: UPDATE refused'); END"
    ),
    "events_no_overwrite": (
        "CREATE TRIGGER events_no_overwrite BEFORE INSERT ON events WHEN EXISTS ("
        "SELECT 1 FROM events WHERE position = NEW.position "
        "OR (run_id = NEW.run_id AND seq = NEW.seq)) BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: overwrite refused'); END"
    ),
    "events_no_delete": (
        "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: DELETE refused'); END"
    ),
}


#: The tables a new ledger is made of, in the order they are created (the marker table
#: first: ``opening`` looks for its row near the start of the file).
CREATE_TABLES = (
    "CREATE TABLE handoff_meta (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE events (position INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "type TEXT NOT NULL, actor TEXT NOT NULL, lease INTEGER, idem_key TEXT, idem_digest BLOB, "
    "batch_size INTEGER NOT NULL, recorded_us INTEGER NOT NULL, schema_version INTEGER NOT NULL, "
    "payload BLOB NOT NULL, prev_hash BLOB NOT NULL, hash BLOB NOT NULL, global_hash BLOB NOT NULL)",
    "CREATE UNIQUE INDEX events_run_seq ON events(run_id, seq)",
    "CREATE UNIQUE INDEX events_idem ON events(run_id, idem_key) WHERE idem_key IS NOT NULL",
    *APPEND_ONLY_TRIGGERS.values(),
    "CREATE TABLE heads (run_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL, last_hash BLOB NOT NULL, "
    "lease INTEGER, lease_holder TEXT, max_lease INTEGER NOT NULL, first_position INTEGER NOT NULL, "
    "last_position INTEGER NOT NULL, lease_digest TEXT)",
    HEADS_FIRST,
    CREATE_UNKEPT,
    VALUES_TABLE,
    ERASURES_INDEX,
    LIVENESS_TABLE,
)


@contextlib.contextmanager
def _immediate(store: SqliteStore, doing: str) -> Iterator[sqlite3.Connection]:
    """One schema change under the writer lock: committed whole, or rolled back whole."""
    conn = store.conn
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield conn
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise explain(exc, doing, store.path) from exc


def prepare(store: SqliteStore, may_create: bool, clock: Callable[[], int]) -> None:
    """Make the file a ledger of this version's schema, or refuse it: create the schema in
    an empty file (when ``may_create``), upgrade an older one on a writable open, and
    refuse a file that is another database or was written by a newer version. ``clock``
    dates a new ledger (its ``created_us``)."""
    conn, path = store.conn, store.path
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise (explain(exc, "opening", path) if store.path == ":memory:" else unreadable_schema(path, exc)) from exc
    if "handoff_meta" not in tables:
        if tables:
            raise NotALedger(
                f"{path} is an SQLite database but not a handoff ledger (it has "
                f"tables {', '.join(sorted(tables)[:5])}); use another file name"
            )
        if not may_create:
            raise NotALedger(f"{path} is empty, not a handoff ledger; run 'handoff init'")
        _create(store, clock)
        return
    meta = dict(conn.execute("SELECT key, value FROM handoff_meta"))
    version = meta_schema_version(meta, path, STORE_SCHEMA_VERSION, "file schema")
    store.file_schema = version
    if store.readonly:  # an older schema stays as it is: it reads as it is (upgrade_note)
        return
    if version < STORE_SCHEMA_VERSION:
        _migrate(store, version)
        store.file_schema = STORE_SCHEMA_VERSION
    _add_heads_index(store)
    _add_lease_digest_column(store)
    if "run_values" not in tables:  # an additive table: the file schema version stays
        with _immediate(store, "adding the values table") as conn:
            conn.execute(VALUES_TABLE)
    if "liveness" not in tables:  # additive, as above
        with _immediate(store, "adding the liveness table") as conn:
            conn.execute(LIVENESS_TABLE)
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name='events_erasures'").fetchone():
        with _immediate(store, "adding an index of the runs' erasures") as conn:  # additive, as above
            conn.execute(ERASURES_INDEX)


def _create(store: SqliteStore, clock: Callable[[], int]) -> None:
    with _immediate(store, "creating the ledger schema") as conn:
        # Another process may have created it while we waited for the lock.
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='handoff_meta'").fetchone():
            return
        for sql in CREATE_TABLES:
            conn.execute(sql)
        conn.executemany("INSERT INTO handoff_meta (key, value) VALUES (?, ?)", [
            ("format", FORMAT_NAME), ("schema_version", str(STORE_SCHEMA_VERSION)),
            ("created_us", str(clock()))])
        store.created_schema = True


def _add_heads_index(store: SqliteStore) -> None:
    """Add ``heads_first`` to a ledger made before it existed.

    An additive index, so the file schema version stays: older versions read and
    write the file as before and SQLite keeps the index current for them. Without it
    (a file only ever opened read-only) ``list_runs`` falls back to one query."""
    if store.conn.execute("SELECT 1 FROM sqlite_master WHERE name='heads_first'").fetchone():
        return
    with _immediate(store, "adding an index to the heads table") as conn:
        conn.execute(HEADS_FIRST)


def has_lease_digest(conn: sqlite3.Connection) -> bool:
    """Whether the heads table has the ``lease_digest`` column (a file from before lease
    tokens, opened read-only, has not)."""
    return any(r[1] == "lease_digest" for r in conn.execute("PRAGMA table_info(heads)"))


def _add_lease_digest_column(store: SqliteStore) -> None:
    """Add ``heads.lease_digest`` (the digest a write's lease token must match) to a
    ledger made before lease tokens. Additive like ``heads_first``: the file schema
    version stays. A lease held at the upgrade has no digest, so no write can prove it:
    it must be revoked and claimed again (docs/reliability.md, "Lease tokens")."""
    if has_lease_digest(store.conn):
        return
    with _immediate(store, "adding the lease_digest column to the heads table") as conn:
        # Another process may have added it while we waited for the lock.
        if not has_lease_digest(conn):
            conn.execute("ALTER TABLE heads ADD COLUMN lease_digest TEXT")


def _migrate(store: SqliteStore, from_version: int) -> None:
    """Upgrade the file to ``STORE_SCHEMA_VERSION`` in one write transaction.

    1 -> 2: the views_unkept table. Under schema 1 every inline write moved the tracking
    rows, so a projection whose row stands behind the log's end was not kept by the
    writes after it: each such position gets a mark naming the projections that were
    ahead of it, so catch-up refolds exactly what it would have. Events, hashes, chains
    and view rows are untouched. An older version then refuses the file (SchemaTooNew):
    it would write without marking."""
    if from_version != 1:
        raise SchemaTooNew(f"{store.path} has file schema {from_version}; no migration from it is known")
    with _immediate(store, f"upgrading the file from schema {from_version}") as conn:
        found = int(dict(conn.execute("SELECT key, value FROM handoff_meta")).get("schema_version", "0"))
        if found != from_version:  # another process upgraded it while we waited
            return
        conn.execute(CREATE_UNKEPT)
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='projection_positions'").fetchone():
            last = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]
            tracking = dict(conn.execute("SELECT name, position FROM projection_positions"))
            for pos in sorted({p for p in tracking.values() if p < last}):
                kept = ",".join(sorted(n for n, p in tracking.items() if p > pos))
                conn.execute(f"INSERT OR REPLACE INTO {UNKEPT} (position, kept) VALUES (?, ?)", (pos + 1, kept))
        conn.execute("UPDATE handoff_meta SET value=? WHERE key='schema_version'", (str(STORE_SCHEMA_VERSION),))


def upgrade_note(store: SqliteStore) -> str | None:
    """What to run when a read-only open found an older file schema, else None."""
    if store.file_schema >= STORE_SCHEMA_VERSION or store.path == ":memory:":
        return None
    return (f"{store.path} is in file schema {store.file_schema}; this version writes "
            f"{STORE_SCHEMA_VERSION}. It reads as it is; to upgrade it in place, open it once with "
            "write access (any handoff command without read-only access, e.g. 'handoff doctor')")


def append_only_problems(conn: sqlite3.Connection) -> list[Problem]:
    """The append-only triggers as the file holds them, against ``APPEND_ONLY_TRIGGERS``."""
    have = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type='trigger' AND tbl_name='events'"))
    out = []
    for name, sql in APPEND_ONLY_TRIGGERS.items():
        if name not in have:
            out.append(Problem(
                "trigger_missing", None, None, None,
                f"the append-only trigger {name} is gone: events can be changed or deleted "
                "without any error. Someone edited the file behind the store; run 'handoff "
                "verify' against a head digest kept elsewhere, and restore from a backup",
            ))
        elif " ".join(str(have[name]).split()) != " ".join(sql.split()):
            out.append(Problem(
                "trigger_altered", None, None, None,
                f"the append-only trigger {name} is not the one the store created: it may "
                "no longer refuse changes. Someone edited the file behind the store; restore "
                "from a backup and compare with a head digest kept elsewhere",
            ))
    return out
