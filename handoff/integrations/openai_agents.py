"""OpenAI Agents SDK hooks and a trace processor that keep an agent run in the ledger.

A word first: in that SDK a "handoff" is one agent passing the conversation to another
agent. It has nothing to do with this library's runs; here it is called an *SDK handoff
between agents*, and it is recorded, at most, as a note of the one run being kept.

The SDK has two extension points, and each does the part it can see:

- ``LedgerRunHooks`` (a ``RunHooks``, passed as ``Runner.run(..., hooks=hooks)``) is also
  the async block that holds the lease for the agent run: ``async with`` claims (after
  refusing a run left with side effects of unknown outcome when no ``reconcile`` is
  given), ends by releasing, or by recording why the run stopped when it raised. The SDK
  gives hooks no call when a run fails, so only a block around the run can end the lease
  at that moment instead of leaving it to the watchdog. Its hooks: ``on_llm_end`` adds a
  heartbeat with the model and token usage (the first answer commits the plan);
  ``on_tool_start``/``on_tool_end`` wrap a tool named in ``side_effects`` in
  ``lease.effect`` and record each tool's outcome as ``tool_outcome`` progress;
  ``on_agent_end`` records the final output as an artifact with ``agent_output``
  evidence, then submits.
- ``LedgerTracingProcessor`` (a ``TracingProcessor``, ``add_trace_processor(...)`` once
  per process) records what only the trace holds: SDK handoffs between agents and
  tripped guardrails, as notes of the run whose trace it is.

How a failed tool is told apart: by default the SDK catches a tool's exception and hands
the model an error message, so ``on_tool_end`` is called as for a tool that returned. The
SDK marks the tool's span with the error before that call; the hooks read it there. With
the SDK's tracing turned off there is no span to read, so a side-effecting tool is
refused before it runs rather than have its outcome guessed.

Needs the ``openai-agents`` extra (``pip install '.[openai-agents]'`` in the checkout).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from contextlib import AsyncExitStack
from typing import Any

from agents import RunHooks
from agents.tracing import (
    FunctionSpanData,
    GuardrailSpanData,
    HandoffSpanData,
    Span,
    Trace,
    TracingProcessor,
    get_current_span,
    get_current_trace,
)
from agents.tracing.spans import NoOpSpan

from handoff.aio import AsyncLedger
from handoff.facade import Ledger
from handoff.ledger.errors import LedgerError, Refused

from ._agent_run import AgentRun, Reconcile, as_async, tool_attrs, usage_attrs

#: Runs kept by hooks, by the SDK's trace id: where the processor sends what it sees. A
#: processor's methods may be called from any thread, so the map is locked.
_RUNS: dict[str, LedgerRunHooks] = {}
_RUNS_LOCK = threading.Lock()


class ToolFailed(Exception):
    """A tool whose error the SDK handed to the model: its side effect's outcome stays open."""


def _model_name(agent: Any) -> str | None:
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        return model
    name = getattr(model, "model", None)  # the SDK's OpenAI models keep their name here
    return name if isinstance(name, str) else None


def _trace_hex(trace: Trace | None) -> str | None:
    """The SDK's trace id (``trace_<32 hex>``) as the W3C id ``handoff otel`` joins."""
    tid = getattr(trace, "trace_id", None)
    if not isinstance(tid, str) or not tid.startswith("trace_"):
        return None
    hex_id = tid[len("trace_"):].lower()
    return hex_id if len(hex_id) == 32 and all(c in "0123456789abcdef" for c in hex_id) else None


