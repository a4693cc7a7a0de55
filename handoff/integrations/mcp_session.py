"""The leases an MCP server holds for its sessions: the only place their tokens live.

A worker session's ``claim`` leaves the lease's token here (``Held``, kept by the
``handoff.lease.Fence`` every in-process worker uses), never in a tool result. A session is
the process over stdio and the transport's ``Mcp-Session-Id`` over HTTP (``Sessions``);
when it ends, what it still holds is released (``Session.end``), saying why.
"""

import logging
import time
from typing import Any

from mcp.server.connection import Connection

from handoff.aio import AsyncLedger
from handoff.ledger.errors import InvalidInput, LedgerError
from handoff.lease import Fence

log = logging.getLogger("handoff.mcp")

#: The reasons a lease is released with when its session ends, by transport.
SESSION_ENDED_STDIO = "the MCP session ended (the host closed stdio)"
SESSION_ENDED_HTTP = "the MCP session ended (the HTTP session was closed or expired)"



class Held:
    """One lease held by one session, kept through the ``Fence`` every in-process worker
    uses (handoff/lease.py): the token is the fence's, and leaves it only as an argument
    to the ledger; the fence says when the lease is gone (the ledger ended it, or no
    heartbeat could be recorded for the heartbeat timeout less the margin)."""

    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        #: Monotonic time of the last heartbeat tried, recorded or not.
        self.tried = fence.last_ok

    run_id = property(lambda self: self.fence.run_id)
    number = property(lambda self: self.fence.lease)

    @property
    def token(self) -> str:
        return str(self.fence.token)

    def due(self, now: float) -> bool:
        """A heartbeat is due: an interval has passed since the last one recorded, and a
        try that was not recorded (a locked or unreachable store) is retried a quarter
        interval later, not at every request."""
        f = self.fence
        return not f.gone and now - f.last_ok >= f.interval_s and now - self.tried >= f.interval_s / 4


class Session:
    """The leases one MCP session holds, keyed by run id: the only place their tokens live."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.held: dict[str, Held] = {}
        self.ended = False

    def lease(self, run_id: str) -> Held:
        held = self.held.get(run_id)
        if held is None:
            raise InvalidInput(f"this MCP session holds no lease on run {run_id}: call claim with that run id "
                               "first (after a release or a revoke, claim again to keep working)",
                               field="run_id")
        return held

    async def beat_due(self, alg: AsyncLedger) -> None:
        """Heartbeat every lease whose beat is due: the session just proved it is alive.
        ``Fence.beat`` keeps the lease through a store error (retried by a later request)
        and ends it only when the ledger says so; once no heartbeat could be recorded for
        the heartbeat timeout less the margin, ``Fence.expired`` trips and the lease is
        no longer used (its writes are refused with LeaseLost, nothing written)."""
        for held in list(self.held.values()):
            now = time.monotonic()
            if not held.due(now):
                continue
            held.tried = now
            fence = held.fence
            await alg.run(lambda lg: fence.beat())
            if fence.last_ok < now:  # not recorded: has the lease outlived what can be proven?
                fence.expired()

    async def end(self, alg: AsyncLedger, why: str) -> None:
        """Release every lease still held (the session ended); what cannot be released is
        left to the watchdog, which revokes it after the heartbeat timeout. A lease the
        ledger ended is not released again; one fenced for want of a heartbeat is, if the
        ledger still names it (otherwise the ledger refuses, and nothing is written)."""
        self.ended = True
        for held in list(self.held.values()):
            fence = held.fence
            if fence.lost or fence.released_by_holder:
                continue
            try:
                await alg.release(held.run_id, held.token, why)
            except LedgerError as exc:
                log.info("lease %s on run %s was not released: %s", held.number, held.run_id, exc.message)
        self.held.clear()


class SdkChanged(RuntimeError):
    """The installed mcp SDK no longer has what ``connection_of`` reads."""


def connection_of(request_session: Any) -> Connection:
    """The SDK's per-connection object behind a request's session: the one place this module
    reads a private attribute of the SDK.

    Why: a lease must be released when its HTTP session ends (the client's DELETE, the
    session's idle expiry). The SDK's ``Connection`` is built for exactly that (its
    ``state`` lives as long as the session, and its ``exit_stack`` is unwound, shielded,
    however the session ends), but mcp 2.x (2.3.0 here) hands a tool or a middleware only
    the request's ``ServerSession``, which keeps the connection as ``_connection``; the
    public ``Context.connection`` exists but is not what handlers receive yet, and no
    lifespan, middleware or session-manager callback is told when a session ends.
    ``tests/integrations/test_mcp_server.py`` checks this attribute on the installed SDK
    and fails loudly if a release renames it; here a missing one is an error, never a
    silent "no session" (which would refuse every claim with the wrong reason).
    """
    connection = getattr(request_session, "_connection", None)
    if not isinstance(connection, Connection):
        raise SdkChanged("the installed mcp SDK no longer keeps the per-connection object on "
                           "ServerSession._connection; handoff.integrations.mcp_session.connection_of must follow it")
    return connection


class Sessions:
    """Which ``Session`` a request belongs to.

    Over stdio the process serves one host on one pipe, whatever protocol era it speaks,
    so the process is the session. Over HTTP a session is the transport's
    (``Mcp-Session-Id``): its state lives on the SDK's per-connection object
    (``connection_of``), whose exit stack releases the leases when the session ends. A
    request with no session (the stateless 2026 HTTP era) can read but cannot hold a lease.
    """

    STATE_KEY = "handoff.session"

    def __init__(self, alg: AsyncLedger, *, single: Session | None = None) -> None:
        self.alg = alg
        self.single = single

    def find(self, request_session: Any, *, create: bool = False) -> Session | None:
        if self.single is not None:
            return self.single
        connection = connection_of(request_session)
        if connection.session_id is None:
            if create:
                raise InvalidInput("this request belongs to no MCP session (a stateless HTTP request), and a lease "
                                   "needs one to live in: connect with a session (the initialize handshake) to "
                                   "claim and work on a run", field="session")
            return None
        found = connection.state.get(self.STATE_KEY)
        if found is None and create:
            found = connection.state[self.STATE_KEY] = Session(f"HTTP session {connection.session_id}")
            connection.exit_stack.push_async_callback(found.end, self.alg, SESSION_ENDED_HTTP)
        return found
