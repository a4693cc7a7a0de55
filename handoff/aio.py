"""``AsyncLedger``: every verb and read of ``Ledger``, awaitable, never blocking the event loop.

An agent written for an event loop (LangGraph, pydantic-ai, the OpenAI Agents SDK, plain
asyncio) must not wait on a lock or an fsync on the loop's thread: every other task of
the agent would stall with it. So each ``AsyncLedger`` runs its ``Ledger``'s calls on one
dedicated thread of its own (a ``Runner``), one at a time and in the order they were
awaited. One thread per ledger, not a pool: the store's connection stays on one thread,
and the order of a task's writes is the order it awaited them.

The methods are the ``Ledger``'s, listed below by name (tests/workers/test_async_ledger.py
checks the list against ``Ledger``'s public methods): the same arguments, the same return
values, the same typed errors. A method that returns an iterator returns an async
iterator here, read a page at a time on the ledger's thread. ``lease()`` is the async
form of ``Ledger.lease()``: its heartbeat and fence are tasks on the loop.

Cancelling an await (a timeout, a cancelled task) never cuts a call in half: a call not
yet started on the ledger's thread is dropped, and one already running finishes there (its
write committed or refused as a whole) while the await raises ``CancelledError`` at once.
To learn which, read the run, or repeat the write with the same idempotency key: a write
that landed answers ``duplicate``.

A backend with a native async path (an async driver) supplies a ``Runner`` of its own
(``AsyncLedger(..., runner=...)``); nothing else changes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from handoff.ledger.errors import InvalidInput, StaleLease, StoreUnavailable, TerminalRun
from handoff.ledger.store import Recorded

from .facade import Ledger, Outcome
from .lease import EffectHandle, Fence, HeldLease, LeaseCore, start

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: How many items of an iterator one hop to the ledger's thread brings back.
PAGE = 256


class Runner(Protocol):
    """Where a ledger's calls run. ``run(fn)`` awaits ``fn()`` done off the event loop."""

    async def run(self, fn: Callable[[], R]) -> R: ...

    def close(self) -> None: ...


class ThreadRunner:
    """One thread, one call at a time, in the order awaited (the default ``Runner``)."""

    def __init__(self, name: str = "handoff-ledger") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[[], R]) -> R:
        # wrap_future: a cancelled await cancels a call that has not started; one that has
        # runs to its end on the thread (a write is never cut in half).
        return await asyncio.wrap_future(self._pool.submit(fn))

    def close(self) -> None:
        self._pool.shutdown(wait=False)


# --- the generic faces of Ledger's methods ---------------------------------------------


class _Call(Generic[P, R]):
    """``AsyncLedger.NAME(...)``: ``Ledger.NAME(...)`` awaited, run on the ledger's thread."""

    def __init__(self, method: Callable[Concatenate[Ledger, P], R]) -> None:
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> _Call[P, R]: ...

    @overload
    def __get__(self, obj: AsyncLedger, owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, obj: AsyncLedger | None, owner: type) -> Any:
        if obj is None:
            return self
        method = self.method

        @functools.wraps(method)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return await obj.run(lambda lg: method(lg, *args, **kwargs))

        return call


