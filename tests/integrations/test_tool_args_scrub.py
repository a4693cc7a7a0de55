"""A side-effecting tool called with a secret in its arguments: what each agent
integration records of the call (``side_effect_started.what``) passes the same scrub as
an exception's text (handoff.lease.bounded_text), so the secret is in neither the ledger,
nor ``handoff log``, nor the trace's ``handoff.effect.what``. Real frameworks with their
own offline models: pydantic-ai's ``FunctionModel``, the OpenAI Agents SDK's
``ScriptedModel``. Every secret shape of tests/delivery/test_secret_shapes.py is walked.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from handoff import Ledger
from handoff.reducers import trace as tr
from tests.support import Handoff
from tests.delivery.test_secret_shapes import _EXAMPLES

SHAPES = sorted(_EXAMPLES)


def _check_nothing_kept(db: str, run: str) -> list[str]:
    """Every secret is absent from the ledger's events, the CLI's log and the trace; the
    recorded descriptions, in call order."""
    with Ledger(db) as lg:
        recs = list(lg.log(run))
        trace = tr.build(lg.store.history(run), run)
    started = [r.event.what for r in recs if r.type == "side_effect_started"]
    assert len(started) == len(SHAPES)
    events = json.dumps([r.event.what for r in recs if r.type == "side_effect_started"]) + repr(recs)
    log = Handoff(db)("log", run, "--json").stdout
    effect_what = [s.attributes["handoff.effect.what"] for s in trace.spans if "handoff.effect.what" in s.attributes]
    assert len(effect_what) == len(SHAPES)
    for shape in SHAPES:
        _, secret = _EXAMPLES[shape]
        for where, text in (("ledger", events), ("log", log), ("trace", json.dumps(effect_what))):
            assert secret not in text and json.dumps(secret)[1:-1] not in text, (shape, where)
    assert all(w.startswith("deploy(") and len(w) <= 200 for w in started)
    return started


# --- pydantic-ai ------------------------------------------------------------------------------


def test_pydantic_ai_records_tool_arguments_scrubbed(tmp_path):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from handoff.integrations.pydantic_ai import HandoffCapability

    def model(messages, info):
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", ()))
        if done < len(SHAPES):
            text = _EXAMPLES[SHAPES[done]][0]
            return ModelResponse(parts=[ToolCallPart("deploy", {"target": "prod", "config": text},
                                                     tool_call_id=f"c{done}")])
        return ModelResponse(parts=[TextPart("deployed")])

    calls: list[str] = []
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        run = lg.open(goal="Deploy", target="chat:#x", owner="alice", run_id="pai-args")
        cap = HandoffCapability(lg, run, worker="agent-1", side_effects={"deploy"},
                                output_path=str(tmp_path / "out.md"))
        agent = Agent(FunctionModel(model), capabilities=[cap])

        @agent.tool_plain
        def deploy(target: str, config: str) -> str:
            calls.append(config)  # the tool itself gets its arguments as they were
            return "ok"

        asyncio.run(agent.run("deploy it"))
        assert lg.status(run)["state"] == "succeeded"
    assert calls == [_EXAMPLES[s][0] for s in SHAPES]
    started = _check_nothing_kept(db, run)
    assert all('"target": "prod"' in w for w in started)  # what is not a secret stays readable


# --- OpenAI Agents SDK ----------------------------------------------------------------------------


def test_openai_agents_records_tool_arguments_scrubbed(tmp_path, monkeypatch):
    pytest.importorskip("agents")
    from agents import Agent, Runner, function_tool, set_trace_processors
    from agents.testing import ScriptedModel, assistant_message, function_call
    from agents.usage import Usage

    from handoff.integrations.openai_agents import LedgerRunHooks, LedgerTracingProcessor

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    set_trace_processors([LedgerTracingProcessor()])  # tracing on, nothing exported
    try:
        calls: list[str] = []

        def deploy(target: str, config: str) -> str:
            calls.append(config)
            return "ok"

        steps = [[function_call("deploy", {"target": "prod", "config": _EXAMPLES[s][0]}, call_id=f"c{i}")]
                 for i, s in enumerate(SHAPES)] + [[assistant_message("deployed")]]
        model = ScriptedModel(steps, default_usage=Usage(requests=1, input_tokens=5, output_tokens=2, total_tokens=7))
        agent = Agent("deployer", model=model, tools=[function_tool(deploy)])
        db = str(tmp_path / "l.db")
        with Ledger(db) as lg:
            run = lg.open(goal="Deploy", target="chat:#x", owner="alice", run_id="oai-args")

            async def go() -> None:
                async with LedgerRunHooks(lg, run, worker="agent-1", side_effects={"deploy"},
                                          output_path=str(tmp_path / "out.md")) as hooks:
                    await Runner.run(agent, "deploy it", hooks=hooks, max_turns=len(SHAPES) + 2)

            asyncio.run(go())
            assert lg.status(run)["state"] == "succeeded"
    finally:
        set_trace_processors([])
    assert calls == [_EXAMPLES[s][0] for s in SHAPES]
    started = _check_nothing_kept(db, run)
    assert all('"target":"prod"' in w.replace(" ", "") for w in started)


# --- the one function ---------------------------------------------------------------------------


def test_the_description_is_scrubbed_whole_before_it_is_cut(tmp_path):
    """A key past the cut is not left half there: the text is scrubbed first, then cut."""
    from handoff.aio import AsyncLedger
    from handoff.integrations._agent_run import MAX_WHAT, AgentRun

    token = "ghp_" + "R4nd0mT0k3nV4lu3AbCdEfGhIjKlMnOpQrSt"
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="g", target="chat:#x", owner="alice", run_id="cut")
        alg = AsyncLedger(ledger=lg)
        agent_run = AgentRun(alg, run, "w", "Test")
        for pad in range(MAX_WHAT - 30, MAX_WHAT + 5):
            text = asyncio.run(agent_run.describe("deploy", {"a": "x" * pad, "b": token}))
            assert "ghp_R4nd" not in text and len(text) <= MAX_WHAT


def test_a_header_or_a_key_in_an_argument_that_is_itself_json_is_scrubbed(tmp_path):
    """The security review's reproductions: ``what`` dumps the arguments as JSON, so an
    argument that is JSON already is escaped twice (``\\"Authorization\\": \\"Token ...``),
    and a private key dumped twice over has line ends ``\\\\n``. Neither is recorded."""
    from handoff.integrations._agent_run import what
    from handoff.lease import bounded_text
    from handoff.reducers import sanitize as sz

    token = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
    body = "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu"
    key = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\nAbCd==\n-----END RSA PRIVATE KEY-----\n"
    calls = {
        token: what("http_request", {"headers": json.dumps({"Authorization": f"Token {token}"})}),
        body: what("write_file", {"content": json.dumps(json.dumps(key))}),
    }
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="g", target="chat:#x", owner="alice", run_id="json-args")
        for secret, text in calls.items():
            assert secret in text  # the description as built holds it ...
            assert [f.detector for f in sz.scan([("what", text)])] == ["secret"]
            out = bounded_text(text, lg, run)  # ... what is recorded does not
            assert secret not in out and secret[:12] not in out, out
            assert out.startswith(text[:text.index("(") + 1])
