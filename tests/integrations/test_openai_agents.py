"""The OpenAI Agents SDK hooks and trace processor against a real ledger, with a scripted
model (the SDK's ``agents.testing.ScriptedModel``: no network). The SDK's own trace
exporter is replaced by ``LedgerTracingProcessor`` alone, so nothing leaves the machine."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, add_trace_processor, function_tool, set_trace_processors  # noqa: E402
from agents.tracing import TracingProcessor  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.usage import Usage  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.openai_agents import LedgerRunHooks, LedgerTracingProcessor  # noqa: E402
from handoff.ledger.errors import Refused  # noqa: E402
from handoff.reducers import trace as tr  # noqa: E402
from handoff.watchdog import watch_once  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
USAGE = Usage(requests=1, input_tokens=12, output_tokens=3, total_tokens=15)


class FakeModel(ScriptedModel):
    model = "fake-model-1"  # where the SDK's own models keep their name


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    set_trace_processors([LedgerTracingProcessor()])
    yield
    set_trace_processors([])


class TraceIds(TracingProcessor):
    """The SDK's trace ids, as a collector would see them."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def on_trace_start(self, trace) -> None:
        self.ids.append(trace.trace_id)

    def on_trace_end(self, trace) -> None: ...
    def on_span_start(self, span) -> None: ...
    def on_span_end(self, span) -> None: ...
    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


def tools(posts: list[str], *, boom: bool = False, raise_out: bool = False):
    def post(text: str) -> str:
        if boom:
            raise RuntimeError("the chat service said 503")
        posts.append(text)
        return "posted"

    def search(q: str) -> str:
        return "found"

    extra = {"failure_error_function": None} if raise_out else {}
    return function_tool(post, **extra), function_tool(search)


def script(*steps) -> FakeModel:
    return FakeModel([list(s) for s in steps], default_usage=USAGE)


async def kept(lg, run, agent, *, run_config=None, **kw):
    async with LedgerRunHooks(lg, run, worker=kw.pop("worker", "agent-1"), **kw) as hooks:
        return await Runner.run(agent, "post it", hooks=hooks, run_config=run_config)


def test_a_full_run_with_an_sdk_handoff_between_agents_is_recorded_and_submitted(tmp_path):
    posts: list[str] = []
    post, search = tools(posts)
    model = script([function_call("transfer_to_writer", {}, call_id="h1")],
                   [function_call("search", {"q": "x"}, call_id="c1"), function_call("post", {"text": "a"}, call_id="c2")],
                   [assistant_message("summary posted")])
    writer = Agent("writer", model=model, tools=[post, search])
    triage = Agent("triage", model=model, handoffs=[writer])
    seen = TraceIds()
    add_trace_processor(seen)
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="o1")
        result = asyncio.run(kept(lg, run, triage, side_effects={"post"}, output_path=str(tmp_path / "out.md")))
        p = lg.status(run)
        recs = list(lg.log(run))
        joined = tr.build(lg.store.history(run), run).trace_id
        live = lg.store.liveness([run])[run]
    assert seen.ids == [f"trace_{joined}"]  # handoff otel puts the run in the SDK's own trace
    assert posts == ["a"] and result.final_output == "summary posted"
    assert p["state"] == "succeeded" and p["lease"] is None and p["pending_effects"] == []
    types = [r.type for r in recs]
    assert types[:3] == ["handoff_opened", "lease_granted", "state_changed"] and types[-1] == "lease_released"
    started = next(r.event for r in recs if r.type == "side_effect_started")
    confirmed = next(r.event for r in recs if r.type == "side_effect_confirmed")
    assert started.key == confirmed.key and confirmed.outcome == "done"
    assert started.attrs == {"gen_ai.tool.name": "post", "gen_ai.tool.call.id": "c2"}
    assert started.what == 'post({"text":"a"})'
    outcomes = {r.event.attrs["gen_ai.tool.name"] for r in recs
                if r.type == "progress_recorded" and r.event.kind == "tool_outcome"}
    assert outcomes == {"post", "search"}
    # One record per model answer (three), with its usage, every one in the log (usage is a
    # fact of the work, never a beat that could be kept beside the log): the first is the
    # plan, the others notes; together they are the artifact's total.
    answers = [r.event for r in recs if r.type == "progress_recorded"
               and r.event.detail in ("the model's first answer", "the model answered")]
    assert [a.kind for a in answers] == ["plan_committed", "note", "note"]
    usage = [a.attrs for a in answers]
    assert all(a["gen_ai.usage.input_tokens"] == 12 and a["gen_ai.request.model"] == "fake-model-1" for a in usage)
    assert len(usage[0]["trace_id"]) == 32 and all("trace_id" not in a for a in usage[1:])  # handoff otel joins it
    assert sum(a["gen_ai.usage.input_tokens"] for a in usage) == 36
    assert live.lease == 1, live
    notes = [r.event for r in recs if r.type == "progress_recorded" and r.event.kind == "note"
             and r.event.detail != "the model answered"]
    assert [n.detail for n in notes] == ["SDK handoff between agents: the conversation moved from agent triage to "
                                         "agent writer, within this run"]
    art = next(r.event for r in recs if r.type == "artifact_recorded")
    assert Path(art.path).read_text() == "summary posted\n" and art.attrs["gen_ai.usage.input_tokens"] == 36
    assert p["evidence"][0]["kind"] == "agent_output" and p["evidence"][0]["outcome"] == "pass"


