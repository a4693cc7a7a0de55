"""What every backend does with folds: the warm-fold cache, lineage, and inline hooks.

``FoldingStore`` is the part of an ``EventStore`` that is the same on every backend. A
dialect supplies four reads inside its open transaction (``_head_locked``, ``_hash_at``,
``_step_rows``, ``_read_run_page``), ``_iter_all``, ``_export_page``, the rows of an
import, and its driver's error mapping (``_driver_error``, ``_ledger_error``); the store's
lock and the context a call into the database runs in (``_reading``,
``write_transaction``), the argument checks of the reads, their paging, the import, the
fold cache, a fork's lineage, the lean fold and the running of inline hooks are written
once, here.
"""

from __future__ import annotations

import abc
import collections
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import msgspec

from . import events as ev
from . import plan
from .plan import Request
from .errors import LedgerError
from .importing import run_import
from .inputs import check_run_id, check_seq
from .store import (Actor, Aggregate, AppendResult, Decision, EventStore, Folded, Head, Recorded, Step,
                    Transaction, keeps_views)

S = TypeVar("S")
T = TypeVar("T")
#: A fold argument not given (``Transaction.state``'s ``head``), told apart from None.
MISSING: Any = object()
#: Runs whose fold stays warm (per aggregate); the least recently used goes first.
CACHE_RUNS = 4096
#: Events per page when a fold reads a run.
PAGE = 1000

#: The tag each event type is stored under.
_TAGS = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}


class Reading:
    """``FoldingStore._reading``: the store's lock held, the driver's errors mapped. A
    class rather than a generator function: a fold enters one per page it reads."""

    __slots__ = ("_store", "_doing")

    def __init__(self, store: FoldingStore, doing: str) -> None:
        self._store, self._doing = store, doing

    def __enter__(self) -> None:
        self._store.lock.acquire()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        store = self._store
        store.lock.release()
        if exc is not None and isinstance(exc, store._driver_error):
            raise store._ledger_error(exc, self._doing) from exc


class WriteTransaction:
    """``FoldingStore.write_transaction``: ``_reading`` entered, then ``begin``; at the end
    of the block ``finish`` (a commit, or a rollback on any exception). A class rather than
    a generator function: every command on SQLite enters one."""

    __slots__ = ("_store", "_doing", "_committing", "_outer")

    def __init__(self, store: FoldingStore, doing: str, committing: str) -> None:
        self._store, self._doing, self._committing = store, doing, committing

    def __enter__(self) -> Transaction:
        store = self._store
        self._outer = outer = store._reading(self._doing)
        outer.__enter__()
        try:
            store.begin(self._doing)
        except BaseException as exc:
            outer.__exit__(type(exc), exc, exc.__traceback__)  # a driver error leaves mapped
            raise
        return store._txn

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._store.finish(exc is None, self._committing)
        except BaseException as failed:
            self._outer.__exit__(type(failed), failed, failed.__traceback__)
            raise
        self._outer.__exit__(kind, exc, tb)


