"""``handoff mcp``: the ledger as an MCP server, so an agent inside an MCP host keeps its
handoff through tools, and never sees its lease.

Why a server and not the shell: a model told to carry a lease token through its context
can read it, repeat it and hand it to the wrong worker. Here ``claim`` returns the lease
*number* and the run's packet; the token stays in the server, in the state of the MCP
session that claimed (``Session``), and the worker tools take the run id only.

A server has one role, fixed at start (``ROLES``), so a host grants exactly what it means
to: the auditor reads; the owner and the operator add their own writes; the worker adds
the lease holder's. A tool the role does not have is not registered at all, so it is
neither listed nor callable. A delivery target that would make the server act outside
the ledger (run a command, send a request, write a file) is used only when the person who
started the server listed it (``Config.allow_targets``, ``--allow-target``): a model's
arguments may have been written by whatever it read last.

Liveness is the host's: while a session holds a lease, every request it sends (a tool
call, a resource read, a ping) heartbeats the lease when one is due, through the lease's
``handoff.lease.Fence`` (the one rule of ``handoff run`` and ``lg.lease()``: a store
error is retried, only the ledger's refusal or a silence past the fence's margin ends it). A host that stops
calling for longer than the run's heartbeat timeout loses the lease to the watchdog: a
stalled model is a stalled worker. When the session ends (stdio closes, an HTTP session
is deleted or expires) the server releases what it still holds, saying why.

Every call goes through ``AsyncLedger`` (the ledger's own thread), so the event loop
never blocks. Refusals are tool errors whose text is the ledger's typed message; no
exception ends the server.
"""

import functools
import hmac
import ipaddress
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import anyio
from mcp.server.connection import Connection
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from handoff import render as R
from handoff.aio import AsyncLedger
from handoff.delivery import allowed as al
from handoff.ledger.errors import InvalidInput, LedgerError, StaleLease, TerminalRun
from handoff.lease import Fence, bounded_text, heartbeat_interval
from handoff.ledger.store import CONTROL_RE, check_run_id
from handoff.reducers import stall
from handoff.reducers import transitions as T
from handoff.reducers.decide import MAX_TEXT

log = logging.getLogger("handoff.mcp")

#: The roles a server may be started with; the auditor's tools are every role's.
ROLES = ("auditor", "owner", "operator", "worker")
#: Addresses an HTTP server may bind without a bearer token.
LOOPBACK_NAMES = ("localhost",)
#: A listing or log page's default and largest size (a model's context is the budget).
PAGE, MAX_PAGE = 50, 500
#: The reasons a lease is released with when its session ends, by transport.
SESSION_ENDED_STDIO = "the MCP session ended (the host closed stdio)"
SESSION_ENDED_HTTP = "the MCP session ended (the HTTP session was closed or expired)"


# --- the lease a session holds ------------------------------------------------------------


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
                           "ServerSession._connection; handoff.integrations.mcp_server.connection_of must follow it")
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


# --- what a model is told ----------------------------------------------------------------


def _states() -> str:
    return ", ".join(T.STATES)


def _kinds() -> str:
    return "; ".join(f"{state}: {', '.join(sorted(kinds))}" for state, kinds in T.PROGRESS_KINDS.items())


def _moves(via: str) -> str:
    return "; ".join(f"{a} -> {b}" for (a, b), vias in sorted(T.MOVES.items()) if via in vias)


INSTRUCTIONS = (
    "handoff-ledger keeps long-running work in an append-only ledger: a contract (goal, target, owner), "
    "one lease holder at a time, progress, evidence and a delivery proven once. Read a run with status; "
    "a worker claims a run, records progress only at meaningful boundaries, records its result file "
    "(artifact) and its checks (evidence), and submits. The lease is kept by this server for your "
    f"session; you never handle a token. States: {_states()}."
)

RunId = Annotated[str, Field(description="The run's id, as open, claim or the runs listing gave it.",
                             min_length=1, max_length=128)]
Limit = Annotated[int, Field(description="At most this many entries.", ge=1, le=MAX_PAGE)]
After = Annotated[str | None, Field(description="Continue after this run id: the 'next' of the page before.")]
Attrs = Annotated[dict[str, str | int | float | bool] | None,
                  Field(description="A few facts about the step: model, tokens in and out, cost, tool.")]


def _ledger_text(exc: LedgerError) -> str:
    """What the model reads for a refusal: the error's type and the ledger's own sentence."""
    return f"{exc.type}: {exc.message}"


def refusal(exc: LedgerError) -> CallToolResult:
    """A ledger refusal as the tool's own error result (``isError``), text exactly the
    ledger's: a ``ToolError`` raised instead would reach the model behind the SDK's
    "Error executing tool X: " prefix, and a model that retries with what it reads should
    read the ledger's sentence, not the SDK's wrapping of it."""
    return CallToolResult(content=[TextContent(type="text", text=_ledger_text(exc))], is_error=True)


def _tool(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A refusal by the ledger becomes a tool error with its typed message; the call, and
    the server, go on. Anything else is the SDK's to report (as a tool error too)."""

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except LedgerError as exc:
            return refusal(exc)

    return call


async def scrubbed(alg: AsyncLedger, run_id: str, text: str) -> str:
    """A model's text as the agent integrations record a tool's arguments and a failure's
    text (handoff/integrations/_agent_run.py): through the one scrub of free text
    (``bounded_text``), on the ledger's thread. A model may paste a key it read into a side
    effect's description or a note; the ledger, the log and a trace must not keep it. Text
    the ledger refuses (a control character, past its length) is handed on as given, so
    the refusal names the field and nothing is written."""
    if not text or len(text) > MAX_TEXT or CONTROL_RE.search(text):
        return text
    return await alg.run(lambda lg: bounded_text(text, lg, run_id, MAX_TEXT))


READ = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
WRITE = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False, openWorldHint=False)


