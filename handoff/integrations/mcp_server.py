"""``handoff mcp``: the ledger as an MCP server, so an agent inside an MCP host keeps its
handoff through tools, and never sees its lease.

Why a server and not the shell: a model told to carry a lease token through its context
can read it, repeat it and hand it to the wrong worker. Here ``claim`` returns the lease
*number* and the run's packet; the token stays in the server, in the state of the MCP
session that claimed (handoff/integrations/mcp_session.py), and the worker tools take the
run id only.

A server has one role, fixed at start (``handoff.operations.MCP_ROLES``), so a host grants
exactly what it means to: the auditor reads; the owner and the operator add their own
writes; the worker adds the lease holder's. Which verbs a role offers, and what a verb's
tool takes and says of each argument, is the table of operations'
(handoff/integrations/mcp_roles.py reads it, against the authority policy). A tool the
role does not have is not registered at all, so it is neither listed nor callable. A
delivery target that would make the server act outside the ledger (run a command, send a
request, write a file) is used only when the person who started the server listed it
(``Config.allow_targets``, ``--allow-target``): a model's arguments may have been written
by whatever it read last.

Liveness is the host's: while a session holds a lease, every request it sends (a tool
call, a resource read, a ping) heartbeats the lease when one is due, through the lease's
``handoff.lease.Fence`` (the one rule of ``handoff run`` and ``lg.lease()``: a store
error is retried, only the ledger's refusal or a silence past the fence's margin ends it). A host that stops
calling for longer than the run's heartbeat timeout loses the lease to the watchdog: a
stalled model is a stalled worker. When the session ends (stdio closes, an HTTP session
is deleted or expires) the server releases what it still holds, saying why.

Every call goes through ``AsyncLedger`` (the ledger's own thread), so the event loop
never blocks. Refusals are tool errors whose text is the ledger's typed message; no
exception ends the server. The HTTP transport's checks (loopback, Host and Origin, the
bearer token) are handoff/integrations/mcp_http.py's.
"""

import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from handoff import render as R
from handoff.aio import AsyncLedger
from handoff.delivery import allowed as al
from handoff.integrations.mcp_http import Guard, check_http, is_loopback, listen, parse_address, read_token, \
    security, url_host
from handoff.integrations.mcp_roles import READ_TOOLS, describe, tool_name, verb_tools
from handoff.integrations.mcp_session import SESSION_ENDED_STDIO, Held, SdkChanged, Session, Sessions
from handoff.ledger import inputs
from handoff.ledger.errors import InvalidInput, LedgerError, StaleLease, TerminalRun
from handoff.ledger.inputs import CONTROL_RE, MAX_TEXT, check_run_id
from handoff.lease import Fence, bounded_text
from handoff.operations import MCP_ROLES
from handoff.reducers import stall
from handoff.reducers import transitions as T

log = logging.getLogger("handoff.mcp")

#: A listing or log page's default and largest size (a model's context is the budget).
PAGE, MAX_PAGE = 50, 500


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

#: A verb's run id: its description is the table's (mcp_roles.describe); a read tool's is RunId's.
RunIdArg = Annotated[str, Field(min_length=1, max_length=128)]
RunId = Annotated[RunIdArg, Field(description="The run's id, as open, claim or the runs listing gave it.")]
Limit = Annotated[int, Field(description="At most this many entries.", ge=1, le=MAX_PAGE)]
After = Annotated[str | None, Field(description="Continue after this run id: the 'next' of the page before.")]
#: The constraints a verb's argument has beyond the table's type (its description is the table's).
Attrs = dict[str, str | int | float | bool] | None
Text = Annotated[str, Field(min_length=1)]  # text that must say something
Key = Annotated[str | None, Field(min_length=1)]  # an idempotency key, when given


def named(field: str, value: str) -> str:
    """A side effect's or a delivery's key checked by the ledger's own rule under the name the
    model sent it as: the ledger names the command's field (``key``), which no tool takes."""
    return inputs.name(field, value)


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

#: A role's verb tools, by tool name: the function and what the model is told of it
#: (``{summary}`` stands for the table row's summary).
Tools = dict[str, tuple[Callable[..., Awaitable[Any]], str]]


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
    if config.role not in MCP_ROLES:
        raise InvalidInput(f"role must be one of {', '.join(MCP_ROLES)}, got {config.role!r}", field="as")
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
    """An ``MCPServer`` offering ``config.role``'s tools and the read-only resources: the
    read tools, and the verbs the table of operations gives the role (``verb_tools``), each
    described from its row."""
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
    tools: Tools = {}
    if config.role in ("owner", "operator"):
        tools = _person_tools(alg, config)
    elif config.role == "worker":
        tools = _worker_tools(alg, config, sessions)
    as_whom = " Recorded as an operator." if config.role == "operator" else ""
    for op in verb_tools(config.role, tools):
        name = tool_name(op)
        fn, text = tools[name]
        server.add_tool(describe(op, fn), name=name, description=text.replace("{summary}", op.summary) + as_whom,
                        annotations=WRITE)
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
    fns = {fn.__name__: fn for fn in (runs, status, stalls, log, replay, diff, report)}
    for name in READ_TOOLS:
        server.add_tool(fns[name], name=name, description=tools[name], annotations=READ)


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


