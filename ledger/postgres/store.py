"""The PostgreSQL event store: one database shared by workers on many hosts.

Same semantics as the SQLite store (ledger/sqlite/store.py), over psycopg 3. Each store object
owns one connection (autocommit, explicit BEGIN/COMMIT) and may be shared by threads.

Order for readers and the ledger-wide chain (docs/postgres.md, "Order"): a write locks
its run (an advisory lock on the run id, then its heads row FOR UPDATE), folds, checks
the lease and the idempotency key and decides, then inserts its events under write ids
(a sequence, taken under the run's lock). Positions are given by sealing, under the seal
lock, in write-id order, with the ledger-wide chain, into ``ledger_order``: the insert's
own trigger seals when nobody else is sealing, and otherwise queues the events in
``unsealed`` for the writer to seal after its commit (or the next writer or reader). A
position exists only once sealed, so a tailing reader never skips an event that commits
late, and no writer waits on a ledger-wide lock through another's commit unless it must
learn its positions. A write is at most two round trips, each ONE simple-query message;
one when this store's last write left the run where it is (a guess, proved on the server).

Append-only: triggers refuse UPDATE, DELETE and TRUNCATE on ``events`` (for owners too);
``verify`` and ``doctor`` check that they are present, enabled and unaltered.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import math
import operator
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

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
from ..copy import copy_to_file
from ..folds import MISSING as _MISSING
from ..folds import FoldingStore, StoreTransaction
from ..importing import ImportHead, ImportRow, run_import
from ..store import (
    DEFAULT_MAX_PAYLOAD,
    GENESIS_HASH,
    Actor,
    Aggregate,
    AppendResult,
    Capabilities,
    Decision,
    Head,
    LeaseToken,
    Problem,
    Recorded,
    Step,
    check_run_id,
    check_seq,
    encode_events,
    global_link,
    reads_position,
)

try:  # the driver is an optional extra: pip install 'handoff-ledger[postgres]'
    import psycopg
    import psycopg.adapt
    from psycopg import errors as pgerr
    from psycopg.generators import execute as _pq_execute
    from psycopg.pq import ExecStatus

    _FATAL_ERROR, _TUPLES_OK = ExecStatus.FATAL_ERROR, ExecStatus.TUPLES_OK
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pgerr = None  # type: ignore[assignment]

from .blobs import PostgresValues
from .schema import (
    PG_SCHEMA_VERSION,
    FORMAT_NAME,
    _RUN_LOCK_NS,
    _LEDGER_NS,
    _MAINTENANCE,
    _VIEWS,
    _SEAL,
    ID_BLOCK,
    LEDGER_TABLES,
    ident,
    REFUSE_FUNCTION,
    APPEND_ONLY_TRIGGERS,
    ORDER_TRIGGERS,
    STAMP_FUNCTION,
    ROLE_TRIGGERS,
    SEAL_FUNCTION,
    QUEUE_FUNCTION,
    QUEUE_TRIGGERS,
    BEGIN_FUNCTION,
    EXPECT_FUNCTION,
    HEAD_MOVED,
    queue_function,
    begin_function,
    expect_function,
    _or_replace,
    seal_function,
    notify_channel,
    _SCHEMA,
    MIGRATIONS,
)

S = TypeVar("S")

PAGE = 1000
#: read_all's default page. A whole-log reader is usually far behind, and each page
#: costs a statement planned and a round trip whatever its size: pages of 2,000 cost
#: about 8% less per event than pages of 1,000; at 4,000 the client's share grows more
#: than the server's shrinks.
READ_PAGE = 2000
_TAGS = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}

_COLUMNS = (
    "e.run_id, e.seq, {pos}, e.type, e.actor, e.lease, e.idem_key, e.recorded_us, "
    "e.schema_version, e.payload, e.prev_hash, e.hash"
)
_SEALED_COLUMNS = _COLUMNS.format(pos="o.position")
#: The events at positions (after, stop]: the page's write ids bound a range scan of the
#: events, joined to the page by hash, in place of one index descent per event (which
#: cost the server twice as much). A page's write ids are close together (a write's
#: events are numbered in its own block, and writes seal soon after they commit), so
#: the range holds little beyond the page: only the events that committed between a
#: write taking its ids and its seal. "+ 0": min() and max() of the bare column would be
#: planned as a walk of the event_id index from one end, filtering on the position,
#: past every page before this one. Unordered: a sort on the client costs less than on
#: the server.
_PAGE = (
    "WITH page AS MATERIALIZED (SELECT min(event_id + 0) AS low, max(event_id + 0) AS high "
    "FROM ledger_order WHERE position > %(after)s AND position <= %(stop)s) "
    f"SELECT {_SEALED_COLUMNS} FROM ledger_order o JOIN events e ON e.id = o.event_id "
    "WHERE o.position > %(after)s AND o.position <= %(stop)s "
    "AND e.id >= (SELECT low FROM page) AND e.id <= (SELECT high FROM page)"
)
_POSITION = operator.itemgetter(2)
#: Where a reader stops: the last sealed position, and whether committed events wait
#: for theirs. The position is read from the order itself (one descent of its key), not
#: from the tail row: sealers commit positions in order, so what is visible is always
#: 1..max, and a tail row that was lost or set back (damage verify reports) neither
#: stops a reader short nor fails it untyped.
_TAIL_AND_QUEUE = ("SELECT coalesce((SELECT max(position) FROM ledger_order), 0), "
                   "EXISTS (SELECT 1 FROM unsealed)")
RUN_COLUMNS = _COLUMNS.format(pos="coalesce(o.position, 0)")
_INSERT = (
    "INSERT INTO events (id, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, viewed) "
    "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
)
#: A batch of more than one event: one statement, one array per column that varies (a
#: statement per event would be parsed and executed as many times).
_INSERT_MANY = (
    "INSERT INTO events (id, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, viewed) "
    "SELECT u.id, %s, u.seq, u.type, %s, %s, u.idem_key, u.idem_digest, %s, %s, %s, u.payload, "
    "u.prev_hash, u.hash, %s FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[], "
    "%s::bytea[], %s::bytea[], %s::bytea[], %s::bytea[]) "
    "AS u(id, seq, type, idem_key, idem_digest, payload, prev_hash, hash) ORDER BY u.id"
)
_UPSERT_HEAD = (
    "INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, "
    "first_position, last_position) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) "
    "ON CONFLICT (run_id) DO UPDATE SET last_seq=excluded.last_seq, "
    "last_hash=excluded.last_hash, lease=excluded.lease, "
    "lease_holder=excluded.lease_holder, max_lease=excluded.max_lease, "
    "last_position=excluded.last_position"
)
#: A repeated key's earlier batch: its first seq and write id, the request's digest, size
#: and actor, and every event's write id and position (null while waiting to be sealed).
_DUPLICATE = (
    "SELECT d.seq, d.id, d.idem_digest, d.batch_size, d.actor, b.ids, b.positions FROM events d, "
    "LATERAL (SELECT array_agg(e.id ORDER BY e.seq) AS ids, array_agg(o.position ORDER BY e.seq) AS positions "
    "FROM events e LEFT JOIN ledger_order o ON o.event_id = e.id "
    "WHERE e.run_id = d.run_id AND e.seq BETWEEN d.seq AND d.seq + d.batch_size - 1) b "
    "WHERE d.run_id=%s AND d.idem_key=%s"
)
_HEAD_SELECT = (
    "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
    "last_position, max_lease, lease_digest FROM heads WHERE run_id=%s"
)
#: A head as the interface shows it: its span in ledger positions (the heads table keeps
#: write ids; 0 for an event still waiting for its position).
_PUBLIC_HEAD = (
    "SELECT h.run_id, h.last_seq, h.last_hash, h.lease, h.lease_holder, "
    "coalesce(f.position, 0), coalesce(l.position, 0) FROM heads h "
    "LEFT JOIN ledger_order f ON f.event_id = h.first_position "
    "LEFT JOIN ledger_order l ON l.event_id = h.last_position"
)
#: Statements that every write sends, by their text (psycopg placeholders): each is
#: prepared once per connection, by an SQL PREPARE inside the write's own message, and
#: EXECUTEd by name after that. A simple query plans each of its statements afresh; a
#: prepared one keeps its plan for the session. {text: (name, text with $n, parameter
#: names or count)}. Only texts registered with ``preparable`` (whose parameter types
#: the server infers from the columns and functions they meet) are prepared.
_PREPARED: dict[str, tuple[str, str, list[str] | int]] = {}
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")


def preparable(sql: str) -> str:
    """Register ``sql`` as a statement _multi prepares per connection; returns it."""
    if sql not in _PREPARED:
        names: list[str] = []
        count = 0

        def dollar(m: re.Match[str]) -> str:
            nonlocal count
            if m.group(0) == "%%":
                return "%"
            if m.group(1) is None:
                count += 1
                return f"${count}"
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        text = _PLACEHOLDER.sub(dollar, sql)
        name = "handoff_" + hashlib.sha256(sql.encode()).hexdigest()[:16]
        _PREPARED[sql] = (name, text, names or count)
    return sql


class _Sql(str):
    """An SQL expression that stands as an EXECUTE argument as it is: the write ids of a
    one-round-trip write (``currval(...) + i``), which the client cannot know before the
    server hands out the block. Only the store makes these, from constants."""

    __slots__ = ()


#: The literal of a value of the commonest types, found by the value's exact type: the
#: one place for them, which _literal starts from and _execute_call looks up directly (a
#: write builds about seventy literals a command).
_QUICK_LITERAL: dict[type, Any] = {
    str: lambda v: None if "\x00" in v else "'" + v.replace("'", "''") + "'",
    int: str,
    bytes: lambda v: "'\\x" + v.hex() + "'",
    type(None): lambda v: "NULL",
    _Sql: str.__str__,
    bool: lambda v: "true" if v else "false",
}


def _literal(v: Any) -> str | None:
    """``v`` as an SQL literal for an EXECUTE's argument list (the prepared statement's
    parameter types convert it), or None for a value psycopg must quote. Only on a
    connection with standard_conforming_strings on and UTF-8 (``handoff_literals``):
    there a quote is the one character a string literal must double."""
    t = type(v)
    quick = _QUICK_LITERAL.get(t)
    if quick is not None:
        return quick(v)  # type: ignore[no-any-return]
    if t is list and v and type(v[0]) is _Sql:
        return "ARRAY[" + ",".join(v) + "]::bigint[]"
    if t is float:  # quoted: float8in reads the shortest repr back exactly (-0.0 too)
        return "'" + repr(v) + "'" if math.isfinite(v) else None
    if t is list:
        items = [_element(i) for i in v]
        return None if None in items else "'{" + ",".join(items).replace("'", "''") + "}'"  # type: ignore[arg-type]
    return None


def _element(v: Any) -> str | None:
    """``v`` as an element of an array literal (the text array_in reads), or None."""
    t = type(v)
    if t is int:
        return str(v)
    if v is None:
        return "NULL"
    if t is str:
        return None if "\x00" in v else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if t is bytes:
        return '"\\\\x' + v.hex() + '"'
    if t is bool:
        return "t" if v else "f"
    return None


def _execute_call(conn: Any, name: str, params: list[str] | int, args: Any) -> str:
    """``EXECUTE name(arguments)``, each argument a literal (psycopg quotes what _literal
    does not know)."""
    values = ([args[k] for k in params] if type(params) is list
              else args if type(args) in (tuple, list) else list(args))
    if not values:
        return f"EXECUTE {name}"
    quick = _QUICK_LITERAL.get
    lits = [(quick(type(v)) or _literal)(v) for v in values]
    if None in lits:
        cur = psycopg.ClientCursor(conn)
        lits = [lit if lit is not None else cur.mogrify("%s", (v,)) for lit, v in zip(lits, values)]
    return f"EXECUTE {name}({', '.join(lits)})"  # type: ignore[arg-type]


#: The statements of a write's two messages, prepared once per connection (_multi).
_HEAD_FOR_UPDATE = preparable(_HEAD_SELECT + " FOR UPDATE")
#: A guessed write's reads (_write): the head and the steps only where the head is not the
#: one guessed from (seq, hash), which a refused guess goes on from.
_HEAD_IF_MOVED = preparable(_HEAD_SELECT + " AND NOT (last_seq = %s AND last_hash = %s) FOR UPDATE")
_STEPS_IF_MOVED = preparable(
    "SELECT seq, type, recorded_us, payload, hash, actor FROM events WHERE run_id=%s AND seq>=%s "
    "AND NOT EXISTS (SELECT 1 FROM heads WHERE run_id=%s AND last_seq=%s AND last_hash=%s) ORDER BY seq")
_STEPS_FROM = preparable("SELECT seq, type, recorded_us, payload, hash, actor FROM events WHERE run_id=%s "
                         "AND seq>=%s ORDER BY seq")
_MOVE_DIGEST = preparable("UPDATE heads SET lease_digest=%s WHERE run_id=%s")
_LOCK_VIEWS_SHARED = preparable("SELECT pg_advisory_xact_lock_shared(%s, %s)")
#: Before its COMMIT a write reads where its insert sealed it (QUEUE_FUNCTION): its first
#: write id and that event's position, or nothing when another session was sealing (and
#: then _SEAL_IF_QUEUED, after the COMMIT in the same message, gives them).
_SEALED_AT = preparable("SELECT current_setting('handoff.sealed', true)")
#: After the COMMIT, in the same message: nothing when the insert sealed the write (the
#: condition is one probe of the queue; the function is not called), else the seal,
#: waiting for the sealer (handoff_seal), so a write is never more than two round trips.
_SEAL_IF_QUEUED = preparable(
    "SELECT s.event_id, s.event_position FROM handoff_seal(true, %(ids)s::bigint[]) s "
    "WHERE EXISTS (SELECT 1 FROM unsealed u WHERE u.event_id = ANY(%(ids)s::bigint[]))")
_BEGIN_WRITE = preparable("SELECT handoff_begin_write(%s)")
_EXPECT_HEAD = preparable("SELECT handoff_expect_head(%s, %s, %s)")
#: A guessed write (_guess) goes behind this savepoint, and is undone to it when refused.
_SAVE_GUESS = "SAVEPOINT handoff_guess"
_UNDO_GUESS = "ROLLBACK TO SAVEPOINT handoff_guess"
#: The write ids of a one-round-trip write, known only to the server when the message is
#: built: its block's first id is the session's ``currval`` once handoff_begin_write ran.
_CURRVAL = "currval('events_id_seq')"
preparable(_INSERT)
preparable(_INSERT_MANY)
preparable(_UPSERT_HEAD)
#: The head of a run that has one (read under the run's lock, or proved by a guess): an
#: UPDATE, which costs less than the upsert's attempt to insert first.
_MOVE_HEAD = preparable(
    "UPDATE heads SET last_seq=%s, last_hash=%s, lease=%s, lease_holder=%s, max_lease=%s, "
    "last_position=%s WHERE run_id=%s")
preparable(_DUPLICATE)
_RUNS_SINCE = (
    "SELECT h.run_id FROM heads h WHERE h.run_id IN (SELECT e.run_id FROM ledger_order o "
    "JOIN events e ON e.id = o.event_id WHERE o.position > %s) ORDER BY h.first_position"
)

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
        #: The names of the statements _multi has prepared in this session (None: not known).
        handoff_prepared: set[str] | None = None
        #: Whether _multi may write string literals itself (_literal).
        handoff_literals = False

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


def _require_utf8(conn: Any, where: str) -> None:
    """Refuse a database whose text would not come back exactly as written.

    The store asks for client encoding UTF8 at connect (so PGCLIENTENCODING, the address
    or a database default cannot change it); the server's own encoding must be UTF8 too:
    on SQL_ASCII the driver returns text as bytes and the server neither checks nor
    converts it, on a narrower one some characters cannot be stored at all.
    """
    server = conn.info.parameter_status("server_encoding")
    if server is None:  # not reported (some poolers): ask
        server = conn.execute("SHOW server_encoding").fetchone()[0]
    db = conn.info.dbname
    if server.upper() != "UTF8":
        name = '"' + db.replace('"', '""') + '"'  # quoted: the name may be a keyword (user)
        raise StoreUnavailable(
            f"the database {db} ({where}) uses encoding {server}, but a handoff ledger needs a "
            "UTF8 database: every run id, name and payload must come back exactly as it was "
            "written, which only UTF8 guarantees. Nothing was created or written. A database's "
            "encoding cannot be changed; create one with UTF8 under another name: CREATE "
            f"DATABASE {ident(db + '_utf8')} ENCODING 'UTF8' TEMPLATE template0; then use "
            f"its address (to reuse the name {name}, first save what this database holds, "
            "with pg_dump, before dropping it)",
            database=db, server_encoding=server,
        )
    if conn.info.encoding != "utf-8":
        raise StoreUnavailable(
            f"the connection to {where} uses client encoding "
            f"{conn.info.parameter_status('client_encoding')} although the store asked for UTF8 "
            "(a connection pooler in between?); text would not round-trip, so nothing was "
            "written. Connect to the server directly, or have the pooler keep client_encoding UTF8",
            database=db, client_encoding=conn.info.parameter_status("client_encoding"),
        )


def as_bytes(v: Any) -> Any:
    return bytes(v) if isinstance(v, (memoryview, bytearray)) else v


def recorded_row(r: Sequence[Any]) -> Recorded:
    return Recorded(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                    as_bytes(r[9]), as_bytes(r[10]), as_bytes(r[11]))


def _head(row: Sequence[Any] | None, *, digest: bool = False) -> Any:
    """(Head or None, highest lease[, token digest]) from a _HEAD_SELECT row."""
    if row is None:
        return (None, 0, None) if digest else (None, 0)
    head = Head(row[0], row[1], as_bytes(row[2]), row[3], row[4], row[5], row[6])
    return (head, row[7], row[8]) if digest else (head, row[7])


def _multi(conn: Any, batch: Sequence[tuple[str, Any]]) -> list[list[Any]]:
    """Run statements as ONE simple-query message and return each one's rows, or raise
    the first failure (_send)."""
    results, failed = _send(conn, batch)
    if failed is not None:
        raise failed
    return results


def _send(conn: Any, batch: Sequence[tuple[str, Any]]) -> tuple[list[list[Any]], Any]:
    """Run statements as ONE simple-query message (parameters bound here): each one's rows
    up to the first that failed, and that failure (a psycopg error; None when all ran).
    One message, ending in one ReadyForQuery: between two of them the session is idle in
    its transaction, where the server's idle timeout ends a client that went away.
    (psycopg's pipeline mode sends a Flush after its Sync, which switches that timeout
    off: a stalled client would hold its locks for good.) The rows of the statements
    before a failure are what a refused guess goes on from (_write).

    A registered statement (``preparable``) goes as ``EXECUTE name(literals)``, preceded,
    the first time on this connection, by its ``PREPARE`` at the head of the same message:
    still one message, and no plan made twice. PREPARE is not undone by a rollback: when
    every PREPARE ran, the connection knows them whatever failed after; when one failed
    (or the server lost them), which exist is not known, and the connection asks the
    server (pg_prepared_statements) when it is next idle, sending plain statements until
    then.

    The message goes through libpq directly and only the rows a write reads are loaded
    (psycopg's cursor would describe every statement's result; a write has twenty)."""
    # Prepared statements only where the store writes the literals (their types then
    # always match the parameters'); elsewhere everything goes plainly, psycopg quoting.
    fast = getattr(conn, "handoff_literals", False)
    known = _known_prepared(conn) if fast else None
    cur = None
    head: list[str] = []
    body: list[str] = []
    for q, a in batch:
        if a is None:
            body.append(q)
            continue
        form = _PREPARED.get(q) if known is not None else None
        if form is None:
            cur = cur or psycopg.ClientCursor(conn)
            body.append(cur.mogrify(q, a))
            continue
        name, text, params = form
        if name not in known:  # type: ignore[operator]
            head.append(f"PREPARE {name} AS {text}")
            known.add(name)  # type: ignore[union-attr]
        body.append(_execute_call(conn, name, params, a))
    pgconn = conn.pgconn
    # handoff_literals holds only on a UTF-8 session (checked when it opened, and the store
    # alone uses the connection); asking psycopg costs a lookup per message.
    encoding = "utf-8" if fast else conn.info.encoding
    # The PREPAREs go first, but after the undoing of a refused guess: in a transaction that
    # failed, nothing but a rollback runs (a PREPARE there would fail too).
    lead = 1 if head and body and body[0] == _UNDO_GUESS else 0
    query = ";\n".join(body[:lead] + head + body[lead:]).encode(encoding)
    try:
        pgconn.send_query(query)
        results = conn.wait(_pq_execute(pgconn))
    except psycopg.Error:
        conn.handoff_prepared = None
        raise
    out: list[list[Any]] = []
    failed = None
    tx = getattr(conn, "handoff_loader", None)
    for i, res in enumerate(results):
        preparing = lead <= i < lead + len(head)
        status = res.status
        if status == _FATAL_ERROR:
            failed = pgerr.error_from_result(res, encoding=encoding)
            if i < lead + len(head) or isinstance(failed, (pgerr.InvalidSqlStatementName,
                                                           pgerr.DuplicatePreparedStatement)):
                conn.handoff_prepared = None  # some exist, some not (or someone deallocated)
            # else every PREPARE at the head ran, and a rollback does not undo one
            break
        if preparing:
            continue
        if status == _TUPLES_OK:
            if tx is None:
                tx = conn.handoff_loader = psycopg.adapt.Transformer(conn)
            tx.set_pgresult(res)
            out.append(tx.load_rows(0, res.ntuples, tuple))
        else:
            out.append([])
    return out, failed


def _after_commit(results: list[list[Any]], batch: Sequence[tuple[str, Any]]) -> bool:
    """Whether a message that failed had run its COMMIT (the failure came after it)."""
    commit = max(i for i, (q, _) in enumerate(batch) if q == "COMMIT")
    return len(results) > commit


def _known_prepared(conn: Any) -> set[str] | None:
    """The statements this connection has prepared, or None (send them plainly) while that
    is not known and cannot be asked (inside a transaction)."""
    known = getattr(conn, "handoff_prepared", None)
    if known is None and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        known = {r[0] for r in conn.execute(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE 'handoff\\_%'")}
        conn.handoff_prepared = known
    return known


class _Rows:
    """One statement's rows, read like a cursor's."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


