# openai_agent.py: an OpenAI Agents SDK agent whose run is kept in the ledger by its hooks.
import asyncio

from agents import Agent, Runner, function_tool, set_trace_processors
from agents.testing import ScriptedModel, assistant_message, function_call  # offline; use your model here

from handoff import Ledger
from handoff.integrations.openai_agents import LedgerRunHooks, LedgerTracingProcessor

set_trace_processors([LedgerTracingProcessor()])  # or add_trace_processor(...) beside the SDK's exporter


@function_tool
def post(text: str) -> str:  # a side effect: recorded as started before, done after
    return "posted"


model = ScriptedModel([[function_call("post", {"text": "hi"}, call_id="c1")], [assistant_message("Posted.")]])
agent = Agent("writer", model=model, tools=[post])


async def main() -> None:
    with Ledger("handoff.db") as lg:
        run = lg.open(goal="Post the summary to #ops", target="chat:#ops", owner="alice")
        async with LedgerRunHooks(lg, run, worker="agent-1", side_effects={"post"}, output_path="summary.md") as hooks:
            await Runner.run(agent, "Summarise and post", hooks=hooks)
        print(lg.status(run)["state"])  # succeeded: output recorded, evidence, submitted


asyncio.run(main())
