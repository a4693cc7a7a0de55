"""The MCP server against the table of operations (handoff/operations.py).

Each role's server is started in-process and asked for its tools through the SDK's own
client: a role offers the read tools and exactly the verbs whose row names it in ``mcp``;
a verb's tool takes exactly the row's parameters but those the server fills itself or
withholds (handoff/integrations/mcp_roles.py), each described by the row's one
description; and the verbs a role offers are ones the authority policy
(``reducers.authority.RULES``) lets that role call. Then the arguments the table names
(``effect_key``, ``delivery_key``, ``lease_number``, ``key``, the contract's fields) are
shown to reach the ledger.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from handoff.aio import AsyncLedger
from handoff.integrations import mcp_roles
from handoff.integrations import mcp_server as ms
from handoff.integrations.mcp_roles import FILLED, READ_TOOLS, WITHHELD, TableDisagrees, offered, tool_name, verb_tools
from handoff.integrations.mcp_session import Session, Sessions
from handoff.operations import BY_NAME, MCP_ROLES, OPERATIONS, Operation
from handoff.reducers.authority import RULES


def config(role: str, root: Path) -> ms.Config:
    return ms.Config(role=role, name="" if role == "auditor" else f"{role}-1",
                     root=str(root) if role == "worker" else None)


async def _servers(address: str, body: Any, *configs: ms.Config) -> Any:
    """One ledger, one in-process server per config (each its own session), their clients."""
    async with AsyncLedger(address) as alg, AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
            Client(ms.build(alg, c, Sessions(alg, single=Session(c.role))))) for c in configs]
        return await body(alg, *clients)


def listed(role: str, tmp_path: Path) -> dict[str, Any]:
    """The tools ``role``'s server lists, by name."""
    async def body(alg: AsyncLedger, client: Client) -> dict[str, Any]:
        return {t.name: t for t in (await client.list_tools()).tools}

    return anyio.run(_servers, str(tmp_path / "ledger.db"), body, config(role, tmp_path))


def ok(r: Any) -> dict[str, Any]:
    assert not r.is_error, r.content[0].text
    return r.structured_content if r.structured_content is not None else json.loads(r.content[0].text)


# --- which tools a role offers ------------------------------------------------------------------


@pytest.mark.parametrize("role", MCP_ROLES)
def test_a_role_lists_the_read_tools_and_exactly_the_tables_verbs(role, tmp_path):
    tools = listed(role, tmp_path)
    verbs = {tool_name(op) for op in OPERATIONS if role in op.mcp}
    assert set(tools) == set(READ_TOOLS) | verbs
    assert not set(READ_TOOLS) & verbs, "a read tool shares a verb's name"
    for name in READ_TOOLS:
        assert tools[name].annotations.read_only_hint is True, name
    for name in verbs:
        assert tools[name].annotations.read_only_hint is False, name
    if role == "auditor":
        assert verbs == set()


@pytest.mark.parametrize("role", MCP_ROLES)
def test_a_roles_verbs_are_ones_the_authority_policy_lets_it_call(role):
    """A worker server writes as the lease holder, an owner or operator server as that kind
    of actor; the auditor writes nothing. The table may not grant more than RULES does."""
    for op in verb_tools(role):
        rule = RULES[op.command]
        if role == "worker":
            assert rule.lease or rule.kinds == {"worker"}, f"{op.name}: no lease or worker may call it"
        else:
            assert role in rule.kinds, f"{op.name}: RULES does not let a {role} call it ({rule.who})"
    if role == "auditor":
        assert verb_tools(role) == ()


def test_a_table_that_grants_a_role_more_than_the_policy_refuses_every_server(monkeypatch, tmp_path):
    review = dataclasses.replace(BY_NAME["review"], mcp=("owner", "worker"))
    monkeypatch.setattr(mcp_roles, "OPERATIONS", tuple(review if op.name == "review" else op for op in OPERATIONS))
    with pytest.raises(TableDisagrees, match="review to the MCP worker role.*RULES"):
        verb_tools("worker")
    with pytest.raises(TableDisagrees, match="review to the MCP worker role"):
        listed("worker", tmp_path)


