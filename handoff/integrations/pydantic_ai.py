"""A pydantic-ai capability that keeps an agent run in the ledger.

pydantic-ai's extension point is the capability (``pydantic_ai.capabilities.
AbstractCapability``): hooks around the whole run, each model request and each tool
call. ``HandoffCapability`` uses them to do what a worker owes the ledger, so an agent
builder adds one argument instead of writing the mapping by hand:

- ``wrap_run``: holds the lease for the agent run (``AsyncLedger.lease``: heartbeats as a
  task, self-fencing; an exception ends it with the reason recorded). A run left
  ``unknown`` by a worker that died mid-tool is reconciled first, through ``reconcile``.
- ``wrap_model_request``: the lease heartbeats throughout; each response adds a heartbeat
  carrying its model and token usage (``gen_ai.*`` attrs). The first response commits
  the plan (``plan_committed``) and moves the run to ``executing``.
- ``wrap_tool_execute``: a tool named in ``side_effects`` runs inside ``lease.effect`` (its
  start is recorded before it runs, ``done`` after; a crash or an exception in between
  leaves the outcome to be reconciled, never guessed); every tool's outcome is recorded
  as ``tool_outcome`` progress, and a tool that raises as a ``note`` (no progress).
- ``after_run``: the final output is written to ``output_path`` and recorded as an
  artifact with ``agent_output`` evidence carrying the run's usage; then, with
  ``submit=True``, the result is submitted.

Needs the ``pydantic-ai`` extra (``pip install 'handoff-ledger[pydantic-ai]'``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai.capabilities import AbstractCapability

from handoff.aio import AsyncLease, AsyncLedger
from handoff.api import Ledger
from handoff.lease import bounded_text
from handoff.reducers import transitions as T

#: How much of a tool's arguments go into the side effect's description.
MAX_WHAT = 200

#: ``reconcile(what)`` looks at the world and says whether the side effect described by
#: ``what`` happened: ``"done"`` or ``"absent"``.
Reconcile = Callable[[str], Awaitable[str]]


def _usage_attrs(usage: Any, model: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for name in ("input_tokens", "output_tokens"):
        value = getattr(usage, name, None)
        if isinstance(value, int) and value >= 0:
            attrs[f"gen_ai.usage.{name}"] = value
    if model:
        attrs["gen_ai.request.model"] = model[:200]
    return attrs


def _what(call: Any) -> str:
    args = call.args if isinstance(call.args, str) else json.dumps(call.args, sort_keys=True, default=str)
    text = f"{call.tool_name}({args})"
    return text if len(text) <= MAX_WHAT else text[:MAX_WHAT - 1] + "…"


@dataclass
class HandoffCapability(AbstractCapability[Any]):
    """``Agent(..., capabilities=[HandoffCapability(ledger, run_id, worker="agent-1")])``.

    ``ledger`` is a ``Ledger`` or an ``AsyncLedger``; ``side_effects`` names the tools
    that change the world (they are wrapped in effect start/confirm); ``output_path`` is
    where the final output is written and recorded as the artifact (default
    ``<run_id>-output.md`` in the working directory); ``reconcile`` is asked about each side
    effect an earlier worker left without an outcome, before this run's agent starts.
    """

    ledger: Ledger | AsyncLedger
    run_id: str
    worker: str = "pydantic-ai"
    side_effects: Collection[str] = ()
    output_path: str | None = None
    reconcile: Reconcile | None = None
    submit: bool = True
    heartbeat_s: float | None = None
    lease: AsyncLease | None = field(default=None, init=False, repr=False)
    _alg: AsyncLedger | None = field(default=None, init=False, repr=False)

    async def for_run(self, ctx: Any) -> HandoffCapability:
        """A copy per agent run: each holds its own lease."""
        mine = copy.copy(self)
        mine.lease, mine._alg = None, None
        return mine

    # --- the run: one lease --------------------------------------------------------

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        if isinstance(self.ledger, AsyncLedger):
            alg, own = self.ledger, False
        else:
            alg, own = AsyncLedger(ledger=self.ledger), True
        self._alg = alg
        try:
            self._refuse_unreconcilable((await alg.status(self.run_id))["pending_effects"])  # before claiming
            async with alg.lease(self.run_id, worker=self.worker, heartbeat_s=self.heartbeat_s) as lease:
                self.lease = lease
                await self._settle_what_was_left(alg, lease)
                state = (await alg.status(self.run_id))["state"]
                if state == T.QUEUED:
                    await lease.transition(T.PLANNING)
                elif state == T.UNKNOWN:
                    await lease.transition(T.EXECUTING)
                return await handler()
        finally:
            self.lease = None
            if own:
                await alg.aclose()

    async def _settle_what_was_left(self, alg: AsyncLedger, lease: AsyncLease) -> None:
        pending = (await alg.status(self.run_id))["pending_effects"]
        self._refuse_unreconcilable(pending)
        for p in pending:
            assert self.reconcile is not None
            outcome = await self.reconcile(p["what"])
            await lease.confirm(p["key"], outcome, note=f"reconciled by {self.worker} before resuming")

    def _refuse_unreconcilable(self, pending: list[dict[str, Any]]) -> None:
        if pending and self.reconcile is None:
            from handoff.ledger.errors import Refused

            raise Refused(f"run {self.run_id} has side effects an earlier worker left without an outcome "
                          f"({', '.join(p['what'] for p in pending)}); give HandoffCapability(reconcile=...) a "
                          "function that looks at the world and answers 'done' or 'absent' for each, or confirm "
                          "them with 'handoff effect-confirm'")

    async def after_run(self, ctx: Any, *, result: Any) -> Any:
        lease, alg = self.lease, self._alg
        assert lease is not None and alg is not None
        out = result.output
        text = out if isinstance(out, str) else json.dumps(out, default=lambda o: getattr(o, "__dict__", str(o)),
                                                           indent=2, sort_keys=True)
        path = Path(self.output_path or f"{self.run_id}-output.md")
        path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        usage = _usage_attrs(ctx.usage, getattr(ctx.model, "model_name", None))
        if (await alg.status(self.run_id))["state"] == T.PLANNING:
            await lease.progress("plan_committed", "the agent answered without a tool call")
            await lease.transition(T.EXECUTING)
        await lease.artifact(str(path), attrs=usage or None)
        await lease.evidence("agent_output", "pass", f"the agent run ended with its output in {path.name}",
                             attrs=usage or None)
        if self.submit:
            await lease.transition(T.VERIFYING)
            await lease.submit(f"{self.worker}: agent output in {path.name}")
        return result

    # --- model requests: liveness and usage ---------------------------------------

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        response = await handler(request_context)
        lease, alg = self.lease, self._alg
        if lease is None or alg is None:
            return response
        attrs = _usage_attrs(getattr(response, "usage", None), getattr(response, "model_name", None))
        await lease.heartbeat(attrs=attrs or None)
        if (await alg.status(self.run_id))["state"] == T.PLANNING:
            await lease.progress("plan_committed", "the model's first answer", attrs=attrs or None)
            await lease.transition(T.EXECUTING)
        return response

    # --- tool calls: progress, and side effects fenced by start/confirm ---------------

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        lease = self.lease
        if lease is None:
            return await handler(args)
        attrs = {"gen_ai.tool.name": call.tool_name[:200], "gen_ai.tool.call.id": str(call.tool_call_id)[:200]}
        try:
            if call.tool_name in self.side_effects:
                # The lease number keeps a resumed agent's call apart from the dead one's,
                # whose model may have chosen the same call id.
                key = f"tool:{lease.number}:{call.tool_name}:{call.tool_call_id}"
                async with lease.effect(key, _what(call), attrs=attrs):
                    result = await handler(args)
            else:
                result = await handler(args)
        except Exception as exc:
            lg = self._alg
            assert lg is not None
            text = f"tool {call.tool_name} raised {type(exc).__name__}: {exc}"
            text = await lg.run(lambda ledger: bounded_text(text, ledger, self.run_id))
            await lease.progress("note", text, attrs=attrs)
            raise
        await lease.progress("tool_outcome", f"{call.tool_name} returned", attrs=attrs)
        return result


__all__ = ["HandoffCapability", "Reconcile"]