# --- the server --------------------------------------------------------------------------


@dataclass
class Config:
    """What a server is fixed to at start."""

    role: str = "auditor"
    #: Who this server acts as: the owner's name in the owner role, the worker's in the worker role.
    name: str = ""
    #: The directory a worker's artifacts must lie under (required for the worker role).
    root: str | None = None
    #: The delivery targets with an adapter (a command, a web request, a file write) the
    #: owner's open and deliver may use (``--allow-target``; handoff/delivery/allowed.py).
    allow_targets: tuple[str, ...] = ()


def check_config(config: Config) -> None:
    """Refuse a server that could not do what its role says, before anything starts."""
    if config.role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}, got {config.role!r}", field="as")
    config.allow_targets = al.check_patterns(config.allow_targets, field="allow_target")
    if config.role in ("owner", "operator", "worker") and not config.name:
        raise InvalidInput(f"the {config.role} role acts under a name: give --name (or set HANDOFF_WORKER)",
                           field="name")
    if config.role == "worker":
        if not config.root:
            raise InvalidInput("the worker role records files, and only under a directory you choose: give "
                               "--root DIR (artifacts outside it are refused)", field="root")
        if not os.path.isdir(config.root):
            raise InvalidInput(f"--root {config.root} is not a directory", field="root")


def build(alg: AsyncLedger, config: Config, sessions: Sessions) -> MCPServer:
    """An ``MCPServer`` offering ``config.role``'s tools and the read-only resources."""
    check_config(config)
    server: MCPServer = MCPServer("handoff-ledger", instructions=INSTRUCTIONS, log_level="WARNING")

    async def alive(ctx: Any, call_next: Any) -> Any:
        # Every request from a session that holds a lease proves the host alive.
        if ctx.request_id is not None:
            try:
                found = sessions.find(ctx.session)
            except SdkChanged:
                # No session state can be reached, so none holds a lease to beat: reads go on,
                # and a claim fails loudly in its own call.
                found = None
            if found is not None and found.held:
                await found.beat_due(alg)
        return await call_next(ctx)

    server.middleware.append(alive)
    _auditor_tools(server, alg)
    _resources(server, alg)
    if config.role in ("owner", "operator"):
        _person_tools(server, alg, config)
    elif config.role == "worker":
        _worker_tools(server, alg, config, sessions)
    return server


def _page(limit: int) -> int:
    return max(1, min(int(limit), MAX_PAGE))


async def runs_listing(alg: AsyncLedger, *, limit: int = PAGE, after: str | None = None,
                       include_terminal: bool = False, filters: dict[str, Any] | None = None) -> dict[str, Any]:
    """A page of runs with their health, as the ``runs`` tool and the ``handoff://runs``
    resource show it: the one place this server asks the library for a run listing.

    ``filters`` go to ``Ledger.runs_page`` by name, unchanged (``states``, ``owner``,
    ``target``, ``worker``, ``health``): the same listing as ``handoff runs``.
    """
    def read(lg: Any) -> dict[str, Any]:
        now = lg.clock()  # one moment for the filter's judgement and the rows' health
        page = lg.runs_page(limit=_page(limit), after=after, include_terminal=include_terminal, now=now,
                            **(filters or {}))
        rows = [R.run_row(cp, stall.classify(cp, now_us=now)) for cp in page.items]
        return {"now": R.iso(now), "runs": rows, "next": page.next, "more": page.more}

    return await alg.run(read)


