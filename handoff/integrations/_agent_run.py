"""What an agent run owes the ledger, whatever framework runs the agent.

The pydantic-ai capability and the OpenAI Agents SDK hooks meet the same moments (the
run starts, the model answers, a tool starts, returns or fails, the agent gives its final
output) through different extension points. ``AgentRun`` holds what each moment writes,
so both record the same events in the same order and a rule changed here changes for
both. It imports no framework.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handoff.aio import AsyncLease, AsyncLedger
from handoff.facade import Ledger
from handoff.lease import bounded_text
from handoff.ledger.errors import Refused
from handoff.reducers import transitions as T

#: How much of a tool's arguments go into the side effect's description.
MAX_WHAT = 200
#: How much of a model's or a tool's name goes into an attribute.
MAX_NAME = 200

#: ``reconcile(what)`` looks at the world and says whether the side effect described by
#: ``what`` happened: ``"done"`` or ``"absent"``.
Reconcile = Callable[[str], Awaitable[str]]


def as_async(ledger: Ledger | AsyncLedger) -> tuple[AsyncLedger, bool]:
    """The ``AsyncLedger`` to write through, and whether this run opened it (and closes it)."""
    if isinstance(ledger, AsyncLedger):
        return ledger, False
    return AsyncLedger(ledger=ledger), True


def usage_attrs(usage: Any, model: str | None) -> dict[str, Any]:
    """A model answer's token usage and model name under the GenAI attribute names."""
    attrs: dict[str, Any] = {}
    for name in ("input_tokens", "output_tokens"):
        value = getattr(usage, name, None)
        if isinstance(value, int) and value >= 0:
            attrs[f"gen_ai.usage.{name}"] = value
    if model:
        attrs["gen_ai.request.model"] = model[:MAX_NAME]
    return attrs


def tool_attrs(name: str, call_id: Any) -> dict[str, Any]:
    return {"gen_ai.tool.name": name[:MAX_NAME], "gen_ai.tool.call.id": str(call_id)[:MAX_NAME]}


def what(tool_name: str, args: Any) -> str:
    """A side effect's description as the tool was called: the tool and its arguments,
    whole. Never recorded as it is: ``AgentRun.describe`` scrubs and bounds it."""
    text_args = args if isinstance(args, str) else json.dumps(args, sort_keys=True, default=str)
    return f"{tool_name}({text_args})"


def output_text(out: Any) -> str:
    text = out if isinstance(out, str) else json.dumps(out, default=lambda o: getattr(o, "__dict__", str(o)),
                                                       indent=2, sort_keys=True)
    return text if text.endswith("\n") else text + "\n"


@dataclass
class AgentRun:
    """One agent run's writes to the ledger. ``owner`` names the integration's class in
    the messages a user reads (``HandoffCapability``, ``LedgerRunHooks``)."""

    alg: AsyncLedger
    run_id: str
    worker: str
    owner: str
    side_effects: Collection[str] = ()
    output_path: str | None = None
    reconcile: Reconcile | None = None
    submit: bool = True
    lease: AsyncLease | None = field(default=None, repr=False)

    def effect_key(self, tool_name: str, call_id: Any) -> str:
        # The lease number keeps a resumed agent's call apart from the dead one's, whose
        # model may have chosen the same call id.
        assert self.lease is not None
        return f"tool:{self.lease.number}:{tool_name}:{call_id}"

    async def describe(self, tool_name: str, args: Any) -> str:
        """What a side effect's start records of the call: the tool and its arguments
        through the one scrub of free text (``bounded_text``: the sanitizer's detectors and
        the run's own patterns, the same as an exception's text), then cut to ``MAX_WHAT``.
        A tool's arguments can hold a key (``deploy({"api_key": ...})``); the ledger, the
        log and a trace's ``handoff.effect.what`` must not."""
        text = what(tool_name, args)
        return await self.alg.run(lambda ledger: bounded_text(text, ledger, self.run_id, MAX_WHAT))

    async def state(self) -> str:
        return (await self.alg.status(self.run_id))["state"]

    async def refuse_unreconcilable(self) -> None:
        """Before claiming: a run left with side effects of unknown outcome, and no way
        given to find them out, is refused with nothing written."""
        self._refuse((await self.alg.status(self.run_id))["pending_effects"])

    def _refuse(self, pending: list[dict[str, Any]]) -> None:
        if pending and self.reconcile is None:
            raise Refused(f"run {self.run_id} has side effects an earlier worker left without an outcome "
                          f"({', '.join(p['what'] for p in pending)}); give {self.owner}(reconcile=...) a "
                          "function that looks at the world and answers 'done' or 'absent' for each, or confirm "
                          "them with 'handoff effect-confirm'")

    async def begin(self, lease: AsyncLease) -> None:
        """With the lease held: settle what an earlier worker left, then move the run to
        where an agent works (a queued run to ``planning``, an ``unknown`` one back to
        ``executing``)."""
        self.lease = lease
        pending = (await self.alg.status(self.run_id))["pending_effects"]
        self._refuse(pending)  # the status may have changed since the check before claiming
        for p in pending:
            assert self.reconcile is not None
            outcome = await self.reconcile(p["what"])
            await lease.confirm(p["key"], outcome, note=f"reconciled by {self.worker} before resuming")
        state = await self.state()
        if state == T.QUEUED:
            await lease.transition(T.PLANNING)
        elif state == T.UNKNOWN:
            await lease.transition(T.EXECUTING)

    async def model_answered(self, attrs: dict[str, Any]) -> None:
        """The answer's usage, in the log every time: the first answer is the plan, a later
        one a note. (Not on a heartbeat: a beat whose attrs equal the last one's is kept
        beside the log, and usage is a fact of the work, summed by the trace.)"""
        lease = self.lease
        assert lease is not None
        if await self.state() == T.PLANNING:
            await lease.progress("plan_committed", "the model's first answer", attrs=attrs or None)
            await lease.transition(T.EXECUTING)
        else:
            await lease.progress("note", "the model answered", attrs=attrs or None)

    async def note(self, text: str, attrs: dict[str, Any] | None = None) -> None:
        """A note, not progress (a tool that failed, something the trace showed), its text
        through the sanitizer's detectors."""
        lease = self.lease
        assert lease is not None
        text = await self.alg.run(lambda ledger: bounded_text(text, ledger, self.run_id))
        await lease.progress("note", text, attrs=attrs or None)

    async def tool_returned(self, tool_name: str, attrs: dict[str, Any]) -> None:
        assert self.lease is not None
        await self.lease.progress("tool_outcome", f"{tool_name} returned", attrs=attrs)

    async def finish(self, output: Any, usage: dict[str, Any]) -> Path:
        """The final output as a file, an artifact and ``agent_output`` evidence (with the
        run's usage), then, with ``submit``, the submit."""
        lease = self.lease
        assert lease is not None
        path = Path(self.output_path or f"{self.run_id}-output.md")
        path.write_text(output_text(output), encoding="utf-8")
        if await self.state() == T.PLANNING:
            await lease.progress("plan_committed", "the agent answered without a tool call")
            await lease.transition(T.EXECUTING)
        await lease.artifact(str(path), attrs=usage or None)
        await lease.evidence("agent_output", "pass", f"the agent run ended with its output in {path.name}",
                             attrs=usage or None)
        if self.submit:
            await lease.transition(T.VERIFYING)
            await lease.submit(f"{self.worker}: agent output in {path.name}")
        return path


__all__ = ["AgentRun", "Reconcile", "as_async", "output_text", "tool_attrs", "usage_attrs", "what"]