class _Stream(Generic[P, T]):
    """``async for item in AsyncLedger.NAME(...)``: ``Ledger.NAME(...)``'s iterator, read
    ``PAGE`` items per hop to the ledger's thread (memory stays flat, as in the Ledger)."""

    def __init__(self, method: Callable[Concatenate[Ledger, P], Iterator[T]]) -> None:
        self.method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, obj: None, owner: type) -> _Stream[P, T]: ...

    @overload
    def __get__(self, obj: AsyncLedger, owner: type) -> Callable[P, AsyncIterator[T]]: ...

    def __get__(self, obj: AsyncLedger | None, owner: type) -> Any:
        if obj is None:
            return self
        method = self.method

        @functools.wraps(method)
        def stream(*args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
            return obj._pages(lambda lg: method(lg, *args, **kwargs))

        return stream


class AsyncLedger:
    """The ``Ledger`` on an event loop: ``async with AsyncLedger("handoff.db") as alg:``.

    ``path`` and ``options`` are ``Ledger``'s; the ledger is opened on its thread when the
    block is entered (or at the first call). ``ledger=`` wraps a ``Ledger`` already open
    instead (it is then yours to close). Every method of the Ledger is here, awaitable
    (iterators as async iterators); ``await alg.run(fn)`` runs ``fn(ledger)`` on the
    ledger's thread for anything else.
    """

    def __init__(self, path: str = "handoff.db", *, ledger: Ledger | None = None, runner: Runner | None = None,
                 **options: Any) -> None:
        if ledger is not None and not isinstance(ledger, Ledger):
            raise InvalidInput(f"ledger must be a handoff Ledger, got {type(ledger).__name__}", field="ledger")
        self._path, self._options = path, options
        self._ledger = ledger
        self._owned = ledger is None
        self._runner: Runner = runner or ThreadRunner()
        self._closed = False

    @property
    def ledger(self) -> Ledger:
        """The ``Ledger`` underneath. Its calls block: make them through ``run``."""
        if self._ledger is None:
            raise InvalidInput("the AsyncLedger is not open yet: 'async with AsyncLedger(...)' or await a call first",
                               field="ledger")
        return self._ledger

    def _open(self) -> Ledger:  # on the ledger's thread
        if self._ledger is None:
            self._ledger = Ledger(self._path, **self._options)
        return self._ledger

    async def run(self, fn: Callable[[Ledger], R]) -> R:
        """``fn(ledger)`` on the ledger's thread; the one way every call here is made."""
        if self._closed:
            raise InvalidInput("this AsyncLedger is closed; open another", field="ledger")
        return await self._runner.run(lambda: fn(self._open()))

    async def __aenter__(self) -> AsyncLedger:
        await self.run(lambda lg: None)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the ledger (if this face opened it) after every call awaited so far."""
        if self._closed:
            return
        if self._owned and self._ledger is not None:
            await self.run(lambda lg: lg.close())
        self._closed = True
        self._runner.close()

    async def _pages(self, make: Callable[[Ledger], Iterator[T]]) -> AsyncIterator[T]:
        it: Iterator[T] = await self.run(lambda lg: iter(make(lg)))
        try:
            while True:
                page = await self.run(lambda lg: list(itertools.islice(it, PAGE)))
                for item in page:
                    yield item
                if len(page) < PAGE:
                    return
        finally:
            close = getattr(it, "close", None)
            if close is not None and not self._closed:
                await self.run(lambda lg: close())

    def lease(self, run_id: str, *, worker: str, token: str | None = None, heartbeat_s: float | None = None,
              fence_margin_s: float | None = None, key: str | None = None) -> AsyncLease:
        """``async with alg.lease(run, worker="agent-1") as lease:``: ``Ledger.lease()`` on
        the loop. Once the lease is lost the block's task is cancelled, so the block ends
        with ``LeaseLost`` at its next await."""
        return AsyncLease(self, run_id, worker=worker, token=token, heartbeat_s=heartbeat_s,
                          fence_margin_s=fence_margin_s, key=key)

    async def events(self, *, since_position: int | None = None, until_position: int | None = None,
                     follow: bool = False, poll_s: float = 0.5, should_stop: Callable[[], bool] | None = None,
                     **filters: Any) -> AsyncIterator[Recorded]:
        """``Ledger.events``; with ``follow`` the waiting between polls is on the loop
        (``asyncio.sleep(poll_s)``), so the ledger's thread is never held by a follower."""
        since = since_position
        while True:
            top = await self.run(lambda lg: lg.store.last_position())
            bound = top if until_position is None else min(top, until_position)
            if since is None or since <= bound:
                async for rec in self._pages(lambda lg: lg.events(since_position=since, until_position=bound,
                                                                  poll_s=poll_s, **filters)):
                    yield rec
                since = bound + 1
            if not follow or (until_position is not None and top >= until_position):
                return
            if should_stop is not None and should_stop():
                return
            await asyncio.sleep(poll_s)
            if should_stop is not None and should_stop():
                return

    # --- Ledger's methods, by name (one line each; what they do is Ledger's docstring) ---

    execute = _Call(Ledger.execute)
    preview = _Call(Ledger.preview)
    append_stream = _Call(Ledger.append_stream)
    open = _Call(Ledger.open)
    open_contract = _Call(Ledger.open_contract)
    claim = _Call(Ledger.claim)
    claim_outcome = _Call(Ledger.claim_outcome)
    worker_actor = _Call(Ledger.worker_actor)
    # --- generated from handoff/operations.py (AsyncLedger verbs): python -m handoff.codegen --write ---
    heartbeat = _Call(Ledger.heartbeat)
    transition = _Call(Ledger.transition)
    progress = _Call(Ledger.progress)
    artifact = _Call(Ledger.artifact)
    withdraw_artifact = _Call(Ledger.withdraw_artifact)
    evidence = _Call(Ledger.evidence)
    block = _Call(Ledger.block)
    unblock = _Call(Ledger.unblock)
    effect_start = _Call(Ledger.effect_start)
    effect_confirm = _Call(Ledger.effect_confirm)
    submit = _Call(Ledger.submit)
    release = _Call(Ledger.release)
    review = _Call(Ledger.review)
    transfer = _Call(Ledger.transfer)
    revoke = _Call(Ledger.revoke)
    close_run = _Call(Ledger.close_run)
    reopen = _Call(Ledger.reopen)
    deliver = _Call(Ledger.deliver)
    delivered = _Call(Ledger.delivered)
    delivery_failed = _Call(Ledger.delivery_failed)
    observe = _Call(Ledger.observe)
    recover = _Call(Ledger.recover)
    effect_outcome = _Call(Ledger.effect_outcome)
    open = _Call(Ledger.open)
    open_contract = _Call(Ledger.open_contract)
    claim = _Call(Ledger.claim)
    claim_outcome = _Call(Ledger.claim_outcome)
    sanitize = _Call(Ledger.sanitize)
    send_delivery = _Call(Ledger.send_delivery)
    fork = _Call(Ledger.fork)
    save_graph_checkpoint = _Call(Ledger.save_graph_checkpoint)
    save_graph_writes = _Call(Ledger.save_graph_writes)
    erase_values = _Call(Ledger.erase_values)
    # --- end of generated code (AsyncLedger verbs) ---
    send_delivery = _Call(Ledger.send_delivery)
    sanitize = _Call(Ledger.sanitize)
    allowed_targets = _Call(Ledger.allowed_targets)
    set_allowed_targets = _Call(Ledger.set_allowed_targets)
    allow_targets = _Call(Ledger.allow_targets)
    deny_targets = _Call(Ledger.deny_targets)
    fork = _Call(Ledger.fork)
    save_graph_checkpoint = _Call(Ledger.save_graph_checkpoint)
    save_graph_writes = _Call(Ledger.save_graph_writes)
    erase_values = _Call(Ledger.erase_values)
    values = _Call(Ledger.values)
    watcher_beat = _Call(Ledger.watcher_beat)
    checkpoint = _Call(Ledger.checkpoint)
    status = _Call(Ledger.status)
    watchers = _Call(Ledger.watchers)
    runs_page = _Call(Ledger.runs_page)
    run_ids = _Call(Ledger.run_ids)
    stalls = _Call(Ledger.stalls)
    stalls_page = _Call(Ledger.stalls_page)
    owner_load = _Call(Ledger.owner_load)
    deliveries = _Call(Ledger.deliveries)
    terminal_count = _Call(Ledger.terminal_count)
    rebuild = _Call(Ledger.rebuild)
    check = _Call(Ledger.check)
    verify = _Call(Ledger.verify)
    verify_report = _Call(Ledger.verify_report)
    export_to = _Call(Ledger.export_to)
    export_sqlite = _Call(Ledger.export_sqlite)
    backup = _Call(Ledger.backup)
    copy_mode = _Call(Ledger.copy_mode)
    ledger_head = _Call(Ledger.ledger_head)
    ledger_head_digest = _Call(Ledger.ledger_head_digest)
    check_anchor = _Call(Ledger.check_anchor)
    write_head = _Call(Ledger.write_head)
    import_lines = _Call(Ledger.import_lines)
    doctor = _Call(Ledger.doctor)
    written = _Call(Ledger.written)
    report = _Call(Ledger.report)
    write_report = _Call(Ledger.write_report)
    diff = _Call(Ledger.diff)

    log = _Stream(Ledger.log)
    runs = _Stream(Ledger.runs)
    iter_runs = _Stream(Ledger.iter_runs)
    iter_stalls = _Stream(Ledger.iter_stalls)
    export = _Stream(Ledger.export)
    export_redacted = _Stream(Ledger.export_redacted)


#: Ledger's public methods the async face offers differently, and why (checked by a test).
NOT_MIRRORED = {
    "close": "aclose(), or leaving 'async with'",
    "lease": "AsyncLedger.lease(): an async block whose heartbeat and fence are tasks",
    "events": "AsyncLedger.events(): follow waits on the loop, not on the ledger's thread",
    "db_role_of": "returns a lookup that reads the store when called; use run(lambda lg: ...)",
}


class AsyncLease(HeldLease):
    """``async with alg.lease(run_id, worker="agent-1") as lease:``: ``handoff.lease.Lease``
    on an event loop. The verbs are coroutines; the heartbeat and the fence are tasks;
    the fence and the heartbeat's verdicts are ``handoff.lease.Fence``'s, as for ``handoff
    run``. Once the lease is lost, the task that entered the block is cancelled and the
    block ends with ``LeaseLost`` (not ``CancelledError``), having written nothing."""

    def __init__(self, alg: AsyncLedger, run_id: str, *, worker: str, token: str | None = None,
                 heartbeat_s: float | None = None, fence_margin_s: float | None = None,
                 key: str | None = None) -> None:
        self.alg = alg
        self.core = LeaseCore(run_id, worker, token, heartbeat_s, fence_margin_s)
        self.key = key
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._helpers: list[asyncio.Task[Any]] = []
        self._cancelled_by_us = False

    async def __aenter__(self) -> AsyncLease:
        core = self.core
        core.enter()
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        try:
            core.fence = await self.alg.run(lambda lg: start(lg, core, self.key, self._lost))
        except BaseException:
            core.state = "new"
            raise
        core.state = "held"
        name = f"handoff-{core.run_id}-lease-{core.fence.lease}"
        self._helpers = [asyncio.create_task(self._beat(), name=f"{name}-heartbeat"),
                         asyncio.create_task(self._watch(), name=f"{name}-fence")]
        return self

    def _lost(self, fence: Fence) -> None:
        """From whichever thread found out: cancel the block's task on its loop."""
        if self._loop is not None and self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None and not self._task.done() and self.core.state == "held":
            self._cancelled_by_us = True
            self._task.cancel("handoff: the lease was lost")

    async def _beat(self) -> None:
        fence = self.core.fence
        assert fence is not None
        while True:
            await asyncio.sleep(fence.interval_s)
            if not await self.alg.run(lambda lg: fence.beat()):
                return

    async def _watch(self) -> None:
        fence = self.core.fence
        assert fence is not None
        while not fence.expired():
            await asyncio.sleep(max(fence.time_left(), 0.005))

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        core, fence = self.core, self.core.fence
        assert fence is not None
        core.state = "ending"  # from here on the block's task is not cancelled for a loss
        fence.expired()  # a fence due now trips before anything is recorded
        for t in self._helpers:
            t.cancel()
        await asyncio.gather(*self._helpers, return_exceptions=True)
        if self._cancelled_by_us and self._task is not None and self._task.cancelling():
            self._task.uncancel()  # our cancel is answered here: the task is not being cancelled
        if fence.gone:
            # Nothing is written, so nothing waits for the ledger's thread (a write stuck
            # on a locked store may still hold it).
            core.state = "ended"
            if exc is None or (self._cancelled_by_us and isinstance(exc, asyncio.CancelledError)):
                raise fence.error() from None
            return False
        await self.alg.run(lambda lg: core.end(lg, exc))
        return False

    # --- the verbs: each checked before it writes and after it returns ----------------

    async def _do(self, call: Callable[[Ledger], Outcome]) -> Outcome:
        core = self.core
        while True:
            core.check()
            try:
                out = await self.alg.run(call)
                break
            except (StaleLease, TerminalRun) as exc:
                fence = core.fence
                assert fence is not None
                await self.alg.run(lambda lg: fence.ended(exc))
                raise fence.error() from exc
            except StoreUnavailable:
                await asyncio.sleep(core.retry_in())  # nothing was written: wait while the lease can be proven
        core.check()  # a write that waited past the fence must not let the work go on
        return out

    # --- generated from handoff/operations.py (AsyncLease verbs): python -m handoff.codegen --write ---
    async def heartbeat(self, *, attrs: Mapping[str, Any] | None = None) -> Outcome:
        """Say the lease holder is alive. Heartbeats are liveness, never progress.

        Most beats write no event: the run's liveness, kept beside the log,
        moves (outcome unchanged). The log records a beat that ends a silence
        longer than half the heartbeat timeout, carries other attrs than the
        last, or is the first in 15 minutes. It takes no key: a heartbeat
        changes no authority, and a repeated one only says again that the holder
        is alive, which is what a retry means.
        """
        return await self._do(self.core.heartbeat(attrs=attrs))

    async def transition(self, to: str, *, reason: str = "", key: str | None = None) -> Outcome:
        """Move the run through its lifecycle (queued -> planning -> executing ->
        verifying)."""
        return await self._do(self.core.transition(to, reason=reason, key=key))

    async def progress(self, kind: str, detail: str = "", *, attrs: Mapping[str, Any] | None = None,
                       key: str | None = None) -> Outcome:
        """Record a step. Only the state's progress kinds advance progress_seq.

        With a key, a retried report writes nothing new.
        """
        return await self._do(self.core.progress(kind, detail, attrs=attrs, key=key))

    async def artifact(self, path: str, *, kind: str = "result", root: str | None = None,
                       max_bytes: int | str | None = None, attrs: Mapping[str, Any] | None = None,
                       key: str | None = None) -> Outcome:
        """Measure a file (regular files only, at most max_bytes) and record it as an
        artifact."""
        return await self._do(self.core.artifact(path, kind=kind, root=root, max_bytes=max_bytes, attrs=attrs,
                                                 key=key))

    async def evidence(self, kind: str, outcome: str, detail: str = "", *,
                       attrs: Mapping[str, Any] | None = None, key: str | None = None) -> Outcome:
        """Record a check that was run and how it came out. Delivery needs a pass and no
        fail."""
        return await self._do(self.core.evidence(kind, outcome, detail, attrs=attrs, key=key))

    async def block(self, reason: str, next_action: str, *, key: str | None = None) -> Outcome:
        """Record a named blocker and the next action; the run waits in 'blocked'.

        A blocked run is not a stall: the watchdog leaves it alone.
        """
        return await self._do(self.core.block(reason, next_action, key=key))

    async def unblock(self, resolution: str, *, blocker_id: int | None = None,
                      key: str | None = None) -> Outcome:
        """Clear blockers; the run returns to the state it was blocked from."""
        return await self._do(self.core.unblock(resolution, blocker_id=blocker_id, key=key))

    async def confirm(self, effect_key: str, outcome: str, *, note: str = "",
                      attrs: Mapping[str, Any] | None = None) -> Outcome:
        """Record a side effect's outcome: done, or absent (it did not happen).

        A reconciliation after a lost worker: look at the world, then say what
        happened.
        """
        return await self._do(self.core.confirm(effect_key, outcome, note=note, attrs=attrs))

    async def submit(self, summary: str = "", *, key: str | None = None) -> Outcome:
        """Submit the result: the run moves to review (or succeeds when the contract needs
        none)."""
        return await self._do(self.core.submit(summary, key=key))

    async def effect_outcome(self, effect_key: str) -> dict[str, Any]:
        """What the ledger knows of a side effect's key: settled (and how), pending, or
        none.

        A resumed step asks before it starts a side effect again: settled means
        skip it, pending means look at the world and confirm first, none means
        start it.
        """
        return await self._do(self.core.effect_outcome(effect_key))
    # --- end of generated code (AsyncLease verbs) ---

    @asynccontextmanager
    async def effect(self, effect_key: str, what: str, **kw: Any) -> AsyncIterator[EffectHandle]:
        """As ``Lease.effect``: the start recorded before, the outcome after."""
        await self._do(self.core.effect_start(effect_key, what, **kw))
        fx = EffectHandle(effect_key)
        try:
            yield fx
        except BaseException:
            if fx.outcome == "absent":
                await self._do(self.core.effect_confirm(fx))
            raise
        await self._do(self.core.effect_confirm(fx))


__all__ = ["AsyncLedger", "AsyncLease", "Runner", "ThreadRunner", "NOT_MIRRORED"]
