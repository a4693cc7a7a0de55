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
  start, the tool and its arguments scrubbed of secrets as an exception's text is, is
  recorded before it runs, ``done`` after; a crash or an exception in between
  leaves the outcome to be reconciled, never guessed); every tool's outcome is recorded
  as ``tool_outcome`` progress, and a tool that raises as a ``note`` (no progress).
- ``after_run``: the final output is written to ``output_path`` and recorded as an
  artifact with ``agent_output`` evidence carrying the run's usage; then, with
  ``submit=True``, the result is submitted.

Needs the ``pydantic-ai`` extra (``pip install '.[pydantic-ai]'`` in the checkout).
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.capabilities import AbstractCapability

from handoff.aio import AsyncLedger
from handoff.facade import Ledger

from ._agent_run import AgentRun, Reconcile, as_async, tool_attrs, usage_attrs


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
    _run: AgentRun | None = field(default=None, init=False, repr=False)

    async def for_run(self, ctx: Any) -> HandoffCapability:
        """A copy per agent run: each holds its own lease."""
        mine = copy.copy(self)
        mine._run = None
        return mine

    # --- the run: one lease --------------------------------------------------------

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        alg, own = as_async(self.ledger)
        run = AgentRun(alg, self.run_id, self.worker, "HandoffCapability", side_effects=self.side_effects,
                       output_path=self.output_path, reconcile=self.reconcile, submit=self.submit)
        try:
            await run.refuse_unreconcilable()  # before claiming
            async with alg.lease(self.run_id, worker=self.worker, heartbeat_s=self.heartbeat_s) as lease:
                await run.begin(lease)
                self._run = run
                return await handler()
        finally:
            self._run = None
            if own:
                await alg.aclose()

    async def after_run(self, ctx: Any, *, result: Any) -> Any:
        run = self._run
        assert run is not None
        await run.finish(result.output, usage_attrs(ctx.usage, getattr(ctx.model, "model_name", None)))
        return result

    # --- model requests: liveness and usage ---------------------------------------

    async def wrap_model_request(self, ctx: Any, *, request_context: Any, handler: Any) -> Any:
        response = await handler(request_context)
        run = self._run
        if run is not None:
            await run.model_answered(usage_attrs(getattr(response, "usage", None),
                                                 getattr(response, "model_name", None)))
        return response

    # --- tool calls: progress, and side effects fenced by start/confirm ---------------

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        run = self._run
        if run is None or run.lease is None:
            return await handler(args)
        attrs = tool_attrs(call.tool_name, call.tool_call_id)
        try:
            if call.tool_name in self.side_effects:
                async with run.lease.effect(run.effect_key(call.tool_name, call.tool_call_id),
                                            await run.describe(call.tool_name, call.args), attrs=attrs):
                    result = await handler(args)
            else:
                result = await handler(args)
        except Exception as exc:
            await run.note(f"tool {call.tool_name} raised {type(exc).__name__}: {exc}", attrs)
            raise
        await run.tool_returned(call.tool_name, attrs)
        return result


__all__ = ["HandoffCapability", "Reconcile"]
