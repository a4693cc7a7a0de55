"""An OpenAI Agents SDK agent process for the crash test: ``python -m tests.integrations.oai_agent DB RUN WORKER DIR``.

Its model is scripted (no network): call ``post``, then answer. The ``post`` tool (a side
effect) appends to ``DIR/posted`` and then, while no post was made before, waits to be
killed; a resumed worker reconciles that post by looking for the file.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENAI_API_KEY", "sk-test-not-a-key")  # the SDK wants one; nothing is sent

from agents import Agent, Runner, function_tool, set_trace_processors  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.usage import Usage  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.openai_agents import LedgerRunHooks, LedgerTracingProcessor  # noqa: E402


class FakeModel(ScriptedModel):
    model = "fake-model-1"


def main(db: str, run_id: str, worker: str, where: str) -> None:
    d = Path(where)
    set_trace_processors([LedgerTracingProcessor()])  # in place of the SDK's exporter: nothing leaves the machine

    async def reconcile(what: str) -> str:
        return "done" if (d / "posted").exists() else "absent"

    @function_tool
    def post(text: str) -> str:
        if (d / "posted").exists():
            return "already posted"
        with (d / "posted").open("a") as f:
            f.write(text + "\n")
        print("POSTED", flush=True)
        while True:  # the first worker dies here, mid-tool
            time.sleep(0.05)

    model = FakeModel([[function_call("post", {"text": "a"}, call_id="call-1")], [assistant_message("posted it")]],
                      default_usage=Usage(requests=1, input_tokens=12, output_tokens=3, total_tokens=15))
    agent = Agent("poster", model=model, tools=[post])

    async def go() -> None:
        with Ledger(db) as lg:
            async with LedgerRunHooks(lg, run_id, worker=worker, side_effects={"post"},
                                      output_path=str(d / f"{worker}.md"), reconcile=reconcile) as hooks:
                await Runner.run(agent, "post it", hooks=hooks)

    asyncio.run(go())
    print("DONE", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