#: What _x returns while a write gathers its statements: there is no result to read yet.
_GATHERED = None


class _NeedsRead(Exception):
    """A guessed write (_guess) reached for the server while it was being made (a decision
    that reads a view, a hook that reads the run, a fork's parent): it is dropped, nothing
    sent, and the write goes the way that reads first."""


class _Guess(msgspec.Struct):
    """A write made before the first round trip from the head this store's last write to
    the run left (_guess): the statements that prove that head and write, how many events,
    the head they leave (its last write id filled in once the server gave the block), the
    fence, what the hooks returned, and the remembered head it was made from."""

    batch: list
    n: int
    new_head: Head
    fence: tuple
    out: Any
    known: tuple  # (head, highest lease, lease digest) the guess was made from


def _decode_steps(run_id: str, rows: Sequence[Sequence[Any]]) -> list[Step] | None:
    """Steps from (seq, type, recorded_us, payload, ..., actor) rows, or None when a payload does
    not decode to its type (the caller then reads the run the slow way, which says why)."""
    try:
        events = ev.decode_many([as_bytes(r[3]) for r in rows])
        if not all(_TAGS[type(e)] == r[1] for r, e in zip(rows, events)):
            return None
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError, UnicodeDecodeError, KeyError):
        return None
    return [Step(run_id, r[0], r[1], r[2], e, r[-1]) for r, e in zip(rows, events)]