def _person_tools(alg: AsyncLedger, config: Config) -> Tools:
    """The owner's or the operator's verb tools, each recorded under the server's ``--name``
    in that role; which of them a role offers is the table's (``verb_tools``), and the
    ledger's authority policy decides the rest (an owner acts on its own runs, or on what
    was transferred to it). The owner settles the work (review, the sanitization gate,
    delivery sent by the ledger or by hand, reopen after a failed check, fork to continue
    after the end, reconcile an unknown side effect, clear a blocker only it can clear);
    the operator keeps runs moving when nobody else can."""
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
    async def open(goal: Text, target: str, origin: str = "", run_id: str | None = None,
                   result_path: str | None = None, stop_rules: list[str] = [], require_review: bool = False,
                   heartbeat_timeout_s: Annotated[float | None, Field(gt=0)] = None,
                   progress_timeout_s: Annotated[float | None, Field(gt=0)] = None,
                   retry_budget: Annotated[int | None, Field(ge=0)] = None,
                   delivery_timeout_s: Annotated[float | None, Field(gt=0)] = None,
                   key: Key = None, public: bool = False, sanitize_patterns: list[str] = [],
                   progress_kinds: dict[str, list[str]] | None = None) -> dict[str, Any]:
        permitted(target, run_id, "Open it with a target a person delivers (chat:#ops, a ticket)")
        contract: dict[str, Any] = {"goal": goal, "target": target, "owner": me, "origin": origin,
                                    "result_path": result_path, "require_review": require_review,
                                    "stop_rules": stop_rules, "public": public, "run_id": run_id,
                                    "sanitize_patterns": sanitize_patterns, "progress_kinds": progress_kinds or {}}
        policy = {k: v for k, v in (("heartbeat_timeout_s", heartbeat_timeout_s),
                                    ("progress_timeout_s", progress_timeout_s), ("retry_budget", retry_budget),
                                    ("delivery_timeout_s", delivery_timeout_s)) if v is not None}
        if policy:
            contract["policy"] = policy
        opened = await alg.open_contract(contract, key=key)
        return await alg.status(opened)

    @_tool
    async def review(run_id: RunIdArg, approve: bool, notes: str = "", key: Key = None) -> dict[str, Any]:
        return _write(await alg.review(run_id, approve, notes, by=me, key=key))

    @_tool
    async def sanitize(run_id: RunIdArg) -> dict[str, Any]:
        return await alg.sanitize(run_id, by=me)

    @_tool
    async def deliver(run_id: RunIdArg, delivery_key: Text, send: bool = True) -> dict[str, Any]:
        named("delivery_key", delivery_key)
        if send:
            permitted((await alg.checkpoint(run_id)).target, run_id,
                      "Deliver it by hand: call deliver with send false, send it, then record delivered")
        got = await alg.deliver(run_id, delivery_key, send=send, by=me)
        if not send:
            return _write(got)
        return {"run_id": run_id, "status": got.status, "sent": got.sent, "receipt": got.receipt,
                "error": got.error, "tries": got.tries, "state": got.checkpoint.state}

    @_tool
    async def delivered(run_id: RunIdArg, delivery_key: Text, receipt: Text) -> dict[str, Any]:
        return _write(await alg.delivered(run_id, named("delivery_key", delivery_key), receipt, by=me))

    @_tool
    async def delivery_failed(run_id: RunIdArg, delivery_key: Text, error: Text) -> dict[str, Any]:
        return _write(await alg.delivery_failed(run_id, named("delivery_key", delivery_key), error, by=me))

    @_tool
    async def reopen(run_id: RunIdArg, reason: Text, key: Key = None) -> dict[str, Any]:
        return _write(await alg.reopen(run_id, reason, by=me, as_operator=operator, key=key))

    @_tool
    async def revoke(run_id: RunIdArg, reason: Text, lease_number: Annotated[int | None, Field(ge=1)] = None,
                     key: Key = None) -> dict[str, Any]:
        return _write(await alg.revoke(run_id, reason, lease_number=lease_number, actor=actor, key=key))

    @_tool
    async def transfer(run_id: RunIdArg, action: str, to: Text, key: Key = None) -> dict[str, Any]:
        return _write(await alg.transfer(run_id, action, to, by=me, key=key))

    @_tool
    async def unblock(run_id: RunIdArg, resolution: Text, blocker_id: int | None = None,
                      key: Key = None) -> dict[str, Any]:
        return _write(await alg.unblock(run_id, resolution, blocker_id=blocker_id, actor=actor, key=key))

    @_tool
    async def effect_confirm(run_id: RunIdArg, effect_key: Text, outcome: str, note: str = "",
                             attrs: Attrs = None) -> dict[str, Any]:
        effect_key, note = named("effect_key", effect_key), await scrubbed(alg, run_id, note)
        return _write(await alg.effect_confirm(run_id, effect_key, outcome, note=note, attrs=attrs, actor=actor))

    @_tool
    async def fork(run_id: RunIdArg, at_seq: Annotated[int, Field(ge=1)], new_run_id: str | None = None,
                   key: Key = None) -> dict[str, Any]:
        if new_run_id is not None:
            check_run_id(new_run_id, "new_run_id")  # named as the model wrote it
        child = await alg.fork(run_id, at_seq, new_run_id=new_run_id, key=key, actor=actor)
        return {"run_id": child, "parent": run_id, "parent_seq": at_seq, "packet": await alg.status(child)}

    @_tool
    async def close(run_id: RunIdArg, disposition: str, reason: str = "", key: Key = None) -> dict[str, Any]:
        if operator and not reason.strip():
            # Someone else's run ends on an operator's word: the owner will want to read why.
            raise InvalidInput("an operator closes a run with a reason: say why it ends", field="reason")
        return _write(await alg.close_run(run_id, disposition, reason, by=me, as_operator=operator, key=key))

    return {
        "open": (open, "Open a handoff: write the contract (goal, target, you as owner) before the work detaches. "
                       "Returns the new run's packet; a worker then claims it by its run_id. A target with an "
                       "adapter (a command cmd:, a web address, a directory file://) is used only if this server "
                       f"allows it: {allowed_here}."),
        "review": (review, "{summary} The run must be ready_for_review."),
        "sanitize": (sanitize, "{summary} A public target's delivery needs a passing check of exactly that "
                               "content; the findings name detector, part and line, never the matched text."),
        "deliver": (deliver, "Deliver a succeeded run's result to its target, exactly once under the delivery_key "
                             "you give (a public target needs a passing sanitize first). With send false you send "
                             "it yourself, and record the outcome with delivered or delivery_failed."),
        "delivered": (delivered, "{summary} For a delivery you sent yourself (deliver with send false); the run "
                                 "becomes delivered."),
        "delivery_failed": (delivery_failed, "{summary} For a delivery you sent yourself; deliver again under a "
                                             "new delivery_key."),
        "reopen": (reopen, "{summary} A worker then withdraws what the check found, records the result again "
                           "and submits it."),
        "revoke": (revoke, "{summary}"),
        "transfer": (transfer, "{summary}"),
        "unblock": (unblock, "{summary}"),
        "effect_confirm": (effect_confirm, "{summary} Use it for a side effect left without an outcome: the first "
                                           "step out of the unknown state."),
        "fork": (fork, "{summary} The answer has its packet too: continue after the run ended, or try again from "
                       "a good point."),
        "close": (close, "{summary} There is no delivery; an operator must say why (reason)."),
    }


