"""The table of operations (handoff/operations.py) against the Python surfaces built from it.

Each check fails both ways: a surface that lacks a verb or a parameter a row lists, and a
surface that has one no row lists. The CLI's and the MCP server's checks live beside their
tests (tests/cli/test_operations_cli.py, tests/integrations/test_mcp_operations.py).
"""

from __future__ import annotations

import inspect
import time

import pytest

from handoff import AsyncLedger, Ledger
from handoff import codegen
from handoff.aio import AsyncLease, _Call
from handoff.lease import Lease, LeaseCore
from handoff.operations import BY_NAME, MCP_ROLES, OPERATIONS, REQUIRED, Operation, Param
from handoff.reducers import commands as C
from handoff.reducers.authority import RULES
from handoff.verbs import POLICY

#: What a default's source text may name.
DEFAULTS = {"POLICY": POLICY, "time": time}
#: Lease-handle methods that are not a row's verb: the side effect's block (effect_start and
#: effect_confirm around the caller's code).
LEASE_OWN = {"effect"}
#: The rows that issue a command (the others answer from the run's checkpoint).
WRITES = [op for op in OPERATIONS if op.command]


def _params(fn: object) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]  # type: ignore[arg-type]


def _same(row: tuple[Param, ...], fn: object, where: str) -> None:
    """``fn``'s parameters are the row's, in the row's order for the positional ones, with
    the row's kinds and defaults."""
    got = _params(fn)
    names = [p.name for p in got]
    want = [p.name for p in row]
    assert sorted(names) == sorted(want), f"{where}: has {names}, the table lists {want}"
    by_name = {p.name: p for p in got}
    positional = [p.name for p in got if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == [p.name for p in row if p.positional], f"{where}: positional {positional}"
    for p in row:
        actual = by_name[p.name]
        if p.default == REQUIRED:
            assert actual.default is inspect.Parameter.empty, f"{where}: {p.name} has a default, the table says required"
        else:
            assert actual.default is not inspect.Parameter.empty, f"{where}: {p.name} is required, the table gives a default"
            assert actual.default == eval(p.default, DEFAULTS), f"{where}: {p.name}'s default"  # noqa: S307
        if isinstance(actual.annotation, str):
            assert actual.annotation == p.annotation, f"{where}: {p.name} is {actual.annotation}, the table says {p.annotation}"


def test_the_generated_code_is_current() -> None:
    assert codegen.stale() == [], "run: python -m handoff.codegen --write"


def test_every_command_has_a_verb_and_every_verb_a_command() -> None:
    issued = {op.command for op in WRITES} | {c for op in WRITES for c in op.issues}
    assert issued == set(RULES), f"commands without a verb: {set(RULES) - issued}; verbs of no command: {issued - set(RULES)}"
    tags = {cls.__struct_config__.tag for cls in C.Command.__subclasses__()}
    assert {op.command for op in WRITES} <= tags
    for op in WRITES:
        assert getattr(C, op.struct).__struct_config__.tag == op.command, op.name


def test_rows_are_well_formed() -> None:
    assert len(BY_NAME) == len(OPERATIONS), "two rows share a verb name"
    for op in OPERATIONS:
        names = [p.name for p in op.params]
        assert len(set(names)) == len(names), f"{op.name}: a parameter twice"
        assert op.summary.endswith("."), f"{op.name}: the summary is a sentence"
        assert set(op.mcp) <= set(MCP_ROLES), op.name
        for p in op.params:
            assert p.help and p.help[0].isupper() and p.help.endswith((".", ")")), f"{op.name}.{p.name}: {p.help!r}"
        if not op.command:
            assert op.reads and not op.struct and not op.issues, f"{op.name}: a verb that writes nothing reads"
            continue
        fields = set(getattr(C, op.struct).__struct_fields__)
        for p in op.params:
            if p.command_field:
                assert p.command_field in fields, f"{op.name}.{p.name} fills {p.command_field}, not a field of {op.struct}"
        if op.built:
            assert op.caller != "custom", f"{op.name}: a built verb says how its caller is named"


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_ledger_has_the_verb_as_the_row_says(op: Operation) -> None:
    _same(op.params, getattr(Ledger, op.name), f"Ledger.{op.name}")
    if op.returns != "Any":
        assert inspect.signature(getattr(Ledger, op.name)).return_annotation == op.returns


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_async_ledger_calls_the_ledgers_verb(op: Operation) -> None:
    call = AsyncLedger.__dict__.get(op.name)
    assert isinstance(call, _Call) and call.method is getattr(Ledger, op.name), f"AsyncLedger.{op.name}"


LEASED = [op for op in OPERATIONS if op.lease_verb is not None]


@pytest.mark.parametrize("op", LEASED, ids=lambda op: op.name)
def test_lease_handles_offer_the_verb(op: Operation) -> None:
    own = tuple(p for p in op.params if p.name not in codegen.HELD)
    for cls in (LeaseCore, Lease, AsyncLease):
        _same(own, getattr(cls, op.lease_verb), f"{cls.__name__}.{op.lease_verb}")  # type: ignore[arg-type]
    assert inspect.iscoroutinefunction(getattr(AsyncLease, op.lease_verb))  # type: ignore[arg-type]
    rule = RULES.get(op.command)
    assert rule is None or rule.lease, f"{op.name}: a lease handle offers it, but its rule does not admit a lease holder"


def _public_methods(cls: type) -> set[str]:
    return {name for name, v in vars(cls).items() if not name.startswith("_") and inspect.isfunction(v)}


def test_lease_handles_offer_no_verb_the_table_lacks() -> None:
    verbs = {op.lease_verb for op in LEASED}
    for cls in (Lease, AsyncLease):
        assert _public_methods(cls) - LEASE_OWN == verbs, cls.__name__


def test_every_ledger_method_that_writes_a_command_is_a_row() -> None:
    """A public method whose code builds a command (``C.<Command>(``) is a verb: it must be
    a row, so no surface can grow a verb the table does not know."""
    writers = set()
    for name in dir(Ledger):
        fn = getattr(Ledger, name)
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        source = inspect.getsource(fn)
        if any(f"C.{cls.__name__}(" in source for cls in C.Command.__subclasses__()):
            writers.add(name)
    assert writers - set(BY_NAME) == set(), "verbs without a row"
    built = {op.name for op in WRITES if op.built}
    assert built <= writers


def test_the_lease_rule_and_the_lease_parameter_agree() -> None:
    """A verb a worker calls with a token takes ``lease``; one no lease may call takes none."""
    for op in WRITES:
        names = {p.name for p in op.params}
        rule = RULES[op.command]
        if op.caller in ("worker", "lease_or_person"):
            assert "lease" in names and rule.lease, op.name
        if not rule.lease:
            assert "lease" not in names, op.name
        if op.caller in ("owner", "person"):
            assert "by" in names, op.name


def test_a_verb_added_by_its_rule_its_row_and_its_test(tmp_path: object) -> None:
    """``effect_outcome`` was added in three places: its rule (reducers/effects.py), its row
    and this test; Ledger, AsyncLedger and both lease handles offer it from the row."""
    import asyncio
    import os

    path = os.path.join(str(tmp_path), "h.db")
    with Ledger(path) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")
        with lg.lease(run, worker="w1") as lease:
            lease.transition("planning")
            lease.transition("executing")
            assert lease.effect_outcome("publish")["state"] == "none"
            with lease.effect("publish", "post the notes"):
                pending = lease.effect_outcome("publish")
            assert pending["state"] == "pending" and pending["what"] == "post the notes"
            assert pending["lease"] == lease.number
        answer = lg.effect_outcome(run, "publish")
        assert answer == {"run_id": run, "effect_key": "publish", "state": "settled", "outcome": "done",
                          "what": None, "started_seq": None, "lease": None}
        before = lg.store.head(run)

    async def asked() -> dict:
        async with AsyncLedger(path) as alg:
            return await alg.effect_outcome(run, "publish")

    assert asyncio.run(asked()) == answer
    with Ledger(path) as lg:
        assert lg.store.head(run) == before  # a question writes nothing