def test_a_table_that_grants_a_verb_the_server_has_no_tool_for_refuses_it(monkeypatch, tmp_path):
    """evidence by an owner is in RULES, but an owner server has no evidence tool."""
    evidence = dataclasses.replace(BY_NAME["evidence"], mcp=(*BY_NAME["evidence"].mcp, "owner"))
    monkeypatch.setattr(mcp_roles, "OPERATIONS",
                        tuple(evidence if op.name == "evidence" else op for op in OPERATIONS))
    with pytest.raises(TableDisagrees, match="evidence to the MCP owner role, and the server has no such tool"):
        listed("owner", tmp_path)


# --- what a verb's tool takes and says -----------------------------------------------------------


@pytest.mark.parametrize("role", [r for r in MCP_ROLES if r != "auditor"])
def test_a_verb_tool_takes_exactly_the_rows_parameters_described_by_the_row(role, tmp_path):
    tools = listed(role, tmp_path)
    for op in verb_tools(role):
        schema = tools[tool_name(op)].input_schema
        props = schema["properties"]
        want = [p.name for p in offered(op)]  # the row's, but FILLED and WITHHELD (mcp_roles)
        unknown = set(props) - {p.name for p in op.params}
        assert not unknown, f"{tool_name(op)} takes {sorted(unknown)}, which the table's {op.name} row does not list"
        assert list(props) == [p for p in want if p in props], f"{op.name}: in another order than the row's"
        assert set(props) == set(want), f"{op.name}: the tool takes {sorted(props)}, the table lists {want}"
        for name in want:
            row = op.param(name)
            assert props[name].get("description") == row.help, f"{op.name}.{name}"
            if row.choices:
                assert set(props[name]["enum"]) == set(row.choices), f"{op.name}.{name}"
        required = {n for n in want if op.param(n).required}
        assert set(schema.get("required", [])) == required, f"{op.name}: required"


def test_what_a_server_fills_or_withholds_is_named_once_and_exists():
    params = {p.name for op in OPERATIONS for p in op.params}
    assert FILLED <= params, f"FILLED names no parameter of any row: {FILLED - params}"
    assert "run_id" not in FILLED  # the model names the run; the server never guesses it
    for verb, withheld in WITHHELD.items():
        op = BY_NAME[verb]
        assert op.mcp, f"{verb} is no tool, yet WITHHELD names it"
        for name, why in withheld.items():
            assert op.param(name) and name not in FILLED, f"{verb}.{name}"
            assert len(why) > 20, f"{verb}.{name}: say why a model may not give it"


def test_a_tools_description_starts_from_its_rows_summary_where_the_summary_fits(tmp_path):
    """Where the row's summary is what an MCP caller does, the tool says it first; claim, open,
    artifact and deliver say what a model gets instead (a lease number, the packet, the root,
    send by default)."""
    own = {"claim", "open", "artifact", "deliver"}
    for role in ("worker", "owner", "operator"):
        (tmp_path / role).mkdir()
        tools = listed(role, tmp_path / role)
        for op in verb_tools(role):
            text = tools[tool_name(op)].description
            if op.name in own:
                assert op.summary not in text, op.name
            else:
                assert text.startswith(op.summary), op.name
            if role == "operator":
                assert text.endswith("Recorded as an operator."), op.name


# --- the table's arguments reach the ledger -------------------------------------------------------