class PostgresStore(PostgresValues, FoldingStore):
    """An EventStore in a PostgreSQL database (``postgresql://user@host:port/dbname``).

    One store object owns one connection and may be shared by threads; open one per
    process. ``busy_timeout_s`` is the lock timeout: how long a write waits for a run or
    for the ledger's tail before it gives up with StoreUnavailable.
    """

    backend = "postgresql"
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
        self.lock = threading.RLock()
        FoldingStore.__init__(self)
        self._txn = PostgresTransaction(self)
        self._views: Any = None
        self._in_txn = False
        self.writing = False  # inside a write transaction (a view read in it locks the views)
        self.exclusive = False  # inside a write_transaction (every other write excluded)
        self._views_locked = False
        self.gather: list[tuple[str, Any]] | None = None  # statements of a write's last round trip
        #: Each run's head as this store's last write or read under the run's lock left it:
        #: (head in write ids, highest lease, lease token digest). A write whose fold is
        #: cached at that head is guessed and sent in one round trip (_guess).
        self._heads: collections.OrderedDict[str, tuple[Head, int, str | None]] = collections.OrderedDict()
        self.fast = False  # making a guessed write: no statement may be sent
        self._undo_pending = False  # a refused guess waits to be undone (_UNDO_GUESS)
        self._guesses = [0, 0]  # guessed writes sent, refused (diagnostics)
        self._guessable = True  # no attached hook reads the position it is given (attach)
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
        try:
            conn = _GuardedConnection.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                application_name="handoff-ledger", client_encoding="UTF8",
            )
        except psycopg.Error as exc:
            raise _explain(exc, "connecting", self.path) from exc
        try:
            _require_utf8(conn, self.path)  # before anything is read or created
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
        except StoreUnavailable:
            conn.close()
            raise
        self._server_at = (int(server_us), (t0 + t1) // 2)
        conn.handoff_prepared = set()  # a new session has prepared nothing
        # psycopg's own automatic preparing is off: after a ROLLBACK or a DROP it clears
        # its statements with DEALLOCATE ALL, which would take the writes' (_multi) too.
        conn.prepare_threshold = None
        conn.handoff_literals = (conn.info.encoding == "utf-8" and
                                 conn.info.parameter_status("standard_conforming_strings") == "on")
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
        """Execute on the store's connection (inside whatever transaction is open); while a
        write gathers its second round trip (_commit_rows), gather instead."""
        if self.fast and (self.gather is None or sql.lstrip()[:6].upper() == "SELECT"):
            raise _NeedsRead(sql)
        if self.gather is not None:
            if sql.lstrip()[:6].upper() != "SELECT":
                self.gather.append((sql, args))
                return _GATHERED
            # A read inside the write (a hook that reads the run back): it must see what
            # was gathered, so that goes first, as one message of its own.
            self._send_gathered()
        if self._undo_pending:  # a refused guess: nothing runs in its transaction before its undoing
            self.ready().execute(_UNDO_GUESS)
            self._undo_pending = False
        return self.ready().execute(sql, args, binary=binary)

    def _send_gathered(self) -> None:
        batch = self.gather
        if batch:
            if self._undo_pending:
                batch.insert(0, (_UNDO_GUESS, None))
                self._undo_pending = False
            _multi(self.ready(), batch)
            del batch[:]

    @contextlib.contextmanager
    def mapped(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise _explain(exc, doing, self.path) from exc

    def _ensure_schema(self, may_create: bool) -> None:
        with self.lock, self.mapped("opening"):
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
            if meta.get("format") != FORMAT_NAME:
                raise NotALedger(f"{self.path} has a handoff_meta table but no handoff-ledger format mark")
            version = int(meta.get("schema_version", "0"))
            if version > PG_SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} was written by a newer handoff-ledger (schema {version}, this "
                    f"version reads up to {PG_SCHEMA_VERSION}); upgrade handoff-ledger"
                )
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
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_RUN_LOCK_NS,))
            if conn.execute("SELECT to_regclass('handoff_meta')").fetchone()[0] is not None:
                conn.execute("COMMIT")
                return
            for sql in _SCHEMA:
                conn.execute(sql)
            schema = conn.execute("SELECT current_schema()").fetchone()[0]
            conn.execute(seal_function(schema))
            conn.execute(queue_function(schema))
            conn.execute(begin_function())
            conn.execute(expect_function())
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
            self._begin("migrating the ledger schema", exclusive=True, seal=False)
            ok = False
            try:
                version = int(self.x("SELECT value FROM handoff_meta WHERE key='schema_version'").fetchone()[0])
                schema = self.x("SELECT current_schema()").fetchone()[0]
                while version < PG_SCHEMA_VERSION:
                    steps = MIGRATIONS.get(version)
                    if steps is None:
                        raise SchemaTooNew(f"no migration from schema {version} is known")
                    for sql in steps:
                        self.x(seal_function(schema) if sql == "{seal}" else
                                seal_function(schema).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
                                if sql == "{reseal}" else
                                queue_function(schema) if sql == "{queue}" else
                                queue_function(schema).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
                                if sql == "{requeue}" else
                                _or_replace(begin_function()) if sql == "{begin}" else
                                _or_replace(expect_function()) if sql == "{expect}" else sql)
                    version += 1
                self.x("UPDATE handoff_meta SET value=%s WHERE key='schema_version'", (str(version),))
                ok = True
            except psycopg.Error as exc:
                raise _explain(exc, "migrating the ledger schema", self.path) from exc
            finally:
                self._finish(ok, "migrating the ledger schema")

    # --- transactions ----------------------------------------------------------------

    def _begin(self, doing: str, *, exclusive: bool = False, seal: bool = True) -> None:
        """BEGIN a write. ``exclusive``: wait until no write is in flight and hold every
        ledger-wide lock to the commit (rebuilds, catch-up, imports, migrations), with the
        order sealed up to date first."""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        with self.mapped(doing):
            conn = self.ready()
            conn.execute("BEGIN")
            self._in_txn = True
            self.writing = True
            self.exclusive = exclusive
            try:
                if exclusive:
                    conn.execute(
                        "SELECT pg_advisory_xact_lock(%s, %s), pg_advisory_xact_lock(%s, %s), "
                        "pg_advisory_xact_lock(%s, %s)",
                        (_LEDGER_NS, _MAINTENANCE, _LEDGER_NS, _VIEWS, _LEDGER_NS, _SEAL),
                    )
                    if seal:
                        conn.execute("SELECT count(*) FROM handoff_seal(true, '{}')")
                else:
                    conn.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", (_LEDGER_NS, _MAINTENANCE))
            except BaseException:
                self._finish(False, doing)
                raise

    def _finish(self, ok: bool, doing: str) -> None:
        conn = self._conn
        if self._undo_pending:  # a refused guess's transaction wrote nothing: end it so
            ok, self._undo_pending = False, False
        self._in_txn = False
        self.writing = False
        self.exclusive = False
        self._views_locked = False
        if ok:
            try:
                cur = conn.execute("COMMIT")
            except psycopg.Error as exc:
                if conn.broken or conn.closed or isinstance(exc, psycopg.OperationalError):
                    raise self._unknown(doing, exc) from exc
                raise _explain(exc, doing, self.path) from exc
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

    def lock_views(self) -> None:
        """A view read inside a write: wait for every write keeping views to end, and keep
        new ones out until this one commits (an owner's load then counts only settled runs)."""
        if not self._views_locked:
            self.x("SELECT pg_advisory_xact_lock(%s, %s)", (_LEDGER_NS, _VIEWS))
            self._views_locked = True

    def _run_key(self, run_id: str) -> int:
        return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big", signed=True)

    def _lock_run(self, run_id: str) -> tuple[Head | None, int]:
        """Lock the run (also one that does not exist yet) and read its head."""
        self.x("SELECT pg_advisory_xact_lock(%s, %s)", (_RUN_LOCK_NS, self._run_key(run_id)))
        return self._head_locked(run_id, lock=True)

    def _head_locked(self, run_id: str, *, lock: bool = False) -> tuple[Head | None, int]:
        row = self.x(_HEAD_SELECT + (" FOR UPDATE" if lock else ""), (run_id,)).fetchone()
        return _head(row)

    @contextlib.contextmanager
    def write_transaction(self, doing: str) -> Iterator[PostgresTransaction]:
        """BEGIN with every write excluded (as under SQLite's write lock) ... COMMIT, or
        ROLLBACK on any exception."""
        with self.lock:
            self._begin(doing, exclusive=True)
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
        with self.lock:
            began = not self._in_txn
            try:
                if began:
                    with self.mapped("reading"):
                        self.ready().execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
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

    # --- sealing ---------------------------------------------------------------------

    def seal(self) -> int:
        """Give every committed event its ledger position now (writers do this themselves
        after each commit; a reader calls it when it finds events still waiting). Returns
        the last sealed position."""
        with self.lock, self.mapped("sealing the ledger order"):
            if self._in_txn:
                raise StoreUnavailable("seal() cannot run inside another transaction of this store")
            self.ready().execute("SELECT count(*) FROM handoff_seal(true, '{}')")
            return self.x("SELECT position FROM ledger_tail").fetchone()[0]

    def wait_for_events(self, after_position: int, timeout_s: float) -> int:
        """Sleep on the ledger's NOTIFY channel (a connection of its own, LISTENing), with
        a poll at least every second as the fallback: a lost notification only delays."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self.lock, self.mapped("waiting for events"):
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
        with self.lock, self.mapped("reading who wrote the events"):
            return dict(self.x(
                "SELECT o.position, e.db_role FROM ledger_order o JOIN events e ON e.id = o.event_id "
                "WHERE o.position BETWEEN %s AND %s", (first_position, last_position),
            ).fetchall())

    def db_role_counts(self, run_id: str | None = None) -> dict[str, int]:
        with self.lock, self.mapped("reading who wrote the events"):
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
        with self.lock, self.mapped("counting unsealed events"):
            return self.x("SELECT count(*) FROM unsealed").fetchone()[0]

    # --- writing ---------------------------------------------------------------------

    def _duplicate(self, run_id: str, key: str, digest: bytes, actor: str,
                   row: Sequence[Any] | None) -> tuple[int, int, list[int], list[int | None]] | None:
        """The earlier batch a repeated key names: (first seq, last seq, its write ids,
        their positions, None where one still waits to be sealed)."""
        if row is None:
            return None
        seq, first_id, stored, size, by, ids, positions = row
        plan.check_repeat(run_id, key, digest, actor, as_bytes(stored), by, seq)
        return seq, seq + size - 1, list(ids), list(positions)

    def _positions_of(self, ids: Sequence[int]) -> tuple[int, ...]:
        """The ledger positions of these write ids, sealing them first if they still wait
        (outside any transaction)."""
        rows = dict(self.x("SELECT event_id, event_position FROM handoff_seal(true, %s)", (list(ids),)).fetchall())
        return tuple(rows[i] for i in ids if i in rows)

    def _ids(self, base: int, n: int) -> list[int]:
        """Write ids for a batch of ``n`` events: the block taken with the write's first
        round trip, and more blocks for a batch larger than one (rare: a long stream)."""
        ids = list(range(base, base + min(n, ID_BLOCK)))
        if n > ID_BLOCK:
            blocks = -(-(n - ID_BLOCK) // ID_BLOCK)
            for (b,) in self.x("SELECT nextval('events_id_seq') FROM generate_series(1, %s)", (blocks,)):
                ids.extend(range(b, b + ID_BLOCK))
            ids = ids[:n]
        return ids

    def _rows(
        self, run_id: str, head: Head | None, max_lease: int, batch: Sequence[ev.Event],
        encoded: list[tuple[str, bytes]], actor: str, lease: int | None, key: str | None,
        digest: bytes | None, ids: list[int],
    ) -> tuple[list[tuple[Any, ...]], Head, tuple[int, str | None, str | None, bool], list[Recorded]]:
        """The batch stamped (plan.stamp) as rows under its write ids, the new head and what
        the fold sees (Recorded.position is the write id until the order is sealed)."""
        done = plan.stamp(run_id, head, max_lease, batch, encoded, actor, lease, key, digest, self._clock(),
                          lambda parent: self._head_locked(parent)[0])
        now, n, viewed = done.now, done.size, self._keeps_views
        rows: list[tuple[Any, ...]] = []
        written: list[Recorded] = []
        for i, (seq, tag, k, d, payload, prev, h) in enumerate(done.events):
            rows.append((ids[i], run_id, seq, tag, actor, lease, k, d, n, now, ev.SCHEMA_VERSION, payload, prev,
                         h, viewed))
            written.append(Recorded(run_id, seq, ids[i], tag, actor, lease, k, now, ev.SCHEMA_VERSION,
                                    payload, prev, h))
        fence = done.fence
        first = head.first_position if head else ids[0]
        new_head = Head(run_id, done.last_seq, done.last_hash, fence.lease, fence.holder, first, ids[-1])
        return rows, new_head, (fence.max_lease, fence.digest, None, fence.digest_moved), written

    def _write_statements(self, rows: list[tuple[Any, ...]], new_head: Head,
                          fence: tuple[int, str | None, str | None, bool],
                          hooks: Callable[[], Any]) -> tuple[Any, list[tuple[str, Any]]]:
        """The statements that write: insert (its trigger seals it when nobody else is
        sealing), move the head, keep the views (the hooks' statements are gathered, not
        sent), read where the insert was sealed, COMMIT. Returns what the hooks returned."""
        max_lease, token_digest, _, digest_moved = fence
        run_id = new_head.run_id
        batch: list[tuple[str, Any]] = []
        if len(rows) == 1:
            batch.append((_INSERT, rows[0]))
        else:
            first = rows[0]
            cols = list(zip(*rows))
            batch.append((_INSERT_MANY, (first[1], first[4], first[5], first[8], first[9], first[10], first[14],
                                         list(cols[0]), list(cols[2]), list(cols[3]), list(cols[6]),
                                         list(cols[7]), list(cols[11]), list(cols[12]), list(cols[13]))))
        if new_head.last_seq > len(rows):  # the run had a head before this write
            batch.append((_MOVE_HEAD, (new_head.last_seq, new_head.last_hash, new_head.lease,
                                       new_head.lease_holder, max_lease, new_head.last_position, run_id)))
        else:
            batch.append((_UPSERT_HEAD, (run_id, new_head.last_seq, new_head.last_hash, new_head.lease,
                                         new_head.lease_holder, max_lease, new_head.first_position,
                                         new_head.last_position)))
        if digest_moved:
            batch.append((_MOVE_DIGEST, (token_digest, run_id)))
        if self._hooks:
            batch.append((_LOCK_VIEWS_SHARED, (_LEDGER_NS, _VIEWS)))
        insert = batch[0]
        self.gather = batch
        try:
            out = hooks()  # the views' statements join the batch (they read no result)
        finally:
            self.gather = None
        if batch and batch[0] is insert:
            # The insert seals (QUEUE_FUNCTION) and holds the seal lock to the COMMIT: it
            # goes last, so that other writers wait for that lock the least. (A hook that
            # read the run sent it first, with what was gathered before its read.)
            batch.append(batch.pop(0))
        batch.append((_SEALED_AT, ()))
        batch.append(("COMMIT", None))
        batch.append((_SEAL_IF_QUEUED, {"ids": [r[0] for r in rows]}))
        return out, batch

    def _commit_rows(self, conn: Any, rows: list[tuple[Any, ...]], new_head: Head,
                     fence: tuple[int, str | None, str | None, bool], hooks: Callable[[], Any],
                     doing: str) -> tuple[Any, list[list[Any]], int]:
        """The write's second round trip: ONE message (a simple query of several statements,
        parameters bound here): _write_statements, after the undoing of a refused guess
        when there was one (_write).

        One message, not a pipeline of several: the server runs none of it before it has
        all of it, so a client that stalls or is cut off mid-send leaves its session idle
        in the transaction the first round trip opened, which the server ends after the
        idle timeout, freeing the run's lock (a pipeline would leave it 'active', waiting
        for the rest, holding every lock with no timeout). Returns what the hooks returned
        each statement's rows and how many statements were sent. A failure before the
        COMMIT, or at it, leaves nothing written (typed error); a lost connection, an
        unknown outcome; a failure after it (the seal after the commit), a committed write."""
        out, batch = self._write_statements(rows, new_head, fence, hooks)
        if self._undo_pending:
            batch.insert(0, (_UNDO_GUESS, None))
            self._undo_pending = False
        try:
            results, failed = _send(conn, batch)
        except psycopg.Error as exc:  # the message may have run to its COMMIT, or not at all
            raise self._unknown(doing, exc) from exc
        finally:
            self._in_txn = self.writing = False
        if failed is not None and not _after_commit(results, batch):
            if conn.closed or conn.broken:
                raise self._unknown(doing, failed) from failed
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise _explain(failed, doing, self.path) from failed
        return out, results, len(batch)

    def _positions_after(self, results: list[list[Any]], n: int, ids: Sequence[int]) -> tuple[int, ...] | None:
        """The committed write's positions (its message of ``n`` statements ended with
        _SEALED_AT, COMMIT, _SEAL_IF_QUEUED): where its insert sealed it, else where the
        seal after the commit put it (another session was sealing at its insert). None
        when that could not be had (a lock timeout): the write is committed and waits in
        the queue for the next writer or reader to seal it."""
        got = results[n - 3][0][0] if len(results) > n - 3 and results[n - 3] else None
        first_id, _, first = (got or "").partition(":")
        # Counted on only when it names this write's first id (not a value the session
        # carried over) and the ids are one block: nothing else was sealed between them.
        if first and first_id == str(ids[0]) and ids[-1] - ids[0] == len(ids) - 1:
            return tuple(range(int(first), int(first) + len(ids)))
        if len(results) < n:
            return None  # the seal after the commit failed
        sealed = dict(results[n - 1])
        if len(sealed) < len(ids):  # sealed in the insert, or by another session since: read them
            try:
                sealed = dict(self.x("SELECT event_id, position FROM ledger_order o "
                                      "WHERE event_id = ANY(%s)", (list(ids),)).fetchall())
            except psycopg.Error:
                return None
        return tuple(sealed[i] for i in ids) if all(i in sealed for i in ids) else None

    def _guess(
        self, run_id: str, aggregate: Aggregate[Any] | None, actor: str, idempotency_key: str | None,
        digest: bytes | None, token: LeaseToken | None, planner: Callable[..., Any],
    ) -> _Guess | None:
        """The write as it would be if the run still stood where this store's last write
        to it left it (a worker reporting on the run it holds, command after command):
        fencing, the decision, the rows and the views' statements, made with no read.
        _write sends them in its first message, behind a savepoint and the server's proof
        that the head is still that one (handoff_expect_head).

        None when there is nothing to guess from (no head remembered, no fold cached at
        it), or when the guess would need the server: a decision, a check or a hook that
        reads; a refusal (refusals are given from the head read under the lock, never
        from what this store remembered); a result with nothing to write (a repeated key
        is answered 'duplicate' first); a batch larger than one block of ids; a fold that
        is not lean; a hook that reads the position it is given (attach)."""
        known = self._heads.get(run_id)
        if known is None or not self._guessable or (aggregate is not None and not aggregate.lean):
            # (a fold that is not lean reads the run's events after a refused guess
            # with a read of its own: a round trip the write without a guess does not pay)
            return None
        head, max_lease, lease_digest = known
        state: Any = None
        if aggregate is not None:
            cached = self._cache.get((id(aggregate), run_id))
            if (cached is None or cached[0] is not aggregate or cached[1] != head.last_seq
                    or cached[2] != head.last_hash):
                return None
            state = cached[3]
        conn = self.ready()
        if not getattr(conn, "handoff_literals", False) or _known_prepared(conn) is None:
            return None  # the ids are SQL expressions, which only the store's own literals carry
        self.fast = True
        try:
            if token is not None:
                plan.check_token(run_id, head, max_lease, token, lease_digest)
            planned = planner(head, max_lease, state)
            if isinstance(planned, AppendResult):
                return None
            events, lease_n = planned
            encoded = encode_events(events, self.max_payload)
            if len(encoded) > ID_BLOCK:
                return None
            ids = [_Sql(_CURRVAL if i == 0 else f"{_CURRVAL}+{i}") for i in range(len(encoded))]
            rows, new_head, fence, written = self._rows(
                run_id, head, max_lease, events, encoded, actor, lease_n, idempotency_key, digest, ids,
            )

            def hooks() -> Any:
                new_state, folds = _MISSING, []
                if aggregate is not None:
                    new_state = aggregate.evolve_all(state, written)
                    folds = [(aggregate, new_state)]
                return new_state, self._run_hooks(run_id, new_head, folds)

            out, batch = self._write_statements(rows, new_head, fence, hooks)
        except Exception:  # noqa: BLE001 - a read, a refusal, or the caller's own signal
            self._settle(False)  # (a preview's): the write decides it from what the server says
            return None
        finally:
            self.fast = False
        batch.insert(0, (_EXPECT_HEAD, (run_id, head.last_seq, head.last_hash)))
        return _Guess(batch, len(rows), new_head, fence, out, known)

    def _know_head(self, head: Head, fence: tuple[int, str | None, str | None, bool],
                   digest_before: str | None) -> None:
        """Remember the head a committed write left (the next write's guess starts there)."""
        max_lease, token_digest, _, digest_moved = fence
        key = head.run_id
        self._heads[key] = (head, max_lease, token_digest if digest_moved else digest_before)
        self._heads.move_to_end(key)
        while len(self._heads) > 4096:
            self._heads.popitem(last=False)

    def _write(
        self, run_id: str, aggregate: Aggregate[Any] | None, actor: str, idempotency_key: str | None,
        digest: bytes | None, token: LeaseToken | None, planner: Callable[..., Any], doing: str,
    ) -> tuple[AppendResult, Any]:
        """One write in at most two round trips. The first: BEGIN, the ledger's shared lock,
        the run's lock and a block of write ids (handoff_begin_write), the run's head, the
        key's earlier batch, and the run's events since the cached fold. Then, with no
        round trip: fencing, the fold, ``plan`` (it returns the events to write and the
        lease they go under, or a finished result). The second: _commit_rows.

        When this store guessed the write (_guess: its last write to the run left the head
        and the fold), the first message carries the whole guessed write too, behind a
        savepoint: one round trip when the head is still that one. When it is not (another
        writer, a taken key), the server refuses the guessed part before it writes
        anything, the savepoint undoes it, and the write goes on from what the first part
        read, exactly as without a guess: still two round trips."""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        conn = self.ready()
        lean = aggregate is not None and aggregate.lean
        cached = self._cache.get((id(aggregate), run_id)) if aggregate is not None else None
        after = cached[1] if cached is not None and cached[0] is aggregate else 0
        guess = self._guess(run_id, aggregate, actor, idempotency_key, digest, token, planner)
        done = False
        try:
            with self.mapped(doing):
                # With a guess, the head and the steps are read only if the head is not
                # the guessed one (each read's condition; the run's lock keeps it so until
                # the guess's proof): a guess that holds reads nothing it already knows.
                moved = (guess.known[0].last_seq, guess.known[0].last_hash) if guess is not None else None
                batch: list[tuple[str, Any]] = [
                    ("BEGIN", None),
                    (_BEGIN_WRITE, (self._run_key(run_id),)),
                    (_HEAD_IF_MOVED, (run_id, *moved)) if moved else (_HEAD_FOR_UPDATE, (run_id,)),
                ]
                if idempotency_key:
                    batch.append((_DUPLICATE, (run_id, idempotency_key)))
                if lean:
                    batch.append((_STEPS_IF_MOVED, (run_id, after, run_id, *moved)) if moved
                                 else (_STEPS_FROM, (run_id, after)))
                self._in_txn = self.writing = True
                same_head = False
                if guess is None:
                    got = iter(_multi(conn, batch)[1:])
                else:
                    core = len(batch)
                    self._guesses[0] += 1
                    full = batch + [(_SAVE_GUESS, None)] + guess.batch
                    try:
                        results, failed = _send(conn, full)
                    except psycopg.Error as exc:  # it may have run to its COMMIT, or not at all
                        raise self._unknown(doing, exc) from exc
                    if failed is None or _after_commit(results, full):
                        done = True
                        return self._guessed(run_id, aggregate, guess, results, len(full))
                    self._heads.pop(run_id, None)
                    self._guesses[1] += 1
                    self._settle(False)
                    if conn.closed or conn.broken:
                        raise self._unknown(doing, failed) from failed
                    # results: the rows of the statements before the one that failed. Up
                    # to the savepoint: as any first message's failure. The proof (just
                    # after it) refused with HL409: the head moved, and the reads above
                    # returned it. Anything later: the proof passed, the head is the
                    # guessed one (a taken key, say).
                    proof = core + 1
                    if (len(results) < proof or (len(results) == proof and failed.sqlstate != HEAD_MOVED)
                            or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE):
                        raise failed  # (IDLE: the COMMIT itself failed; nothing to go on in)
                    same_head = len(results) > proof
                    self._undo_pending = True  # the guess is undone in the next message
                    got = iter(results[1:core])
                c_id, c_head = _Rows(next(got)), _Rows(next(got))
                c_dup = _Rows(next(got)) if idempotency_key else None
                c_steps = _Rows(next(got)) if lean else None
                if same_head:
                    head, max_lease, lease_digest = guess.known  # type: ignore[union-attr]
                else:
                    head, max_lease, lease_digest = _head(c_head.fetchone(), digest=True)
                dup = (self._duplicate(run_id, idempotency_key, digest, actor, c_dup.fetchone())  # type: ignore[arg-type]
                       if c_dup is not None else None)
                if dup is not None:  # nothing to write: end the transaction (the second round trip)
                    state = None
                    if aggregate is not None:
                        state = (self._state_from(run_id, aggregate, head, cached, c_steps.fetchall())
                                 if c_steps is not None else _MISSING)
                    self._finish(True, doing)
                    done = True
                    if state is _MISSING:
                        state = self._state_locked(run_id, aggregate, head)  # type: ignore[arg-type]
                    positions = (tuple(dup[3]) if None not in dup[3] else self._positions_of(dup[2]))
                    return AppendResult(run_id, "duplicate", dup[0], dup[1], positions), state
                if token is not None:
                    plan.check_token(run_id, head, max_lease, token, lease_digest)
                base = c_id.fetchone()[0]
                state: Any = None
                if aggregate is not None:
                    state = (self._state_from(run_id, aggregate, head, cached, c_steps.fetchall())
                             if c_steps is not None else _MISSING)
                    if state is _MISSING:
                        state = self._state_locked(run_id, aggregate, head)
                planned = planner(head, max_lease, state)
                if isinstance(planned, AppendResult):
                    self._finish(True, doing)
                    done = True
                    return planned, state
                events, lease_n = planned
                encoded = encode_events(events, self.max_payload)
                ids = self._ids(base, len(encoded))
                rows, new_head, fence, written = self._rows(
                    run_id, head, max_lease, events, encoded, actor, lease_n, idempotency_key, digest, ids,
                )
                forking = head is None and isinstance(events[0], ev.RunForked)

                def hooks() -> Any:
                    if aggregate is not None and not forking:
                        new_state = aggregate.evolve_all(state, written)
                        known = [(aggregate, new_state)]
                    else:
                        new_state, known = _MISSING, []
                    folded = self._run_hooks(run_id, new_head, known)
                    return new_state, folded

                (new_state, folded), results, n = self._commit_rows(conn, rows, new_head, fence, hooks, doing)
                done = True
                self._know_head(new_head, fence, lease_digest)
                positions = self._positions_after(results, n, ids)
        finally:
            self.gather = None
            if not done:
                self._settle(False)
                self._in_txn = self.writing = False
                self._undo_pending = False
                if not (conn.closed or conn.broken) and \
                        conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
        return self._committed(run_id, aggregate, new_head, folded, new_state, len(rows), positions)

    def _guessed(self, run_id: str, aggregate: Aggregate[Any] | None, guess: _Guess,
                 results: list[list[Any]], n: int) -> tuple[AppendResult, Any]:
        """A guessed write that committed in its one round trip: its ids are the block the
        server handed out (the first message's second statement), its positions where its
        insert was sealed."""
        self._in_txn = self.writing = False
        base = results[1][0][0]
        ids = [base + i for i in range(guess.n)]
        new_head = msgspec.structs.replace(guess.new_head, last_position=ids[-1])
        self._know_head(new_head, guess.fence, guess.known[2])
        positions = self._positions_after(results, n, ids)
        new_state, folded = guess.out
        return self._committed(run_id, aggregate, new_head, folded, new_state, guess.n, positions)

    def _settle(self, committed: bool) -> None:
        """Tell the view store whether the rows the last gathered write sent are now the
        server's (ledger/postgres/views.py: a later guessed write sends no statement for rows that
        are still equal)."""
        if self._views is not None:
            self._views.settled(committed)

    def _committed(self, run_id: str, aggregate: Aggregate[Any] | None, new_head: Head,
                   folded: tuple[Head | None, list[tuple[Aggregate[Any], Any]]], new_state: Any,
                   n: int, positions: tuple[int, ...] | None) -> tuple[AppendResult, Any]:
        self._settle(True)
        if folded[0] is not None:
            self._remember_all(run_id, (new_head, folded[1]))
        if aggregate is not None:
            if new_state is _MISSING:
                new_state = next((st for agg, st in folded[1] if agg is aggregate), _MISSING)
            if new_state is _MISSING:
                new_state = self._state_locked(run_id, aggregate, new_head)
            self._remember(aggregate, run_id, new_head.last_seq, new_head.last_hash, new_state)
        first = new_head.last_seq - n + 1
        return AppendResult(run_id, "committed", first, new_head.last_seq, positions or ()), new_state

    def _state_from(self, run_id: str, aggregate: Aggregate[S], head: Head | None,
                    cached: tuple[Any, int, bytes, Any] | None, rows: list[Sequence[Any]]) -> Any:
        """The fold at the locked head from the steps the first round trip brought, or
        _MISSING when they are not enough (a fork's lineage, a cached fold off the chain)."""
        if head is None:
            return aggregate.initial(run_id)
        if cached is not None and cached[0] is aggregate and cached[1] > 0:
            if not rows or rows[0][0] != cached[1] or as_bytes(rows[0][4]) != cached[2]:
                return _MISSING
            state, rows = cached[3], rows[1:]
        else:
            if rows and rows[0][1] == "run_forked":
                return _MISSING
            state = aggregate.initial(run_id)
        if not rows:
            return state if (cached is not None and cached[1] == head.last_seq) else _MISSING
        if rows[-1][0] != head.last_seq:
            return _MISSING
        steps = _decode_steps(run_id, rows)
        if steps is None:
            return _MISSING
        return aggregate.evolve_all(state, steps)

    def append(
        self, run_id: str, events: Sequence[ev.Event], *, actor: Actor,
        expected_seq: int | None = None, lease: str | None = None, idempotency_key: str | None = None,
    ) -> AppendResult:
        # Checked and encoded before any round trip.
        req = plan.append_request(run_id, events, actor=actor, expected_seq=expected_seq, lease=lease,
                                  key=idempotency_key, max_payload=self.max_payload)

        def decide(head: Head | None, max_lease: int, state: Any) -> Any:
            plan.check_fence(run_id, head, req.expected_seq, None)
            return req.events, req.lease

        # With hooks attached, fold for the first of them in the same round trips (its
        # steps come with the first one), so the hooks need no read of their own.
        folded_for = self._hooks[0][0] if self._hooks else None
        with self.lock:
            result, _ = self._write_resent(run_id, folded_for, req.actor, req.key, req.digest, req.token, decide,
                                           "appending")
        return result

    def execute(
        self, run_id: str, aggregate: Aggregate[S], decide: Callable[[S, Head | None], Decision], *,
        actor: Actor, idempotency_key: str | None = None, digest_of: bytes | None = None,
        lease: str | None = None,
    ) -> tuple[AppendResult, S]:
        req = plan.execute_request(run_id, actor=actor, key=idempotency_key, lease=lease, digest_of=digest_of)

        def planned(head: Head | None, max_lease: int, state: Any) -> Any:
            decision = decide(state, head)
            if not decision.events:
                return plan.unchanged(run_id, head)
            plan.check_decision(run_id, decision, req.token, head, max_lease)
            return decision.events, decision.lease

        with self.lock:
            return self._write_resent(run_id, aggregate, req.actor, req.key, req.digest, req.token, planned,
                                      "committing a command")

    def _write_resent(self, *args: Any) -> tuple[AppendResult, Any]:
        """_write, sent once more when the session lost the statements it had prepared.

        A pooler in transaction mode hands each transaction whichever server session is
        free, and anything may run ``DEALLOCATE ALL``: an ``EXECUTE`` then names a
        statement the session does not have (or a ``PREPARE`` one it already has, when the
        pooler hands over a used session). The server refuses it before the write's
        COMMIT (a failure after the COMMIT is reported as committed, never raised), so
        nothing was written and the whole write, its fencing included, can run again; the
        connection has forgotten what it prepared and prepares again in that same message.
        """
        try:
            return self._write(*args)
        except StoreUnavailable as exc:
            if pgerr is None or not isinstance(
                    exc.__cause__, (pgerr.InvalidSqlStatementName, pgerr.DuplicatePreparedStatement)):
                raise
        return self._write(*args)

    # --- hooks and the fold cache ----------------------------------------------------

    def attach(self, aggregate: Aggregate[Any], hook: Callable[..., None]) -> None:
        super().attach(aggregate, hook)
        # A guessed write knows its write ids only on the server (_Sql): a hook that reads
        # the position it is given turns guessing off for this store.
        self._guessable = self._guessable and not reads_position(hook)

    # --- reading ---------------------------------------------------------------------

    def _hash_at(self, run_id: str, seq: int) -> bytes | None:
        row = self.x("SELECT hash FROM events WHERE run_id=%s AND seq=%s", (run_id, seq)).fetchone()
        return None if row is None else as_bytes(row[0])

    @contextlib.contextmanager
    def _reading(self, doing: str = "reading") -> Iterator[None]:
        with self.lock, self.mapped(doing):
            yield

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

    def _steps_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Step]:
        sql = "SELECT seq, type, recorded_us, payload, actor FROM events WHERE run_id=%s AND seq>%s"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=%s"
            args.append(until_seq)
        rows = self.x(sql + " ORDER BY seq", args).fetchall()
        steps = _decode_steps(run_id, rows)
        if steps is None:
            events = [rec.event for rec in self._read_run_page(run_id, after_seq, until_seq)]
            steps = [Step(run_id, seq, type_, at_us, event, actor) for (seq, type_, at_us, _, actor), event in zip(rows, events)]
        return steps

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
            with self.lock, self.mapped("reading"):
                page = self._read_run_page(run_id, cursor, stop)
                if not self._in_txn and any(r.position == 0 for r in page):
                    self._seal_quietly()
                    page = self._read_run_page(run_id, cursor, stop)
            yield from page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def read_all(self, *, after_position: int = 0, until_position: int | None = None,
                 page: int = READ_PAGE) -> Iterator[Recorded]:
        check_seq(after_position, "after_position")
        if until_position is not None:
            check_seq(until_position, "until_position")
        check_seq(page, "page", low=1, high=1_000_000)
        return self._iter_all(after_position, until_position, page)

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
            with self.lock, self.mapped("reading"):
                if cursor >= tail:
                    tail, waiting = self.x(_TAIL_AND_QUEUE).fetchone()
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
                rows = self.x(_PAGE, {"after": cursor, "stop": stop}, binary=True).fetchall()
            rows.sort(key=_POSITION)
            yield from itertools.starmap(Recorded, rows)
            cursor = stop

    def read_for_export(self, run_ids: Sequence[str] | None = None) -> Iterator[tuple[Recorded, bytes | None, int]]:
        wanted = None if run_ids is None else set(run_ids)
        cursor = 0
        with self.lock, self.mapped("exporting"):
            if not self._in_txn:
                self._seal_quietly()
        while True:
            with self.lock, self.mapped("exporting"):
                rows = self.x(
                    f"SELECT {_SEALED_COLUMNS}, e.idem_digest, e.batch_size FROM ledger_order o "
                    "JOIN events e ON e.id = o.event_id WHERE o.position>%s "
                    "ORDER BY o.position LIMIT %s", (cursor, PAGE),
                ).fetchall()
            if not rows:
                return
            for r in rows:
                if wanted is None or r[0] in wanted:
                    yield recorded_row(r), as_bytes(r[12]), r[13]
            cursor = rows[-1][2]

    def head(self, run_id: str) -> Head | None:
        check_run_id(run_id)
        with self.lock, self.mapped("reading a run's head"):
            return self._public_head(run_id)

    def _public_head(self, run_id: str) -> Head | None:
        row = self.x(_PUBLIC_HEAD + " WHERE h.run_id=%s", (run_id,)).fetchone()
        if row is not None and not row[6] and not self._in_txn:
            self._seal_quietly()
            row = self.x(_PUBLIC_HEAD + " WHERE h.run_id=%s", (run_id,)).fetchone()
        return None if row is None else Head(row[0], row[1], as_bytes(row[2]), row[3], row[4], row[5], row[6])

    def list_runs(self, *, prefix: str | None = None) -> Iterator[Head]:
        return self.heads_in_order(prefix, public=True)

    def heads_in_order(self, prefix: str | None, *, public: bool) -> Iterator[Head]:
        """Heads in the order runs began; ``public``: spans in ledger positions (sealing
        first what still waits), else in write ids (verify compares those with the log)."""
        if public and not self._in_txn:
            with self.lock, self.mapped("listing runs"):
                if self.x("SELECT EXISTS (SELECT 1 FROM unsealed)").fetchone()[0]:
                    self._seal_quietly()
        sql = (_PUBLIC_HEAD if public else
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
            with self.lock, self.mapped("listing runs"):
                rows = self.x(q, [*args, PAGE]).fetchall()
            for r in rows:
                yield Head(r[1], r[2], as_bytes(r[3]), r[4], r[5], r[6], r[7])
            if len(rows) < PAGE:
                return
            cursor = (rows[-1][0], rows[-1][1])

    def count_runs(self) -> int:
        with self.lock, self.mapped("counting runs"):
            return self.x("SELECT count(*) FROM heads").fetchone()[0]

    def last_position(self) -> int:
        with self.lock, self.mapped("reading the last position"):
            return self.x("SELECT position FROM ledger_tail").fetchone()[0]

    # --- import ----------------------------------------------------------------------

    def import_records(
        self, items: Iterable[tuple[Recorded, bytes | None, int]], *,
        aggregate: Aggregate[Any] | None = None,
        admit: Callable[[Any, Recorded, ev.Event], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        """Insert exported events verbatim, all or nothing (ledger/importing.py), inside a
        write transaction that excludes every other write and holds the seal lock: imported
        events take the next positions after the sealed tail, with their write ids drawn
        from the ledger's sequence."""
        with self.lock:
            self._begin("importing", exclusive=True)
            ok = False
            try:
                # The import gives its events their positions itself: the insert trigger
                # only queues them (QUEUE_FUNCTION).
                self.x("SELECT set_config('handoff.importing', 'on', true)")
                self._free_ids: list[int] = []
                counts, touched = run_import(self, items, aggregate, admit, before_commit)
                ok = True
            except psycopg.Error as exc:
                raise _explain(exc, "importing", self.path) from exc
            finally:
                self._finish(ok, "committing an import")
        for run_id, folded in touched:
            self._remember_all(run_id, folded)
        return counts

    def _import_tail(self) -> tuple[int, bytes]:
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
                cur.executemany(_INSERT, events)
                cur.executemany("INSERT INTO ledger_order (position, event_id, global_hash) VALUES (%s,%s,%s)",
                                order)
            for h in heads:
                f = h.fence
                cur.execute(_UPSERT_HEAD, (h.run_id, h.seq, h.hash, f.lease, f.holder, f.max_lease,
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
        from .verify import verify_snapshot

        with self.read_transaction():
            with self.mapped("verifying"):
                return verify_snapshot(self, run_id, progress)

    def trigger_problems(self) -> list[Problem]:
        have = {
            name: (defn, enabled)
            for name, defn, enabled in self.x(
                "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t "
                "WHERE t.tgrelid IN ('events'::regclass, 'ledger_order'::regclass) AND NOT t.tgisinternal"
            )
        }
        schema = self.x("SELECT current_schema()").fetchone()[0]
        have = {n: (d.replace(f" ON {schema}.events ", " ON events ")
                    .replace(f" ON {schema}.ledger_order ", " ON ledger_order ").replace(f'"{schema}".', ""), e)
                for n, (d, e) in have.items()}
        out = []
        advice = ("Someone changed the database behind the store; check the log against a head "
                  "digest kept elsewhere, and restore from a backup")
        for name, sql in {**APPEND_ONLY_TRIGGERS, **ORDER_TRIGGERS, **ROLE_TRIGGERS, **QUEUE_TRIGGERS}.items():
            if name not in have:
                what = ("events can be changed or deleted without any error" if name in APPEND_ONLY_TRIGGERS
                        else "sealed positions can be moved or deleted without any error" if name in ORDER_TRIGGERS
                        else "new events are no longer queued for a position" if name in QUEUE_TRIGGERS
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
        definer = {"handoff_seal", "handoff_queue"}
        for fn, create in (("handoff_refuse_change", REFUSE_FUNCTION), ("handoff_stamp_role", STAMP_FUNCTION),
                           ("handoff_seal", seal_function(schema)), ("handoff_queue", queue_function(schema)),
                           ("handoff_begin_write", begin_function()),
                           ("handoff_expect_head", expect_function())):
            row = self.x("SELECT prosrc, prosecdef, proconfig FROM pg_proc WHERE proname = %s "
                          "AND pronamespace = current_schema()::regnamespace", (fn,)).fetchone()
            pinned = row is not None and (fn not in definer or (
                row[1] and any(c.startswith("search_path=") for c in (row[2] or []))))
            if row is None or _norm(row[0]) != _norm(create.split("$$")[1]) or not pinned:
                out.append(Problem("trigger_altered", None, None, None,
                                   f"the function {fn}, which the ledger's triggers and writes call, was changed or "
                                   f"dropped. {advice}"))
        return out

    def append_only_problems(self) -> list[Problem]:
        with self.lock, self.mapped("reading the triggers"):
            return self.trigger_problems()

    def ledger_head(self) -> tuple[int, bytes]:
        with self.lock, self.mapped("reading the ledger's head"):
            row = self.x("SELECT position, global_hash FROM ledger_tail").fetchone()
        return row[0], as_bytes(row[1])

    def global_hash_at(self, position: int) -> bytes | None:
        check_seq(position, "position")
        if position == 0:
            return None
        with self.lock, self.mapped("reading the ledger-wide chain"):
            row = self.x("SELECT global_hash FROM ledger_order WHERE position=%s", (position,)).fetchone()
        return None if row is None else as_bytes(row[0])

    def backup_to(self, path: str) -> tuple[int, bytes, int]:
        """A consistent copy of the whole ledger into the new SQLite file ``path``: one
        snapshot of this database, imported there verbatim (positions and both chains
        carry over, so the copy's head digest is this ledger's)."""
        self.seal()
        return copy_to_file(self, path)

    # --- the rest of the interface ---------------------------------------------------

    def schema_name(self) -> str:
        """The database schema the ledger lives in (the session's current schema)."""
        with self.lock, self.mapped("reading the schema name"):
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
            from .views import PostgresViewStore

            self._views = PostgresViewStore(self)
        return self._views

    def diagnostics(self) -> dict[str, Any]:
        with self.lock, self.mapped("reading the server's settings"):
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
            # Writes this process sent in one round trip, and how many of them the server
            # refused (another writer had moved the run: each then took two).
            "guessed_writes": {"sent": self._guesses[0], "refused": self._guesses[1]},
        }

    def close(self) -> None:
        with self.lock:
            for conn in (self._conn, self._listener):
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()


def _norm(sql: str) -> str:
    return " ".join(sql.replace(";", " ").split()).lower()


class PostgresTransaction(StoreTransaction):
    """The handle write_transaction, read_transaction and inline hooks receive."""

    __slots__ = ()

    def head(self, run_id: str) -> Head | None:
        store = self._store
        if store.writing and not store.exclusive:
            return store._head_locked(run_id)[0]  # inside a write: its span in write ids, as its hooks see it
        return store._public_head(run_id)

    def runs_since(self, position: int) -> list[str]:
        """Runs with events after a write id (the views' cursor on this backend)."""
        return [r[0] for r in self._store.x(_RUNS_SINCE, (position,))]

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


def rebuild_refusal(store: PostgresStore) -> str | None:
    """Why this session may not rebuild projections (None if it may): a rebuild creates
    shadow tables and drops and renames the old ones, which needs CREATE on the schema
    and ownership of the view tables."""
    row = store.x(
        "SELECT current_user, current_schema(), has_schema_privilege(current_schema(), 'CREATE'), "
        "(SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() "
        " AND tablename <> ALL(%s) AND NOT pg_has_role(tableowner, 'USAGE'))",
        (list(LEDGER_TABLES),),
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