def fold_heartbeats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive heartbeats as one row (``heartbeats``: how many, ``first_at``/``at``):
    a long run's log is mostly heartbeats, and a model's context is not the place for them."""
    out: list[dict[str, Any]] = []
    for row in rows:
        last = out[-1] if out else None
        if row["type"] == "heartbeat_recorded" and last is not None and last["type"] == "heartbeat_recorded" \
                and last["lease"] == row["lease"]:
            last["heartbeats"] += 1
            last["seq"], last["at"] = row["seq"], row["at"]
            continue
        if row["type"] == "heartbeat_recorded":
            row = {**row, "heartbeats": 1, "first_at": row["at"], "first_seq": row["seq"]}
        out.append(row)
    return out


def _auditor_tools(server: MCPServer, alg: AsyncLedger) -> None:
    @_tool
    async def runs(limit: Limit = PAGE, after: After = None,
                   states: Annotated[list[str], Field(description=f"Only runs in these states ({_states()}).")] = [],
                   owner: Annotated[str | None, Field(description="Only this owner's runs.")] = None,
                   target: Annotated[str | None, Field(description="Only runs delivering to this target "
                                                                   "(e.g. chat:#ops).")] = None,
                   worker: Annotated[str | None, Field(description="Only runs whose lease this worker holds.")] = None,
                   health: Annotated[list[str], Field(description="Only runs judged so now "
                                                                  f"({', '.join(sorted(stall.CLASSIFICATIONS))}).")] = [],
                   include_terminal: Annotated[bool, Field(description="Include runs that ended.")] = False,
                   ) -> dict[str, Any]:
        filters = {"states": tuple(states), "owner": owner, "target": target, "worker": worker,
                   "health": tuple(health)}
        return await runs_listing(alg, limit=limit, after=after, include_terminal=include_terminal,
                                  filters=filters)

    @_tool
    async def status(run_id: RunId) -> dict[str, Any]:
        return await alg.status(run_id)

    @_tool
    async def stalls(limit: Limit = PAGE, after: After = None) -> dict[str, Any]:
        def read(lg: Any) -> dict[str, Any]:
            now = lg.clock()
            page = lg.stalls_page(limit=_page(limit), after=after, now=now)
            return {"now": R.iso(now), "stalls": [R.stall_row(cp, h) for cp, h in page.items],
                    "next": page.next, "more": page.more}

        return await alg.run(read)

    @_tool
    async def log(run_id: RunId,
                  after_seq: Annotated[int, Field(description="Only events after this seq (the 'next' of the page "
                                                              "before).", ge=0)] = 0,
                  limit: Annotated[int, Field(description="At most this many events read.", ge=1,
                                              le=MAX_PAGE)] = 100,
                  fold: Annotated[bool, Field(description="Fold consecutive heartbeats into one row.")] = True,
                  ) -> dict[str, Any]:
        def read(lg: Any) -> dict[str, Any]:
            import itertools

            it = lg.log(run_id, after_seq=after_seq)
            recs = list(itertools.islice(it, _page(limit) + 1))
            more = len(recs) > _page(limit)
            rows = [R.log_row(r) for r in recs[:_page(limit)]]
            return {"run_id": run_id, "events": fold_heartbeats(rows) if fold else rows,
                    "next": rows[-1]["seq"] if more and rows else None}

        return await alg.run(read)

    @_tool
    async def replay(run_id: RunId, at_seq: Annotated[int, Field(description="The seq to stop at.", ge=1)]
                     ) -> dict[str, Any]:
        return await alg.status(run_id, at_seq=at_seq)

    @_tool
    async def diff(run_a: RunId, run_b: RunId) -> dict[str, Any]:
        return await alg.diff(run_a, run_b)

    @_tool
    async def report(run_id: RunId) -> str:
        doc = await alg.write_report(run_id, None, fmt="md")
        return doc["text"]

    tools = {
        "runs": "List runs with their health (healthy, stalled, worker_unavailable...), oldest first, a page at a "
                "time; pass 'next' as 'after' for the next page. Ended runs only with include_terminal.",
        "status": "The run's checkpoint packet: state, contract, lease number and holder, progress, blockers, "
                  "artifacts, evidence, pending side effects, review, delivery and health. Read it before acting.",
        "stalls": "Runs whose health needs attention now, with the evidence (last heartbeat, last progress) and "
                  "the action the watchdog would take.",
        "log": "A run's events, oldest first, a page at a time, consecutive heartbeats folded into one row.",
        "replay": "The run's checkpoint packet exactly as it stood at a seq.",
        "diff": "Compare two runs (a fork and its origin, two attempts): where their histories part, and how "
                "their ends differ.",
        "report": "The run's incident report in Markdown: where it stands, who holds it, progress, stalls, what "
                  "the watchdog did, delivery.",
    }
    for fn in (runs, status, stalls, log, replay, diff, report):
        server.add_tool(fn, name=fn.__name__, description=tools[fn.__name__], annotations=READ)


def _resources(server: MCPServer, alg: AsyncLedger) -> None:
    async def read(call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await call()
        except LedgerError as exc:
            raise ResourceError(_ledger_text(exc)) from None

    @server.resource("handoff://runs", name="runs", mime_type="application/json",
                     description="The first page of runs that have not ended, with their health.")
    async def runs_resource() -> dict[str, Any]:
        return await read(lambda: runs_listing(alg))

    @server.resource("handoff://runs/{run_id}/packet", name="packet", mime_type="application/json",
                     description="A run's checkpoint packet: everything the next actor needs.")
    async def packet_resource(run_id: str) -> dict[str, Any]:
        return await read(lambda: alg.status(run_id))

    @server.resource("handoff://runs/{run_id}/report", name="report", mime_type="text/markdown",
                     description="A run's incident report in Markdown.")
    async def report_resource(run_id: str) -> str:
        doc = await read(lambda: alg.write_report(run_id, None, fmt="md"))
        return doc["text"]


def _write(out: Any) -> dict[str, Any]:
    return R.write_doc(out)


#: What a person's server offers beyond reading, by role: every path a run can take ends with
#: one of these or a worker's tool. The owner settles the work (review, the sanitization gate,
#: delivery sent by the ledger or by hand, reopen after a failed check, fork to continue after
#: the end, reconcile an unknown side effect, clear a blocker only it can clear); the operator
#: keeps runs moving when nobody else can (revoke, unblock, reconcile, reopen, fork, close).
OWNER_TOOLS = ("open", "review", "sanitize", "deliver", "delivered", "delivery_failed", "reopen", "revoke",
               "transfer", "unblock", "effect_confirm", "fork", "close")
OPERATOR_TOOLS = ("revoke", "unblock", "effect_confirm", "reopen", "fork", "close")

DeliveryKey = Annotated[str, Field(description="The delivery's idempotency key: the one you gave deliver.",
                                   min_length=1)]


def _person_tools(server: MCPServer, alg: AsyncLedger, config: Config) -> None:
    """The owner's or the operator's tools (``OWNER_TOOLS``, ``OPERATOR_TOOLS``), each
    recorded under the server's ``--name`` in that role: the ledger's permission table
    decides the rest (an owner acts on its own runs, or on what was transferred to it)."""
    from handoff.ledger.store import Actor

    me, operator = config.name, config.role == "operator"
    actor = Actor("operator" if operator else "owner", me)

    # The patterns themselves are not shown to the model: an exact webhook address is a
    # secret of its own (it carries the hook's token); their count and kinds are enough.
    kinds = sorted({p.split(":", 1)[0] + ":" for p in config.allow_targets})
    allowed_here = (f"{len(config.allow_targets)} pattern(s) of kind {', '.join(kinds)}, not shown; ask the person "
                    "who runs this server which" if config.allow_targets else "none is allowed")

    def permitted(target: str, run_id: str | None, instead: str) -> None:
        # What a model asks for may have been written by whoever it read last (a web page,
        # an issue, a file): an order to run a command, send a request or write a file is
        # followed only when the person who started this server listed it.
        al.check(target, config.allow_targets, run_id=run_id, whose="this MCP server's --allow-target list",
                 how=f"{instead}, or ask whoever runs this server to start it with --allow-target naming the "
                     "target (a prefix ending in '*' allows a family of them)")

    @_tool
    async def open(goal: Annotated[str, Field(description="What the run must achieve, in words a person reads.",
                                              min_length=1)],
                   target: Annotated[str, Field(description="Where the result must be seen: chat:#ops, a ticket "
                                                            "(a person delivers it). A command (cmd:), a web "
                                                            "address or a directory (file://) only if this server "
                                                            f"allows it: {allowed_here}.")],
                   result_path: Annotated[str | None, Field(description="The result file the run must "
                                                                        "produce.")] = None,
                   require_review: Annotated[bool, Field(description="You approve the result before "
                                                                     "delivery.")] = False,
                   stop_rules: Annotated[list[str], Field(description="When the worker must stop.")] = [],
                   heartbeat_timeout_s: Annotated[float | None, Field(description="Seconds without a heartbeat "
                                                                      "before the worker counts as gone.",
                                                                      gt=0)] = None,
                   progress_timeout_s: Annotated[float | None, Field(description="Seconds without progress before "
                                                                     "the run counts as stalled.", gt=0)] = None,
                   public: Annotated[bool, Field(description="The target is visible to others (delivery needs a "
                                                             "passing sanitization check).")] = False,
                   run_id: Annotated[str | None, Field(description="A run id of your choosing.")] = None,
                   key: Annotated[str | None, Field(description="An idempotency key: a retry with the same key "
                                                                "opens no second run.")] = None,
                   ) -> dict[str, Any]:
        permitted(target, run_id, "Open it with a target a person delivers (chat:#ops, a ticket)")
        contract: dict[str, Any] = {"goal": goal, "target": target, "owner": me, "result_path": result_path,
                                    "require_review": require_review, "stop_rules": stop_rules,
                                    "public": public, "run_id": run_id}
        policy = {k: v for k, v in (("heartbeat_timeout_s", heartbeat_timeout_s),
                                    ("progress_timeout_s", progress_timeout_s)) if v is not None}
        if policy:
            contract["policy"] = policy
        opened = await alg.open_contract(contract, key=key)
        return await alg.status(opened)

    @_tool
    async def review(run_id: RunId, approve: Annotated[bool, Field(description="true approves the result, false "
                                                                              "sends it back to executing.")],
                     notes: Annotated[str, Field(description="What you saw.")] = "") -> dict[str, Any]:
        return _write(await alg.review(run_id, me, approve, notes))

    @_tool
    async def sanitize(run_id: RunId) -> dict[str, Any]:
        return await alg.sanitize(run_id, me)

    @_tool
    async def deliver(run_id: RunId,
                      key: Annotated[str, Field(description="The delivery's idempotency key: a retry with it "
                                                            "delivers nothing twice.", min_length=1)],
                      send: Annotated[bool, Field(description="true: the ledger sends the result to the target "
                                                              "itself; false: you send it, then record the outcome "
                                                              "with delivered or delivery_failed.")] = True,
                      ) -> dict[str, Any]:
        if send:
            permitted((await alg.checkpoint(run_id)).target, run_id,
                      "Deliver it by hand: call deliver with send false, send it, then record delivered")
        got = await alg.deliver(run_id, me, key, send=send)
        if not send:
            return _write(got)
        return {"run_id": run_id, "status": got.status, "sent": got.sent, "receipt": got.receipt,
                "error": got.error, "tries": got.tries, "state": got.checkpoint.state}

    @_tool
    async def delivered(run_id: RunId, key: DeliveryKey,
                        receipt: Annotated[str, Field(description="What proves the target has it: a message id, "
                                                                  "a URL, a commit.", min_length=1)],
                        ) -> dict[str, Any]:
        return _write(await alg.delivered(run_id, key, receipt, by=me))

    @_tool
    async def delivery_failed(run_id: RunId, key: DeliveryKey,
                              error: Annotated[str, Field(description="What went wrong.", min_length=1)],
                              ) -> dict[str, Any]:
        return _write(await alg.delivery_failed(run_id, key, error, by=me))

    @_tool
    async def reopen(run_id: RunId,
                     reason: Annotated[str, Field(description="Why the result must change (what the check found).",
                                                  min_length=1)]) -> dict[str, Any]:
        return _write(await alg.reopen(run_id, by=me, reason=reason, as_operator=operator))

    @_tool
    async def revoke(run_id: RunId, reason: Annotated[str, Field(description="Why the lease is taken away.",
                                                                 min_length=1)],
                     lease: Annotated[int | None, Field(description="Only if this lease number still holds "
                                                                    "it.")] = None) -> dict[str, Any]:
        return _write(await alg.revoke(run_id, reason, lease=lease, actor=actor))

    @_tool
    async def transfer(run_id: RunId,
                       action: Annotated[Literal[tuple(sorted(T.TRANSFERABLE))],  # type: ignore[valid-type]
                                         Field(description="The action to hand over.")],
                       to: Annotated[str, Field(description="Who may perform it from now on.", min_length=1)],
                       ) -> dict[str, Any]:
        return _write(await alg.transfer(run_id, action, to, by=me))

    @_tool
    async def unblock(run_id: RunId, resolution: Annotated[str, Field(description="How the blocker went away.",
                                                                      min_length=1)],
                      blocker_id: Annotated[int | None, Field(description="Only this blocker (default: all).")] = None,
                      ) -> dict[str, Any]:
        return _write(await alg.unblock(run_id, resolution, blocker_id=blocker_id, actor=actor))

    @_tool
    async def effect_confirm(run_id: RunId,
                             key: Annotated[str, Field(description="The side effect's key (status lists the "
                                                                   "pending ones).", min_length=1)],
                             outcome: Literal["done", "absent"],
                             note: Annotated[str, Field(description="How you know.")] = "") -> dict[str, Any]:
        note = await scrubbed(alg, run_id, note)
        return _write(await alg.effect_confirm(run_id, key, outcome, note=note, actor=actor))

    @_tool
    async def fork(run_id: RunId,
                   at_seq: Annotated[int, Field(description="The seq to continue from (log shows them); before "
                                                            "the run ended.", ge=1)],
                   new_run_id: Annotated[str | None, Field(description="The new run's id (default: derived from "
                                                                       "the parent's).")] = None,
                   key: Annotated[str | None, Field(description="An idempotency key: a retry with the same key "
                                                                "forks no second child.")] = None,
                   ) -> dict[str, Any]:
        if new_run_id is not None:
            check_run_id(new_run_id, "new_run_id")  # named as the model wrote it
        child = await alg.fork(run_id, at_seq, new_run_id=new_run_id, key=key, actor=actor)
        return {"run_id": child, "parent": run_id, "parent_seq": at_seq, "packet": await alg.status(child)}

    @_tool
    async def close(run_id: RunId,
                    disposition: Annotated[Literal[T.CLOSE_DISPOSITIONS],  # type: ignore[valid-type]
                                           Field(description="How the run ends.")],
                    reason: Annotated[str, Field(description="Why (an operator must say).")] = "",
                    ) -> dict[str, Any]:
        if operator and not reason.strip():
            # Someone else's run ends on an operator's word: the owner will want to read why.
            raise InvalidInput("an operator closes a run with a reason: say why it ends", field="reason")
        return _write(await alg.close_run(run_id, me, disposition, reason, as_operator=operator))

    as_whom = ", as an operator" if operator else ""
    tools = {
        "open": "Open a handoff: write the contract (goal, target, you as owner) before the work detaches. "
                "Returns the new run's packet; a worker then claims it by its run_id.",
        "review": "Approve or reject a submitted result (state ready_for_review).",
        "sanitize": "Check what a delivery would send now for secrets, private paths and addresses, and record "
                    "the check. A public target's delivery needs a passing check of exactly that content; the "
                    "findings name detector, part and line, never the matched text.",
        "deliver": "Deliver a succeeded run's result to its target, exactly once under the key you give (a public "
                   "target needs a passing sanitize first).",
        "delivered": "Record that a delivery you sent yourself (deliver with send false) reached the target, "
                     "with its receipt; the run becomes delivered.",
        "delivery_failed": "Record that a delivery you sent yourself failed; deliver again under a new key.",
        "reopen": f"Send a succeeded run whose latest sanitization check failed back to verifying{as_whom}, so a "
                  "worker can withdraw what the check found, record the result again and submit it.",
        "revoke": f"Take the lease away from the worker holding it{as_whom} (it can no longer write).",
        "transfer": "Hand one of your actions on a run (review, deliver, close...) to someone else.",
        "unblock": f"Clear a run's blocker{as_whom}, saying how it went away; the run returns to where it was.",
        "effect_confirm": f"Record{as_whom} whether a side effect left without an outcome happened (done) or not "
                          "(absent): the first step out of the unknown state.",
        "fork": f"Start a new run{as_whom} that continues this one as it stood at a seq (to continue after the "
                "run ended, or to try again from a good point). Returns the new run's id and packet.",
        "close": f"End a run without delivery{as_whom}: {', '.join(T.CLOSE_DISPOSITIONS)}.",
    }
    fns = {fn.__name__: fn for fn in (open, review, sanitize, deliver, delivered, delivery_failed, reopen, revoke,
                                      transfer, unblock, effect_confirm, fork, close)}
    for name in OPERATOR_TOOLS if operator else OWNER_TOOLS:
        server.add_tool(fns[name], name=name, description=tools[name], annotations=WRITE)


def _say_lost(fence: Fence) -> None:
    why = "fenced: no heartbeat recorded in time" if fence.fenced else fence.lost_reason
    log.info("lease %s on run %s is no longer this session's (%s)", fence.lease, fence.run_id, why)


def _worker_tools(server: MCPServer, alg: AsyncLedger, config: Config, sessions: Sessions) -> None:
    me, root = config.name, os.path.realpath(config.root or ".")

    def mine(ctx: Context, run_id: str) -> tuple[Session, Held]:
        check_run_id(run_id)  # the ledger's refusal, before a message repeats what the model sent
        found = sessions.find(ctx.request_context.session)
        if found is None:
            raise InvalidInput(f"this MCP session holds no lease on run {run_id}: call claim first", field="run_id")
        return found, found.lease(run_id)

    async def under_lease(ctx: Context, run_id: str, call: Callable[[str], Awaitable[Any]]) -> dict[str, Any]:
        session, held = mine(ctx, run_id)
        fence = held.fence
        if fence.fenced:
            raise fence.error()  # no heartbeat could be recorded in time: this lease is no longer used
        sent = time.monotonic()
        try:
            out = await call(held.token)
        except (StaleLease, TerminalRun) as exc:
            await alg.run(lambda lg: fence.ended(exc))  # the ledger ended the lease: no more beats
            raise
        fence.proven(sent)  # a write under the lease was accepted: the lease was held then
        if out.checkpoint.lease != held.number:  # released or submitted: the lease is over
            session.held.pop(run_id, None)
        return _write(out)

    @_tool
    async def claim(run_id: RunId, ctx: Context) -> dict[str, Any]:
        session = sessions.find(ctx.request_context.session, create=True)
        assert session is not None
        held = session.held.get(run_id)
        if held is not None and not held.fence.gone:
            packet = await alg.status(run_id)
            if packet["lease"] == held.number:
                # This session holds the run already (a retry, or a claim after submit or a
                # reopen): the ledger's LeaseHeld would tell the model to use a token it
                # never saw, so answer with the lease it has.
                return {"run_id": run_id, "lease": held.number, "worker": me, "packet": packet,
                        "already_held": True}
        if held is not None and held.fence.fenced:
            # Fenced for want of a heartbeat, perhaps still named by the ledger: give it back
            # before claiming anew (refused, and nothing written, if it was taken meanwhile).
            try:
                await alg.release(run_id, held.token, f"{me} could not prove lease {held.number} in time; "
                                                      "claiming the run anew")
            except LedgerError as exc:
                log.info("fenced lease %s on run %s was not released: %s", held.number, run_id, exc.message)
        session.held.pop(run_id, None)  # that lease ended; claim anew
        since = time.monotonic()
        got = await alg.claim_outcome(run_id, me)
        fence = Fence(alg.ledger, run_id, got.token, me, timeout_s=got.outcome.checkpoint.policy.heartbeat_timeout_s,
                      since=since, on_lost=_say_lost, say=log.warning)
        session.held[run_id] = Held(fence)
        return {"run_id": run_id, "lease": got.token.lease, "worker": me, "packet": await alg.status(run_id)}

    @_tool
    async def heartbeat(run_id: RunId, ctx: Context, attrs: Attrs = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.heartbeat(run_id, t, attrs=attrs))

    @_tool
    async def progress(run_id: RunId, ctx: Context,
                       kind: Annotated[str, Field(description=f"What moved. Counts as progress: {_kinds()} (and "
                                                              "the contract's own kinds). Logged but never "
                                                              f"progress: {', '.join(sorted(T.NOT_PROGRESS))}.")],
                       detail: Annotated[str, Field(description="What happened, in a sentence.")] = "",
                       attrs: Attrs = None) -> dict[str, Any]:
        async def call(t: str) -> Any:
            # A note is what the integrations record of a failure: scrubbed as they scrub it.
            text = await scrubbed(alg, run_id, detail) if kind == "note" else detail
            return await alg.progress(run_id, t, kind, text, attrs=attrs)

        return await under_lease(ctx, run_id, call)

    @_tool
    async def transition(run_id: RunId, ctx: Context,
                         to: Annotated[str, Field(description=f"The next state. Moves: {_moves('transition')}.")],
                         reason: Annotated[str, Field(description="Why.")] = "") -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.transition(run_id, t, to, reason=reason))

    @_tool
    async def artifact(run_id: RunId, ctx: Context,
                       path: Annotated[str, Field(description=f"The file, relative to {root} or absolute under "
                                                              "it; the ledger reads and measures it.",
                                                  min_length=1)],
                       kind: Annotated[str, Field(description="What the file is: result, log, diff...")] = "result",
                       attrs: Attrs = None) -> dict[str, Any]:
        where = os.path.join(root, path)  # an absolute path stays itself; the ledger refuses it outside root
        return await under_lease(ctx, run_id, lambda t: alg.artifact(run_id, t, where, kind=kind, root=root,
                                                                     attrs=attrs))

    @_tool
    async def withdraw_artifact(run_id: RunId, ctx: Context,
                                path: Annotated[str, Field(description="The artifact's path as artifact recorded "
                                                                       "it (status lists them), or relative to "
                                                                       f"{root}.", min_length=1)],
                                reason: Annotated[str, Field(description="Why it no longer counts.",
                                                             min_length=1)]) -> dict[str, Any]:
        where = os.path.join(root, path)  # a recorded (absolute) path stays itself
        return await under_lease(ctx, run_id, lambda t: alg.withdraw_artifact(run_id, where, reason, lease=t))

    @_tool
    async def evidence(run_id: RunId, ctx: Context,
                       kind: Annotated[str, Field(description="What was checked: tests, lint, review...",
                                                  min_length=1)],
                       outcome: Literal["pass", "fail", "skipped"],
                       detail: Annotated[str, Field(description="What the check saw.")] = "",
                       attrs: Attrs = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.evidence(run_id, kind, outcome, detail, lease=t,
                                                                     attrs=attrs))

    @_tool
    async def effect_start(run_id: RunId, ctx: Context,
                           key: Annotated[str, Field(description="The side effect's own key, unique in the run.",
                                                     min_length=1)],
                           what: Annotated[str, Field(description="What is about to happen outside, e.g. "
                                                                  "'POST /deploy v42'.", min_length=1)],
                           ) -> dict[str, Any]:
        async def call(t: str) -> Any:
            return await alg.effect_start(run_id, t, key, await scrubbed(alg, run_id, what))

        return await under_lease(ctx, run_id, call)

    @_tool
    async def effect_confirm(run_id: RunId, ctx: Context,
                             key: Annotated[str, Field(description="The side effect's key.", min_length=1)],
                             outcome: Literal["done", "absent"],
                             note: Annotated[str, Field(description="How you know.")] = "") -> dict[str, Any]:
        async def call(t: str) -> Any:
            return await alg.effect_confirm(run_id, key, outcome, note=await scrubbed(alg, run_id, note), lease=t)

        return await under_lease(ctx, run_id, call)

    @_tool
    async def block(run_id: RunId, ctx: Context,
                    reason: Annotated[str, Field(description="What the run cannot go on without.", min_length=1)],
                    next_action: Annotated[str, Field(description="What must happen to unblock it, and by whom.",
                                                      min_length=1)]) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.block(run_id, reason, next_action, lease=t))

    @_tool
    async def unblock(run_id: RunId, ctx: Context,
                      resolution: Annotated[str, Field(description="How the blocker went away.", min_length=1)],
                      blocker_id: Annotated[int | None, Field(description="Only this blocker (default: "
                                                                          "all).")] = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.unblock(run_id, resolution, blocker_id=blocker_id,
                                                                    lease=t))

    @_tool
    async def submit(run_id: RunId, ctx: Context,
                     summary: Annotated[str, Field(description="One paragraph on what was done.")] = "",
                     ) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.submit(run_id, t, summary))

    @_tool
    async def release(run_id: RunId, ctx: Context,
                      reason: Annotated[str, Field(description="Why you stop working on the run.")] = "",
                      ) -> dict[str, Any]:
        session, held = mine(ctx, run_id)
        out = await alg.release(run_id, held.token, reason)
        held.fence.released_by_holder = True
        session.held.pop(run_id, None)
        return _write(out)

    tools = {
        "claim": "Take a run's lease so you may work on it. Returns the lease number and the run's packet; this "
                 "server keeps the lease for your session and heartbeats it while you keep calling. Refused while "
                 "another worker holds the run; if this session holds it already, answers with that lease.",
        "heartbeat": "Say you are alive without recording progress (any call does this for you when due).",
        "progress": "Record progress at a meaningful boundary (a plan committed, a tool's outcome, a verifier's "
                    "result), not for every step: what counts depends on the run's state.",
        "transition": "Move the run to its next working state.",
        "artifact": "Record a file the work produced (the result named by the contract, a log, a diff); the "
                    "ledger measures it and keeps its size and sha256.",
        "withdraw_artifact": "Take back an artifact recorded by mistake or found unfit (for example what a "
                             "failed sanitization check named), so it no longer counts for submit; record the "
                             "corrected file again with artifact. The log keeps both records.",
        "evidence": "Record a check of the result (tests, lint, a review) and its outcome.",
        "effect_start": "Before doing something outside that must not happen twice (a deploy, a payment), "
                        "record it under a key.",
        "effect_confirm": "Record whether a started side effect happened (done) or not (absent).",
        "block": "Say the run cannot go on without something, and what must happen next.",
        "unblock": "Say how a blocker went away.",
        "submit": "Submit the result (from verifying) with its artifacts and evidence recorded first. You keep "
                  "the lease until you release it: if the owner reopens the run, continue under it.",
        "release": "Give the run back without submitting (you stop; another worker may claim it).",
    }
    for fn in (claim, heartbeat, progress, transition, artifact, withdraw_artifact, evidence, effect_start, effect_confirm, block,
               unblock, submit, release):
        server.add_tool(fn, name=fn.__name__, description=tools[fn.__name__], annotations=WRITE)


# --- running it --------------------------------------------------------------------------


def _open_ledger(db: str, busy_timeout_s: float) -> AsyncLedger:
    # Never a new ledger: a mistyped --db is refused (exit 3), as by every command but init.
    return AsyncLedger(db, busy_timeout_s=busy_timeout_s, create=False)


async def serve_stdio(db: str, config: Config, *, busy_timeout_s: float = 5.0) -> None:
    """Serve one host over stdin and stdout until it closes them (or SIGTERM/SIGINT); then
    release what the session still holds."""
    check_config(config)
    session = Session("stdio")
    async with _open_ledger(db, busy_timeout_s) as alg:
        server = build(alg, config, Sessions(alg, single=session))
        try:
            async with anyio.create_task_group() as tg:
                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(stop_on_signal)
                await server.run_stdio_async()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await session.end(alg, SESSION_ENDED_STDIO)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` spells (an IPv4-mapped IPv6 address as its IPv4 one), or None."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback(host: str) -> bool:
    """Every spelling of an address only this machine reaches: ``localhost``, all of
    127/8, ``::1`` in any of its forms, and ``::ffff:127.x.y.z``."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def host_forms(host: str, port: int) -> list[str]:
    """The ``Host`` header values a request to this server may carry when it serves
    ``host`` on loopback: the address served, as given and in its short form (in
    brackets for IPv6), and ``localhost``, each with the port served (and without it on
    port 80). A page that DNS rebinding brought here carries its own name instead."""
    names = {"localhost", host.lower()}
    ip = ipaddress.ip_address(host) if _ip(host) is not None else None
    if ip is not None:
        names.add(str(ip))
    if host.lower() == "localhost":
        names.add("127.0.0.1")
    out = []
    for name in sorted(names):
        shown = f"[{name}]" if ":" in name else name
        out.append(f"{shown}:{port}")
        if port == 80:
            out.append(shown)
    return out