def test_effect_key_delivery_key_lease_number_and_the_idempotency_key_reach_the_ledger(backend, tmp_path):
    root = tmp_path / "work"
    root.mkdir()

    async def body(alg: AsyncLedger, owner: Client, worker: Client, operator: Client) -> None:
        run = ok(await owner.call_tool("open", {
            "goal": "g", "target": "chat:#ops", "origin": "issue 7", "retry_budget": 5, "delivery_timeout_s": 90,
            "sanitize_patterns": ["ACME-[0-9]+"], "progress_kinds": {"executing": ["llm_step"]},
            "key": "open-1"}))["run_id"]
        again = ok(await owner.call_tool("open", {
            "goal": "g", "target": "chat:#ops", "origin": "issue 7", "retry_budget": 5, "delivery_timeout_s": 90,
            "sanitize_patterns": ["ACME-[0-9]+"], "progress_kinds": {"executing": ["llm_step"]},
            "key": "open-1"}))
        assert again["run_id"] == run
        opened = [r async for r in alg.log(run)][0].event
        assert (opened.origin, opened.sanitize_patterns) == ("issue 7", ("ACME-[0-9]+",))
        cp = await alg.checkpoint(run)
        assert (cp.owner, cp.policy.retry_budget, cp.policy.delivery_timeout_s) == ("owner-1", 5, 90)
        assert cp.progress_kinds.get("executing") == ("llm_step",)

        ok(await worker.call_tool("claim", {"run_id": run}))
        ok(await worker.call_tool("transition", {"run_id": run, "to": "planning", "key": "t1"}))
        ok(await worker.call_tool("transition", {"run_id": run, "to": "executing"}))
        before = [r.seq async for r in alg.log(run)]
        ok(await worker.call_tool("progress", {"run_id": run, "kind": "llm_step", "key": "p1"}))
        ok(await worker.call_tool("progress", {"run_id": run, "kind": "llm_step", "key": "p1"}))  # a retry
        assert len([r.seq async for r in alg.log(run)]) == len(before) + 1
        ok(await worker.call_tool("effect_start", {"run_id": run, "effect_key": "deploy-1", "what": "deploy",
                                                   "attrs": {"tool": "kubectl"}}))
        # A revoke aimed at an older lease cannot take the current one.
        assert (await operator.call_tool("revoke", {"run_id": run, "reason": "old", "lease_number": 7})).is_error
        assert (await alg.checkpoint(run)).lease == 1
        ok(await operator.call_tool("revoke", {"run_id": run, "reason": "stuck", "lease_number": 1}))
        ok(await owner.call_tool("effect_confirm", {"run_id": run, "effect_key": "deploy-1", "outcome": "done",
                                                    "note": "v42 is live"}))
        started = [r.event for r in [r async for r in alg.log(run)] if r.type == "side_effect_started"]
        assert [e.key for e in started] == ["deploy-1"] and dict(started[0].attrs) == {"tool": "kubectl"}
        assert (await alg.status(run))["pending_effects"] == []

        # A run that succeeded, delivered by hand under a delivery key.
        done = await alg.open(goal="g", target="chat:#ops", owner="owner-1")
        lease = await alg.claim(done, "w9")
        for state in ("planning", "executing", "verifying"):
            await alg.transition(done, str(lease), state)
        (root / "result.md").write_text("done\n")
        await alg.artifact(done, str(lease), str(root / "result.md"))
        await alg.evidence(done, "tests", "pass", lease=str(lease))
        await alg.submit(done, str(lease))
        ok(await owner.call_tool("deliver", {"run_id": done, "delivery_key": "d1", "send": False}))
        ok(await owner.call_tool("delivery_failed", {"run_id": done, "delivery_key": "d1", "error": "HTTP 502"}))
        ok(await owner.call_tool("deliver", {"run_id": done, "delivery_key": "d2", "send": False}))
        out = ok(await owner.call_tool("delivered", {"run_id": done, "delivery_key": "d2", "receipt": "msg-42"}))
        assert out["state"] == "delivered"
        keys = [(r.type, r.event.key) for r in [r async for r in alg.log(done)] if r.type.startswith("deliver")]
        assert ("delivery_failed", "d1") in keys and ("delivery_confirmed", "d2") in keys, keys

    anyio.run(_servers, backend.address(), body, config("owner", tmp_path), config("worker", root),
              config("operator", tmp_path))
