"""The PostgreSQL event store: one database shared by workers on many hosts.

Same semantics as the SQLite store (ledger/sqlite.py), over psycopg 3. Each store object
owns one connection (autocommit, explicit BEGIN/COMMIT) and may be shared by threads.

Order for readers and the ledger-wide chain (docs/postgres.md, "Order"): a write locks
its run first (an advisory lock on the run id, then its heads row FOR UPDATE), folds,
checks the lease and the idempotency key and decides with no ledger-wide lock held; only
then does it lock the one ``ledger_tail`` row, take the next gap-free positions, chain
the ledger-wide hash, insert, keep its views and commit. The tail row is held from the
insert through the commit, so positions become visible in order: a reader tailing
``read_all`` never skips an event that commits late; it sees nothing past a stalled
writer's position until that writer ends. The cost is that commits are serialized
through one flush at a time; docs/postgres.md measures it and says what would lift it.

Append-only: triggers refuse UPDATE, DELETE and TRUNCATE on ``events`` (for owners too);
``verify`` and ``doctor`` check that they are present, enabled and unaltered.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import msgspec

from . import events as ev
from .errors import (
    CorruptLedger,
    IdempotencyConflict,
    InvalidInput,
    LedgerError,
    NotALedger,
    OutcomeUnknown,
    SchemaTooNew,
    SeqConflict,
    StaleLease,
    StoreUnavailable,
)
from .store import (
    DEFAULT_MAX_PAYLOAD,
    GENESIS_HASH,
    Aggregate,
    AppendResult,
    Decision,
    EventStore,
    Head,
    LeaseToken,
    Problem,
    Recorded,
    Step,
    Transaction,
    Actor,
    chain_hash,
    check_actor,
    check_idempotency_key,
    check_run_id,
    check_seq,
    encode_events,
    request_digest,
)

try:  # the driver is an optional extra: pip install 'handoff-ledger[postgres]'
    import psycopg
    from psycopg import errors as pgerr
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pgerr = None  # type: ignore[assignment]

S = TypeVar("S")

#: Layout version of the database schema (tables, indexes, triggers), kept in handoff_meta.
PG_SCHEMA_VERSION = 2
FORMAT_NAME = "handoff-ledger"
PAGE = 1000
_TAGS = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}
_MISSING = object()
#: Advisory lock namespace (the first key of pg_advisory_xact_lock(int, int)) for runs.
_RUN_LOCK_NS = 0x48414E44  # "HAND"

_COLUMNS = (
    "run_id, seq, position, type, actor, lease, idem_key, recorded_us, "
    "schema_version, payload, prev_hash, hash"
)
_INSERT = (
    "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, global_hash) "
    "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
)
_UPSERT_HEAD = (
    "INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, "
    "first_position, last_position) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) "
    "ON CONFLICT (run_id) DO UPDATE SET last_seq=excluded.last_seq, "
    "last_hash=excluded.last_hash, lease=excluded.lease, "
    "lease_holder=excluded.lease_holder, max_lease=excluded.max_lease, "
    "last_position=excluded.last_position"
)
_RUNS_SINCE = (
    "SELECT run_id FROM heads WHERE run_id IN "
    "(SELECT run_id FROM events WHERE position > %s) ORDER BY first_position"
)

#: The function and triggers that make the log append-only, exactly as created. verify
#: and doctor compare the database's with these.
REFUSE_FUNCTION = (
    "CREATE FUNCTION handoff_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE EXCEPTION 'handoff ledger events are append-only: % refused', TG_OP "
    "USING ERRCODE = 'insufficient_privilege'; END $$"
)
APPEND_ONLY_TRIGGERS = {
    "events_no_update": "CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
    "FOR EACH ROW EXECUTE FUNCTION handoff_refuse_change()",
    "events_no_delete": "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
    "FOR EACH ROW EXECUTE FUNCTION handoff_refuse_change()",
    "events_no_truncate": "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
    "FOR EACH STATEMENT EXECUTE FUNCTION handoff_refuse_change()",
}

#: Who wrote each event, said by the server: whatever an INSERT sends for ``db_role``,
#: the row keeps the session's role (a client cannot name another). verify checks it too.
STAMP_FUNCTION = (
    "CREATE FUNCTION handoff_stamp_role() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "NEW.db_role := session_user; RETURN NEW; END $$"
)
ROLE_TRIGGERS = {
    "events_stamp_role": "CREATE TRIGGER events_stamp_role BEFORE INSERT ON events "
    "FOR EACH ROW EXECUTE FUNCTION handoff_stamp_role()",
}

_SCHEMA = [
    "CREATE TABLE handoff_meta (key text PRIMARY KEY, value text NOT NULL)",
    # The log. db_role is the role that inserted the row, filled in by the server.
    "CREATE TABLE events ("
    " position bigint PRIMARY KEY, run_id text COLLATE \"C\" NOT NULL, seq bigint NOT NULL,"
    " type text NOT NULL, actor text NOT NULL, lease bigint, idem_key text, idem_digest bytea,"
    " batch_size integer NOT NULL, recorded_us bigint NOT NULL, schema_version integer NOT NULL,"
    " payload bytea NOT NULL, prev_hash bytea NOT NULL, hash bytea NOT NULL,"
    " global_hash bytea NOT NULL, db_role text NOT NULL DEFAULT session_user,"
    " CONSTRAINT events_run_seq UNIQUE (run_id, seq))",
    "CREATE UNIQUE INDEX events_idem ON events (run_id, idem_key) WHERE idem_key IS NOT NULL",
    # One row: the last position and the ledger-wide hash there. Locked by every append
    # from its insert to its commit: the order positions become visible in.
    "CREATE TABLE ledger_tail (one boolean PRIMARY KEY DEFAULT true CHECK (one),"
    " position bigint NOT NULL, global_hash bytea NOT NULL)",
    "CREATE TABLE heads (run_id text COLLATE \"C\" PRIMARY KEY, last_seq bigint NOT NULL,"
    " last_hash bytea NOT NULL, lease bigint, lease_holder text, max_lease bigint NOT NULL,"
    " first_position bigint NOT NULL, last_position bigint NOT NULL, lease_digest text)",
    "CREATE INDEX heads_first ON heads (first_position)",
    REFUSE_FUNCTION,
    *APPEND_ONLY_TRIGGERS.values(),
    STAMP_FUNCTION,
    *ROLE_TRIGGERS.values(),
]

#: Migrations from an older schema version: {from_version: [statements]}. Run in one
#: transaction under the tail lock by the first writable open; none exist yet.
MIGRATIONS: dict[int, list[str]] = {
    1: [STAMP_FUNCTION, *ROLE_TRIGGERS.values()],  # 2: db_role stamped by a trigger, not a default
}


def global_link(prev_global: bytes, position: int, event_hash: bytes) -> bytes:
    """The ledger-wide chain, as on SQLite: each event's hash bound to its position and to
    the link before it (so a copy between backends keeps every hash)."""
    return hashlib.sha256(b"".join((prev_global, position.to_bytes(8, "big"), event_hash))).digest()


def _now_us() -> int:
    return time.time_ns() // 1000


#: How long a statement may go without an answer from the server beyond its lock waits,
#: by default, before the connection is given up (PostgresStore's ``reply_timeout_s``).
DEFAULT_REPLY_TIMEOUT_S = 30.0


if psycopg is not None:

    class _GuardedConnection(psycopg.Connection):  # type: ignore[misc,name-defined]
        """A connection that stops waiting for an answer after ``wait_limit_s``.

        Without it a server that stops answering while the TCP connection stays up (a
        partition behind a proxy or a NAT, a frozen server host) makes every call hang
        for ever, and a COMMIT sent into that silence never reports that its outcome is
        unknown. Past the limit the connection is closed (it is mid-protocol and cannot
        be reused) and the wait raises OperationalError, which the store maps like any
        lost connection: StoreUnavailable, or OutcomeUnknown during COMMIT.
        """

        wait_limit_s: float | None = None

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            limit = self.wait_limit_s if timeout is None else timeout
            try:
                return super().wait(gen, interval=interval, timeout=limit)
            except pgerr._WaitTimeout:
                with contextlib.suppress(Exception):
                    self.pgconn.finish()
                raise psycopg.OperationalError(
                    f"no answer from the server within {limit:g}s; the connection was closed"
                ) from None


def is_driver_error(exc: BaseException) -> bool:
    """An error from psycopg itself (ledger.backends.is_driver_error asks)."""
    return psycopg is not None and isinstance(exc, psycopg.Error)


_PASSWORD = re.compile(r"(://[^:/@]*):[^@/]*@")


def redact(url: str) -> str:
    """The address without its password, for messages and diagnostics."""
    out = _PASSWORD.sub(r"\1:***@", url)
    return re.sub(r"(password=)[^&\s]*", r"\1***", out)


_REFUSED_AT_CONNECT = re.compile(
    r"FATAL:\s+(database \S+ does not exist|role \S+ does not exist|password authentication failed"
    r"|no pg_hba\.conf entry|permission denied for database|.*not permitted to log in)")
_FULL_AT_CONNECT = re.compile(r"FATAL:\s+(sorry, too many clients|too many connections|remaining connection slots)")


def _fatal(text: str) -> str:
    """The server's own sentence out of libpq's "connection failed: ... FATAL: ..." text."""
    return text.split("FATAL:", 1)[-1].strip()


def _explain(exc: BaseException, doing: str, where: str) -> LedgerError:
    """Map a driver error to the library's own, in one place."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, (pgerr.LockNotAvailable, pgerr.QueryCanceled)):
        return StoreUnavailable(
            f"PostgreSQL gave up waiting while {doing} on {where} ({text}): another session "
            "held a lock past the lock timeout, or the statement ran past its timeout; nothing "
            "was written. Retry, or raise the timeout (--busy-timeout)",
            cause=text,
        )
    if isinstance(exc, (pgerr.DeadlockDetected, pgerr.SerializationFailure)):
        return StoreUnavailable(
            f"PostgreSQL aborted the transaction while {doing} on {where} ({text}); nothing was "
            "written. Retry",
            cause=text,
        )
    if isinstance(exc, pgerr.InsufficientPrivilege):
        return StoreUnavailable(
            f"the database role may not do this while {doing} on {where} ({text}); nothing "
            "was written. Check the role in the address and its grants (docs/postgres.md, roles)",
            cause=text,
        )
    if isinstance(exc, (pgerr.InvalidCatalogName, pgerr.InvalidAuthorizationSpecification,
                        pgerr.InvalidPassword)):
        return StoreUnavailable(
            f"PostgreSQL refused the connection to {where} ({text}); check the database name, "
            "the user and the password in the address",
            cause=text,
        )
    if isinstance(exc, (pgerr.DiskFull, pgerr.OutOfMemory, pgerr.TooManyConnections)):
        return StoreUnavailable(
            f"the PostgreSQL server at {where} is out of resources ({text}) while {doing}; "
            "nothing was written. Retry later, or ask its operator",
            cause=text,
        )
    if isinstance(exc, psycopg.OperationalError) and _REFUSED_AT_CONNECT.search(text):
        # libpq reports these at connect without an SQLSTATE: only the server's text says.
        return StoreUnavailable(
            f"PostgreSQL refused the connection to {where} ({_fatal(text)}); check the database name, "
            "the user and the password in the address",
            cause=text,
        )
    if isinstance(exc, psycopg.OperationalError) and _FULL_AT_CONNECT.search(text):
        return StoreUnavailable(
            f"the PostgreSQL server at {where} is out of resources ({_fatal(text)}) while {doing}; "
            "nothing was written. Retry later, or ask its operator (max_connections)",
            cause=text,
        )
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(
            f"cannot reach the PostgreSQL server at {where} while {doing} ({text}); nothing was "
            "written. Check that the server is running, that host and port in the address are "
            "right, and that this host may connect (pg_hba.conf, firewalls)",
            cause=text,
        )
    return StoreUnavailable(f"PostgreSQL failed while {doing} on {where}: {text}", cause=text)


