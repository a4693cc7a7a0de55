"""The ``handoff`` commands of the table's verbs, built from their rows (handoff/operations.py).

A row with ``cli`` set and ``cli_built`` becomes one click command: RUN (taken from
``$HANDOFF_RUN`` for the verbs a worker calls), one option per parameter the CLI takes
(``--name-with-dashes`` or the row's spelling; a bool is a flag, a spelling ``--yes/--no``
a pair of which one must be given; ``choices`` a choice, each ``_`` also accepted as
``-``), ``--json``; its help is the row's summary, details and example, each option's
help the parameter's one description. It opens the ledger, calls the verb by name and
prints what the row's ``said`` says (a format string over ``out``, the Outcome, and the
parameters; ``{value:?yes|no}`` says yes when value is true, else no).

Apart from cli.py, which adds these commands among its hand-written ones, so the
commands' order stays the one docs/cli.md shows. Imports click and this package's CLI
modules only; the ledger is opened through the factory cli.py passes in.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Callable
from typing import Any

import click

from handoff import operations as ops
from handoff.clioptions import (attr_option, json_option, key_option, lease_option, run_argument,
                                worker_run_argument)
from handoff.clitypes import attr_map
from handoff.completion import COMPLETE_KIND, COMPLETE_STATE
from handoff.output import echo_write

#: The callers whose verbs a worker runs: RUN may come from $HANDOFF_RUN, as under 'handoff run'.
WORKER_CALLERS = ("worker", "lease_or_person")

# --- what only the CLI needs to know of a parameter -------------------------------------------

#: Completion for an option (handoff/completion.py), by (verb, parameter).
COMPLETE: dict[tuple[str, str], Any] = {("transition", "to"): COMPLETE_STATE, ("progress", "kind"): COMPLETE_KIND}
#: Click types beyond the annotation's: a lease number counts from 1.
TYPES: dict[str, Any] = {"lease_number": click.IntRange(min=1)}
_BASIC = {"str": click.STRING, "int": click.INT, "float": click.FLOAT}


def spelling(op: ops.Operation, p: ops.Param) -> str:
    """How the CLI takes ``p``: ``--option``, ``--yes/--no``, ``argument`` or ``""`` (not at all)."""
    return p.option


def built_rows() -> list[ops.Operation]:
    """The rows whose command is built here, in the table's order."""
    return [op for op in ops.OPERATIONS if op.cli and op.cli_built]


def command_help(op: ops.Operation) -> str:
    """The row's summary and details, then its example in a block click prints as it is."""
    return op.doc + "\n\n\b\nExample:\n    " + "\n    ".join(op.example.splitlines())


class _Said(string.Formatter):
    """``str.format``, plus ``{value:?yes|no}``: yes when value is true (non-empty), else no."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        if format_spec.startswith("?"):
            yes, _, no = format_spec[1:].partition("|")
            return yes if value else no
        return super().format_field(value, format_spec)


SAY = _Said()


def said(op: ops.Operation, out: Any, params: dict[str, Any]) -> str:
    return SAY.format(op.said, out=out, **params)


def _default(p: ops.Param) -> Any:
    return None if p.required else ast.literal_eval(p.default)


def _option(op: ops.Operation, p: ops.Param, spelled: str) -> Callable[[Any], Any]:
    """The click option of ``p`` (a decorator)."""
    if p.name == "lease":
        return lease_option(required=p.required, help=p.help)
    if p.name == "key":
        return key_option(help=p.help)
    if p.name == "attrs":
        return attr_option(help=p.help)
    base = p.annotation.split("|")[0].strip()
    if base == "bool":
        if "/" in spelled:  # a pair: one of the two must be given when the row requires it
            return click.option(spelled, p.name, default=_default(p), help=p.help)
        if not p.required and _default(p) is False:
            return click.option(spelled, p.name, is_flag=True, help=p.help)
    if p.choices:
        kind: Any = click.Choice([*(c.replace("_", "-") for c in p.choices), *(c for c in p.choices if "_" in c)])
    elif p.name in TYPES or base in _BASIC:
        kind = TYPES.get(p.name, _BASIC.get(base))
    else:
        raise TypeError(f"{op.name}: the CLI cannot take {p.name} ({p.annotation}); give it cli=\"\" or a "
                        "hand-written command")
    return click.option(spelled, p.name, type=kind, required=p.required, default=_default(p), help=p.help,
                        metavar=p.metavar, shell_complete=COMPLETE.get((op.name, p.name)))


def build(op: ops.Operation, *, ledger: Callable[[], Any], cls: type[click.Command] = click.Command
          ) -> click.Command:
    """The command of ``op``'s row; ``ledger()`` opens the ledger (a context manager)."""
    if op.cli_extra:
        raise TypeError(f"{op.name}: options beyond the row's ({', '.join(op.cli_extra)}) need a hand-written command")
    taken = [(p, spelling(op, p)) for p in op.params if spelling(op, p)]
    for p in op.params:
        if p.required and not spelling(op, p):
            raise TypeError(f"{op.name}: the CLI must take the required parameter {p.name}")
    pairs = {p.name: s for p, s in taken if "/" in s and p.required}
    decorators: list[Callable[[Any], Any]] = []
    for p, spelled in taken:
        if spelled == "argument":
            if p.name != "run_id":
                raise TypeError(f"{op.name}: only RUN is built as an argument, not {p.name}")
            decorators.append(worker_run_argument if op.caller in WORKER_CALLERS else run_argument)
        else:
            decorators.append(_option(op, p, spelled))
    decorators.append(json_option)

    def callback(as_json: bool, **given: Any) -> None:
        params: dict[str, Any] = {}
        for p, spelled in taken:
            value = given["run" if p.name == "run_id" else "attr_pairs" if p.name == "attrs" else p.name]
            if p.name == "attrs":
                value = attr_map(value)
            elif p.choices and isinstance(value, str):
                value = value.replace("-", "_") if value.replace("-", "_") in p.choices else value
            if value is None and p.name in pairs:
                yes, no = pairs[p.name].split("/")
                raise click.UsageError(f"say {yes} or {no}")
            params[p.name] = value
        with ledger() as lg:
            out = getattr(lg, op.name)(**params)
        extra = {}
        if op.cli_doc:
            from handoff import render

            extra = getattr(render, op.cli_doc)(out.checkpoint)
        unchanged = SAY.format(op.said_unchanged, out=out, **params) if op.said_unchanged else None
        echo_write(out, as_json, said(op, out, params), unchanged=unchanged, **extra)

    f: Any = callback
    for deco in reversed(decorators):
        f = deco(f)
    cmd = click.command(op.cli, cls=cls, help=command_help(op))(f)
    cmd.operation = op  # type: ignore[attr-defined]  # which row it was built from
    return cmd
