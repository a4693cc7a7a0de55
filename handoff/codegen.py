"""Write the Python surfaces of the table of operations (handoff/operations.py).

``python -m handoff.codegen --write`` rewrites the regions between the markers below in
handoff/verbs.py (the ``Ledger`` verbs a row builds), handoff/lease.py (the lease
handles' verbs) and handoff/aio.py (``AsyncLedger``'s calls and ``AsyncLease``'s verbs);
``--check`` exits 1 naming the stale files. Generated, committed, and proved current by
tests/test_operations.py, the way psycopg keeps its sync code generated from its async
code: a reader and a type checker see plain methods, and a verb's row is its one source.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from .operations import OPERATIONS, Operation, Param

HERE = Path(__file__).resolve().parent
BEGIN = "# --- generated from handoff/operations.py ({name}): python -m handoff.codegen --write ---"
END = "# --- end of generated code ({name}) ---"

#: The parameters a lease handle fills in itself.
HELD = {"run_id", "lease", "worker", "by", "actor"}


def _signature(params: tuple[Param, ...]) -> list[str]:
    parts = ["self"]
    star = False
    for p in params:
        if not p.positional and not star:
            parts.append("*")
            star = True
        parts.append(f"{p.name}: {p.annotation}" + ("" if p.required else f" = {p.default}"))
    return parts


def _def(head: str, parts: list[str], returns: str) -> str:
    """``head(parts) -> returns:`` wrapped at 110 columns, continuation lines under the '('."""
    lines, line = [], f"    {head}("
    pad = " " * len(line)
    for i, part in enumerate(parts):
        piece = part + (", " if i < len(parts) - 1 else f") -> {returns}:")
        if len(line) + len(piece.rstrip()) > 110 and line.strip() != f"{head}(":
            lines.append(line.rstrip())
            line = pad
        line += piece
    lines.append(line)
    return "\n".join(lines) + "\n"


def _literal(op: Operation, p: Param) -> bool:
    """A field the command types as a Literal: the verb passes text and decide checks it."""
    from handoff.reducers import commands as C

    return "Literal" in str(getattr(C, op.struct).__annotations__.get(p.command_field, ""))


def _docstring(op: Operation, indent: str) -> str:
    body = textwrap.fill(op.summary, 88 - len(indent), subsequent_indent=indent)
    if op.details:
        body += "\n\n" + textwrap.fill(op.details, 88 - len(indent), initial_indent=indent, subsequent_indent=indent)
        body += "\n" + indent
    return f'{indent}"""{body}"""\n'


def _field_value(op: Operation, p: Param) -> str:
    if p.name == "attrs":
        return "check_attrs(attrs)"
    return p.name


def ledger_method(op: Operation) -> str:
    """``Ledger.<name>``: build the row's command and hand it to ``execute`` (or, for a
    verb that writes nothing, answer from the run's checkpoint with its reducer)."""
    names = {p.name for p in op.params}
    ind = "        "
    lines = [_def(f"def {op.name}", _signature(op.params), op.returns), _docstring(op, ind)]
    if op.reads:
        module, _, function = op.reads.partition(".")
        args = ", ".join(p.name for p in op.params if p.name != "run_id")
        lines.append(f"{ind}from handoff.reducers import {module}\n")
        lines.append(f"{ind}return {module}.{function}(self.checkpoint(run_id), {args})\n")
        return "".join(lines)
    fields = [f"{p.command_field}={_field_value(op, p)}" for p in op.params if p.command_field]
    typed = any(p.command_field and _literal(op, p) for p in op.params)
    run = ["run_id"]
    if op.caller == "worker":
        lines.append(f"{ind}t = lease_token(lease)\n")
        fields.insert(0, "lease=t.lease")
        actor = "self.worker_actor(run_id, t, worker)"
    elif op.caller == "lease_or_person":
        lines.append(f"{ind}t = None if lease is None else lease_token(lease)\n")
        fields.append("lease=t and t.lease")
        actor = f"self._actor(run_id, t, actor, by{', worker' if 'worker' in names else ''})"
    elif op.caller == "owner":
        if "as_operator" in names:
            actor = 'Actor("operator" if as_operator else "owner", by)'
        elif "by" in names and not op.param("by").required:
            actor = 'Actor("owner", by or self.checkpoint(run_id).owner)'
        else:
            actor = 'Actor("owner", by)'
    elif op.caller == "person":
        lines.append(f"{ind}actor = actor or self._person_actor(run_id, by)\n")
        actor = "actor"
    elif op.caller == "watchdog":
        actor = 'Actor("watchdog", watcher)'
    else:  # pragma: no cover - a custom verb is hand-written
        raise ValueError(f"{op.name}: a {op.caller} verb is not generated")
    ignore = "  # type: ignore[arg-type]" if typed else ""
    lines.append(_wrap(f"{ind}cmd = C.{op.struct}(", fields, ")" + ignore))
    extra = "".join([", key=key" if "key" in names else "", ", token=t" if "lease" in names else ""])
    lines.append(_wrap(f"{ind}return self.execute(", [*run, "cmd", f"actor={actor}", *extra.split(", ")[1:]], ")"))
    return "".join(lines)


