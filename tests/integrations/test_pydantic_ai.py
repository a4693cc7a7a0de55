"""The pydantic-ai capability against a real ledger, with pydantic-ai's offline TestModel."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.pydantic_ai import HandoffCapability  # noqa: E402
from handoff.ledger.errors import Refused  # noqa: E402
from handoff.watchdog import watch_once  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent


def agent_with(cap: HandoffCapability, *, boom: bool = False) -> Agent:
    agent = Agent(TestModel(), capabilities=[cap])

    @agent.tool_plain
    def post(text: str) -> str:
        if boom:
            raise RuntimeError("the chat service said 503")
        return "posted"

    @agent.tool_plain
    def search(q: str) -> str:
        return "found"

    return agent


def test_a_full_run_is_recorded_and_submitted(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="p1")
        cap = HandoffCapability(lg, run, worker="agent-1", side_effects={"post"}, output_path=str(tmp_path / "out.md"))
        result = asyncio.run(agent_with(cap).run("post it"))
        p = lg.status(run)
        recs = list(lg.log(run))
    assert p["state"] == "succeeded" and p["lease"] is None and p["pending_effects"] == []
    types = [r.type for r in recs]
    assert types[:3] == ["handoff_opened", "lease_granted", "state_changed"] and types[-1] == "lease_released"
    started = next(r.event for r in recs if r.type == "side_effect_started")
    confirmed = next(r.event for r in recs if r.type == "side_effect_confirmed")
    assert started.key == confirmed.key and confirmed.outcome == "done"
    assert started.attrs["gen_ai.tool.name"] == "post"
    outcomes = {r.event.attrs["gen_ai.tool.name"] for r in recs
                if r.type == "progress_recorded" and r.event.kind == "tool_outcome"}
    assert outcomes == {"post", "search"}
    usage = [r.event.attrs for r in recs if r.type == "progress_recorded"
             and r.event.detail in ("the model's first answer", "the model answered")]  # every answer's usage
    assert usage and all(a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.request.model"] == "test" for a in usage)
    art = next(r.event for r in recs if r.type == "artifact_recorded")
    assert Path(art.path).read_text().strip() == result.output and art.attrs["gen_ai.usage.input_tokens"] == sum(
        a["gen_ai.usage.input_tokens"] for a in usage)
    assert p["evidence"][0]["kind"] == "agent_output" and p["evidence"][0]["outcome"] == "pass"


def test_a_tool_that_raises_leaves_its_side_effect_to_be_reconciled(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="p2")
        cap = HandoffCapability(lg, run, worker="agent-1", side_effects={"post"}, output_path=str(tmp_path / "o.md"))
        with pytest.raises(RuntimeError, match="503"):
            asyncio.run(agent_with(cap, boom=True).run("post it"))
        p = lg.status(run)
        recs = list(lg.log(run))
    notes = [r.event.detail for r in recs if r.type == "progress_recorded" and r.event.kind == "note"]
    assert any("tool post raised RuntimeError: the chat service said 503" in n for n in notes)
    assert not any(r.type == "side_effect_confirmed" for r in recs)  # never guessed
    assert p["state"] == "unknown" and p["health"]["classification"] == "needs_reconciliation"
    assert [e["what"] for e in p["pending_effects"]] == ['post({"text": "a"})'] and p["lease"] is None
    # a new agent without a way to reconcile is refused before it claims: nothing written
    with Ledger(str(tmp_path / "l.db")) as lg:
        cap = HandoffCapability(lg, run, worker="agent-2", side_effects={"post"}, output_path=str(tmp_path / "o.md"))
        with pytest.raises(Refused, match="reconcile"):
            asyncio.run(agent_with(cap).run("post it"))
        after = list(lg.log(run))
    assert after == recs


def test_a_run_killed_mid_tool_is_resumed_by_a_second_agent_process(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        run = lg.open(goal="Post a summary", target="chat:#x", owner="alice", run_id="p3", heartbeat_timeout_s=30)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "tests.integrations.pai_agent", db, run]
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
        assert p["lease"] == 1 and [e["what"] for e in p["pending_effects"]] == ['post({"text": "a"})']
        # the watchdog, once the heartbeat timeout has passed, revokes the lease: outcome unknown
        watch_once(lg, name="wd", now_us=lg.clock() + 31 * 1_000_000 * 2)
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
    assert (tmp_path / "posted").read_text() == "a"  # posted once: the second agent's call found it done
    assert [r.event.lease for r in recs if r.type == "lease_revoked"] == [1]
