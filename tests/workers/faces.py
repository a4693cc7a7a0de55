"""The two faces of a lease block, driven by one test body: ``async with face.lease(...)``.

``Ledger.lease()`` (sync: threads beat and fence) and ``AsyncLedger.lease()`` (tasks on
the loop) promise the same behaviour; each test of tests/workers is written once against
this adapter and runs on both. The sync block is entered and left from a coroutine, which
changes nothing for it: its heartbeat and fence run on threads of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

from handoff import Ledger
from handoff.aio import AsyncLedger

FACES = ["sync", "async"]


class SyncBlock:
    """A sync ``Lease`` with coroutine verbs, so it reads like the async one."""

    def __init__(self, lease: Any) -> None:
        self.lease = lease

    async def __aenter__(self) -> SyncBlock:
        self.lease.__enter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return self.lease.__exit__(*exc)

    @contextlib.asynccontextmanager
    async def effect(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        with self.lease.effect(*args, **kw) as fx:
            yield fx

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.lease, name)
        if not callable(attr) or isinstance(attr, str):
            return attr

        async def call(*args: Any, **kw: Any) -> Any:
            return attr(*args, **kw)

        return call


class Face:
    """``lg`` (a sync Ledger, for setting up and reading back) and ``lease(...)`` of one face."""

    def __init__(self, name: str, lg: Ledger) -> None:
        self.name, self.lg = name, lg
        self.alg = AsyncLedger(ledger=lg) if name == "async" else None

    def lease(self, run_id: str, **kw: Any) -> Any:
        if self.alg is not None:
            return self.alg.lease(run_id, **kw)
        return SyncBlock(self.lg.lease(run_id, **kw))

    async def close(self) -> None:
        if self.alg is not None:
            await self.alg.aclose()


class Blocking:
    """An ``AsyncLedger`` called like a ``Ledger``: each coroutine runs to its end on a
    loop of this object's own (on a thread), each async iterator is read into a list.
    The Ledger conformance suite (tests/test_ledger_conformance.py) runs through it, so
    every verb, read and refusal it checks is checked on the async face too."""

    def __init__(self, alg: AsyncLedger) -> None:
        import threading

        object.__setattr__(self, "_alg", alg)
        object.__setattr__(self, "_loop", asyncio.new_event_loop())
        object.__setattr__(self, "_overrides", {})
        threading.Thread(target=self._loop.run_forever, name="blocking-face", daemon=True).start()

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        if name in self._overrides:
            return self._overrides[name]
        if name in ("store", "clock", "projector"):  # the Ledger's attributes, not verbs
            return getattr(self._alg.ledger, name)
        attr = getattr(self._alg, name)

        def call(*args: Any, **kw: Any) -> Any:
            got = attr(*args, **kw)
            if inspect.isasyncgen(got):
                async def collect() -> list[Any]:
                    return [x async for x in got]

                return self._wait(collect())
            return self._wait(got)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        self._overrides[name] = value  # a test replacing a method (as it would on a Ledger)

    def close(self) -> None:
        self._wait(self._alg.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
