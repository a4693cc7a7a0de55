"""The operator's actions on the run page, each a row of the table of operations.

An action names its row (``handoff.operations``) and the fields the page asks for, which
are that row's parameters; the server fills in who acts (``by``, the name it was started
with) and, for ``close_run``, ``as_operator``. The call is the ``Ledger`` method of the row,
so the ledger's rules decide exactly as they do for ``handoff revoke`` or the MCP tool: a
refusal is shown as the typed error's message and nothing is written.
tests/serve/test_actions_table.py checks every action against its row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from handoff.ledger.errors import InvalidInput
from handoff.operations import BY_NAME


@dataclasses.dataclass(frozen=True)
class Field:
    """A field of an action's form: the row's parameter ``name``; ``kind`` is how the page
    asks for it (text, a choice, a number, yes/no); ``fixed``: filled from the run shown,
    not typed (the lease a revoke aims at)."""

    name: str
    kind: str = "text"
    choices: tuple[str, ...] = ()
    fixed: bool = False


@dataclasses.dataclass(frozen=True)
class Action:
    """One button of the run page: its label, the verb (a row of the table) and its fields;
    ``when``: the states it is offered in (empty: any state that has not ended)."""

    id: str
    label: str
    verb: str
    fields: tuple[Field, ...]
    fill: tuple[tuple[str, Any], ...] = ()
    when: tuple[str, ...] = ()
    needs_lease: bool = False

    @property
    def row(self) -> Any:
        return BY_NAME[self.verb]


#: Filled by the server, never typed on the page: who acts, and the write's key (none: a
#: confirmed action is posted once; a repeat is refused by the ledger's own rules).
SERVER_FILLS = frozenset({"run_id", "by", "as_operator"})


def _choices(verb: str, param: str) -> tuple[str, ...]:
    return BY_NAME[verb].param(param).choices


ACTIONS: tuple[Action, ...] = (
    Action("revoke", "Revoke the lease", "revoke",
           (Field("reason"), Field("lease_number", "int", fixed=True)), needs_lease=True),
    Action("pause", "Pause (raise a blocker)", "block", (Field("reason"), Field("next_action")),
           when=("queued", "planning", "executing", "verifying", "unknown")),
    Action("unblock", "Unblock", "unblock", (Field("resolution"), Field("blocker_id", "int")), when=("blocked",)),
    Action("close", "Close the run", "close_run",
           (Field("disposition", "choice", _choices("close_run", "disposition")), Field("reason")),
           fill=(("as_operator", True),)),
    Action("approve", "Approve the result", "review", (Field("notes"),), fill=(("approve", True),),
           when=("ready_for_review",)),
    Action("reject", "Reject the result", "review", (Field("notes"),), fill=(("approve", False),),
           when=("ready_for_review",)),
)
BY_ID = {a.id: a for a in ACTIONS}


def offered(cp: Any) -> list[Action]:
    """The actions that make sense for the run as it stands (the ledger still decides)."""
    if cp.terminal:
        return []
    return [a for a in ACTIONS if (not a.when or cp.state in a.when) and (not a.needs_lease or cp.lease is not None)]


def arguments(action: Action, form: dict[str, str]) -> dict[str, Any]:
    """The keyword arguments of the row's method from the posted form: each field checked
    against its kind; an empty optional field is left to the row's default."""
    out: dict[str, Any] = {}
    for f in action.fields:
        raw = (form.get(f.name) or "").strip()
        param = action.row.param(f.name)
        if not raw:
            if param.required:
                raise InvalidInput(f"{action.label.lower()} needs {f.name.replace('_', ' ')}: {param.help}",
                                   field=f.name)
            continue
        if f.kind == "int":
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
                raise InvalidInput(f"{f.name.replace('_', ' ')} must be a whole number, got {raw[:40]!r}",
                                   field=f.name)
            out[f.name] = int(raw)
        elif f.kind == "choice" and raw not in f.choices:
            raise InvalidInput(f"{f.name} must be one of {', '.join(f.choices)}, got {raw[:40]!r}", field=f.name)
        else:
            out[f.name] = raw
    out.update(action.fill)
    return out


def perform(ledger: Any, action: Action, run_id: str, by: str, form: dict[str, str]) -> Any:
    """Call the row's method as ``by``; returns its Outcome, raises its typed refusal."""
    kwargs = arguments(action, form)
    return getattr(ledger, action.verb)(run_id, by=by, **kwargs)
