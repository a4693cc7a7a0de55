"""The PostgreSQL event store: one database shared by workers on many hosts.

Same semantics as the SQLite store, over psycopg 3. Each store object owns one
connection (autocommit, explicit BEGIN/COMMIT) and may be shared by threads. A write is
decided on the client and sent as one message to ``handoff_append``, which writes it only
onto the head it was decided from (ledger/postgres/writing.py). Positions are given by
sealing, in write-id order, behind the writers: a tailing reader never skips an event
that commits late (docs/architecture.md). Triggers keep ``events`` and ``ledger_order``
append-only, for their owner too; ``verify`` and ``doctor`` check them.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar


from ..errors import (
    LedgerError,
    NotALedger,
    OutcomeUnknown,
    SchemaTooNew,
    StoreUnavailable,
)
from ..file_copies import copy_to_file
from ..store_core import MISSING as _MISSING
from ..store_core import FoldingStore, StoreTransaction
from ..importing import ImportHead, ImportRow
from ..inputs import check_run_id, check_seq
from ..store import (
    DEFAULT_MAX_PAYLOAD,
    FORMAT_NAME,
    GENESIS_HASH,
    Aggregate,
    Capabilities,
    Head,
    Problem,
    Recorded,
    meta_schema_version,
    now_us,
)

from .connection import DEFAULT_REPLY_TIMEOUT_S, connect, explain, pgerr, psycopg, redact  # psycopg None without the extra
from .rows import (
    PAGE_SQL,
    POSITION,
    PUBLIC_HEAD,
    RUN_COLUMNS,
    RUNS_SINCE,
    SEALED_COLUMNS,
    TAIL_AND_QUEUE,
    INSERT,
    UPSERT_HEAD,
    HEAD_SELECT,
    as_bytes,
    head_of,
    recorded_row,
)
from .postgres_values import PostgresValues
from .postgres_liveness import PostgresLiveness
from .view_functions import EXISTING, views_function
from .writing import Writes
from .postgres_schema import (
    CREATE_LOCK,
    ID_BLOCK,
    MAINTENANCE_LOCK,
    MIGRATIONS,
    PG_SCHEMA_VERSION,
    QUEUE_TRIGGERS,
    LIVENESS_REVOKED,
    REVOKED,
    VIEWS_FUNCTION_EMPTY,
    VIEWS_LOCK,
    SCHEMA,
    functions,
    layout_problems,
    migration_step,
    notify_channel,
)

S = TypeVar("S")

PAGE = 1000

class PostgresStore(Writes, PostgresValues, PostgresLiveness, FoldingStore):
    """An EventStore in a PostgreSQL database (``postgresql://user@host:port/dbname``).

    One store object owns one connection and may be shared by threads; open one per
    process. ``busy_timeout_s`` is the lock timeout: how long a write waits for a run or
    for the ledger's tail before it gives up with StoreUnavailable.
    """

    backend = "postgresql"
    #: read_all's default page. A whole-log reader is usually far behind, and each page
    #: costs a statement planned and a round trip whatever its size: pages of 2,000 cost
    #: about 8% less per event than pages of 1,000; at 4,000 the client's share grows more
    #: than the server's shrinks.
    READ_PAGE = 2000
    capabilities = Capabilities(attested_roles=True, own_clock=True)

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
            from ..errors import BackendUnavailable
            from ..extras import install_hint

            raise BackendUnavailable(
                "this address names a PostgreSQL ledger, but the PostgreSQL driver is not "
                f"installed; install it with: {install_hint('postgres')}"
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
        FoldingStore.__init__(self)
        self._txn = PostgresTransaction(self)
        self._views: Any = None
        self._in_txn = False
        #: While a write is decided: the view rows its hooks keep (view_rows) and the view
        #: counts its decision read (view_read), which go to the server with the batch.
        self._view_rows: dict[str, Any] | None = None
        self._guards: list[Any] | None = None
        self._values: dict[str, dict[str, bytes]] | None = None  # values put while deciding
        #: The write whose hooks are running: (run, head it leaves, head it was decided
        #: from, its rows). A hook reading that run sees the write (PostgresTransaction).
        self._pending: tuple[str, Head, Head | None, list[Recorded]] | None = None
        self._decided_again = 0  # writes refused because their run moved, and decided again
        #: Writes decided from this session's memory of their run that found it moved (or
        #: ran out of write ids), decided again from a read.
        self._known_moved = 0
        #: Per run, the head this session last saw (its write or its read), the highest
        #: lease and the lease's token digest there, and a digest of each view table's rows
        #: its last write there sent: what a write is decided from first.
        self._seen: collections.OrderedDict[str, tuple[Head, int, str | None, dict[str, bytes] | None]] = (
            collections.OrderedDict())
        #: The write ids left in the block this session's last read took: [first, end).
        self._spare: tuple[int, int] | None = None
        self._listener: Any = None  # LISTENing connection, opened by the first wait_for_events
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
        self._conn, self._server_at = connect(self.url, self.path, self.connect_timeout_s, self.busy_timeout_s,
                                              self.reply_timeout_s)

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
            return now_us()
        server_us, mono_ns = self._server_at
        return server_us + (time.monotonic_ns() - mono_ns) // 1000

    def clock(self) -> int:
        """The store's "now": the server's clock unless a clock was injected."""
        return self._clock()

    def ready(self) -> Any:
        """The connection, reconnected if the last one was lost (outside a transaction)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if self._in_txn:
                raise StoreUnavailable(f"the connection to {self.path} was lost mid-transaction")
            self._connect()
            conn = self._conn
        return conn

    def x(self, sql: str, args: Any = None, *, binary: bool = False) -> Any:
        """Execute on the store's connection (inside whatever transaction is open)."""
        return self.ready().execute(sql, args, binary=binary)

    _driver_error = psycopg.Error if psycopg is not None else Exception

    def _ledger_error(self, exc: BaseException, doing: str) -> LedgerError:
        return explain(exc, doing, self.path)

    def _ensure_schema(self, may_create: bool) -> None:
        with self._reading("opening"):
            tables = {r[0] for r in self.x(
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
            meta = dict(self.x("SELECT key, value FROM handoff_meta").fetchall())
            version = meta_schema_version(meta, self.path, PG_SCHEMA_VERSION)
            if version < PG_SCHEMA_VERSION:
                if self.readonly:
                    raise StoreUnavailable(
                        f"{self.path} holds a ledger of schema {version}, which this version reads only "
                        f"after upgrading it to schema {PG_SCHEMA_VERSION}; a writable open does that "
                        "(as the role that owns the ledger): run 'handoff --db URL init'"
                    )
                self._migrate(version)  # any writable open, not only init's

    def _create_schema(self) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            # Two processes creating at once: the second waits here, then finds the schema.
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", CREATE_LOCK)
            if conn.execute("SELECT to_regclass('handoff_meta')").fetchone()[0] is not None:
                conn.execute("COMMIT")
                return
            for sql in SCHEMA:
                conn.execute(sql)
            schema = conn.execute("SELECT current_schema()").fetchone()[0]
            for name, (create, _) in functions(schema).items():
                if name not in ("handoff_refuse_change", "handoff_stamp_role"):  # (made with the tables)
                    conn.execute(create)
            conn.execute(VIEWS_FUNCTION_EMPTY)
            for revoke in (*REVOKED, *LIVENESS_REVOKED):
                conn.execute(revoke)
            for sql in QUEUE_TRIGGERS.values():
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
        """Bring an older schema up to this version, in one transaction that excludes every
        write (the hook for later versions: add statements to MIGRATIONS)."""
        with self.lock:
            self.begin("migrating the ledger schema", migrating=True)
            ok = False
            try:
                version = int(self.x("SELECT value FROM handoff_meta WHERE key='schema_version'").fetchone()[0])
                schema = self.x("SELECT current_schema()").fetchone()[0]
                while version < PG_SCHEMA_VERSION:
                    steps = MIGRATIONS.get(version)
                    if steps is None:
                        raise SchemaTooNew(f"no migration from schema {version} is known")
                    for sql in steps:
                        if sql == "{views}":  # made anew from the sync functions there are
                            sql = views_function(self.x(EXISTING).fetchall())
                        self.x(migration_step(sql, schema))
                    version += 1
                self.x("UPDATE handoff_meta SET value=%s WHERE key='schema_version'", (str(version),))
                ok = True
            except psycopg.Error as exc:
                raise explain(exc, "migrating the ledger schema", self.path) from exc
            finally:
                self.finish(ok, "migrating the ledger schema")

    # --- transactions ----------------------------------------------------------------

    def begin(self, doing: str, *, migrating: bool = False) -> None:
        """BEGIN a transaction that excludes every write: wait until no write is in flight
        and hold every ledger-wide lock to the commit (rebuilds, catch-up, imports,
        migrations), with the order sealed up to date first. (A write is one message of
        its own: _append.)"""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        with self._reading(doing):
            conn = self.ready()
            conn.execute("BEGIN")
            self._in_txn = True
            try:
                if migrating:
                    # Every writer of every version inserts into events: none writes while
                    # the layout changes (an older one's locks may not exist yet).
                    conn.execute("LOCK TABLE events, heads IN EXCLUSIVE MODE")
                else:
                    # (the owner's locks: no other role may take them; schema.MAINTENANCE_LOCK)
                    conn.execute(f"LOCK TABLE {MAINTENANCE_LOCK}, {VIEWS_LOCK} IN EXCLUSIVE MODE")
                    conn.execute("SELECT count(*) FROM handoff_seal(true, '{}')")
                    conn.execute("SELECT 1 FROM ledger_tail FOR UPDATE")
            except pgerr.InsufficientPrivilege as exc:
                self.finish(False, doing)
                raise StoreUnavailable(
                    f"{doing} is for the role that owns the ledger (the one that ran 'handoff init'): "
                    f"this role may not take the lock that keeps every write out meanwhile, on {self.path}; "
                    "nothing was changed. Run it as the owner (docs/postgres.md, roles)",
                    cause=str(exc).splitlines()[0]) from None
            except BaseException:
                self.finish(False, doing)
                raise

    def finish(self, ok: bool, doing: str) -> None:
        conn = self._conn
        self._in_txn = False
        if ok:
            try:
                cur = conn.execute("COMMIT")
            except psycopg.Error as exc:
                if conn.broken or conn.closed or isinstance(exc, psycopg.OperationalError):
                    raise self._unknown(doing, exc) from exc
                raise explain(exc, doing, self.path) from exc
            if cur.statusmessage != "COMMIT":  # the server rolled back a failed transaction
                raise StoreUnavailable(f"PostgreSQL rolled back the transaction while {doing} on "
                                       f"{self.path}; nothing was written. Retry")
        elif conn is not None and not conn.closed and not conn.broken:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.close()

    def _unknown(self, doing: str, exc: BaseException) -> OutcomeUnknown:
        return OutcomeUnknown(
            f"the connection to {self.path} was lost while committing ({doing}): the write may "
            "or may not be stored. Retry with the same idempotency key (a stored write answers "
            "'duplicate'), or read the run to see",
            cause=str(exc),
        )

    def _head_locked(self, run_id: str, *, lock: bool = False) -> tuple[Head | None, int]:
        row = self.x(HEAD_SELECT + (" FOR UPDATE" if lock else ""), (run_id,)).fetchone()
        return head_of(row)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[PostgresTransaction]:
        """One snapshot (REPEATABLE READ, READ ONLY), or the transaction already open."""
        with self.lock:
            began = not self._in_txn
            try:
                if began:
                    with self._reading("reading"):
                        self.ready().execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    self._in_txn = True
                yield self._txn
            except psycopg.Error as exc:
                raise explain(exc, "reading", self.path) from exc
            finally:
                if began:
                    self._in_txn = False
                    conn = self._conn
                    if conn is not None and not conn.closed and not conn.broken:
                        with contextlib.suppress(psycopg.Error):
                            conn.execute("ROLLBACK")

    # --- sealing ---------------------------------------------------------------------

    def seal(self) -> int:
        """Give every committed event its ledger position now (writers do this themselves
        after each commit; a reader calls it when it finds events still waiting). Returns
        the last sealed position."""
        with self._reading("sealing the ledger order"):
            if self._in_txn:
                raise StoreUnavailable("seal() cannot run inside another transaction of this store")
            self.ready().execute("SELECT count(*) FROM handoff_seal(true, '{}')")
            return self.x("SELECT position FROM ledger_tail").fetchone()[0]

    def wait_for_events(self, after_position: int, timeout_s: float) -> int:
        """Sleep on the ledger's NOTIFY channel (a connection of its own, LISTENing), with
        a poll at least every second as the fallback: a lost notification only delays."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._reading("waiting for events"):
                if self._listener is None or self._listener.closed or self._listener.broken:
                    self._listen()
                last = self.x("SELECT position FROM ledger_tail").fetchone()[0]
                if last <= after_position and not self._in_txn and \
                        self.x("SELECT EXISTS (SELECT 1 FROM unsealed)").fetchone()[0]:
                    self._seal_quietly()
                    last = self.x("SELECT position FROM ledger_tail").fetchone()[0]
            left = deadline - time.monotonic()
            if last > after_position or left <= 0:
                return last
            try:
                for _ in self._listener.notifies(timeout=min(left, 1.0), stop_after=1):
                    pass
            except psycopg.Error:
                self._listener = None  # reconnect next time round; the poll covers the gap

    def _listen(self) -> None:
        with contextlib.suppress(Exception):
            if self._listener is not None:
                self._listener.close()
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                               application_name="handoff-ledger-listen", client_encoding="UTF8")
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        conn.execute(f"LISTEN {notify_channel(schema)}")
        self._listener = conn

    def db_roles(self, first_position: int, last_position: int) -> dict[int, str]:
        with self._reading("reading who wrote the events"):
            return dict(self.x(
                "SELECT o.position, e.db_role FROM ledger_order o JOIN events e ON e.id = o.event_id "
                "WHERE o.position BETWEEN %s AND %s", (first_position, last_position),
            ).fetchall())

    def db_role_counts(self, run_id: str | None = None) -> dict[str, int]:
        with self._reading("reading who wrote the events"):
            if run_id is None:
                rows = self.x("SELECT db_role, count(*) FROM events GROUP BY db_role ORDER BY db_role")
            else:
                rows = self.x("SELECT db_role, count(*) FROM events WHERE run_id=%s GROUP BY db_role "
                               "ORDER BY db_role", (run_id,))
            return {r: n for r, n in rows}

    def _seal_quietly(self) -> bool:
        """A reader's seal of what waits, when it can: a read-only session (a role with
        default_transaction_read_only, a standby) cannot, and a seal lock held past the
        lock timeout is not worth more waiting. False then: the reader reads what is
        sealed, and waits or polls for the rest, as for any commit still to come."""
        try:
            self.ready().execute("SELECT count(*) FROM handoff_seal(true, '{}')")
            return True
        except (pgerr.LockNotAvailable, pgerr.QueryCanceled, pgerr.ReadOnlySqlTransaction,
                pgerr.InsufficientPrivilege, pgerr.UniqueViolation):
            return False

    def unsealed_count(self) -> int:
        with self._reading("counting unsealed events"):
            return self.x("SELECT count(*) FROM unsealed").fetchone()[0]

    # --- reading ---------------------------------------------------------------------

    def _hash_at(self, run_id: str, seq: int) -> bytes | None:
        row = self.x("SELECT hash FROM events WHERE run_id=%s AND seq=%s", (run_id, seq)).fetchone()
        return None if row is None else as_bytes(row[0])


    def _read_run_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Recorded]:
        # An event committed but not sealed yet reads with position 0 (the reader seals
        # and reads again when it can: _iter_run).
        sql = (f"SELECT {RUN_COLUMNS} FROM events e LEFT JOIN ledger_order o ON o.event_id = e.id "
               "WHERE e.run_id=%s AND e.seq>%s")
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND e.seq<=%s"
            args.append(until_seq)
        return [recorded_row(r) for r in self.x(sql + " ORDER BY e.seq", args)]

    def _step_rows(self, run_id: str, after_seq: int, until_seq: int | None) -> list[tuple[Any, ...]]:
        sql = "SELECT seq, type, recorded_us, payload, actor FROM events WHERE run_id=%s AND seq>%s"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=%s"
            args.append(until_seq)
        return [(r[0], r[1], r[2], as_bytes(r[3]), r[4]) for r in self.x(sql + " ORDER BY seq", args)]

    def _iter_run(self, run_id: str, after_seq: int, until_seq: int | None) -> Iterator[Recorded]:
        # An event committed but not sealed yet reads with position 0: seal (when this
        # session may) and read the page again.
        def page(run: str, cursor: int, stop: int) -> list[Recorded]:
            rows = self._read_run_page(run, cursor, stop)
            if not self._in_txn and any(r.position == 0 for r in rows) and self._seal_quietly():
                rows = self._read_run_page(run, cursor, stop)
            return rows

        return itertools.chain.from_iterable(self._pages(page, run_id, after_seq, until_seq))

    def _iter_all(self, after_position: int, until_position: int | None, page: int) -> Iterator[Recorded]:
        """Pages of positions (cursor, stop], never past the tail last read: every position
        up to the tail is committed with it (a seal, an import or a migration inserts the
        positions and moves the tail in one transaction), so a page's rows are all there
        is in its range, gaps or not, and the cursor moves to its end. The store is free
        between pages: nothing stays open while the caller holds a page."""
        cursor = after_position
        tail = after_position  # reaching it: read the tail again
        sealed = False
        while until_position is None or cursor < until_position:
            with self._reading("reading"):
                if cursor >= tail:
                    tail, waiting = self.x(TAIL_AND_QUEUE).fetchone()
                    if cursor >= tail:
                        if sealed or not waiting or self._in_txn:
                            return
                        # Committed events wait for their positions (their writer died between
                        # its commit and its seal, or is sealing now): seal them, and read on.
                        self._seal_quietly()
                        sealed = True
                        continue
                stop = min(cursor + page, tail)
                if until_position is not None:
                    stop = min(stop, until_position)
                # Binary rows: the hashes and the payload come as bytes, not as hex text
                # the server writes and the client parses (a catch-up reads every event).
                rows = self.x(PAGE_SQL, {"after": cursor, "stop": stop}, binary=True).fetchall()
            rows.sort(key=POSITION)
            yield from itertools.starmap(Recorded, rows)
            cursor = stop

    def _export_page(self, after: int) -> list[tuple[Recorded, bytes | None, int]]:
        if after == 0 and not self._in_txn:
            self._seal_quietly()  # the export reads what is sealed: seal what waits first
        rows = self.x(f"SELECT {SEALED_COLUMNS}, e.idem_digest, e.batch_size FROM ledger_order o "
                      "JOIN events e ON e.id = o.event_id WHERE o.position>%s ORDER BY o.position LIMIT %s",
                      (after, PAGE)).fetchall()
        return [(recorded_row(r), as_bytes(r[12]), r[13]) for r in rows]

    def head(self, run_id: str) -> Head | None:
        check_run_id(run_id)
        return self._read("reading a run's head", self._public_head, run_id)

    def _public_head(self, run_id: str) -> Head | None:
        row = self.x(PUBLIC_HEAD + " WHERE h.run_id=%s", (run_id,)).fetchone()
        if row is not None and not row[6] and not self._in_txn:
            self._seal_quietly()
            row = self.x(PUBLIC_HEAD + " WHERE h.run_id=%s", (run_id,)).fetchone()
        return None if row is None else Head(row[0], row[1], as_bytes(row[2]), row[3], row[4], row[5], row[6])

    def list_runs(self, *, prefix: str | None = None) -> Iterator[Head]:
        return self.heads_in_order(prefix, public=True)

    def heads_in_order(self, prefix: str | None, *, public: bool) -> Iterator[Head]:
        """Heads in the order runs began; ``public``: spans in ledger positions (sealing
        first what still waits), else in write ids (verify compares those with the log)."""
        if public and not self._in_txn:
            with self._reading("listing runs"):
                if self.x("SELECT EXISTS (SELECT 1 FROM unsealed)").fetchone()[0]:
                    self._seal_quietly()
        sql = (PUBLIC_HEAD if public else
               "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, last_position, "
               "first_position FROM heads h")
        cursor: tuple[Any, ...] | None = None
        while True:
            terms, args = [], []
            if prefix:
                terms.append("h.run_id >= %s AND h.run_id < %s")
                args += [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]
            if cursor is not None:
                terms.append("(h.first_position, h.run_id) > (%s, %s)")
                args += list(cursor)
            q = sql.replace("SELECT ", "SELECT h.first_position, ", 1)
            q += (" WHERE " + " AND ".join(terms) if terms else "")
            q += " ORDER BY h.first_position, h.run_id LIMIT %s"
            with self._reading("listing runs"):
                rows = self.x(q, [*args, PAGE]).fetchall()
            for r in rows:
                yield Head(r[1], r[2], as_bytes(r[3]), r[4], r[5], r[6], r[7])
            if len(rows) < PAGE:
                return
            cursor = (rows[-1][0], rows[-1][1])

    def count_runs(self) -> int:
        with self._reading("counting runs"):
            return self.x("SELECT count(*) FROM heads").fetchone()[0]

    def last_position(self) -> int:
        with self._reading("reading the last position"):
            return self.x("SELECT position FROM ledger_tail").fetchone()[0]

    # --- import ----------------------------------------------------------------------

    def _import_tail(self) -> tuple[int, bytes]:
        """The sealed tail, in the import's transaction (which excludes every write and
        holds the seal lock: imported events take the next positions after it, with their
        write ids drawn from the ledger's sequence)."""
        self._free_ids: list[int] = []
        position, ghash = self.x("SELECT position, global_hash FROM ledger_tail").fetchone()
        return position, as_bytes(ghash)

    def _key_used(self, run_id: str, key: str) -> bool:
        return self.x("SELECT 1 FROM events WHERE run_id=%s AND idem_key=%s", (run_id, key)).fetchone() is not None

    def _next_id(self) -> int:
        if not self._free_ids:
            (base,) = self.x("SELECT nextval('events_id_seq')").fetchone()
            self._free_ids = list(range(base + ID_BLOCK - 1, base - 1, -1))
        return self._free_ids.pop()

    def _import_rows(self, rows: list[ImportRow], heads: list[ImportHead]) -> None:
        """Insert the rows under fresh write ids, with their positions in the ledger order
        at once; the heads keep their spans in write ids."""
        by_run = {h.run_id: h for h in heads}
        events, order = [], []
        viewed = self._keeps_views
        for pos, r, digest, size, g in rows:
            wid = self._next_id()
            cur = by_run[r.run_id]
            cur.last_position = wid
            if cur.fresh:
                cur.first_position, cur.fresh = wid, False
            events.append((wid, r.run_id, r.seq, r.type, r.actor, r.lease, r.idempotency_key, digest, size,
                           r.recorded_us, r.schema_version, r.payload, r.prev_hash, r.hash, viewed))
            order.append((pos, wid, g))
        conn = self.ready()
        with conn.cursor() as cur:
            if events:
                cur.executemany(INSERT, events)
                cur.executemany("INSERT INTO ledger_order (position, event_id, global_hash) VALUES (%s,%s,%s)",
                                order)
            for h in heads:
                f = h.fence
                cur.execute(UPSERT_HEAD, (h.run_id, h.seq, h.hash, f.lease, f.holder, f.max_lease,
                                           h.first_position, h.last_position))
                if f.digest_moved:
                    cur.execute("UPDATE heads SET lease_digest=%s WHERE run_id=%s", (f.digest, h.run_id))

    def _import_done(self, last_position: int, global_hash: bytes) -> None:
        self.x("UPDATE ledger_tail SET position=%s, global_hash=%s", (last_position, bytes(global_hash)))
        # The insert trigger queued the imported events, which already have their
        # positions: the seal (as the owner) takes them off the queue.
        self.x("SELECT count(*) FROM handoff_seal(true, '{}')")

    # --- checking --------------------------------------------------------------------

    def verify(self, run_id: str | None = None, *, progress: Callable[[int, int], None] | None = None
               ) -> list[Problem]:
        """Walk the log under one snapshot; report what is damaged ([] when sound)."""
        from .postgres_verify import verify_snapshot

        with self.read_transaction():
            with self._reading("verifying"):
                return verify_snapshot(self, run_id, progress)

    def trigger_problems(self) -> list[Problem]:
        return layout_problems(self.x)

    def append_only_problems(self) -> list[Problem]:
        with self._reading("reading the triggers"):
            return self.trigger_problems()

    def ledger_head(self) -> tuple[int, bytes]:
        with self._reading("reading the ledger's head"):
            row = self.x("SELECT position, global_hash FROM ledger_tail").fetchone()
        return row[0], as_bytes(row[1])

    def global_hash_at(self, position: int) -> bytes | None:
        check_seq(position, "position")
        if position == 0:
            return None
        with self._reading("reading the ledger-wide chain"):
            row = self.x("SELECT global_hash FROM ledger_order WHERE position=%s", (position,)).fetchone()
        return None if row is None else as_bytes(row[0])

    def backup_to(self, path: str) -> tuple[int, bytes, int]:
        """A consistent copy of the whole ledger into the new SQLite file ``path``: one
        snapshot of this database, imported there verbatim (positions and both chains
        carry over, so the copy's head digest is this ledger's)."""
        self.seal()
        return copy_to_file(self, path)

    # --- ledger-wide settings (ledger/store.py) -------------------------------------

    def setting(self, name: str) -> str | None:
        with self._reading("reading a ledger setting"):
            row = self.x("SELECT value FROM handoff_meta WHERE key = %s", (f"setting.{name}",)).fetchone()
        return None if row is None else str(row[0])

    def put_setting(self, name: str, value: str | None) -> None:
        # The owner's transaction (begin): a least-privilege role may read settings, not change them.
        with self.write_transaction("changing a ledger setting"):
            if value is None:
                self.x("DELETE FROM handoff_meta WHERE key = %s", (f"setting.{name}",))
            else:
                self.x("INSERT INTO handoff_meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET "
                       "value = excluded.value", (f"setting.{name}", value))

    # --- the rest of the interface ---------------------------------------------------

    def schema_name(self) -> str:
        """The database schema the ledger lives in (the session's current schema)."""
        with self._reading("reading the schema name"):
            return str(self.x("SELECT current_schema()").fetchone()[0])

    def roles_sql(self, prefix: str = "handoff") -> str:
        """``roles_sql`` for this ledger's schema."""
        return self.access_roles(prefix)["sql"]  # type: ignore[no-any-return]

    def access_roles(self, prefix: str = "handoff") -> dict[str, Any]:
        from .roles import roles_sql

        schema = self.schema_name()
        return {"schema": schema, "roles": {g: f"{prefix}_{g}" for g in ("writer", "watchdog", "auditor")},
                "sql": roles_sql(schema, prefix)}

    @property
    def views(self) -> Any:
        if self._views is None:
            from .postgres_view_store import PostgresViewStore

            self._views = PostgresViewStore(self)
        return self._views

    def diagnostics(self) -> dict[str, Any]:
        with self._reading("reading the server's settings"):
            facts = dict(self.x(
                "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
                "'synchronous_commit', 'fsync', 'default_transaction_isolation', 'lock_timeout', "
                "'max_connections')"
            ).fetchall())
            db, user = self.x("SELECT current_database(), session_user").fetchone()
            version = self.x("SELECT value FROM handoff_meta WHERE key='schema_version'").fetchone()
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
            "order": "positions sealed behind the writers, in commit order (docs/postgres.md)",
            "unsealed": self.unsealed_count(),
            # Writes this process made whose run another writer moved between their read
            # and their write (each was decided again from the new head).
            "writes_decided_again": self._decided_again,
            "writes_from_memory_moved": self._known_moved,
        }

    def close(self) -> None:
        with self.lock:
            for conn in (self._conn, self._listener):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()


class PostgresTransaction(StoreTransaction):
    """The handle write_transaction, read_transaction and inline hooks receive."""

    __slots__ = ()

    def head(self, run_id: str) -> Head | None:
        store = self._store
        pending = store._pending
        if pending is not None and pending[0] == run_id:  # a hook of this write: the head it leaves
            return pending[1]
        return store._public_head(run_id)

    def state(self, run_id: str, aggregate: Aggregate[S], head: Head | None | object = _MISSING) -> S:
        store = self._store
        pending = store._pending
        if pending is not None and pending[0] == run_id:  # a hook of this write: the fold after it
            return store._after_write(run_id, pending[2], pending[3], [], [aggregate])[0][1]  # type: ignore[no-any-return]
        return super().state(run_id, aggregate, head)

    def runs_since(self, position: int) -> list[str]:
        """Runs with events after a write id (the views' cursor on this backend)."""
        return [r[0] for r in self._store.x(RUNS_SINCE, (position,))]

    def count_runs(self, *, begun_by: int | None = None) -> int:
        x = self._store.x
        if begun_by is None:
            return x("SELECT count(*) FROM heads").fetchone()[0]
        return x("SELECT count(*) FROM heads h JOIN ledger_order o ON o.event_id = h.first_position "
                 "WHERE o.position <= %s", (begun_by,)).fetchone()[0]

    def last_position(self) -> int:
        """The last sealed position. Inside write_transaction every write is excluded and
        everything committed was sealed when it began: no event can still appear below it."""
        return self._store.x("SELECT position FROM ledger_tail").fetchone()[0]