def url_host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8765`` for IPv6) as (host, port)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidInput(f"--http takes HOST:PORT, e.g. 127.0.0.1:8765 (port 0: any free port); got {text!r}",
                           field="http")
    return host.strip("[]"), int(port)


def read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read the token file {path}: {exc.strerror}", field="token_file") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise InvalidInput(f"the token in {path} must be one line of at least 16 characters without spaces "
                           "(e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(32))')",
                           field="token_file")
    return token


def check_http(host: str, token: str | None) -> None:
    """Beyond loopback, anyone who reaches the port could act in this server's role."""
    if not is_loopback(host) and token is None:
        raise InvalidInput(f"refusing to serve on {host}, which is reachable beyond this machine, without a bearer "
                           "token: give --token-file FILE (clients then send 'Authorization: Bearer <token>'), or "
                           "bind 127.0.0.1", field="http")


class Guard:
    """The HTTP checks the SDK leaves to us: a bearer token (when one is set) on every
    request, and beyond loopback no browser page at all (a request carrying an ``Origin``
    is refused: the DNS-rebinding case; an MCP host sends none). On loopback, where no
    token is asked for, the SDK's Host and Origin checks (``security``) refuse a request
    whose Host is not this server's address (421) or whose Origin is another site (403)."""

    def __init__(self, app: Any, token: str | None, loopback: bool) -> None:
        self.app, self.token, self.loopback = app, token, loopback

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            refusal = None
            if self.token is not None:
                given = headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                    refusal = (401, "a bearer token is required: send 'Authorization: Bearer <token>'")
            if refusal is None and not self.loopback and "origin" in headers:
                refusal = (403, "requests from a web page (with an Origin header) are refused")
            if refusal is not None:
                from starlette.responses import PlainTextResponse

                extra = {"WWW-Authenticate": "Bearer"} if refusal[0] == 401 else None
                await PlainTextResponse(refusal[1], status_code=refusal[0], headers=extra)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def security(host: str, port: int) -> Any:
    """The SDK's DNS-rebinding checks for a loopback server on ``host``:``port``: the Host
    header must be one of ``host_forms`` and an Origin, when sent, one of those pages."""
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = host_forms(host, port)
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[f"http://{h}" for h in hosts])


