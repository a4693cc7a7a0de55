"""The SQLite event store: one file, WAL, every write under BEGIN IMMEDIATE.

Durability first: ``synchronous=FULL`` unless the caller names ``NORMAL``. The events
table refuses UPDATE and DELETE by trigger. Positions are assigned inside the write
lock, so they become visible in order and a catch-up reader never skips one.
Checkpoints run only under the writer lock (see docs/architecture.md, "WAL reset").
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import msgspec

from .. import events as ev
from .. import plan, verify
from ..errors import (
    InvalidInput,
    LedgerError,
    NotALedger,
    OutcomeUnknown,
    SchemaTooNew,
    StoreUnavailable,
)
from ..folds import Folded, FoldingStore, StoreTransaction
from ..importing import ImportHead, ImportRow, run_import
from ..plan import Request
from ..store import (
    DEFAULT_MAX_PAYLOAD,
    GENESIS_HASH,
    Actor,
    Aggregate,
    AppendResult,
    Capabilities,
    Decision,
    Head,
    Problem,
    Recorded,
    Step,
    check_run_id,
    check_seq,
    encode_events,
    global_link,
)
from . import blobs, schema
from .driver import explain as _explain
from .schema import APPEND_ONLY_TRIGGERS, CREATE_UNKEPT, FORMAT_NAME, HEADS_FIRST, MARK_UNKEPT, UNKEPT
from .group import GroupCommit
from .opening import sniff, unreadable_schema, unusable_path

S = TypeVar("S")

PAGE = 1000
_TAGS = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}
# Runs with events after a position, in the order they first appeared in the log (the
# order a full rebuild inserts them in), so new view rows get rowids in creation order.
_RUNS_SINCE = (
    "SELECT run_id FROM heads WHERE run_id IN "
    "(SELECT run_id FROM events WHERE position > ?) ORDER BY first_position"
)
#: Checkpoint once the WAL file grows past this many bytes (checked after commits).
WAL_CHECKPOINT_BYTES = 8 << 20

Sync = Literal["FULL", "NORMAL"]

_COLUMNS = (
    "run_id, seq, position, type, actor, lease, idem_key, recorded_us, "
    "schema_version, payload, prev_hash, hash"
)


#: A run's head after a write (new run or existing): the one statement both the live
#: append and the import keep it with.
_UPSERT_HEAD = (
    "INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, "
    "first_position, last_position) VALUES (?,?,?,?,?,?,?,?) "
    "ON CONFLICT(run_id) DO UPDATE SET last_seq=excluded.last_seq, "
    "last_hash=excluded.last_hash, lease=excluded.lease, "
    "lease_holder=excluded.lease_holder, max_lease=excluded.max_lease, "
    "last_position=excluded.last_position"
)
_INSERT_FIRST = (
    "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, global_hash) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_REST = (
    "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, global_hash) "
    "VALUES (?,?,?,?,?,?,NULL,NULL,?,?,?,?,?,?,?)"
)


def _decoded(payloads: list[bytes], types: list[str]) -> list[ev.Event] | None:
    """A page of payloads decoded together, or None if one does not decode or is not the
    type its row names (the caller then reads the page whole, to name the damaged one)."""
    try:
        events = ev.decode_many(payloads)
        if list(map(_TAGS.__getitem__, map(type, events))) == types:
            return events
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError, UnicodeDecodeError, KeyError):
        pass
    return None


def _now_us() -> int:
    return time.time_ns() // 1000



class SqliteStore(blobs.SqliteValues, FoldingStore):
    """An EventStore in one SQLite file (or ``:memory:`` for tests and scratch work).

    One store object owns one connection and may be shared by threads; open one per
    process for multi-process use. ``synchronous`` is ``"FULL"`` (acknowledged means on
    disk after power loss) or ``"NORMAL"`` (faster; the last commits may be lost on
    power loss, never on a process crash).
    """

    capabilities = Capabilities(is_file=True, group_commit=True)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Sync = "FULL",
        busy_timeout_s: float = 5.0,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], int] | None = None,
        create: bool = True,
        readonly: bool = False,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise InvalidInput(
                f"synchronous must be FULL or NORMAL, got {synchronous!r}", field="synchronous"
            )
        self.path = os.fspath(path)
        self.synchronous = synchronous
        self.busy_timeout_s = busy_timeout_s
        self.max_payload = max_payload
        self._clock = clock or _now_us
        self.lock = threading.RLock()
        FoldingStore.__init__(self)
        self._memory = self.path == ":memory:"
        self._txn = SqliteTransaction(self)
        self._views: Any = None
        self._db: Any = None
        self._commits_since_check = 0
        self._heads_indexed = False
        self._group: GroupCommit | None = None
        #: The file's schema: an older one stays only on a read-only open (see _migrate).
        self.file_schema = schema.STORE_SCHEMA_VERSION
        self.readonly = readonly
        self.conn = self._connect(create=create, readonly=readonly)
        try:
            self._ensure_schema(create and not readonly)
            # Only once the file is known to be a ledger: switching a foreign database
            # to WAL would rewrite its header even though we then refuse it.
            if not self._memory and not readonly:
                self._enable_wal()
        except BaseException:
            self.conn.close()
            raise

    @property
    def db(self) -> Any:
        """A sqlite_utils.Database on the store's connection, for schema work and inspection.

        Imported on first use: sqlite-utils costs ~60 ms to import, which every short-lived
        ``handoff progress`` process would otherwise pay.
        """
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    @classmethod
    def memory(cls, **kw: Any) -> SqliteStore:
        return cls(":memory:", **kw)

    # --- opening -------------------------------------------------------------------

    def _connect(self, *, create: bool, readonly: bool) -> sqlite3.Connection:
        path = self.path
        if not self._memory:
            refusal = unusable_path(path)
            if refusal is not None:
                raise refusal
            exists = os.path.exists(path)
            if exists:
                refusal = sniff(path)
                if refusal is not None:
                    raise refusal
            if not exists:
                if not create or readonly:
                    raise StoreUnavailable(
                        f"no ledger at {path}; create one with 'handoff init' or pass --db"
                    )
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                    os.close(fd)
                except FileExistsError:
                    if os.path.islink(path) and not os.path.exists(path):
                        # O_EXCL does not follow a link; SQLite would, creating the file
                        # at the link's target with the umask's mode instead of 0600.
                        raise InvalidInput(
                            f"{path} is a symbolic link to {os.readlink(path)!r}, which does not "
                            "exist; a new ledger is not created through a link. Name the real "
                            "path, or create the ledger there first",
                            field="db",
                        ) from None
                except OSError as exc:
                    raise StoreUnavailable(
                        f"cannot create the ledger {path}: {exc.strerror}; check the directory",
                    ) from exc
        try:
            if readonly and not self._memory:
                import urllib.parse  # only here: every short-lived CLI process pays for imports

                uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
                conn = sqlite3.connect(
                    uri, uri=True, timeout=self.busy_timeout_s, isolation_level=None,
                    check_same_thread=False,
                )
            else:
                conn = sqlite3.connect(
                    path, timeout=self.busy_timeout_s, isolation_level=None,
                    check_same_thread=False,
                )
        except sqlite3.Error as exc:
            raise _explain(exc, "opening", path) from exc
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        try:
            conn.execute("PRAGMA trusted_schema=OFF")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            # After a RESTART checkpoint the next writer overwrites the WAL from its start
            # (no file growth on every commit, which costs ext4 a journal commit per
            # fdatasync); this cap trims it back after an unusually large burst.
            conn.execute(f"PRAGMA journal_size_limit={WAL_CHECKPOINT_BYTES}")
            # No automatic (passive) checkpoints: see _maybe_checkpoint.
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.DatabaseError as exc:
            conn.close()
            low = str(exc).lower()
            if not self._memory and ("not a database" in low or "malformed" in low):
                raise unreadable_schema(path, exc) from exc
            raise _explain(exc, "opening", path) from exc
        except sqlite3.Error as exc:
            conn.close()
            raise _explain(exc, "opening", path) from exc
        return conn

    def _enable_wal(self) -> None:
        try:
            mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.Error as exc:
            raise _explain(exc, "opening", self.path) from exc
        if str(mode).lower() != "wal":
            raise StoreUnavailable(
                f"could not switch {self.path} to WAL mode (got {mode}); is it on a "
                "network filesystem? Those are not supported"
            )

    def _ensure_schema(self, may_create: bool) -> None:
        conn = self.conn
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            raise (unreadable_schema(self.path, exc) if not self._memory else _explain(exc, "opening", self.path)) from exc
        if "handoff_meta" not in tables:
            if tables:
                raise NotALedger(
                    f"{self.path} is an SQLite database but not a handoff ledger (it has "
                    f"tables {', '.join(sorted(tables)[:5])}); use another file name"
                )
            if not may_create:
                raise NotALedger(f"{self.path} is empty, not a handoff ledger; run 'handoff init'")
            self._create_schema()
            return
        meta = dict(conn.execute("SELECT key, value FROM handoff_meta"))
        if meta.get("format") != FORMAT_NAME:
            raise NotALedger(f"{self.path} has a handoff_meta table but no handoff-ledger format mark")
        version = int(meta.get("schema_version", "0"))
        if version > schema.STORE_SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} was written by a newer handoff-ledger (file schema {version}, "
                f"this version reads up to {schema.STORE_SCHEMA_VERSION}); upgrade handoff-ledger"
            )
        self.file_schema = version
        if version < schema.STORE_SCHEMA_VERSION and not self.readonly:  # any writable open upgrades
            self._migrate(version)
            self.file_schema = schema.STORE_SCHEMA_VERSION
        if not self.readonly:
            self._ensure_heads_index()
            self._ensure_lease_digest_column()
            blobs.ensure(self)

    def _ensure_heads_index(self) -> None:
        """Add ``heads_first`` to a ledger made before it existed.

        An additive index, so the file schema version stays: older versions read and
        write the file as before and SQLite keeps the index current for them. Without it
        (a file only ever opened read-only) ``list_runs`` falls back to one query."""
        conn = self.conn
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='heads_first'").fetchone():
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(HEADS_FIRST)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _explain(exc, "adding an index to the heads table", self.path) from exc

    def _ensure_lease_digest_column(self) -> None:
        """Add ``heads.lease_digest`` (the digest a write's lease token must match) to a
        ledger made before lease tokens. Additive like ``heads_first``: the file schema
        version stays. A lease held at the upgrade has no digest, so no write can prove it:
        it must be revoked and claimed again (docs/reliability.md, "Lease tokens")."""
        conn = self.conn
        if any(r[1] == "lease_digest" for r in conn.execute("PRAGMA table_info(heads)")):
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            # Another process may have added it while we waited for the lock.
            if not any(r[1] == "lease_digest" for r in conn.execute("PRAGMA table_info(heads)")):
                conn.execute("ALTER TABLE heads ADD COLUMN lease_digest TEXT")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _explain(exc, "adding the lease_digest column to the heads table", self.path) from exc

    def _create_schema(self) -> None:
        db = self.db
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            # Another process may have created it while we waited for the lock.
            if db["handoff_meta"].exists():
                self.conn.execute("COMMIT")
                return
            db.create_table("handoff_meta", {"key": str, "value": str}, pk="key")
            db["handoff_meta"].insert_all(
                [
                    {"key": "format", "value": FORMAT_NAME},
                    {"key": "schema_version", "value": str(schema.STORE_SCHEMA_VERSION)},
                    {"key": "created_us", "value": str(self._clock())},
                ]
            )
            db.create_table(
                "events",
                {
                    "position": int,
                    "run_id": str,
                    "seq": int,
                    "type": str,
                    "actor": str,
                    "lease": int,
                    "idem_key": str,
                    "idem_digest": bytes,
                    "batch_size": int,
                    "recorded_us": int,
                    "schema_version": int,
                    "payload": bytes,
                    "prev_hash": bytes,
                    "hash": bytes,
                    "global_hash": bytes,
                },
                pk="position",
                not_null=[
                    "run_id", "seq", "type", "actor", "batch_size", "recorded_us",
                    "schema_version", "payload", "prev_hash", "hash", "global_hash",
                ],
            )
            db["events"].create_index(["run_id", "seq"], index_name="events_run_seq", unique=True)
            self.conn.execute(
                "CREATE UNIQUE INDEX events_idem ON events(run_id, idem_key) "
                "WHERE idem_key IS NOT NULL"
            )
            for sql in APPEND_ONLY_TRIGGERS.values():
                self.conn.execute(sql)
            db.create_table(
                "heads",
                {
                    "run_id": str,
                    "last_seq": int,
                    "last_hash": bytes,
                    "lease": int,
                    "lease_holder": str,
                    "max_lease": int,
                    "first_position": int,
                    "last_position": int,
                    "lease_digest": str,
                },
                pk="run_id",
                not_null=["last_seq", "last_hash", "max_lease", "first_position", "last_position"],
            )
            self.conn.execute(HEADS_FIRST)
            self.conn.execute(CREATE_UNKEPT)
            self.conn.execute(blobs.CREATE)
            self.conn.execute("COMMIT")
            self.created_schema = True
        except sqlite3.Error as exc:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise _explain(exc, "creating the ledger schema", self.path) from exc

    def _migrate(self, from_version: int) -> None:
        """Upgrade the file to ``schema.STORE_SCHEMA_VERSION`` in one write transaction.

        1 -> 2: the views_unkept table. Under schema 1 every inline write moved the tracking
        rows, so a projection whose row stands behind the log's end was not kept by the
        writes after it: each such position gets a mark naming the projections that were
        ahead of it, so catch-up refolds exactly what it would have. Events, hashes, chains
        and view rows are untouched. An older version then refuses the file (SchemaTooNew):
        it would write without marking."""
        if from_version != 1:
            raise SchemaTooNew(f"{self.path} has file schema {from_version}; no migration from it is known")
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            found = int(dict(conn.execute("SELECT key, value FROM handoff_meta")).get("schema_version", "0"))
            if found == from_version:  # another process may have upgraded it while we waited
                conn.execute(CREATE_UNKEPT)
                tracked = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='projection_positions'").fetchone()
                if tracked:
                    last = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]
                    tracking = dict(conn.execute("SELECT name, position FROM projection_positions"))
                    for pos in sorted({p for p in tracking.values() if p < last}):
                        kept = ",".join(sorted(n for n, p in tracking.items() if p > pos))
                        conn.execute(f"INSERT OR REPLACE INTO {UNKEPT} (position, kept) VALUES (?, ?)",
                                     (pos + 1, kept))
                conn.execute("UPDATE handoff_meta SET value=? WHERE key='schema_version'",
                             (str(schema.STORE_SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _explain(exc, f"upgrading the file from schema {from_version}", self.path) from exc

    def upgrade_note(self) -> str | None:
        """What to run when a read-only open found an older file schema, else None."""
        if self.file_schema >= schema.STORE_SCHEMA_VERSION or self._memory:
            return None
        return (f"{self.path} is in file schema {self.file_schema}; this version writes "
                f"{schema.STORE_SCHEMA_VERSION}. It reads as it is; to upgrade it in place, open it once with "
                "write access (any handoff command without read-only access, e.g. 'handoff doctor')")

    # --- writing -------------------------------------------------------------------

    def begin(self, doing: str) -> None:
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _explain(exc, doing, self.path) from exc

    def finish(self, ok: bool, doing: str) -> None:
        conn = self.conn
        if ok:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if "i/o" in str(exc).lower():
                    # The frames may be in the WAL already; a crash now would bring them back.
                    raise OutcomeUnknown(
                        f"the commit to {self.path} failed while syncing ({exc}) during {doing}: "
                        "the write may or may not be stored. Retry with the same idempotency key "
                        "(a stored write answers 'duplicate'), or read the run to see",
                        cause=str(exc),
                    ) from exc
                raise _explain(exc, doing, self.path) from exc
            try:
                self._maybe_checkpoint()
            except LedgerError:
                # The commit stands; a checkpoint that could not run now is retried after
                # a later commit. Reporting it would tell the caller "nothing was written".
                pass
        elif conn.in_transaction:
            conn.execute("ROLLBACK")

    def _maybe_checkpoint(self) -> None:
        """Checkpoint only in RESTART mode, which takes the writer lock for its whole run.

        Automatic checkpoints are off on every connection we open, so no checkpoint ever
        runs beside a commit: that closes the window of SQLite's WAL-reset bug (fixed in
        3.51.3) on the 3.40 library this machine ships. A busy reader makes it give up at
        once (busy_timeout 0), to be retried after a later commit.
        """
        if self._memory:
            return
        self._commits_since_check += 1
        if self._commits_since_check < 64:
            return
        self._commits_since_check = 0
        try:
            size = os.stat(self.path + "-wal").st_size
        except OSError:
            return
        if size >= WAL_CHECKPOINT_BYTES:
            self.checkpoint(wait=False)

    def checkpoint(self, *, wait: bool = True) -> tuple[int, int, int]:
        """Copy the WAL into the database, holding the writer lock; the next writer restarts it.

        Returns SQLite's (busy, WAL frames, frames checkpointed).
        """
        with self.lock:
            conn = self.conn
            try:
                if not wait:
                    conn.execute("PRAGMA busy_timeout=0")
                row = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                return tuple(row)  # type: ignore[return-value]
            except sqlite3.Error as exc:
                raise _explain(exc, "checkpointing", self.path) from exc
            finally:
                if not wait:
                    conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")

    def _head_locked(self, run_id: str) -> tuple[Head | None, int]:
        row = self.conn.execute(
            "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
            "last_position, max_lease FROM heads WHERE run_id=?",
            (run_id,),
        ).fetchone()
        if row is None:
            return None, 0
        return Head(*row[:7]), row[7]

    def _hash_at(self, run_id: str, seq: int) -> bytes | None:
        row = self.conn.execute("SELECT hash FROM events WHERE run_id=? AND seq=?", (run_id, seq)).fetchone()
        return None if row is None else row[0]

    @contextlib.contextmanager
    def _reading(self, doing: str = "reading") -> Iterator[None]:
        with self.lock:
            try:
                yield
            except sqlite3.Error as exc:
                raise _explain(exc, doing, self.path) from exc

    def _page_size(self) -> int:
        return PAGE

    def _lease_digest_locked(self, run_id: str) -> str | None:
        try:
            row = self.conn.execute("SELECT lease_digest FROM heads WHERE run_id=?", (run_id,)).fetchone()
        except sqlite3.OperationalError:
            # A file from before lease tokens, opened read-only (a writable open adds the
            # column): no lease of it has a digest.
            if any(r[1] == "lease_digest" for r in self.conn.execute("PRAGMA table_info(heads)")):
                raise
            return None
        return None if row is None else row[0]

    def _duplicate(self, req: Request) -> AppendResult | None:
        """The earlier batch a repeated key names, or None; IdempotencyConflict when that
        key stood for another request."""
        row = self.conn.execute(
            "SELECT seq, position, idem_digest, batch_size, actor FROM events "
            "WHERE run_id=? AND idem_key=?",
            (req.run_id, req.key),
        ).fetchone()
        if row is None:
            return None
        seq, position, stored, size, by = row
        plan.check_repeat(req.run_id, req.key, req.digest, req.actor, stored, by, seq)  # type: ignore[arg-type]
        return AppendResult(req.run_id, "duplicate", seq, seq + size - 1,
                            tuple(range(position, position + size)))

    def _insert_locked(self, req: Request, head: Head | None, max_lease: int, batch: Sequence[ev.Event],
                       encoded: list[tuple[str, bytes]], lease: int | None,
                       written: list[Recorded]) -> tuple[AppendResult, Head]:
        """Insert a batch and move the head; return what was appended and the new head (as
        ``_head_locked`` would now read it), and put the new events in ``written`` as a
        reader would get them, without reading them back."""
        conn = self.conn
        run_id = req.run_id
        tail = conn.execute("SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
        last_pos, gprev = tail if tail is not None else (0, GENESIS_HASH)
        done = plan.stamp(run_id, head, max_lease, batch, encoded, req.actor, lease, req.key, req.digest,
                          self._clock(), lambda parent: self._head_locked(parent)[0])
        n = done.size
        rows = []
        for i, (seq, tag, k, digest, payload, prev, h) in enumerate(done.events):
            pos = last_pos + 1 + i
            gprev = global_link(gprev, pos, h)
            # Blobs are bound as bytearray: Python's sqlite3 binds it directly, while bytes
            # (and None) go through the adapter lookup first (docs/performance.md).
            rows.append((pos, run_id, seq, tag, req.actor, lease, k, bytearray(digest) if digest else None,
                         n, done.now, ev.SCHEMA_VERSION, bytearray(payload), bytearray(prev), bytearray(h),
                         bytearray(gprev)))
            written.append(Recorded(run_id, seq, pos, tag, req.actor, lease, k, done.now, ev.SCHEMA_VERSION,
                                    payload, prev, h))
        conn.execute(_INSERT_FIRST, rows[0])
        if n > 1:
            # Only a batch's first event carries the idempotency key and digest.
            conn.executemany(_INSERT_REST, [r[:6] + r[8:] for r in rows[1:]])
        fence = done.fence
        first_position = head.first_position if head else last_pos + 1
        conn.execute(_UPSERT_HEAD, (run_id, done.last_seq, bytearray(done.last_hash), fence.lease, fence.holder,
                                    fence.max_lease, first_position, last_pos + n))
        if fence.digest_moved:
            conn.execute("UPDATE heads SET lease_digest=? WHERE run_id=?", (fence.digest, run_id))
        if not self._keeps_views:
            conn.execute(MARK_UNKEPT, (last_pos + 1,))
        result = AppendResult(run_id, "committed", done.last_seq - n + 1, done.last_seq,
                              tuple(range(last_pos + 1, last_pos + n + 1)))
        return result, Head(run_id, done.last_seq, done.last_hash, fence.lease, fence.holder, first_position,
                            last_pos + n)

    # --- import: the core's streamed import (ledger/importing.py) on this file ---------

    def import_records(
        self,
        items: Iterable[tuple[Recorded, bytes | None, int]],
        *,
        aggregate: Aggregate[Any] | None = None,
        admit: Callable[[Any, Recorded, ev.Event], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        with self.lock:
            self.begin("importing")
            ok = False
            try:
                counts, touched = run_import(self, items, aggregate, admit, before_commit)
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, "importing", self.path) from exc
            finally:
                self.finish(ok, "committing an import")
        for run_id, folded in touched:
            self._remember_all(run_id, folded)
        return counts

    def _import_tail(self) -> tuple[int, bytes]:
        tail = self.conn.execute("SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
        return tail if tail is not None else (0, GENESIS_HASH)

    def _key_used(self, run_id: str, key: str) -> bool:
        return self.conn.execute("SELECT 1 FROM events WHERE run_id=? AND idem_key=?", (run_id, key)).fetchone() is not None

    def _import_rows(self, rows: list[ImportRow], heads: list[ImportHead]) -> None:
        conn = self.conn
        if rows:
            conn.executemany(_INSERT_FIRST, [
                (pos, r.run_id, r.seq, r.type, r.actor, r.lease, r.idempotency_key, digest, size, r.recorded_us,
                 r.schema_version, bytearray(r.payload), bytearray(r.prev_hash), bytearray(r.hash), bytearray(g))
                for pos, r, digest, size, g in rows])
            if not self._keeps_views:
                conn.execute(MARK_UNKEPT, (rows[0][0],))
        for h in heads:
            conn.execute(_UPSERT_HEAD, (h.run_id, h.seq, bytearray(h.hash), h.fence.lease, h.fence.holder,
                                        h.fence.max_lease, h.first_position, h.last_position))
            if h.fence.digest_moved:
                conn.execute("UPDATE heads SET lease_digest=? WHERE run_id=?", (h.fence.digest, h.run_id))

    def _import_done(self, last_position: int, global_hash: bytes) -> None:
        """Nothing more: the rows carry their positions and the ledger-wide chain."""

    # --- commands --------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        events: Sequence[ev.Event],
        *,
        actor: Actor,
        expected_seq: int | None = None,
        lease: str | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        req = plan.append_request(run_id, events, actor=actor, expected_seq=expected_seq, lease=lease,
                                  key=idempotency_key, max_payload=self.max_payload)
        with self.lock:
            self.begin("appending")
            ok = False
            try:
                if req.key:
                    dup = self._duplicate(req)
                    if dup is not None:
                        ok = True
                        return dup
                head, max_lease = self._head_locked(run_id)
                plan.check_fence(run_id, head, req.expected_seq, None)
                if req.token is not None:
                    plan.check_token(run_id, head, max_lease, req.token, self._lease_digest_locked(run_id))
                # The hooks' states before the write (cached for a warm run), so that after
                # it they are evolved over the rows written instead of reading them back. A
                # new fork child is the exception: its fold starts with the parent's prefix.
                forking = head is None and isinstance(req.events[0], ev.RunForked)
                before = [] if forking else [
                    (agg, self._state_locked(run_id, agg, head)) for agg, _ in self._hooks
                ]
                written: list[Recorded] = []
                result, new_head = self._insert_locked(req, head, max_lease, req.events, req.encoded,  # type: ignore[arg-type]
                                                       req.lease, written)
                folded = self._run_hooks(
                    run_id, new_head, [(agg, agg.evolve_all(state, written)) for agg, state in before]
                )
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, "appending", self.path) from exc
            finally:
                self.finish(ok, "committing an append")
            self._remember_all(run_id, folded)
            return result

    def _steps_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Step]:
        """Events of one run as Steps: five columns read, the payloads decoded together."""
        sql = "SELECT seq, type, recorded_us, payload, actor FROM events WHERE run_id=? AND seq>?"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=?"
            args.append(until_seq)
        try:
            rows = self.conn.execute(sql + " ORDER BY seq", args).fetchall()
        except sqlite3.Error as exc:
            raise _explain(exc, "reading", self.path) from exc
        events = _decoded([r[3] for r in rows], [r[1] for r in rows])
        if events is None:
            # Read the page again whole: Recorded.event raises CorruptLedger naming the
            # position of the payload that does not decode or does not match its type.
            events = [rec.event for rec in self._read_run_page(run_id, after_seq, until_seq)]
        return [
            Step(run_id, seq, type_, at_us, event, actor)
            for (seq, type_, at_us, _, actor), event in zip(rows, events)
        ]

    def execute(
        self,
        run_id: str,
        aggregate: Aggregate[S],
        decide: Callable[[S, Head | None], Decision],
        *,
        actor: Actor,
        idempotency_key: str | None = None,
        digest_of: bytes | None = None,
        lease: str | None = None,
    ) -> tuple[AppendResult, S]:
        req = plan.execute_request(run_id, actor=actor, key=idempotency_key, lease=lease, digest_of=digest_of)
        if self._group is not None:
            return self._group.submit(run_id, lambda: self._execute_locked(req, aggregate, decide))
        with self.lock:
            self.begin("appending")
            ok = False
            try:
                result, state, folded = self._execute_locked(req, aggregate, decide)
                ok = True
            finally:
                self.finish(ok, "committing a command")
            if folded is not None:
                self._remember_all(run_id, folded)
            return result, state

    def _execute_locked(
        self, req: Request, aggregate: Aggregate[S], decide: Callable[[S, Head | None], Decision],
    ) -> tuple[AppendResult, S, Folded | None]:
        """The body of ``execute`` inside an open write transaction: the result, the state
        after it, and the folds to remember once the transaction commits (None: nothing new)."""
        run_id = req.run_id
        try:
            head, max_lease = self._head_locked(run_id)
            if req.key:
                dup = self._duplicate(req)
                if dup is not None:
                    return dup, self._state_locked(run_id, aggregate, head), None
            if req.token is not None:
                plan.check_token(run_id, head, max_lease, req.token, self._lease_digest_locked(run_id))
            state = self._state_locked(run_id, aggregate, head)
            decision = decide(state, head)
            if not decision.events:
                return plan.unchanged(run_id, head), state, None
            plan.check_decision(run_id, decision, req.token, head, max_lease)
            encoded = encode_events(decision.events, self.max_payload)
            written: list[Recorded] = []
            result, new_head = self._insert_locked(req, head, max_lease, decision.events, encoded,
                                                   decision.lease, written)
            if head is None:
                # A new run: fold its whole lineage, so a fork child that this
                # command created starts from the parent's prefix.
                new_state = self._state_locked(run_id, aggregate, new_head)
            else:
                new_state = aggregate.evolve_all(state, written)
            folded = self._run_hooks(run_id, new_head, [(aggregate, new_state)])
        except sqlite3.Error as exc:
            raise _explain(exc, "appending", self.path) from exc
        if folded[0] is None:
            # The head new_state belongs to, as of this transaction: after COMMIT
            # another process may already have moved it past what new_state covers.
            folded = (new_head, [])
        if all(a is not aggregate for a, _ in folded[1]):
            folded[1].append((aggregate, new_state))
        return result, new_state, folded

    # --- reading -------------------------------------------------------------------

    def _read_run_page(
        self, run_id: str, after_seq: int, until_seq: int | None
    ) -> list[Recorded]:
        sql = f"SELECT {_COLUMNS} FROM events WHERE run_id=? AND seq>?"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=?"
            args.append(until_seq)
        sql += " ORDER BY seq"
        return [Recorded(*r) for r in self.conn.execute(sql, args)]

    def read_run(
        self, run_id: str, *, after_seq: int = 0, until_seq: int | None = None
    ) -> Iterator[Recorded]:
        # Checked now, not at the first next(): a bad argument fails where it was passed.
        check_run_id(run_id)
        check_seq(after_seq, "after_seq")
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return self._iter_run(run_id, after_seq, until_seq)

    def _iter_run(self, run_id: str, after_seq: int, until_seq: int | None) -> Iterator[Recorded]:
        cursor = after_seq
        while True:
            stop = cursor + PAGE if until_seq is None else min(cursor + PAGE, until_seq)
            if until_seq is not None and cursor >= until_seq:
                return
            with self.lock:
                try:
                    page = self._read_run_page(run_id, cursor, stop)
                except sqlite3.Error as exc:
                    raise _explain(exc, "reading", self.path) from exc
            yield from page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def read_all(
        self, *, after_position: int = 0, until_position: int | None = None, page: int = PAGE
    ) -> Iterator[Recorded]:
        check_seq(after_position, "after_position")
        if until_position is not None:
            check_seq(until_position, "until_position")
        check_seq(page, "page", low=1, high=1_000_000)
        return self._iter_all(after_position, until_position, page)

    def _iter_all(self, after_position: int, until_position: int | None, page: int) -> Iterator[Recorded]:
        cursor = after_position
        while True:
            sql = f"SELECT {_COLUMNS} FROM events WHERE position>?"
            args: list[Any] = [cursor]
            if until_position is not None:
                sql += " AND position<=?"
                args.append(until_position)
            sql += " ORDER BY position LIMIT ?"
            args.append(page)
            with self.lock:
                try:
                    rows = self.conn.execute(sql, args).fetchall()
                except sqlite3.Error as exc:
                    raise _explain(exc, "reading", self.path) from exc
            if not rows:
                return
            for r in rows:
                yield Recorded(*r)
            cursor = rows[-1][2]
            if len(rows) < page:
                return

    def read_for_export(
        self, run_ids: Sequence[str] | None = None
    ) -> Iterator[tuple[Recorded, bytes | None, int]]:
        """Events in global order with what an export needs beyond the envelope."""
        wanted = None if run_ids is None else set(run_ids)
        cursor = 0
        while True:
            with self.lock:
                try:
                    rows = self.conn.execute(
                        f"SELECT {_COLUMNS}, idem_digest, batch_size FROM events WHERE position>? "
                        "ORDER BY position LIMIT ?",
                        (cursor, PAGE),
                    ).fetchall()
                except sqlite3.Error as exc:
                    raise _explain(exc, "exporting", self.path) from exc
            if not rows:
                return
            for r in rows:
                if wanted is None or r[0] in wanted:
                    yield Recorded(*r[:12]), r[12], r[13]
            cursor = rows[-1][2]

    def head(self, run_id: str) -> Head | None:
        check_run_id(run_id)
        with self.lock:
            try:
                return self._head_locked(run_id)[0]
            except sqlite3.Error as exc:
                raise _explain(exc, "reading a run's head", self.path) from exc

    def list_runs(self, *, prefix: str | None = None) -> Iterator[Head]:
        sql = ("SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
               "last_position FROM heads")
        args: tuple[str, ...] = ()
        if prefix:
            # A key range on the primary key: O(matches), not a scan of every run.
            sql += " WHERE run_id >= ? AND run_id < ?"
            args = (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))
        order = " ORDER BY first_position, run_id"
        if prefix or not self._has_heads_index():
            with self.lock:
                rows = self.conn.execute(sql + order, args).fetchall()
            yield from (Head(*r) for r in rows)
            return
        # Keyset pages on the index: memory stays flat however many runs there are, and
        # each page is read whole, so a caller may write between pages. The key includes
        # run_id so that no row is skipped even where first positions tie or are odd (a
        # damaged heads table, which verify reports; every listing must still show it).
        page = self.conn.execute
        cursor: tuple[Any, ...] | None = None
        while True:
            with self.lock:
                if cursor is None:
                    rows = page(sql + order + " LIMIT ?", (PAGE,)).fetchall()
                else:
                    rows = page(
                        sql + " WHERE (first_position, run_id) > (?, ?)" + order + " LIMIT ?",
                        (*cursor, PAGE),
                    ).fetchall()
            yield from (Head(*r) for r in rows)
            if len(rows) < PAGE:
                return
            cursor = (rows[-1][5], rows[-1][0])

    def count_runs(self) -> int:
        with self.lock:
            return self.conn.execute("SELECT count(*) FROM heads").fetchone()[0]

    def _has_heads_index(self) -> bool:
        if not self._heads_indexed:
            with self.lock:
                self._heads_indexed = bool(self.conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name='heads_first'"
                ).fetchone())
        return self._heads_indexed

    def last_position(self) -> int:
        with self.lock:
            return self.conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]

    # --- checking ------------------------------------------------------------------

    def verify(
        self, run_id: str | None = None, *, progress: Callable[[int, int], None] | None = None
    ) -> list[Problem]:
        """Walk the log and report broken links, seq gaps, bad payloads and stale heads.

        Reports the first problem of each run (later ones usually follow from it) and any
        hole in the global positions, which is where a deleted row shows. Runs in one
        read transaction, so a concurrent writer cannot make the heads look ahead of the
        events walked (a false head_mismatch).
        """
        with self.lock:
            began = not self.conn.in_transaction
            try:
                if began:
                    self.conn.execute("BEGIN")
                return self._verify_snapshot(run_id, progress)
            except sqlite3.Error as exc:
                raise _explain(exc, "verifying", self.path) from exc
            finally:
                if began and self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")

    def _verify_snapshot(
        self, run_id: str | None, progress: Callable[[int, int], None] | None
    ) -> list[Problem]:
        source = self.read_run(run_id) if run_id is not None else self.read_all()
        found = verify.walk(((rec, rec.position) for rec in source), whole=run_id is None,
                            total=self.last_position(), progress=progress)
        # The ledger-wide checks run for one run too: a hole or a break anywhere in the
        # global chain makes every run's place in the order doubtful.
        problems = found.problems + self._verify_global_chain(gaps=run_id is not None)
        heads = {h.run_id: h for h in self.list_runs()} if run_id is None else (
            {run_id: h} if (h := self.head(run_id)) else {}
        )

        def fence_of(rid: str) -> tuple:
            row = self.conn.execute("SELECT lease, lease_holder, max_lease FROM heads WHERE run_id=?",
                                     (rid,)).fetchone()
            return (*row, self._lease_digest_locked(rid))

        problems += verify.check_heads(found, heads, fence_of, "positions")
        problems.extend(self._append_only_locked())
        return problems

    def _verify_global_chain(self, *, gaps: bool = False) -> list[Problem]:
        """Walk the ledger-wide chain; report the first position where it breaks.

        ``gaps``: also report the first hole in the positions (the whole-ledger walk
        finds those itself; a one-run verify relies on this walk for them)."""
        prev, cursor = GENESIS_HASH, 0
        found: list[Problem] = []
        while True:
            rows = self.conn.execute(
                "SELECT position, run_id, seq, hash, global_hash FROM events WHERE position > ? "
                "ORDER BY position LIMIT ?", (cursor, PAGE * 10),
            ).fetchall()
            for position, rid, seq, h, g in rows:
                if gaps and position != cursor + 1:
                    found.append(Problem("position_gap", rid, seq, position,
                                         f"positions jump from {cursor} to {position}: events are missing"))
                    gaps = False
                cursor = position
                if not isinstance(h, bytes) or g != global_link(prev, position, h):
                    return found + [Problem("global_chain", rid, seq, position,
                                            "the ledger-wide chain breaks here: events were reordered, moved "
                                            "between positions, inserted or removed behind the store")]
                prev = g
            if len(rows) < PAGE * 10:
                return found

    def _append_only_locked(self) -> list[Problem]:
        have = dict(self.conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='trigger' AND tbl_name='events'"
        ).fetchall())
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

    def append_only_problems(self) -> list[Problem]:
        with self.lock:
            try:
                return self._append_only_locked()
            except sqlite3.Error as exc:
                raise _explain(exc, "reading the triggers", self.path) from exc

    # --- heads of the whole ledger, and copies ---------------------------------------

    def ledger_head(self) -> tuple[int, bytes]:
        with self.lock:
            try:
                row = self.conn.execute(
                    "SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1"
                ).fetchone()
            except sqlite3.Error as exc:
                raise _explain(exc, "reading the ledger's head", self.path) from exc
        if row is None:
            return 0, GENESIS_HASH
        return row[0], bytes(row[1]) if isinstance(row[1], (bytes, bytearray)) else b""

    def global_hash_at(self, position: int) -> bytes | None:
        check_seq(position, "position")
        with self.lock:
            try:
                row = self.conn.execute(
                    "SELECT global_hash FROM events WHERE position=?", (position,)
                ).fetchone()
            except sqlite3.Error as exc:
                raise _explain(exc, "reading the ledger-wide chain", self.path) from exc
        if row is None or not isinstance(row[0], (bytes, bytearray)):
            return None
        return bytes(row[0])

    def backup_to(self, path: str) -> tuple[int, bytes, int]:
        """SQLite's online backup of every page, WAL included, in one step under one read
        snapshot: writers go on meanwhile and the copy is exactly one committed state.
        The copy is left in rollback-journal mode, so it is one self-contained file."""
        try:
            dst = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise _explain(exc, "creating a backup", path) from exc
        try:
            with self.lock:
                self.conn.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
            row = dst.execute("SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
            runs = dst.execute("SELECT count(*) FROM heads").fetchone()[0]
        except sqlite3.Error as exc:
            raise _explain(exc, "copying the ledger into a backup", self.path) from exc
        finally:
            dst.close()
        return (0, GENESIS_HASH, runs) if row is None else (row[0], bytes(row[1]), runs)

    # --- the backend-neutral interface for the layers above (ledger/store.py) ---------

    @contextlib.contextmanager
    def write_transaction(self, doing: str) -> Iterator[SqliteTransaction]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception), under the lock."""
        with self.lock:
            self.begin(doing)
            ok = False
            try:
                yield self._txn
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, doing, self.path) from exc
            finally:
                self.finish(ok, doing)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[SqliteTransaction]:
        """One read snapshot (``BEGIN`` ... ``ROLLBACK``), or the transaction already open."""
        with self.lock:
            conn = self.conn
            began = not conn.in_transaction
            try:
                if began:
                    conn.execute("BEGIN")
                yield self._txn
            except sqlite3.Error as exc:
                raise _explain(exc, "reading", self.path) from exc
            finally:
                if began and conn.in_transaction:
                    conn.execute("ROLLBACK")

    @property
    def views(self) -> Any:
        """The view store on this file (ledger/sqlite/views.py)."""
        if self._views is None:
            from .views import SqliteViewStore

            self._views = SqliteViewStore(self)
        return self._views

    def diagnostics(self) -> dict[str, Any]:
        """What ``handoff doctor`` prints: the file, the SQLite library and its settings."""
        version = sqlite3.sqlite_version
        affected = tuple(int(x) for x in version.split(".")[:3]) < (3, 51, 3)
        with self.lock:
            pragma = lambda name: self.conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
            return {
                "path": self.path if self._memory else os.path.abspath(self.path),
                "backend": "sqlite",
                "backend_version": version,
                "sqlite_version": version,
                "wal_reset_bug": {
                    "affected_version": affected,
                    "mitigation": "automatic checkpoints off; checkpoints run only in RESTART mode, "
                    "which holds the writer lock (docs/architecture.md)",
                },
                "journal_mode": pragma("journal_mode"),
                "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(pragma("synchronous")),
                "wal_autocheckpoint": pragma("wal_autocheckpoint"),
                "file_schema": self.file_schema,
                **({"upgrade": note} if (note := self.upgrade_note()) else {}),
            }

    def integrity_check(self) -> str:
        with self.lock:
            return "; ".join(r[0] for r in self.conn.execute("PRAGMA integrity_check"))

    @property
    def sqlite_version(self) -> str:
        return sqlite3.sqlite_version

    def enable_group_commit(self) -> None:
        """Let concurrent ``execute`` calls from this process's threads share one write
        transaction and one fsync (see ``_GroupCommit``); each command is still fenced,
        deduplicated and decided on its own. ``handoff.Ledger(group_commit=True)`` calls it."""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; group commit needs a writable one")
        with self.lock:
            if self._group is None:
                self._group = GroupCommit(self)

    def close(self) -> None:
        with self.lock:
            try:
                self.conn.close()
            except sqlite3.Error:
                pass


class SqliteTransaction(StoreTransaction):
    """The handle ``write_transaction``, ``read_transaction`` and inline hooks receive."""

    __slots__ = ()

    def head(self, run_id: str) -> Head | None:
        return self._store._head_locked(run_id)[0]

    def runs_since(self, position: int) -> list[str]:
        return [r[0] for r in self._store.conn.execute(_RUNS_SINCE, (position,))]

    def count_runs(self, *, begun_by: int | None = None) -> int:
        conn = self._store.conn
        if begun_by is None:
            return conn.execute("SELECT count(*) FROM heads").fetchone()[0]
        return conn.execute("SELECT count(*) FROM heads WHERE first_position <= ?", (begun_by,)).fetchone()[0]

    def last_position(self) -> int:
        return self._store.last_position()