class LedgerRunHooks(RunHooks[Any]):
    """``async with LedgerRunHooks(lg, run, worker="agent-1") as hooks: await Runner.run(agent,
    text, hooks=hooks)``.

    ``ledger`` is a ``Ledger`` or an ``AsyncLedger``; ``side_effects`` names the tools that
    change the world (their start is recorded before they run, ``done`` after they
    return); ``output_path`` is where the final output is written and recorded as the
    artifact (default ``<run_id>-output.md``); ``reconcile`` is asked about each side
    effect an earlier worker left without an outcome, before the agent starts. One
    object keeps one agent run: enter a new one for the next run.
    """

    def __init__(self, ledger: Ledger | AsyncLedger, run_id: str, *, worker: str = "openai-agents",
                 side_effects: Collection[str] = (), output_path: str | None = None,
                 reconcile: Reconcile | None = None, submit: bool = True, heartbeat_s: float | None = None) -> None:
        self.ledger, self.run_id, self.worker = ledger, run_id, worker
        self.side_effects = frozenset(side_effects)
        self.output_path, self.reconcile, self.submit, self.heartbeat_s = output_path, reconcile, submit, heartbeat_s
        self._run: AgentRun | None = None
        self._stack: AsyncExitStack | None = None
        self._trace_id: str | None = None
        self._trace_hex: str | None = None
        self._effects: dict[str, tuple[Any, str]] = {}  # call id -> (the open lease.effect, tool name)
        self._notes: list[tuple[str, dict[str, Any]]] = []  # from the processor, written at the next hook
        self._lock = threading.Lock()
        self._used = False

    # --- the run: one lease ----------------------------------------------------------

    async def __aenter__(self) -> LedgerRunHooks:
        if self._used:
            raise Refused(f"this LedgerRunHooks already kept an agent run of {self.run_id}; make a new one "
                          "for each run (each holds its own lease)")
        self._used = True
        alg, own = as_async(self.ledger)
        run = AgentRun(alg, self.run_id, self.worker, "LedgerRunHooks", side_effects=self.side_effects,
                       output_path=self.output_path, reconcile=self.reconcile, submit=self.submit)
        stack = AsyncExitStack()
        if own:
            stack.push_async_callback(alg.aclose)
        try:
            await run.refuse_unreconcilable()  # before claiming: nothing written
            # Entered in the caller's task, so a lost lease cancels the run itself.
            lease = await stack.enter_async_context(alg.lease(self.run_id, worker=self.worker,
                                                              heartbeat_s=self.heartbeat_s))
            await run.begin(lease)
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._run, self._stack = run, stack
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        run, stack = self._run, self._stack
        assert run is not None and stack is not None
        self._unregister()
        try:
            if exc is not None:
                await self._flush()
                for call_id, (_, name) in list(self._effects.items()):
                    # The run raised while the tool ran: its outcome stays open, never guessed.
                    await run.note(f"tool {name} did not return: the run stopped with {type(exc).__name__}",
                                   tool_attrs(name, call_id))
        except LedgerError:
            pass  # the lease is gone (or the store is): the lease block below says so, or the watchdog will
        finally:
            self._effects.clear()
            self._run = None
            await stack.__aexit__(exc_type, exc, tb)
        # The SDK wraps an error raised in a tool hook in its own UserError; the ledger's
        # typed error (a refusal, a lost lease) is what says what to do.
        cause = exc.__cause__ if exc is not None else None
        if isinstance(cause, LedgerError) and not isinstance(exc, LedgerError):
            raise cause
        return False

    def _unregister(self) -> None:
        if self._trace_id is not None:
            with _RUNS_LOCK:
                if _RUNS.get(self._trace_id) is self:
                    del _RUNS[self._trace_id]

    def _current(self) -> AgentRun:
        if self._run is None:
            raise Refused("LedgerRunHooks records only inside its block: 'async with LedgerRunHooks(...) as "
                          "hooks:' around 'await Runner.run(agent, ..., hooks=hooks)'")
        return self._run

    # --- what the processor saw, written on the run's own task --------------------------

    def note_from_trace(self, text: str, attrs: dict[str, Any]) -> None:
        with self._lock:
            self._notes.append((text, attrs))

    async def _flush(self) -> None:
        with self._lock:
            notes, self._notes = self._notes, []
        run = self._current()
        for text, attrs in notes:
            await run.note(text, attrs)

    # --- the hooks ---------------------------------------------------------------------

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self._current()
        if self._trace_id is None:
            trace = get_current_trace()
            tid = getattr(trace, "trace_id", None)
            if isinstance(tid, str) and tid:
                self._trace_id, self._trace_hex = tid, _trace_hex(trace)
                with _RUNS_LOCK:
                    _RUNS[tid] = self
        await self._flush()

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        run = self._current()
        await self._flush()
        attrs = usage_attrs(getattr(response, "usage", None), _model_name(agent))
        if self._trace_hex is not None:
            # Once: ``handoff otel`` then puts the run's spans in the SDK's trace.
            attrs["trace_id"], self._trace_hex = self._trace_hex, None
        await run.model_answered(attrs)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        run = self._current()
        await self._flush()
        name = getattr(tool, "name", type(tool).__name__)
        if name not in self.side_effects:
            return
        span = get_current_span()
        if span is None or isinstance(span, NoOpSpan):
            raise Refused(f"tool {name} changes the world, and the SDK's tracing is off for this run, so whether "
                          "it failed could not be told from its span; turn tracing on (keep it on this machine "
                          "with agents.set_trace_processors([...])) so LedgerRunHooks can record its outcome")
        call_id = str(getattr(context, "tool_call_id", "") or id(context))
        assert run.lease is not None
        attrs = tool_attrs(name, call_id)
        effect = run.lease.effect(run.effect_key(name, call_id),
                                  await run.describe(name, getattr(context, "tool_arguments", "") or ""), attrs=attrs)
        await effect.__aenter__()  # the start is recorded before the tool runs
        self._effects[call_id] = (effect, name)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        run = self._current()
        name = getattr(tool, "name", type(tool).__name__)
        call_id = str(getattr(context, "tool_call_id", "") or id(context))
        attrs = tool_attrs(name, call_id)
        span = get_current_span()
        error = getattr(span, "error", None) if isinstance(getattr(span, "span_data", None), FunctionSpanData) else None
        effect, _ = self._effects.pop(call_id, (None, name))
        if error is None:
            if effect is not None:
                await effect.__aexit__(None, None, None)  # done
            await run.tool_returned(name, attrs)
            return
        message = error.get("message", "an error") if isinstance(error, dict) else str(error)
        if effect is not None:
            failed = ToolFailed(message)
            await effect.__aexit__(ToolFailed, failed, None)  # the outcome stays open
        await run.note(f"tool {name} failed ({message}); the SDK gave the model an error message "
                              "instead of its result", attrs)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        run = self._current()
        await self._flush()
        pending = (await run.alg.status(self.run_id))["pending_effects"]
        if pending:
            raise Refused(f"the agent gave its final output, but side effects of run {self.run_id} have no outcome "
                          f"({', '.join(p['what'] for p in pending)}); the output is not submitted: find out what "
                          "happened and confirm each with 'handoff effect-confirm', or resume with "
                          "LedgerRunHooks(reconcile=...)")
        usage = usage_attrs(getattr(context, "usage", None), _model_name(agent))
        await run.finish(output, usage)


class LedgerTracingProcessor(TracingProcessor):
    """``agents.add_trace_processor(LedgerTracingProcessor())``, once per process.

    For each trace that a ``LedgerRunHooks`` block is keeping, it hands the hooks what
    only the trace shows: an SDK handoff between agents (the conversation moved from one
    agent to another, inside the same run) and a guardrail that tripped. The hooks write
    them as ``note`` progress at their next call, on the run's own task. Traces of runs
    no hooks keep are left alone. Nothing is exported anywhere.
    """

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def on_span_end(self, span: Span[Any]) -> None:
        with _RUNS_LOCK:
            hooks = _RUNS.get(span.trace_id)
        if hooks is None:
            return
        data = span.span_data
        if isinstance(data, HandoffSpanData):
            hooks.note_from_trace(f"SDK handoff between agents: the conversation moved from agent {data.from_agent} "
                                  f"to agent {data.to_agent}, within this run",
                                  {"gen_ai.agent.name": str(data.to_agent)[:200]})
        elif isinstance(data, GuardrailSpanData) and data.triggered:
            hooks.note_from_trace(f"guardrail {data.name} tripped", {})

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


__all__ = ["LedgerRunHooks", "LedgerTracingProcessor", "Reconcile", "ToolFailed"]
