"""What each role of the MCP server offers, read from the table of operations
(handoff/operations.py), and how a verb's tool names and describes its arguments.

Every role reads (``READ_TOOLS``). Beyond reading, a role offers the verbs whose row names
it in ``mcp``, and only verbs the one authority policy
(``handoff.reducers.authority.RULES``) lets that role's server call: a worker server
writes as the lease holder, so the verb's rule must admit a lease (or a worker as such,
as claim's does); an owner or an operator server writes as that kind of actor, so the
rule's kinds must name it; an auditor writes nothing. ``verb_tools`` refuses a table
that grants more, so the table cannot widen a role past the ledger's own rule.

A verb's tool is named as the verb (``TOOL_NAMES`` says where not) and takes the row's
parameters under the row's names, each described by the row's one description
(``describe``), except those the server fills itself (``FILLED``) and those it withholds
from a model (``WITHHELD``, each with its reason).
"""

import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from handoff.operations import MCP_ROLES, OPERATIONS, Operation, Param
from handoff.reducers.authority import RULES

#: The tools every role has (the auditor only these): they read, and write nothing.
READ_TOOLS = ("runs", "status", "stalls", "log", "replay", "diff", "report")

#: A verb's tool name where it is not the verb's own: the name hosts and docs already use.
TOOL_NAMES = {"close_run": "close"}

#: The row's parameters the server fills itself, never a model: who acts (the session's
#: lease, the server's --name and role: lease, worker, by, actor, as_operator, owner),
#: where a worker's files must lie (root: --root), and the environment a bearer token is
#: read from (env: the server's own). Every other parameter, run_id included, is the
#: model's to give, unless ``WITHHELD`` says why not.
FILLED = frozenset({"lease", "worker", "by", "actor", "as_operator", "owner", "root", "env"})

#: The row's parameters a tool does not offer a model, by verb, and why.
WITHHELD: dict[str, dict[str, str]] = {
    "claim": {"key": "the session answers a repeated claim with the lease it holds (already_held)"},
    "release": {"key": "once released the session holds no lease on the run, so a retry is refused before "
                       "the ledger is asked"},
    "artifact": {"max_bytes": "the ledger's own limit on what it measures holds for a model"},
    "deliver": {"timeout_s": "a send's timeout is the contract's send policy, set by the person who opened it",
                "retries": "a send's retries are the contract's send policy, set by the person who opened it"},
    "open": {"send": "how the ledger sends (timeout, retries, the variable a bearer token is read from) is the "
                     "person's to set: a model naming that variable could have another secret sent",
             "owner_cap": "how many of an owner's runs may hold a lease at once is a limit people set"},
}


class TableDisagrees(RuntimeError):
    """The table of operations grants a role a verb its server cannot offer: the authority
    policy denies that role the verb, or the server has no tool for it. A programming
    error, found before any server starts (tests/integrations/test_mcp_operations.py)."""


def tool_name(op: Operation) -> str:
    return TOOL_NAMES.get(op.name, op.name)


def admits(role: str, op: Operation) -> bool:
    """Whether the authority policy lets ``role``'s server call ``op`` at all (the run's
    owner, a transfer or a held lease decide the rest, per run, in the ledger)."""
    rule = RULES[op.command]
    if role == "worker":
        return rule.lease or "worker" in rule.kinds
    if role in ("owner", "operator"):
        return role in rule.kinds
    return False


def verb_tools(role: str, implemented: Mapping[str, object] | None = None) -> tuple[Operation, ...]:
    """The verbs ``role`` offers as tools, in the table's order: the rows whose ``mcp`` names
    it. Refused (TableDisagrees) when a row grants one the authority policy denies the role,
    or (given the tools ``implemented`` for the role, by tool name) one with no tool."""
    if role not in MCP_ROLES:
        raise TableDisagrees(f"{role!r} is not one of the MCP roles {MCP_ROLES}")
    ops = tuple(op for op in OPERATIONS if role in op.mcp)
    denied = [op.name for op in ops if not admits(role, op)]
    if denied:
        raise TableDisagrees(f"handoff/operations.py offers {', '.join(denied)} to the MCP {role} role, but the "
                             f"authority policy (RULES) does not let a {role} call it: remove {role!r} from "
                             "those rows' mcp")
    if implemented is not None:
        missing = [op.name for op in ops if tool_name(op) not in implemented]
        if missing:
            raise TableDisagrees(f"handoff/operations.py offers {', '.join(missing)} to the MCP {role} role, and "
                                 "the server has no such tool for it: add the tool "
                                 f"(handoff/integrations/mcp_server.py) or remove {role!r} from those rows' mcp")
    return ops


def offered(op: Operation) -> tuple[Param, ...]:
    """The row's parameters ``op``'s tool takes from a model, in the row's order."""
    withheld = WITHHELD.get(op.name, {})
    return tuple(p for p in op.params if p.name not in FILLED and p.name not in withheld)


def describe(op: Operation, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a tool's function) with each parameter the row lists described by the row's
    one description, and restricted to the row's choices where it has some. What a model
    reads of an argument is then the table's text, as ``--help`` shows it; a tool's own
    constraints (a minimum length, a bound) stay with its function."""
    sig = inspect.signature(fn)
    hints = dict(getattr(fn, "__annotations__", {}))
    rows = {p.name: p for p in op.params}
    params = []
    for p in sig.parameters.values():
        row = rows.get(p.name)
        if row is not None:
            annotation: Any = p.annotation
            if row.choices:
                annotation = Literal[row.choices]  # type: ignore[valid-type]
            annotation = Annotated[annotation, Field(description=row.help)]
            hints[p.name] = annotation
            p = p.replace(annotation=annotation)
        params.append(p)
    fn.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    fn.__annotations__ = hints
    return fn