def _b(v: Any) -> Any:
    return bytes(v) if isinstance(v, (memoryview, bytearray)) else v


def _rec(r: Sequence[Any]) -> Recorded:
    return Recorded(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], _b(r[9]), _b(r[10]), _b(r[11]))


class PostgresStore(EventStore):
    """An EventStore in a PostgreSQL database (``postgresql://user@host:port/dbname``).

    One store object owns one connection and may be shared by threads; open one per
    process. ``busy_timeout_s`` is the lock timeout: how long a write waits for a run or
    for the ledger's tail before it gives up with StoreUnavailable.
    """

    backend = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        busy_timeout_s: float = 5.0,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], int] | None = None,
        create: bool = True,
        readonly: bool = False,
        connect_timeout_s: float = 5.0,
        reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
    ) -> None:
        if psycopg is None:
            from .errors import BackendUnavailable

            raise BackendUnavailable(
                "this address names a PostgreSQL ledger, but the PostgreSQL driver is not "
                "installed; install it with: pip install 'handoff-ledger[postgres]'"
            )
        self.url = url
        self.path = redact(url)
        self.busy_timeout_s = busy_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.reply_timeout_s = reply_timeout_s
        self.max_payload = max_payload
        self.readonly = readonly
        #: With no clock given, time is the server's (see ``server_clock``): every host
        #: that writes and the watchdog that judges health read the same clock.
        self._clock = clock or self.server_clock
        self._server_at: tuple[int, int] | None = None  # (server us, local monotonic ns) at connect
        self._lock = threading.RLock()
        self._cache: collections.OrderedDict[tuple[int, str], tuple[Any, int, bytes, Any]] = (
            collections.OrderedDict()
        )
        self._hooks: list[tuple[Aggregate[Any], Callable[..., None]]] = []
        self._txn = PostgresTransaction(self)
        self._views: Any = None
        self._in_txn = False
        self._writing = False  # inside a write transaction (views read in it lock the tail)
        self._tail: tuple[int, bytes] | None = None  # the tail, once locked in this transaction
        self._conn: Any = None
        #: True when this open created the ledger's schema (``handoff init`` reports it).
        self.created_schema = False
        self._connect()
        try:
            self._ensure_schema(create and not readonly)
        except BaseException:
            self.close()
            raise

    # --- connecting ------------------------------------------------------------------

    def _connect(self) -> None:
        try:
            conn = _GuardedConnection.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                application_name="handoff-ledger",
            )
        except psycopg.Error as exc:
            raise _explain(exc, "connecting", self.path) from exc
        try:
            ms = max(1, int(self.busy_timeout_s * 1000))
            conn.execute(f"SET lock_timeout = {ms}")
            # A session that dies or is cut off inside a transaction must not hold a run or
            # the tail longer than the others wait for a lock: the server ends it once it
            # has sat idle in its transaction that long (at least a second).
            conn.execute(f"SET idle_in_transaction_session_timeout = {max(1000, ms)}")
            conn.execute("SET default_transaction_isolation = 'read committed'")
            # A statement waits at most for its lock (lock_timeout) and then for an answer.
            conn.wait_limit_s = self.busy_timeout_s + self.reply_timeout_s
            t0 = time.monotonic_ns()
            server_us = conn.execute(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").fetchone()[0]
            t1 = time.monotonic_ns()
        except psycopg.Error as exc:
            conn.close()
            raise _explain(exc, "connecting", self.path) from exc
        self._server_at = (int(server_us), (t0 + t1) // 2)
        self._conn = conn

    def server_clock(self) -> int:
        """Now by the server's clock, in microseconds since the epoch, with no round trip.

        Read once per connection (the server's time at the middle of the round trip) and
        advanced by this host's monotonic clock since, so this host's wall clock, however
        wrong, plays no part. Health is judged on this one clock: heartbeats are stamped
        with it by every worker, and the watchdog's "now" is read from it, so a worker and
        a watchdog whose own clocks disagree by minutes still agree on how long a run has
        been silent (docs/postgres.md, "Clocks").
        """
        if self._server_at is None:
            return _now_us()
        server_us, mono_ns = self._server_at
        return server_us + (time.monotonic_ns() - mono_ns) // 1000

    def clock(self) -> int:
        """The store's "now": the server's clock unless a clock was injected."""
        return self._clock()

    def _ready(self) -> Any:
        """The connection, reconnected if the last one was lost (outside a transaction)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if self._in_txn:
                raise StoreUnavailable(f"the connection to {self.path} was lost mid-transaction")
            self._connect()
            conn = self._conn
        return conn

    def _x(self, sql: str, args: Sequence[Any] | None = None) -> Any:
        """Execute on the store's connection (inside whatever transaction is open)."""
        return self._ready().execute(sql, args, prepare=None)

    @contextlib.contextmanager
    def _mapped(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise _explain(exc, doing, self.path) from exc

    def _ensure_schema(self, may_create: bool) -> None:
        with self._lock, self._mapped("opening"):
            tables = {r[0] for r in self._x(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )}
            if "handoff_meta" not in tables:
                if tables:
                    raise NotALedger(
                        f"the database {self.path} is not a handoff ledger (it has tables "
                        f"{', '.join(sorted(tables)[:5])}); name an empty database, or create "
                        "one (createdb) and run 'handoff --db URL init'"
                    )
                if not may_create:
                    raise NotALedger(
                        f"the database {self.path} holds no ledger yet; run 'handoff --db URL init'"
                    )
                self._create_schema()
                return
            meta = dict(self._x("SELECT key, value FROM handoff_meta").fetchall())
            if meta.get("format") != FORMAT_NAME:
                raise NotALedger(f"{self.path} has a handoff_meta table but no handoff-ledger format mark")
            version = int(meta.get("schema_version", "0"))
            if version > PG_SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} was written by a newer handoff-ledger (schema {version}, this "
                    f"version reads up to {PG_SCHEMA_VERSION}); upgrade handoff-ledger"
                )
            if version < PG_SCHEMA_VERSION and may_create:
                self._migrate(version)

    def _create_schema(self) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            # Two processes creating at once: the second waits here, then finds the schema.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_RUN_LOCK_NS,))
            if conn.execute("SELECT to_regclass('handoff_meta')").fetchone()[0] is not None:
                conn.execute("COMMIT")
                return
            for sql in _SCHEMA:
                conn.execute(sql)
            conn.execute(
                "INSERT INTO handoff_meta VALUES ('format', %s), ('schema_version', %s), "
                "('created_us', %s)",
                (FORMAT_NAME, str(PG_SCHEMA_VERSION), str(self._clock())),
            )
            conn.execute("INSERT INTO ledger_tail (position, global_hash) VALUES (0, %s)", (GENESIS_HASH,))
            conn.execute("COMMIT")
            self.created_schema = True
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
            raise

    def _migrate(self, from_version: int) -> None:
        """Bring an older schema up to this version, in one transaction (the hook for later
        versions: add statements to MIGRATIONS)."""
        with self.write_transaction("migrating the ledger schema"):
            version = int(self._x("SELECT value FROM handoff_meta WHERE key='schema_version'").fetchone()[0])
            while version < PG_SCHEMA_VERSION:
                steps = MIGRATIONS.get(version)
                if steps is None:
                    raise SchemaTooNew(f"no migration from schema {version} is known")
                for sql in steps:
                    self._x(sql)
                version += 1
            self._x("UPDATE handoff_meta SET value=%s WHERE key='schema_version'", (str(version),))

    # --- transactions ----------------------------------------------------------------

    def _begin(self, doing: str, *, tail: bool = False) -> None:
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        with self._mapped(doing):
            self._ready().execute("BEGIN")
        self._in_txn = True
        self._writing = True
        self._tail = None
        if tail:
            self._lock_tail(doing)

    def _finish(self, ok: bool, doing: str) -> None:
        conn = self._conn
        self._in_txn = False
        self._writing = False
        self._tail = None
        if ok:
            try:
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                if conn.broken or conn.closed or isinstance(exc, psycopg.OperationalError):
                    # The COMMIT may have reached the server and landed before the line broke.
                    raise OutcomeUnknown(
                        f"the connection to {self.path} was lost while committing ({doing}): the "
                        "write may or may not be stored. Retry with the same idempotency key (a "
                        "stored write answers 'duplicate'), or read the run to see",
                        cause=str(exc),
                    ) from exc
                raise _explain(exc, doing, self.path) from exc
        elif conn is not None and not conn.closed and not conn.broken:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.close()

    def _lock_tail(self, doing: str = "appending") -> tuple[int, bytes]:
        """Lock the ledger's tail row (held to the commit) and return it."""
        if self._tail is None:
            with self._mapped(doing):
                row = self._x("SELECT position, global_hash FROM ledger_tail FOR UPDATE").fetchone()
            self._tail = (row[0], _b(row[1]))
        return self._tail

    def _lock_run(self, run_id: str) -> tuple[Head | None, int]:
        """Lock the run (also one that does not exist yet) and read its head."""
        key = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big", signed=True)
        self._x("SELECT pg_advisory_xact_lock(%s, %s)", (_RUN_LOCK_NS, key))
        return self._head_row(run_id, lock=True)

    def _head_row(self, run_id: str, *, lock: bool = False) -> tuple[Head | None, int]:
        row = self._x(
            "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
            "last_position, max_lease FROM heads WHERE run_id=%s" + (" FOR UPDATE" if lock else ""),
            (run_id,),
        ).fetchone()
        if row is None:
            return None, 0
        return Head(row[0], row[1], _b(row[2]), row[3], row[4], row[5], row[6]), row[7]

    @contextlib.contextmanager
    def write_transaction(self, doing: str) -> Iterator[PostgresTransaction]:
        """BEGIN, the ledger's tail locked (writers wait, as under SQLite's write lock) ...
        COMMIT, or ROLLBACK on any exception."""
        with self._lock:
            self._begin(doing, tail=True)
            ok = False
            try:
                yield self._txn
                ok = True
            except psycopg.Error as exc:
                raise _explain(exc, doing, self.path) from exc
            finally:
                self._finish(ok, doing)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[PostgresTransaction]:
        """One snapshot (REPEATABLE READ, READ ONLY), or the transaction already open."""
        with self._lock:
            began = not self._in_txn
            try:
                if began:
                    with self._mapped("reading"):
                        self._ready().execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    self._in_txn = True
                yield self._txn
            except psycopg.Error as exc:
                raise _explain(exc, "reading", self.path) from exc
            finally:
                if began:
                    self._in_txn = False
                    conn = self._conn
                    if conn is not None and not conn.closed and not conn.broken:
                        with contextlib.suppress(psycopg.Error):
                            conn.execute("ROLLBACK")

    # --- writing ---------------------------------------------------------------------

    def _lease_digest(self, run_id: str) -> str | None:
        row = self._x("SELECT lease_digest FROM heads WHERE run_id=%s", (run_id,)).fetchone()
        return None if row is None else row[0]

    def _check_token(self, run_id: str, head: Head | None, max_lease: int, token: LeaseToken) -> None:
        self._check_fence(run_id, head, None, token.lease, max_lease)
        digest = self._lease_digest(run_id)
        if digest is None:
            raise StaleLease.untokened(run_id, token.lease)
        if not token.matches(digest):
            raise StaleLease.wrong_token(run_id, token.lease)

    def _check_fence(self, run_id: str, head: Head | None, expected_seq: int | None,
                     lease: int | None, max_lease: int | None = None) -> None:
        actual = head.last_seq if head else 0
        if expected_seq is not None and expected_seq != actual:
            raise SeqConflict(
                f"run {run_id} is at seq {actual}, not {expected_seq} as expected; someone "
                "else wrote first. Re-read the run and decide again",
                run_id=run_id, actual_seq=actual, expected_seq=expected_seq,
            )
        if lease is not None:
            current = head.lease if head else None
            if current != lease:
                raise StaleLease.superseded(run_id, lease, current, head.lease_holder if head else None,
                                            max_lease if max_lease is not None else 0)

    def _find_duplicate(self, run_id: str, key: str, digest: bytes, actor: str) -> AppendResult | None:
        row = self._x(
            "SELECT seq, position, idem_digest, batch_size, actor FROM events WHERE run_id=%s AND idem_key=%s",
            (run_id, key),
        ).fetchone()
        if row is None:
            return None
        seq, position, stored, size, by = row
        # The digest covers the actor; the second test stops an imported line whose digest
        # was copied from another actor's request (see ledger/sqlite.py).
        if _b(stored) != digest or by != actor:
            raise IdempotencyConflict(
                f"idempotency key {key!r} was already used on run {run_id} (seq {seq}) for a "
                "different request; use a new key for a new request",
                run_id=run_id, seq=seq,
            )
        # A batch's positions: those of its seqs (contiguous here, as every batch is
        # inserted under the tail lock in one piece).
        return AppendResult(run_id, "duplicate", seq, seq + size - 1, tuple(range(position, position + size)))

    def _check_fork(self, run_id: str, seq: int, fork: ev.RunForked) -> None:
        if seq != 1:
            raise InvalidInput(
                f"run_forked can only be the first event of a new run; run {run_id} "
                f"would get it at seq {seq}",
                field="events",
            )
        parent = fork.parent
        if parent == run_id or not isinstance(parent, str):
            raise InvalidInput(f"run {run_id} cannot be forked from itself", field="parent")
        check_run_id(parent, "parent")
        parent_head, _ = self._head_row(parent)
        if parent_head is None or not 0 <= fork.parent_seq <= parent_head.last_seq:
            at = parent_head.last_seq if parent_head else None
            raise InvalidInput(
                f"cannot fork {run_id} from {parent} at seq {fork.parent_seq}: the parent "
                + ("does not exist" if at is None else f"is at seq {at}"),
                field="parent_seq",
            )

    def _insert_locked(
        self, run_id: str, head: Head | None, max_lease: int, batch: Sequence[ev.Event],
        encoded: list[tuple[str, bytes]], actor: str, lease: int | None, key: str | None,
        digest: bytes | None, written: list[Recorded] | None = None,
    ) -> tuple[AppendResult, Head]:
        """Check the batch's lease moves, then lock the tail, chain, insert and move the head."""
        seq = head.last_seq if head else 0
        prev = head.last_hash if head else GENESIS_HASH
        cur_lease = head.lease if head else None
        holder = head.lease_holder if head else None
        token_digest: str | None = None
        digest_moved = False
        now = self._clock()
        hashes = []
        for (tag, payload), event in zip(encoded, batch):
            seq += 1
            k = key if len(hashes) == 0 else None
            h = chain_hash(prev, run_id, seq, tag, actor, lease, k, now, ev.SCHEMA_VERSION, payload)
            hashes.append((seq, k, prev, h))
            prev = h
            if isinstance(event, ev.LeaseGranted):
                if event.lease <= max_lease:
                    raise StaleLease(
                        f"lease token {event.lease} is not above run {run_id}'s highest lease "
                        f"{max_lease}; fencing tokens only grow, so an old token can never "
                        "be granted again",
                        lease=event.lease, current_lease=cur_lease,
                    )
                cur_lease, holder, max_lease = event.lease, event.worker, event.lease
                token_digest, digest_moved = event.token_digest or None, True
            elif isinstance(event, (ev.LeaseReleased, ev.LeaseRevoked)):
                if event.lease == cur_lease:
                    cur_lease, holder = None, None
                    token_digest, digest_moved = None, True
            elif isinstance(event, ev.RunForked):
                self._check_fork(run_id, seq, event)
        # Everything above ran without the ledger-wide lock; from here to the commit the
        # tail is held, so positions become visible in the order they were taken.
        last_pos, gprev = self._lock_tail()
        first_position = head.first_position if head else last_pos + 1
        n = len(encoded)
        rows = []
        for i, ((tag, payload), (s, k, p, h)) in enumerate(zip(encoded, hashes)):
            pos = last_pos + 1 + i
            gprev = global_link(gprev, pos, h)
            rows.append((pos, run_id, s, tag, actor, lease, k, digest if (i == 0 and k) else None,
                         n, now, ev.SCHEMA_VERSION, payload, p, h, gprev))
        with self._conn.cursor() as cur:
            if n == 1:
                cur.execute(_INSERT, rows[0])
            else:
                cur.executemany(_INSERT, rows)
            cur.execute("UPDATE ledger_tail SET position=%s, global_hash=%s", (last_pos + n, gprev))
            cur.execute(_UPSERT_HEAD, (run_id, seq, prev, cur_lease, holder, max_lease,
                                       first_position, last_pos + n))
            if digest_moved:
                cur.execute("UPDATE heads SET lease_digest=%s WHERE run_id=%s", (token_digest, run_id))
        self._tail = (last_pos + n, gprev)
        if written is not None:
            written.extend(Recorded(r[1], r[2], r[0], r[3], r[4], r[5], r[6], r[9], r[10], r[11], r[12], r[13])
                           for r in rows)
        result = AppendResult(run_id, "committed", seq - n + 1, seq, tuple(range(last_pos + 1, last_pos + n + 1)))
        return result, Head(run_id, seq, prev, cur_lease, holder, first_position, last_pos + n)

    def append(
        self, run_id: str, events: Sequence[ev.Event], *, actor: Actor,
        expected_seq: int | None = None, lease: str | None = None, idempotency_key: str | None = None,
    ) -> AppendResult:
        check_run_id(run_id)
        check_actor(actor)
        check_idempotency_key(idempotency_key, actor)
        try:
            events = tuple(events)
        except TypeError:
            raise InvalidInput("events must be a sequence of events", field="events") from None
        if not events:
            raise InvalidInput("an append needs at least one event", field="events")
        if expected_seq is not None and (
            isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0
        ):
            raise InvalidInput("expected_seq must be a whole number >= 0", field="expected_seq")
        token = LeaseToken.parse(lease) if lease is not None else None
        lease_n = token.lease if token is not None else None
        encoded = encode_events(events, self.max_payload)
        actor_s = str(actor)
        digest = request_digest(actor_s, lease_n, [p for _, p in encoded]) if idempotency_key else None
        with self._lock:
            self._begin("appending")
            ok = False
            try:
                head, max_lease = self._lock_run(run_id)
                if idempotency_key:
                    dup = self._find_duplicate(run_id, idempotency_key, digest, actor_s)  # type: ignore[arg-type]
                    if dup is not None:
                        ok = True
                        return dup
                self._check_fence(run_id, head, expected_seq, None)
                if token is not None:
                    self._check_token(run_id, head, max_lease, token)
                forking = head is None and isinstance(events[0], ev.RunForked)
                before = [] if forking else [(agg, self._state(run_id, agg, head)) for agg, _ in self._hooks]
                written: list[Recorded] = []
                result, new_head = self._insert_locked(
                    run_id, head, max_lease, events, encoded, actor_s, lease_n, idempotency_key, digest,
                    written=written,
                )
                folded = self._run_hooks(
                    run_id, new_head, [(agg, agg.evolve_all(state, written)) for agg, state in before]
                )
                ok = True
            except psycopg.Error as exc:
                raise _explain(exc, "appending", self.path) from exc
            finally:
                self._finish(ok, "committing an append")
            self._remember_all(run_id, folded)
            return result

    def execute(
        self, run_id: str, aggregate: Aggregate[S], decide: Callable[[S, Head | None], Decision], *,
        actor: Actor, idempotency_key: str | None = None, digest_of: bytes | None = None,
        lease: str | None = None,
    ) -> tuple[AppendResult, S]:
        check_run_id(run_id)
        check_actor(actor)
        check_idempotency_key(idempotency_key, actor)
        token = LeaseToken.parse(lease) if lease is not None else None
        actor_s = str(actor)
        digest = request_digest(actor_s, None, [digest_of or b""]) if idempotency_key else None
        with self._lock:
            self._begin("appending")
            ok = False
            try:
                head, max_lease = self._lock_run(run_id)
                if idempotency_key:
                    dup = self._find_duplicate(run_id, idempotency_key, digest, actor_s)  # type: ignore[arg-type]
                    if dup is not None:
                        ok = True
                        return dup, self._state(run_id, aggregate, head)
                if token is not None:
                    self._check_token(run_id, head, max_lease, token)
                state = self._state(run_id, aggregate, head)
                decision = decide(state, head)
                if not decision.events:
                    ok = True
                    seq = head.last_seq if head else 0
                    return AppendResult(run_id, "unchanged", seq, seq, ()), state
                if decision.lease is not None and (token is None or token.lease != decision.lease):
                    raise StaleLease(
                        f"a write under lease {decision.lease} of run {run_id} must carry that "
                        "lease's token (the one its claim printed); nothing was written",
                        run_id=run_id, lease=decision.lease, why="no_token",
                    )
                self._check_fence(run_id, head, None, decision.lease, max_lease)
                encoded = encode_events(decision.events, self.max_payload)
                written: list[Recorded] = []
                result, new_head = self._insert_locked(
                    run_id, head, max_lease, decision.events, encoded, actor_s,
                    decision.lease, idempotency_key, digest, written=written,
                )
                if head is None:
                    new_state = self._state(run_id, aggregate, new_head)
                else:
                    new_state = aggregate.evolve_all(state, written)
                folded = self._run_hooks(run_id, new_head, [(aggregate, new_state)])
                if folded[0] is None:
                    folded = (new_head, [])
                ok = True
            except psycopg.Error as exc:
                raise _explain(exc, "appending", self.path) from exc
            finally:
                self._finish(ok, "committing a command")
            if all(a is not aggregate for a, _ in folded[1]):
                folded[1].append((aggregate, new_state))
            self._remember_all(run_id, folded)
            return result, new_state

    # --- hooks and the fold cache ----------------------------------------------------

    def attach(self, aggregate: Aggregate[Any], hook: Callable[..., None]) -> None:
        self._hooks.append((aggregate, hook))

    def _run_hooks(self, run_id: str, head: Head, known: list[tuple[Aggregate[Any], Any]]
                   ) -> tuple[Head | None, list[tuple[Aggregate[Any], Any]]]:
        if not self._hooks:
            return None, []
        # Views are shared by every run: keep them under the tail lock like SQLite's writer.
        self._lock_tail()
        folded = []
        for aggregate, hook in self._hooks:
            state = next((st for agg, st in known if agg is aggregate), _MISSING)
            if state is _MISSING:
                state = self._state(run_id, aggregate, head)
            hook(self._txn, run_id, state, head.last_position)
            folded.append((aggregate, state))
        return head, folded

    def _remember_all(self, run_id: str, folded: tuple[Head | None, list[tuple[Aggregate[Any], Any]]]) -> None:
        head, states = folded
        if head is None:
            return
        for aggregate, state in states:
            self._remember(aggregate, run_id, head.last_seq, head.last_hash, state)

    def _remember(self, aggregate: Aggregate[Any], run_id: str, seq: int, h: bytes, state: Any) -> None:
        ckey = (id(aggregate), run_id)
        self._cache[ckey] = (aggregate, seq, h, state)
        self._cache.move_to_end(ckey)
        while len(self._cache) > 4096:
            self._cache.popitem(last=False)

    def _state(self, run_id: str, aggregate: Aggregate[S], head: Head | None) -> S:
        """The fold at the head, from a cached fold when it is still on the chain."""
        if head is None:
            return aggregate.initial(run_id)
        ckey = (id(aggregate), run_id)
        cached = self._cache.get(ckey)
        if cached is not None and cached[0] is aggregate and cached[1] <= head.last_seq:
            _, seq, h, state = cached
            if seq == head.last_seq and h == head.last_hash:
                self._cache.move_to_end(ckey)
                return state
            row = self._x("SELECT hash FROM events WHERE run_id=%s AND seq=%s", (run_id, seq)).fetchone()
            if row is not None and _b(row[0]) == h:
                if aggregate.lean:
                    return aggregate.evolve_all(state, self._steps(run_id, seq, None))
                return aggregate.evolve_all(state, self._read_run_page(run_id, seq, None))
        if aggregate.lean:
            return aggregate.evolve_all(aggregate.initial(run_id), self._lineage_steps(run_id, None))
        return aggregate.evolve_all(aggregate.initial(run_id), self.history(run_id))

    # --- reading ---------------------------------------------------------------------

    def _read_run_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Recorded]:
        sql = f"SELECT {_COLUMNS} FROM events WHERE run_id=%s AND seq>%s"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=%s"
            args.append(until_seq)
        return [_rec(r) for r in self._x(sql + " ORDER BY seq", args)]

    def _steps(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Step]:
        sql = "SELECT seq, type, recorded_us, payload FROM events WHERE run_id=%s AND seq>%s"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=%s"
            args.append(until_seq)
        rows = self._x(sql + " ORDER BY seq", args).fetchall()
        try:
            events = ev.decode_many([_b(r[3]) for r in rows])
            intact = all(_TAGS[type(e)] == r[1] for r, e in zip(rows, events))
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError, UnicodeDecodeError):
            intact = False
        if not intact:
            events = [rec.event for rec in self._read_run_page(run_id, after_seq, until_seq)]
        return [Step(run_id, seq, type_, at_us, event) for (seq, type_, at_us, _), event in zip(rows, events)]

    def _lineage_steps(self, run_id: str, until_seq: int | None) -> Iterator[Step]:
        cursor = 0
        while until_seq is None or cursor < until_seq:
            stop = cursor + PAGE if until_seq is None else min(cursor + PAGE, until_seq)
            with self._lock, self._mapped("reading"):
                page = self._steps(run_id, cursor, stop)
            if cursor == 0 and page and page[0].type == "run_forked":
                fork = page[0].event
                assert isinstance(fork, ev.RunForked)
                yield from self._lineage_steps(fork.parent, fork.parent_seq)
            yield from page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def fold(self, run_id: str, aggregate: Aggregate[S], *, until_seq: int | None = None) -> S:
        if not aggregate.lean:
            return super().fold(run_id, aggregate, until_seq=until_seq)
        check_run_id(run_id)
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return aggregate.evolve_all(aggregate.initial(run_id), self._lineage_steps(run_id, until_seq))

    def read_run(self, run_id: str, *, after_seq: int = 0, until_seq: int | None = None) -> Iterator[Recorded]:
        check_run_id(run_id)
        check_seq(after_seq, "after_seq")
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return self._iter_run(run_id, after_seq, until_seq)

    def _iter_run(self, run_id: str, after_seq: int, until_seq: int | None) -> Iterator[Recorded]:
        cursor = after_seq
        while True:
            if until_seq is not None and cursor >= until_seq:
                return
            stop = cursor + PAGE if until_seq is None else min(cursor + PAGE, until_seq)
            with self._lock, self._mapped("reading"):
                page = self._read_run_page(run_id, cursor, stop)
            yield from page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def read_all(self, *, after_position: int = 0, until_position: int | None = None,
                 page: int = PAGE) -> Iterator[Recorded]:
        check_seq(after_position, "after_position")
        if until_position is not None:
            check_seq(until_position, "until_position")
        check_seq(page, "page", low=1, high=1_000_000)
        return self._iter_all(after_position, until_position, page)

    def _iter_all(self, after_position: int, until_position: int | None, page: int) -> Iterator[Recorded]:
        cursor = after_position
        while True:
            sql = f"SELECT {_COLUMNS} FROM events WHERE position>%s"
            args: list[Any] = [cursor]
            if until_position is not None:
                sql += " AND position<=%s"
                args.append(until_position)
            sql += " ORDER BY position LIMIT %s"
            args.append(page)
            with self._lock, self._mapped("reading"):
                rows = self._x(sql, args).fetchall()
            if not rows:
                return
            for r in rows:
                yield _rec(r)
            cursor = rows[-1][2]
            if len(rows) < page:
                return

    def read_for_export(self, run_ids: Sequence[str] | None = None) -> Iterator[tuple[Recorded, bytes | None, int]]:
        wanted = None if run_ids is None else set(run_ids)
        cursor = 0
        while True:
            with self._lock, self._mapped("exporting"):
                rows = self._x(
                    f"SELECT {_COLUMNS}, idem_digest, batch_size FROM events WHERE position>%s "
                    "ORDER BY position LIMIT %s", (cursor, PAGE),
                ).fetchall()
            if not rows:
                return
            for r in rows:
                if wanted is None or r[0] in wanted:
                    yield _rec(r), _b(r[12]), r[13]
            cursor = rows[-1][2]

    def head(self, run_id: str) -> Head | None:
        check_run_id(run_id)
        with self._lock, self._mapped("reading a run's head"):
            return self._head_row(run_id)[0]

    def list_runs(self, *, prefix: str | None = None) -> Iterator[Head]:
        sql = "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, last_position FROM heads"
        cursor: tuple[Any, ...] | None = None
        while True:
            terms, args = [], []
            if prefix:
                terms.append("run_id >= %s AND run_id < %s")
                args += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
            if cursor is not None:
                terms.append("(first_position, run_id) > (%s, %s)")
                args += list(cursor)
            q = sql + (" WHERE " + " AND ".join(terms) if terms else "")
            q += " ORDER BY first_position, run_id LIMIT %s"
            with self._lock, self._mapped("listing runs"):
                rows = self._x(q, [*args, PAGE]).fetchall()
            for r in rows:
                yield Head(r[0], r[1], _b(r[2]), r[3], r[4], r[5], r[6])
            if len(rows) < PAGE:
                return
            cursor = (rows[-1][5], rows[-1][0])

    def count_runs(self) -> int:
        with self._lock, self._mapped("counting runs"):
            return self._x("SELECT count(*) FROM heads").fetchone()[0]

    def last_position(self) -> int:
        with self._lock, self._mapped("reading the last position"):
            return self._x("SELECT position FROM ledger_tail").fetchone()[0]

    # --- import ----------------------------------------------------------------------

    def import_records(
        self, items: Iterable[tuple[Recorded, bytes | None, int]], *,
        aggregate: Aggregate[Any] | None = None,
        admit: Callable[[Any, Recorded, ev.Event], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        """Insert exported events verbatim, all or nothing, with the SQLite store's checks
        (ledger/postgres_import.py); already-present events are skipped."""
        from .postgres_import import PgImport

        with self._lock:
            self._begin("importing", tail=True)
            ok = False
            try:
                run = PgImport(self, aggregate, admit)
                for item in items:
                    run.add(*item)
                touched = run.finish()
                if before_commit is not None:
                    before_commit()
                ok = True
            except psycopg.Error as exc:
                raise _explain(exc, "importing", self.path) from exc
            finally:
                self._finish(ok, "committing an import")
        for run_id, folded in touched:
            self._remember_all(run_id, folded)
        return {"imported": run.imported, "skipped": run.skipped, "runs": len(run.seen)}

    # --- checking --------------------------------------------------------------------

    def verify(self, run_id: str | None = None, *, progress: Callable[[int, int], None] | None = None
               ) -> list[Problem]:
        """Walk the log under one snapshot; report what is damaged ([] when sound)."""
        from .postgres_verify import verify_snapshot

        with self.read_transaction():
            with self._mapped("verifying"):
                return verify_snapshot(self, run_id, progress)

    def _append_only(self) -> list[Problem]:
        have = {
            name: (defn, enabled)
            for name, defn, enabled in self._x(
                "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t "
                "WHERE t.tgrelid = 'events'::regclass AND NOT t.tgisinternal"
            )
        }
        schema = self._x("SELECT current_schema()").fetchone()[0]
        have = {n: (d.replace(f" ON {schema}.events ", " ON events ").replace(f'"{schema}".', ""), e)
                for n, (d, e) in have.items()}
        out = []
        advice = ("Someone changed the database behind the store; check the log against a head "
                  "digest kept elsewhere, and restore from a backup")
        for name, sql in {**APPEND_ONLY_TRIGGERS, **ROLE_TRIGGERS}.items():
            if name not in have:
                what = ("events can be changed or deleted without any error" if name in APPEND_ONLY_TRIGGERS
                        else "a client can now write any role into db_role")
                out.append(Problem("trigger_missing", None, None, None,
                                   f"the trigger {name} is gone: {what}. {advice}"))
                continue
            defn, enabled = have[name]
            if _norm(defn) != _norm(sql):
                out.append(Problem("trigger_altered", None, None, None,
                                   f"the append-only trigger {name} is not the one the store created: it "
                                   f"may no longer refuse changes. {advice}"))
            elif enabled != "O":
                out.append(Problem("trigger_disabled", None, None, None,
                                   f"the append-only trigger {name} is disabled (ALTER TABLE ... DISABLE "
                                   f"TRIGGER or session_replication_role): it refuses nothing. {advice}"))
        for fn, create in (("handoff_refuse_change", REFUSE_FUNCTION), ("handoff_stamp_role", STAMP_FUNCTION)):
            row = self._x("SELECT prosrc FROM pg_proc WHERE proname = %s "
                          "AND pronamespace = current_schema()::regnamespace", (fn,)).fetchone()
            if row is None or _norm(row[0]) != _norm(create.split("$$")[1]):
                out.append(Problem("trigger_altered", None, None, None,
                                   f"the function {fn}, which the ledger's triggers call, was changed or "
                                   f"dropped. {advice}"))
        return out

    def append_only_problems(self) -> list[Problem]:
        with self._lock, self._mapped("reading the triggers"):
            return self._append_only()

    def ledger_head(self) -> tuple[int, bytes]:
        with self._lock, self._mapped("reading the ledger's head"):
            row = self._x("SELECT position, global_hash FROM ledger_tail").fetchone()
        return row[0], _b(row[1])

    def global_hash_at(self, position: int) -> bytes | None:
        check_seq(position, "position")
        if position == 0:
            return None
        with self._lock, self._mapped("reading the ledger-wide chain"):
            row = self._x("SELECT global_hash FROM events WHERE position=%s", (position,)).fetchone()
        return None if row is None else _b(row[0])

    def backup_to(self, path: str) -> tuple[int, bytes, int]:
        """A consistent copy of the whole ledger into the new SQLite file ``path``: one
        snapshot of this database, imported there verbatim (positions and both chains
        carry over, so the copy's head digest is this ledger's)."""
        from .sqlite import SqliteStore

        dst = SqliteStore(path)
        try:
            with self.read_transaction():
                dst.import_records(self.read_for_export())
            position, ghash = dst.ledger_head()
            return position, ghash, dst.count_runs()
        finally:
            dst.close()

    # --- the rest of the interface ---------------------------------------------------

    def schema_name(self) -> str:
        """The database schema the ledger lives in (the session's current schema)."""
        with self._lock, self._mapped("reading the schema name"):
            return str(self._x("SELECT current_schema()").fetchone()[0])

    def roles_sql(self, prefix: str = "handoff") -> str:
        """``roles_sql`` for this ledger's schema."""
        return roles_sql(self.schema_name(), prefix)

    @property
    def views(self) -> Any:
        if self._views is None:
            from .postgres_views import PostgresViewStore

            self._views = PostgresViewStore(self)
        return self._views

    def diagnostics(self) -> dict[str, Any]:
        with self._lock, self._mapped("reading the server's settings"):
            facts = dict(self._x(
                "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
                "'synchronous_commit', 'fsync', 'default_transaction_isolation', 'lock_timeout', "
                "'max_connections')"
            ).fetchall())
            db, user = self._x("SELECT current_database(), session_user").fetchone()
            version = self._x("SELECT value FROM handoff_meta WHERE key='schema_version'").fetchone()
        return {
            "path": self.path,
            "backend": "postgresql",
            "backend_version": facts.get("server_version", "?"),
            "driver": f"psycopg {psycopg.__version__}",
            "database": db,
            "role": user,
            "schema_version": int(version[0]) if version else None,
            "synchronous_commit": facts.get("synchronous_commit"),
            "fsync": facts.get("fsync"),
            "lock_timeout_ms": int(self.busy_timeout_s * 1000),
            "order": "positions taken under the ledger_tail row lock, held to commit (docs/postgres.md)",
        }

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()


def _norm(sql: str) -> str:
    return " ".join(sql.replace(";", " ").split()).lower()


class PostgresTransaction(Transaction):
    """The handle write_transaction, read_transaction and inline hooks receive."""

    __slots__ = ("_store",)

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def head(self, run_id: str) -> Head | None:
        return self._store._head_row(run_id)[0]

    def state(self, run_id: str, aggregate: Aggregate[S], head: Head | None | object = _MISSING) -> S:
        store = self._store
        if head is _MISSING:
            head = store._head_row(run_id)[0]
        return store._state(run_id, aggregate, head)  # type: ignore[arg-type]

    def fold(self, run_id: str, aggregate: Aggregate[S]) -> S:
        return self._store.fold(run_id, aggregate)

    def runs_since(self, position: int) -> list[str]:
        return [r[0] for r in self._store._x(_RUNS_SINCE, (position,))]

    def count_runs(self, *, begun_by: int | None = None) -> int:
        x = self._store._x
        if begun_by is None:
            return x("SELECT count(*) FROM heads").fetchone()[0]
        return x("SELECT count(*) FROM heads WHERE first_position <= %s", (begun_by,)).fetchone()[0]

    def last_position(self) -> int:
        return self._store._x("SELECT position FROM ledger_tail").fetchone()[0]

    @property
    def views(self) -> Any:
        return self._store.views


# --- least-privilege roles ---------------------------------------------------------------

_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")
#: The tables of the ledger proper. Every other table in the schema is a view table or a
#: projection's tracking/version table, which appends keep inline.
_LEDGER_TABLES = ("events", "heads", "ledger_tail", "handoff_meta")


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def roles_sql(schema: str, prefix: str = "handoff") -> str:
    """The SQL that creates the ledger's least-privilege group roles in ``schema``.

    Three NOLOGIN roles (``<prefix>_writer``, ``<prefix>_watchdog``, ``<prefix>_auditor``);
    make LOGIN roles members of them (``GRANT handoff_writer TO worker_host1``). Writer and
    watchdog may append (INSERT on ``events``, never UPDATE, DELETE or TRUNCATE; the
    heads, tail and view tables kept inline); the auditor only reads. None may create
    tables, so a projection rebuild (shadow tables swapped in) stays the owner's. Run it
    as the role that owns the ledger, after ``handoff init``: the default privileges it
    sets apply to the tables that role creates later (a rebuild's, a new projection's).
    Idempotent: running it twice changes nothing.
    """
    if not _ROLE_NAME.fullmatch(prefix):
        raise InvalidInput(f"a role prefix is lower-case letters, digits and _, not {prefix!r}", field="prefix")
    if not schema or "\x00" in schema:
        raise InvalidInput(f"{schema!r} is not a schema name", field="schema")
    s = _quote_ident(schema)
    writer, watchdog, auditor = (f"{prefix}_{r}" for r in ("writer", "watchdog", "auditor"))
    appenders = f"{writer}, {watchdog}"
    everyone = f"{writer}, {watchdog}, {auditor}"
    lit = "'" + f"{s}.events".replace("'", "''") + "'"
    # The name in a comment line: a control character (a newline) would end the comment and
    # turn the rest of a crafted schema name into SQL.
    shown = re.sub(r"[\x00-\x1f\x7f]", "?", schema)
    out = [
        f"-- handoff-ledger least-privilege roles for schema {shown} (docs/postgres.md, roles).",
        "-- Run as the role that owns the ledger's tables, after 'handoff init'.",
        "BEGIN;",
    ]
    for role, what in ((writer, "workers and the CLI: open, claim, append"),
                       (watchdog, "the watchdog: reads and appends (expiries, stalls)"),
                       (auditor, "auditors and dashboards: reads only")):
        out += [
            f"-- {role}: {what}",
            "DO $$ BEGIN",
            f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN",
            f"    CREATE ROLE {role} NOLOGIN;",
            "  END IF;",
            "END $$;",
        ]
    out += [
        "DO $$ BEGIN",
        f"  EXECUTE format('GRANT CONNECT ON DATABASE %I TO {everyone}', current_database());",
        "END $$;",
        f"GRANT USAGE ON SCHEMA {s} TO {everyone};",
        # View tables, tracking and version tables: whatever the schema holds besides the ledger.
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {appenders};",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {auditor};",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {appenders};",
        # The ledger proper: exactly what an append needs.
        *(f"REVOKE ALL ON {s}.{t} FROM {appenders};" for t in _LEDGER_TABLES),
        f"GRANT SELECT, INSERT ON {s}.events TO {appenders};",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.heads, {s}.ledger_tail TO {appenders};",
        f"GRANT SELECT ON {s}.handoff_meta TO {appenders};",
        # Tables the owner creates later (a rebuild's swapped-in tables, a new projection).
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {appenders};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT ON TABLES TO {auditor};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE ON SEQUENCES TO {appenders};",
        # Belt and braces: the log is never changed, whoever granted what before.
        f"REVOKE UPDATE, DELETE, TRUNCATE ON {s}.events FROM {everyone};",
        f"REVOKE CREATE ON SCHEMA {s} FROM {everyone};",
        f"-- check: SELECT has_table_privilege('{writer}', {lit}, 'DELETE');  -- false",
        "COMMIT;",
    ]
    return "\n".join(out) + "\n"


def rebuild_refusal(store: PostgresStore) -> str | None:
    """Why this session may not rebuild projections (None if it may): a rebuild creates
    shadow tables and drops and renames the old ones, which needs CREATE on the schema
    and ownership of the view tables."""
    row = store._x(
        "SELECT current_user, current_schema(), has_schema_privilege(current_schema(), 'CREATE'), "
        "(SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() "
        " AND tablename <> ALL(%s) AND NOT pg_has_role(tableowner, 'USAGE'))",
        (list(_LEDGER_TABLES),),
    ).fetchone()
    user, schema, may_create, foreign = row
    if may_create and not foreign:
        return None
    return (
        f"rebuilding projections creates, drops and renames tables, and the role {user} "
        + ("has no CREATE on the schema " + str(schema) if not may_create else
           f"does not own {foreign} of the view tables in the schema {schema}")
        + f" on {store.path}; nothing was changed. A role with CREATE on the schema that owns "
        "its tables (the one that ran 'handoff init') must run it (docs/postgres.md, roles)"
    )
