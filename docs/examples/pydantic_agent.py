# pydantic_agent.py: a pydantic-ai agent whose run is kept in the ledger by one capability.
import asyncio

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel  # offline; use your model name here

from handoff import Ledger
from handoff.integrations.pydantic_ai import HandoffCapability

with Ledger("handoff.db") as lg:
    run = lg.open(goal="Post the summary to #ops", target="chat:#ops", owner="alice")
    cap = HandoffCapability(lg, run, worker="agent-1", side_effects={"post"}, output_path="summary.md")
    agent = Agent(TestModel(), capabilities=[cap])

    @agent.tool_plain
    def post(text: str) -> str:  # a side effect: recorded as started before, done after
        return "posted"

    asyncio.run(agent.run("Summarise and post"))
    print(lg.status(run)["state"])  # succeeded: output recorded, evidence, submitted
