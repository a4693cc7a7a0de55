# async_agent.py: an agent on an event loop; the ledger never blocks the loop.
import asyncio
from pathlib import Path

from handoff import AsyncLedger, LeaseLost


async def call_tool(name: str) -> str:
    await asyncio.sleep(0.01)  # the tool's real work: an HTTP call, a model call...
    return f"{name}: ok"


async def main() -> None:
    async with AsyncLedger("handoff.db") as alg:  # the ledger's calls run on a thread of its own
        run = await alg.open(goal="Summarise three sources", target="chat:#ops", owner="alice")
        try:
            async with alg.lease(run, worker="agent-1") as lease:  # heartbeat and fence are tasks
                await lease.transition("planning")
                await lease.progress("plan_committed", "three tool calls, then the summary")
                await lease.transition("executing")
                for name in ("search", "fetch", "extract"):
                    async with lease.effect(f"{name}-1", f"call {name}"):
                        print(await call_tool(name))
                    await lease.progress("tool_outcome", f"{name} done")
                Path("summary.md").write_text("# Summary\n\nThree sources, summarised.\n")
                await lease.artifact("summary.md")
                await lease.transition("verifying")
                await lease.submit("summary written")
        except LeaseLost as lost:  # the block's task was cancelled when the lease was lost
            print("stopped:", lost.message)
        print((await alg.status(run))["state"])
        async for rec in alg.log(run):  # iterators are async iterators
            print(rec.seq, rec.type)


asyncio.run(main())