class FoldingStore(EventStore):
    """The backend-neutral half of a store: a dialect subclasses it and fills in its reads."""

    _txn: Transaction
    max_payload: int
    #: An attached hook keeps every projection inline (``ledger.store.Hook.keeps_views``):
    #: a dialect then marks no view as behind for its writes.
    _keeps_views: bool = False

    def __init__(self) -> None:
        #: The store's lock: one connection, shared by threads; every call into the
        #: database holds it (``_reading``, ``write_transaction``).
        self.lock = threading.RLock()
        self._cache: collections.OrderedDict[tuple[int, str], tuple[Any, int, bytes, Any]] = (
            collections.OrderedDict()
        )
        self._hooks: list[tuple[Aggregate[Any], Callable[..., None]]] = []
        self._keeps_views = False

    # --- what a dialect supplies ------------------------------------------------------

    @abc.abstractmethod
    def _head_locked(self, run_id: str) -> tuple[Head | None, int]:
        """The run's head (in the dialect's own span units) and highest lease, read in the
        open transaction."""

    @abc.abstractmethod
    def _hash_at(self, run_id: str, seq: int) -> bytes | None:
        """The hash of the run's event at ``seq``, or None."""

    def _step_rows(self, run_id: str, after_seq: int, until_seq: int | None) -> Sequence[Sequence[Any]]:
        """The run's events after ``after_seq`` (up to ``until_seq``) as (seq, type,
        recorded_us, payload, actor) rows, for ``_steps_page`` (unless a dialect has its own)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _read_run_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Recorded]:
        """The run's events after ``after_seq`` (up to ``until_seq``) as Recorded."""

    @abc.abstractmethod
    def _iter_all(self, after_position: int, until_position: int | None, page: int) -> Iterator[Recorded]:
        """``read_all`` once its arguments are checked."""

    #: The driver's errors, which ``_reading`` maps with ``_ledger_error``.
    _driver_error: ClassVar[type[BaseException]] = Exception

    @abc.abstractmethod
    def _ledger_error(self, exc: BaseException, doing: str) -> LedgerError:
        """The driver's error as the library's own, naming ``doing`` and the store."""

    def _reading(self, doing: str = "reading") -> Reading:
        """The context one call into the database runs in (a read outside a transaction, a
        whole write transaction): the store's lock, and the driver's errors mapped to the
        library's, naming ``doing``."""
        return Reading(self, doing)

    def _read(self, doing: str, read: Callable[..., T], *args: Any) -> T:
        """``read(*args)`` under ``_reading(doing)``, in one Python call instead of the
        context's three: for the reads a status lookup or a fold makes (a head, a page,
        a view row), where those calls were a measurable share of the lookup."""
        with self.lock:
            try:
                return read(*args)
            except self._driver_error as exc:
                raise self._ledger_error(exc, doing) from exc

    def begin(self, doing: str) -> None:
        """Open a write transaction (for ``write_transaction``, unless a dialect has its own)."""
        raise NotImplementedError

    def finish(self, ok: bool, doing: str) -> None:
        """Commit the open write transaction (``ok``), or roll it back."""
        raise NotImplementedError

    def write_transaction(self, doing: str, committing: str | None = None) -> WriteTransaction:
        """``begin`` ... ``finish``: committed when the block ends, rolled back on any
        exception; driver errors name ``doing``, or ``committing`` for the commit's own."""
        return WriteTransaction(self, doing, committing or doing)

    def import_records(
        self, items: Iterable[tuple[Recorded, bytes | None, int]], *, aggregate: Aggregate[Any] | None = None,
        admit: Callable[[Any, Recorded, ev.Event], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        """Insert exported events verbatim, all or nothing (ledger/importing.py), in one
        write transaction that excludes every other write; the dialect inserts the rows
        (``_import_tail``, ``_key_used``, ``_import_rows``, ``_import_done``)."""
        with self.write_transaction("importing", "committing an import"):
            counts, touched = run_import(self, items, aggregate, admit, before_commit)
        for run_id, folded in touched:
            self._remember_all(run_id, folded)
        return counts

    # --- commands, checked where they enter (ledger/plan.py), then the dialect's write ---

    def append(self, run_id: str, events: Sequence[ev.Event], *, actor: Actor, expected_seq: int | None = None,
               lease: str | None = None, idempotency_key: str | None = None) -> AppendResult:
        return self._append(plan.append_request(run_id, events, actor=actor, expected_seq=expected_seq,
                                                lease=lease, key=idempotency_key, max_payload=self.max_payload))

    def execute(self, run_id: str, aggregate: Aggregate[S], decide: Callable[[S, Head | None], Decision], *,
                actor: Actor, idempotency_key: str | None = None, digest_of: bytes | None = None,
                lease: str | None = None) -> tuple[AppendResult, S]:
        req = plan.execute_request(run_id, actor=actor, key=idempotency_key, lease=lease, digest_of=digest_of)
        return self._execute(req, aggregate, decide)

    def _append(self, req: Request) -> AppendResult:
        """Write an append's checked request (its events encoded) under its fence."""
        raise NotImplementedError

    def _execute(self, req: Request, aggregate: Aggregate[S],
                 decide: Callable[[S, Head | None], Decision]) -> tuple[AppendResult, S]:
        """Fold, decide and write a command's checked request in one write transaction."""
        raise NotImplementedError

    # --- reads, checked where they enter ---------------------------------------------

    #: ``read_all``'s default page.
    READ_PAGE: ClassVar[int] = PAGE

    def read_run(self, run_id: str, *, after_seq: int = 0, until_seq: int | None = None) -> Iterator[Recorded]:
        # Checked now, not at the first next(): a bad argument fails where it was passed.
        check_run_id(run_id)
        check_seq(after_seq, "after_seq")
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return self._iter_run(run_id, after_seq, until_seq)

    def read_all(self, *, after_position: int = 0, until_position: int | None = None,
                 page: int | None = None) -> Iterator[Recorded]:
        check_seq(after_position, "after_position")
        if until_position is not None:
            check_seq(until_position, "until_position")
        page = self.READ_PAGE if page is None else check_seq(page, "page", low=1, high=1_000_000)
        return self._iter_all(after_position, until_position, page)

    def read_for_export(self, run_ids: Sequence[str] | None = None) -> Iterator[tuple[Recorded, bytes | None, int]]:
        """Events in ledger order with what an export needs beyond the envelope (a batch's
        request digest and size), a page at a time (``_export_page``), the store free
        between pages."""
        wanted = None if run_ids is None else set(run_ids)
        cursor = 0
        while True:
            with self._reading("exporting"):
                page = self._export_page(cursor)
            if not page:
                return
            for item in page:
                if wanted is None or item[0].run_id in wanted:
                    yield item
            cursor = page[-1][0].position

    @abc.abstractmethod
    def _export_page(self, after: int) -> list[tuple[Recorded, bytes | None, int]]:
        """The page of ``read_for_export`` after ``after`` (a position), in ledger order."""

    def _iter_run(self, run_id: str, after_seq: int, until_seq: int | None) -> Iterator[Recorded]:
        return itertools.chain.from_iterable(self._pages(self._read_run_page, run_id, after_seq, until_seq))

    def _pages(self, read: Callable[[str, int, int], list[Any]], run_id: str, after_seq: int,
               until_seq: int | None) -> Iterator[list[Any]]:
        """A run's events a page at a time, each page read whole under ``_reading`` (so a
        caller may write between pages), until a short page or ``until_seq``."""
        cursor = after_seq
        page_size = self._page_size()
        while until_seq is None or cursor < until_seq:
            stop = cursor + page_size if until_seq is None else min(cursor + page_size, until_seq)
            page = self._read("reading", read, run_id, cursor, stop)
            yield page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def _steps_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Step]:
        """The run's events after ``after_seq`` (up to ``until_seq``) as Steps: five columns
        read, the payloads decoded together."""
        rows = self._step_rows(run_id, after_seq, until_seq)
        steps = decode_steps(run_id, rows)
        if steps is None:
            # Read the page again whole: Recorded.event raises CorruptLedger naming the
            # position of the payload that does not decode or does not match its type.
            events = [rec.event for rec in self._read_run_page(run_id, after_seq, until_seq)]
            steps = [Step(run_id, r[0], r[1], r[2], e, r[-1]) for r, e in zip(rows, events)]
        return steps

    # --- inline hooks -----------------------------------------------------------------

    def attach(self, aggregate: Aggregate[Any], hook: Callable[..., None]) -> None:
        """Run ``hook(txn, run_id, state, last_position)`` inside every append's transaction.

        ``state`` is ``aggregate``'s fold of the run after the append. This is how inline
        projections stay in step with the log: a failing hook rolls the append back. A write
        is marked as keeping the views only if a hook keeps all of them: one that keeps a
        few (a subset projector, any other hook) leaves the rest to catch-up."""
        self._hooks.append((aggregate, hook))
        self._keeps_views = self._keeps_views or keeps_views(hook)

    def _run_hooks(self, run_id: str, head: Head, known: list[tuple[Aggregate[Any], Any]]) -> Folded:
        """Run every hook on the run's state after a write, at ``head`` (the one the write
        left); ``known`` holds states the caller already folded from the rows it wrote."""
        if not self._hooks:
            return None, []
        folded = []
        for aggregate, hook in self._hooks:
            state = next((st for agg, st in known if agg is aggregate), MISSING)
            if state is MISSING:
                state = self._state_locked(run_id, aggregate, head)
            hook(self._txn, run_id, state, head.last_position)
            folded.append((aggregate, state))
        return head, folded

    # --- the fold cache ---------------------------------------------------------------

    def _remember_all(self, run_id: str, folded: Folded) -> None:
        head, states = folded
        if head is None:
            return
        for aggregate, state in states:
            self._remember(aggregate, run_id, head.last_seq, head.last_hash, state)

    def _remember(self, aggregate: Aggregate[Any], run_id: str, seq: int, h: bytes, state: Any) -> None:
        ckey = (id(aggregate), run_id)
        # Holding the aggregate keeps its id() from being reused by another object.
        self._cache[ckey] = (aggregate, seq, h, state)
        self._cache.move_to_end(ckey)
        while len(self._cache) > CACHE_RUNS:
            self._cache.popitem(last=False)

    def _cached(self, aggregate: Aggregate[Any], run_id: str) -> tuple[Any, int, bytes, Any] | None:
        """The warm fold of the run for this aggregate, (aggregate, seq, hash, state), or None."""
        cached = self._cache.get((id(aggregate), run_id))
        return cached if cached is not None and cached[0] is aggregate else None

    def _state_locked(self, run_id: str, aggregate: Aggregate[S], head: Head | None) -> S:
        """The folded state at the head, reusing a cached fold when it is still current."""
        if head is None:
            return aggregate.initial(run_id)
        cached = self._cached(aggregate, run_id)
        if cached is not None and cached[1] <= head.last_seq:
            _, seq, h, state = cached
            if seq == head.last_seq and h == head.last_hash:
                self._cache.move_to_end((id(aggregate), run_id))
                return state  # type: ignore[no-any-return]
            # Verify the cached point is still on the chain before folding forward.
            if self._hash_at(run_id, seq) == h:
                if aggregate.lean:
                    return aggregate.evolve_all(state, self._steps_page(run_id, seq, None))
                return aggregate.evolve_all(state, self._read_run_page(run_id, seq, None))
        if aggregate.lean:
            return aggregate.evolve_all(aggregate.initial(run_id), self._lineage_steps(run_id, None))
        return aggregate.evolve_all(aggregate.initial(run_id), self.history(run_id))

    def state_at(self, run_id: str, aggregate: Aggregate[S], last_seq: int, last_hash: bytes) -> S | None:
        with self.lock:
            cached = self._cached(aggregate, run_id)
        if cached is None or cached[1] != last_seq or cached[2] != last_hash:
            return None
        return cached[3]  # type: ignore[no-any-return]

    # --- lineage and the lean fold ----------------------------------------------------

    def fold(self, run_id: str, aggregate: Aggregate[S], *, until_seq: int | None = None) -> S:
        if not aggregate.lean:
            return super().fold(run_id, aggregate, until_seq=until_seq)
        check_run_id(run_id)
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return aggregate.evolve_all(aggregate.initial(run_id), self._lineage_steps(run_id, until_seq))

    def _lineage_steps(self, run_id: str, until_seq: int | None) -> Iterator[Step]:
        """``history`` as Steps: a fork's inherited prefix first, then the run, a page at a time."""
        return itertools.chain.from_iterable(self._lineage_pages(run_id, until_seq))

    def _lineage_pages(self, run_id: str, until_seq: int | None) -> Iterator[list[Step]]:
        # Pages, chained by the caller in C: a generator resumed per event cost ~8% of a fold.
        for i, page in enumerate(self._pages(self._steps_page, run_id, 0, until_seq)):
            if i == 0 and page and page[0].type == "run_forked":
                fork = page[0].event
                assert isinstance(fork, ev.RunForked)
                yield from self._lineage_pages(fork.parent, fork.parent_seq)
            yield page

    def _page_size(self) -> int:
        """Events per page a fold reads (a dialect's module may set its own ``PAGE``)."""
        return PAGE


def decode_steps(run_id: str, rows: Sequence[Sequence[Any]]) -> list[Step] | None:
    """Steps from (seq, type, recorded_us, payload, ..., actor) rows, the payloads decoded
    together; None when one does not decode or is not the type its row names (the caller
    then reads the page whole, to name the damaged one)."""
    try:
        events = ev.decode_many([r[3] for r in rows])
        if list(map(_TAGS.__getitem__, map(type, events))) != [r[1] for r in rows]:
            return None
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError, UnicodeDecodeError, KeyError):
        return None
    return [Step(run_id, r[0], r[1], r[2], e, r[-1]) for r, e in zip(rows, events)]


class StoreTransaction(Transaction):
    """The handle ``write_transaction``, ``read_transaction`` and inline hooks receive, for
    a ``FoldingStore``: stateless beyond its store (the transaction is the store's
    connection's, and its lock is held by whoever opened it)."""

    __slots__ = ("_store",)

    def __init__(self, store: FoldingStore) -> None:
        self._store = store

    def state(self, run_id: str, aggregate: Aggregate[S], head: Head | None | object = MISSING) -> S:
        store = self._store
        if head is MISSING:
            head = store._head_locked(run_id)[0]
        return store._state_locked(run_id, aggregate, head)  # type: ignore[arg-type]

    def fold(self, run_id: str, aggregate: Aggregate[S]) -> S:
        return self._store.fold(run_id, aggregate)

    @property
    def views(self) -> Any:
        return self._store.views