def test_a_tool_whose_error_goes_to_the_model_leaves_its_side_effect_to_be_reconciled(tmp_path):
    post, search = tools([], boom=True)
    agent = Agent("writer", model=script([function_call("post", {"text": "a"}, call_id="c1")],
                                         [assistant_message("could not post")]), tools=[post, search])
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="o2")
        with pytest.raises(Refused, match="not submitted"):
            asyncio.run(kept(lg, run, agent, side_effects={"post"}, output_path=str(tmp_path / "o.md")))
        p = lg.status(run)
        recs = list(lg.log(run))
    notes = [r.event.detail for r in recs if r.type == "progress_recorded" and r.event.kind == "note"]
    assert any(n.startswith("tool post failed") for n in notes)
    assert not any(r.type in ("side_effect_confirmed", "result_submitted", "artifact_recorded") for r in recs)
    assert not any(r.type == "progress_recorded" and r.event.kind == "tool_outcome" for r in recs)
    assert p["state"] == "unknown" and p["health"]["classification"] == "needs_reconciliation"
    assert [e["what"] for e in p["pending_effects"]] == ['post({"text":"a"})'] and p["lease"] is None
    # a new agent without a way to reconcile is refused before it claims: nothing written
    agent2 = Agent("writer", model=script([assistant_message("x")]), tools=list(tools([])))
    with Ledger(str(tmp_path / "l.db")) as lg:
        with pytest.raises(Refused, match="reconcile"):
            asyncio.run(kept(lg, run, agent2, worker="agent-2", side_effects={"post"}))
        after = list(lg.log(run))
    assert after == recs


def test_a_tool_that_raises_out_of_the_run_ends_the_lease_with_its_effect_open(tmp_path):
    post, search = tools([], boom=True, raise_out=True)
    agent = Agent("writer", model=script([function_call("post", {"text": "a"}, call_id="c1")]), tools=[post, search])
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="o3")
        with pytest.raises(Exception, match="503"):
            asyncio.run(kept(lg, run, agent, side_effects={"post"}))
        p = lg.status(run)
        recs = list(lg.log(run))
    notes = [r.event.detail for r in recs if r.type == "progress_recorded" and r.event.kind == "note"]
    assert notes[0] == "tool post did not return: the run stopped with UserError"
    assert "503" in notes[1]  # why the worker stopped, recorded by the lease block
    assert types_end(recs) == "lease_released" and not any(r.type == "side_effect_confirmed" for r in recs)
    assert p["state"] == "unknown" and [e["what"] for e in p["pending_effects"]] == ['post({"text":"a"})']


def types_end(recs) -> str:
    return next(r.type for r in reversed(recs) if r.type.startswith("lease_"))


def test_a_side_effecting_tool_is_refused_before_it_runs_when_tracing_is_off(tmp_path):
    posts: list[str] = []
    agent = Agent("writer", model=script([function_call("post", {"text": "a"}, call_id="c1")]),
                  tools=list(tools(posts)))
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="o4")
        with pytest.raises(Refused, match="tracing is off"):
            asyncio.run(kept(lg, run, agent, side_effects={"post"}, run_config=RunConfig(tracing_disabled=True)))
        recs = list(lg.log(run))
    assert posts == [] and not any(r.type == "side_effect_started" for r in recs)


def test_the_hooks_refuse_outside_their_block_and_a_second_run(tmp_path):
    agent = Agent("writer", model=script([assistant_message("hi")], [assistant_message("hi")]))
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Say hi", target="chat:#x", owner="alice", run_id="o5")
        hooks = LedgerRunHooks(lg, run, worker="agent-1", output_path=str(tmp_path / "o.md"))
        with pytest.raises(Refused, match="inside its block"):
            asyncio.run(Runner.run(agent, "hi", hooks=hooks))
        assert [r.type for r in lg.log(run)] == ["handoff_opened"]

        async def twice() -> None:
            async with hooks:
                await Runner.run(agent, "hi", hooks=hooks)
            async with hooks:
                pass

        with pytest.raises(Refused, match="make a new one"):
            asyncio.run(twice())
        assert lg.status(run)["state"] == "succeeded"


def test_a_run_killed_mid_tool_is_resumed_by_a_second_agent_process(tmp_path):
    db = str(tmp_path / "l.db")
    timeout_s = 30
    with Ledger(db) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="o6", heartbeat_timeout_s=timeout_s)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENAI_API_KEY="sk-test-not-a-key")
    cmd = [sys.executable, "-m", "tests.integrations.oai_agent", db, run]
    first = subprocess.Popen([*cmd, "agent-1", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=ROOT)
    try:
        assert first.stdout.readline().strip() == "POSTED"  # the post happened; the tool has not returned
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    with Ledger(db) as lg:
        p = lg.status(run)
        assert p["lease"] == 1 and [e["what"] for e in p["pending_effects"]] == ['post({"text":"a"})']
        # the watchdog, once the heartbeat timeout has passed, revokes the lease: outcome unknown
        watch_once(lg, name="wd", now_us=lg.clock() + 2 * (timeout_s + 1) * 1_000_000)
        p = lg.status(run)
        assert p["state"] == "unknown" and p["health"]["classification"] == "needs_reconciliation"
    second = subprocess.run([*cmd, "agent-2", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=120)
    assert second.returncode == 0, second.stderr
    with Ledger(db, readonly=True) as lg:
        p = lg.status(run)
        recs = list(lg.log(run))
    assert p["state"] == "succeeded" and p["pending_effects"] == []
    settled = [r for r in recs if r.type in ("reconciliation_recorded", "side_effect_confirmed")]
    assert settled[0].actor == "worker:agent-2" and settled[0].event.outcome == "done"
    assert (tmp_path / "posted").read_text() == "a\n"  # posted once: the second agent's call found it done
    assert [r.event.lease for r in recs if r.type == "lease_revoked"] == [1]
