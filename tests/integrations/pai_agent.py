"""A pydantic-ai agent process for the crash test: ``python -m tests.integrations.pai_agent DB RUN WORKER DIR``.

Its ``post`` tool (a side effect) writes ``DIR/posted`` and then, for worker-1, waits to be
killed; a resumed worker reconciles that post by looking for the file.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from handoff import Ledger
from handoff.integrations.pydantic_ai import HandoffCapability


def main(db: str, run_id: str, worker: str, where: str) -> None:
    d = Path(where)

    async def reconcile(what: str) -> str:
        return "done" if (d / "posted").exists() else "absent"

    with Ledger(db) as lg:
        cap = HandoffCapability(lg, run_id, worker=worker, side_effects={"post"}, output_path=str(d / f"{worker}.md"),
                                reconcile=reconcile)
        agent = Agent(TestModel(), capabilities=[cap])

        @agent.tool_plain
        def post(text: str) -> str:
            if not (d / "posted").exists():
                (d / "posted").write_text(text)
                print("POSTED", flush=True)
                while True:  # the first worker dies here, mid-tool
                    time.sleep(0.05)
            return "already posted"

        asyncio.run(agent.run("post it"))
    print("DONE", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