def _held_params(op: Operation) -> tuple[Param, ...]:
    return tuple(p for p in op.params if p.name not in HELD)


def _call_args(params: tuple[Param, ...]) -> str:
    return ", ".join(p.name if p.positional else f"{p.name}={p.name}" for p in params)


def core_method(op: Operation) -> str:
    """``LeaseCore.<lease_verb>``: the call on a Ledger the sync and async handles share."""
    own = _held_params(op)
    args = _call_args(own)
    held = "worker=self.worker" if op.caller == "worker" else 'lease=t, actor=Actor("worker", self.worker)'
    lead = "self.run_id, t, " if op.caller == "worker" else "self.run_id, "
    if op.reads:  # a question, not a write: asked as the block's worker would, under its check
        held, lead = "", "self.run_id, "
        args = args.rstrip(", ")
    returns = "Outcome" if not op.reads else op.returns
    return (_def(f"def {op.lease_verb}", _signature(own), f"Callable[[Ledger], {returns}]")
            + ("        self.check()\n" if op.reads else "        t = self.token\n")
            + _wrap(f"        return lambda lg: lg.{op.name}(",
                    [a for a in f"{lead}{args}{', ' if args else ''}{held}".split(", ") if a], ")"))


def _wrap(head: str, args: list[str], tail: str) -> str:
    """``head`` + the arguments joined by commas + ``tail``, wrapped at 110 columns."""
    lines, line, pad = [], head, " " * len(head)
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else tail)
        if len(line) + len(piece.rstrip()) > 110 and line != head:
            lines.append(line.rstrip())
            line = pad
        line += piece
    lines.append(line)
    return "\n".join(lines) + "\n"


def handle_method(op: Operation, *, is_async: bool) -> str:
    own = _held_params(op)
    args = _call_args(own)
    ind = "        "
    head = "async def" if is_async else "def"
    wait = "await " if is_async else ""
    return (_def(f"{head} {op.lease_verb}", _signature(own), op.returns) + _docstring(op, ind)
            + _wrap(f"{ind}return {wait}self._do(self.core.{op.lease_verb}(", args.split(", ") if args else [], "))"))


def _join(methods: list[str]) -> str:
    return "\n".join(methods)


def regions() -> dict[tuple[str, str], str]:
    """What each marked region should hold: (file, region name) -> the code."""
    built = [op for op in OPERATIONS if op.built or op.reads]
    leased = [op for op in OPERATIONS if op.lease_verb is not None]
    calls = "".join(f"    {op.name} = _Call(Ledger.{op.name})\n" for op in OPERATIONS)
    return {
        ("verbs.py", "Ledger verbs"): _join([ledger_method(op) for op in built]),
        ("lease.py", "LeaseCore verbs"): _join([core_method(op) for op in leased]),
        ("lease.py", "Lease verbs"): _join([handle_method(op, is_async=False) for op in leased]),
        ("aio.py", "AsyncLedger verbs"): calls,
        ("aio.py", "AsyncLease verbs"): _join([handle_method(op, is_async=True) for op in leased]),
    }


def _replace(text: str, name: str, code: str) -> str:
    begin, end = BEGIN.format(name=name), END.format(name=name)
    head, found, rest = text.partition(begin)
    if not found:
        raise SystemExit(f"handoff.codegen: no region {name!r} (a line '{begin.strip()}')")
    _, found, tail = rest.partition(end)
    if not found:
        raise SystemExit(f"handoff.codegen: region {name!r} has no end line '{end.strip()}'")
    indent = head[head.rfind("\n") + 1:]
    return f"{head}{begin}\n{code}{indent}{end}{tail}"


def rendered() -> dict[Path, str]:
    out: dict[Path, str] = {}
    for (file, name), code in regions().items():
        path = HERE / file
        text = out.get(path) or path.read_text(encoding="utf-8")
        out[path] = _replace(text, name, code)
    return out


def stale() -> list[Path]:
    return [p for p, text in rendered().items() if p.read_text(encoding="utf-8") != text]


def main(argv: list[str], echo: Callable[[str], None] = print) -> int:
    if argv[1:] == ["--write"]:
        for path, text in rendered().items():
            if path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                echo(f"wrote {path.relative_to(HERE.parent)}")
        return 0
    if argv[1:] == ["--check"]:
        paths = stale()
        for p in paths:
            echo(f"stale: {p.relative_to(HERE.parent)} (run python -m handoff.codegen --write)")
        return 1 if paths else 0
    echo("usage: python -m handoff.codegen --write | --check")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