def _say_lost(fence: Fence) -> None:
    why = "fenced: no heartbeat recorded in time" if fence.fenced else fence.lost_reason
    log.info("lease %s on run %s is no longer this session's (%s)", fence.lease, fence.run_id, why)


def _worker_tools(alg: AsyncLedger, config: Config, sessions: Sessions) -> Tools:
    """The lease holder's verb tools: each acts under the lease this session claimed, never
    one the model names, and records files only under ``--root``."""
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
    async def claim(run_id: RunIdArg, ctx: Context) -> dict[str, Any]:
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
    async def heartbeat(run_id: RunIdArg, ctx: Context, attrs: Attrs = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.heartbeat(run_id, t, attrs=attrs))

    @_tool
    async def progress(run_id: RunIdArg, ctx: Context, kind: str, detail: str = "", attrs: Attrs = None,
                       key: Key = None) -> dict[str, Any]:
        async def call(t: str) -> Any:
            # A note is what the integrations record of a failure: scrubbed as they scrub it.
            text = await scrubbed(alg, run_id, detail) if kind == "note" else detail
            return await alg.progress(run_id, t, kind, text, attrs=attrs, key=key)

        return await under_lease(ctx, run_id, call)

    @_tool
    async def transition(run_id: RunIdArg, ctx: Context, to: str, reason: str = "", key: Key = None
                         ) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.transition(run_id, t, to, reason=reason, key=key))

    @_tool
    async def artifact(run_id: RunIdArg, ctx: Context, path: Text, kind: str = "result", attrs: Attrs = None,
                       key: Key = None) -> dict[str, Any]:
        where = os.path.join(root, path)  # an absolute path stays itself; the ledger refuses it outside root
        return await under_lease(ctx, run_id, lambda t: alg.artifact(run_id, t, where, kind=kind, root=root,
                                                                     attrs=attrs, key=key))

    @_tool
    async def withdraw_artifact(run_id: RunIdArg, ctx: Context, path: Text, reason: Text, key: Key = None
                                ) -> dict[str, Any]:
        where = os.path.join(root, path)  # a recorded (absolute) path stays itself
        return await under_lease(ctx, run_id, lambda t: alg.withdraw_artifact(run_id, where, reason, lease=t,
                                                                              key=key))

    @_tool
    async def evidence(run_id: RunIdArg, ctx: Context, kind: Text, outcome: str, detail: str = "",
                       attrs: Attrs = None, key: Key = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.evidence(run_id, kind, outcome, detail, attrs=attrs,
                                                                     lease=t, key=key))

    @_tool
    async def effect_start(run_id: RunIdArg, ctx: Context, effect_key: Text, what: Text, attrs: Attrs = None
                           ) -> dict[str, Any]:
        named("effect_key", effect_key)

        async def call(t: str) -> Any:
            return await alg.effect_start(run_id, t, effect_key, await scrubbed(alg, run_id, what), attrs=attrs)

        return await under_lease(ctx, run_id, call)

    @_tool
    async def effect_confirm(run_id: RunIdArg, ctx: Context, effect_key: Text, outcome: str, note: str = "",
                             attrs: Attrs = None) -> dict[str, Any]:
        named("effect_key", effect_key)

        async def call(t: str) -> Any:
            return await alg.effect_confirm(run_id, effect_key, outcome, note=await scrubbed(alg, run_id, note),
                                            attrs=attrs, lease=t)

        return await under_lease(ctx, run_id, call)

    @_tool
    async def block(run_id: RunIdArg, ctx: Context, reason: Text, next_action: Text, key: Key = None
                    ) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.block(run_id, reason, next_action, lease=t, key=key))

    @_tool
    async def unblock(run_id: RunIdArg, ctx: Context, resolution: Text, blocker_id: int | None = None,
                      key: Key = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.unblock(run_id, resolution, blocker_id=blocker_id,
                                                                    lease=t, key=key))

    @_tool
    async def submit(run_id: RunIdArg, ctx: Context, summary: str = "", key: Key = None) -> dict[str, Any]:
        return await under_lease(ctx, run_id, lambda t: alg.submit(run_id, t, summary, key=key))

    @_tool
    async def release(run_id: RunIdArg, ctx: Context, reason: str = "") -> dict[str, Any]:
        session, held = mine(ctx, run_id)
        out = await alg.release(run_id, held.token, reason)
        held.fence.released_by_holder = True
        session.held.pop(run_id, None)
        return _write(out)

    return {
        "claim": (claim, "Take a run's lease so you may work on it. Returns the lease number and the run's packet; "
                         "this server keeps the lease for your session and heartbeats it while you keep calling. "
                         "Refused while another worker holds the run; if this session holds it already, answers "
                         "with that lease."),
        "heartbeat": (heartbeat, "{summary} Any call of this session does it for you when one is due."),
        "progress": (progress, "{summary} Record it at a meaningful boundary (a plan committed, a tool's outcome, "
                               f"a verifier's result), not for every step. Progress by state: {_kinds()} (and the "
                               f"contract's own kinds); logged but never progress: {', '.join(sorted(T.NOT_PROGRESS))}."),
        "transition": (transition, "{summary} " + f"Moves: {_moves('transition')}."),
        "artifact": (artifact, "Record a file the work produced (the result named by the contract, a log, a diff); "
                               f"the ledger measures it and keeps its size and sha256. Its path is relative to {root} "
                               "or absolute under it."),
        "withdraw_artifact": (withdraw_artifact, "{summary} For an artifact recorded by mistake or found unfit (what "
                                                 "a failed sanitization check named): record the corrected file again "
                                                 "with artifact; the log keeps both records. Its path is as status "
                                                 f"lists it, or relative to {root}."),
        "evidence": (evidence, "{summary}"),
        "effect_start": (effect_start, "{summary} For something outside that must not happen twice (a deploy, a "
                                       "payment): record it under its effect_key, do it, then record its outcome "
                                       "with effect_confirm."),
        "effect_confirm": (effect_confirm, "{summary}"),
        "block": (block, "{summary}"),
        "unblock": (unblock, "{summary}"),
        "submit": (submit, "{summary} Record its artifacts and evidence first. You keep the lease until you "
                           "release it: if the owner reopens the run, continue under it."),
        "release": (release, "{summary} You stop; another worker may claim it."),
    }


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
