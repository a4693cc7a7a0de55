"""A PostgreSQL ledger's connection: opened, guarded against a silent server, and its
errors mapped to the library's own, in one place."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

from ..errors import LedgerError, StoreUnavailable
from .postgres_schema import ident

try:  # the driver is an optional extra: pip install '.[postgres]' from the checkout
    import psycopg
    from psycopg import errors as pgerr
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    pgerr = None  # type: ignore[assignment]


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
            start = time.monotonic()
            try:
                return super().wait(gen, interval=interval, timeout=limit)
            except psycopg.OperationalError:
                # psycopg gives up the wait with an OperationalError of its own once the
                # limit has passed (the session is mid-protocol: it cannot be reused).
                if limit is None or time.monotonic() - start < limit:
                    raise
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


def _refused(where: str, detail: str, *, cause: str) -> StoreUnavailable:
    """The server would not let this address in, whether it said so by SQLSTATE or in text."""
    return StoreUnavailable(
        f"PostgreSQL refused the connection to {where} ({detail}); check the database name, "
        "the user and the password in the address",
        cause=cause,
    )


def _out_of_resources(where: str, detail: str, doing: str, *, cause: str, setting: str = "") -> StoreUnavailable:
    """The server is full (disk, memory, connections), whether it said so by SQLSTATE or in text."""
    return StoreUnavailable(
        f"the PostgreSQL server at {where} is out of resources ({detail}) while {doing}; "
        f"nothing was written. Retry later, or ask its operator{setting}",
        cause=cause,
    )


def explain(exc: BaseException, doing: str, where: str) -> LedgerError:
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
        return _refused(where, text, cause=text)
    if isinstance(exc, (pgerr.DiskFull, pgerr.OutOfMemory, pgerr.TooManyConnections)):
        return _out_of_resources(where, text, doing, cause=text)
    # libpq reports these two at connect without an SQLSTATE: only the server's text says.
    if isinstance(exc, psycopg.OperationalError) and _REFUSED_AT_CONNECT.search(text):
        return _refused(where, _fatal(text), cause=text)
    if isinstance(exc, psycopg.OperationalError) and _FULL_AT_CONNECT.search(text):
        return _out_of_resources(where, _fatal(text), doing, cause=text, setting=" (max_connections)")
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


def connect(url: str, where: str, connect_timeout_s: float, busy_timeout_s: float,
            reply_timeout_s: float) -> tuple[Any, tuple[int, int]]:
    """A new session for a store: autocommit, UTF8 checked, the store's timeouts set, and
    the server's clock read once: (connection, (server us, local monotonic ns))."""
    try:
        conn = _GuardedConnection.connect(
            url, autocommit=True, connect_timeout=max(1, int(connect_timeout_s)),
            application_name="handoff-ledger", client_encoding="UTF8",
        )
    except psycopg.Error as exc:
        raise explain(exc, "connecting", where) from exc
    try:
        _require_utf8(conn, where)  # before anything is read or created
        ms = max(1, int(busy_timeout_s * 1000))
        conn.execute(
            f"SET lock_timeout = {ms};"
            # A session that dies or is cut off inside a transaction (a maintenance one: a
            # write is one message) must not hold the ledger longer than the others wait
            # for a lock: the server ends it once it has sat idle in its transaction that long.
            f"SET idle_in_transaction_session_timeout = {max(1000, ms)};"
            "SET default_transaction_isolation = 'read committed'")
        # A statement waits at most for its lock (lock_timeout) and then for an answer.
        conn.wait_limit_s = busy_timeout_s + reply_timeout_s
        t0 = time.monotonic_ns()
        server_us = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").fetchone()[0]
        t1 = time.monotonic_ns()
    except psycopg.Error as exc:
        conn.close()
        raise explain(exc, "connecting", where) from exc
    except StoreUnavailable:
        conn.close()
        raise
    # No server-side prepared statements: behind a pooler in transaction mode a session's
    # statements may be another client's, or gone (a write binds its values on the client).
    conn.prepare_threshold = None
    return conn, (int(server_us), (t0 + t1) // 2)