def listen(host: str, port: int) -> Any:
    """A socket bound to ``host``:``port`` (port 0: any free one), before the app is made,
    so the Host check can name the port actually served."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {url_host(host)}:{port}: {exc.strerror or exc}; choose another "
                           "address or port (port 0: any free one)", field="http") from None
    return sock


async def serve_http(db: str, config: Config, address: str, *, token_file: str | None = None,
                     busy_timeout_s: float = 5.0, ready: Callable[[int], None] | None = None) -> None:
    """Serve streamable HTTP on ``address`` until interrupted. Every check is made before
    the port is bound; once it listens, ``ready`` is told the port (by default a line on
    stderr names the address, so port 0 can be used)."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    check_config(config)
    host, port = parse_address(address)
    token = read_token(token_file)
    check_http(host, token)
    loopback = is_loopback(host)
    async with _open_ledger(db, busy_timeout_s) as alg:
        server = build(alg, config, Sessions(alg))
        sock = listen(host, port)
        bound = sock.getsockname()[1]
        # On loopback (no token) the SDK checks Host and Origin; beyond it Guard refuses any Origin.
        checks = security(host, bound) if loopback else TransportSecuritySettings(
            enable_dns_rebinding_protection=False)
        app = server.streamable_http_app(host=host, transport_security=checks)
        uv = uvicorn.Server(uvicorn.Config(Guard(app, token, loopback), host=host, port=bound, log_level="warning",
                                           lifespan="on"))
        if ready is None:
            def ready(bound: int) -> None:
                print(f"handoff mcp: serving http://{url_host(host)}:{bound}/mcp as {config.role}", file=sys.stderr,
                      flush=True)

        async def tell() -> None:
            while not uv.started:
                await anyio.sleep(0.02)
            ready(bound)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(tell)
                await uv.serve(sockets=[sock])
        finally:
            sock.close()
