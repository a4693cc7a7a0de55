"""Import: exported events inserted verbatim, with every check a live write makes.

Backend-neutral: the store it writes into answers a few questions and inserts rows
(``ImportTarget``); the chain, envelope, fencing, key and fork checks, the caller's
``admit`` rules and the inline views are kept here, once.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from . import events as ev
from .errors import InvalidInput, PayloadTooLarge, StaleLease
from .plan import LeaseState, check_fork
from .inputs import check_actor, check_idempotency_key
from .store import (
    GENESIS_HASH,
    Actor,
    Aggregate,
    Folded,
    Head,
    Recorded,
    Step,
    global_link,
)

#: Times an imported event may carry (UTC µs): from 2000-01-01 to the end of year 9999.
#: Nothing this library wrote predates 2000, and later than 9999 cannot be printed.
IMPORT_MIN_US = 946_684_800_000_000
IMPORT_MAX_US = 253_402_300_799_999_999
#: How far after the importing store's "now" an imported event may be dated (µs): ten
#: minutes of clock difference between the host that wrote it and this one.
IMPORT_MAX_AHEAD_US = 600_000_000
#: Rows buffered before one executemany; runs whose fold is kept warm during an import.
IMPORT_ROWS = 1000
IMPORT_RUNS = 4096


def check_imported_envelope(rec: Recorded, max_payload: int, now_us: int | None = None) -> None:
    """What a live write guarantees about an envelope, required of an imported one.

    ``now_us`` (the importing store's clock): no event can have been written later than
    now, give or take ``IMPORT_MAX_AHEAD_US`` of clock difference between hosts."""
    where = f"run {rec.run_id} seq {rec.seq}"
    try:
        actor = check_actor(Actor.parse(rec.actor))
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: actor {rec.actor[:60]!r} is not valid ({exc.message})", field="actor") from None
    if rec.lease is not None and rec.lease < 1:
        raise InvalidInput(f"{where}: lease {rec.lease} is not a lease (leases start at 1)", field="lease")
    if rec.lease is not None and not rec.actor.startswith("worker:"):
        raise InvalidInput(f"{where}: only a worker writes under a lease, not {rec.actor[:60]}", field="lease")
    try:
        check_idempotency_key(rec.idempotency_key, actor)  # the watchdog's keys stay the watchdog's
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}", field="idempotency_key") from None
    if now_us is not None and rec.recorded_us > now_us + IMPORT_MAX_AHEAD_US:
        raise InvalidInput(
            f"{where}: recorded_us {rec.recorded_us} is {(rec.recorded_us - now_us) // 1_000_000} s after "
            "now by this ledger's clock; history cannot come from the future (a heartbeat dated ahead "
            "would keep a dead worker looking alive). Check the exporting host's clock",
            field="recorded_us",
        )
    if not 1 <= rec.schema_version <= ev.SCHEMA_VERSION:
        raise InvalidInput(
            f"{where}: schema_version {rec.schema_version} is not one this version writes or reads "
            f"(1 to {ev.SCHEMA_VERSION}); upgrade handoff-ledger to import it",
            field="schema_version",
        )
    if len(rec.payload) > max_payload:
        raise PayloadTooLarge(
            f"{where} ({rec.type}) is {len(rec.payload)} bytes, over the limit of {max_payload} a "
            "live write obeys; such an event cannot have been written by this library",
            field="payload",
        )
    if not IMPORT_MIN_US <= rec.recorded_us <= IMPORT_MAX_US:
        raise InvalidInput(
            f"{where}: recorded_us {rec.recorded_us} is outside 2000-01-01 to 9999-12-31 (UTC); "
            "the export was edited or its clock was wrong",
            field="recorded_us",
        )


#: A row an import inserts: (position, record, idempotency digest, batch size, ledger-wide hash).
ImportRow = tuple[int, Recorded, "bytes | None", int, bytes]


class ImportHead:
    """Where one run stands during an import: its head as it will be written, its fence,
    and its fold. A dialect that keeps spans in other units than positions (PostgreSQL's
    write ids) rewrites ``first_position`` / ``last_position`` when it inserts the rows;
    ``fresh``: the run's span began in rows not inserted yet."""

    __slots__ = ("run_id", "seq", "hash", "fence", "first_position", "last_position", "stored_seq",
                 "state", "dirty", "granted_here", "fresh")

    def __init__(self, run_id: str, head: Head | None, max_lease: int) -> None:
        self.run_id = run_id
        self.seq = head.last_seq if head else 0
        self.hash = head.last_hash if head else GENESIS_HASH
        self.fence = LeaseState.of(head, max_lease)
        self.first_position = head.first_position if head else None
        self.last_position = head.last_position if head else None
        self.stored_seq = self.seq
        # The current lease, if any, was granted by this ledger: only its token proves it.
        self.granted_here = self.fence.lease is not None
        self.state: Any = None
        self.dirty = False
        self.fresh = False

    def head(self) -> Head:
        return Head(self.run_id, self.seq, bytes(self.hash), self.fence.lease, self.fence.holder,
                    self.first_position, self.last_position)  # type: ignore[arg-type]


class ImportTarget(Protocol):
    """What an import asks of the store it writes into, inside the store's open write
    transaction (besides the fold cache and hooks of ``FoldingStore``)."""

    max_payload: int
    _clock: Callable[[], int]

    def _import_tail(self) -> tuple[int, bytes]: ...
    def _head_locked(self, run_id: str) -> tuple[Head | None, int]: ...
    def _hash_at(self, run_id: str, seq: int) -> bytes | None: ...
    def _key_used(self, run_id: str, key: str) -> bool: ...
    def _import_rows(self, rows: list[ImportRow], heads: list[ImportHead]) -> None: ...
    def _import_done(self, last_position: int, global_hash: bytes) -> None: ...
    def _state_locked(self, run_id: str, aggregate: Aggregate[Any], head: Head | None) -> Any: ...
    def _lineage_steps(self, run_id: str, until_seq: int | None) -> Iterator[Step]: ...
    def history(self, run_id: str, *, until_seq: int | None = None) -> Iterator[Recorded]: ...
    def _run_hooks(self, run_id: str, head: Head, known: list[tuple[Aggregate[Any], Any]]) -> Folded: ...


def run_import(store: ImportTarget, items: Iterable[tuple[Recorded, bytes | None, int]],
               aggregate: Aggregate[Any] | None, admit: Callable[[Any, Recorded, ev.Event], None] | None,
               before_commit: Callable[[], None] | None) -> tuple[dict[str, int], list[tuple[str, Folded]]]:
    """Insert exported events verbatim inside the caller's write transaction; the counts,
    and the folds to remember once it commits.

    Each item is (record, idempotency digest, batch size), with chains already checked
    by ledger.jsonl.parse_lines. Items are consumed as they come (a file is read line
    by line, rows go in by the thousand): any refusal raises, and the caller rolls all
    of it back. A run that exists must hold the same events up to its head (same
    hashes); the import may only extend it. Every new event's envelope is checked as a
    live write's would be (actor, lease, key, payload size, time: see
    ``check_imported_envelope``) and fenced on leases; with ``aggregate`` and ``admit``,
    ``admit(state, record, event)`` is called with the run's folded state before each
    new event and may refuse it (the rules live with the caller, not in the store).
    ``before_commit()`` may refuse the whole import at its end. Inline projections are
    kept in the same transaction. Importing twice changes nothing."""
    run = _Import(store, aggregate, admit)
    for item in items:
        run.add(*item)
    touched = run.finish()
    if before_commit is not None:
        before_commit()
    return {"imported": run.imported, "skipped": run.skipped, "runs": len(run.seen)}, touched


class _Import:
    """One streamed import: rows buffered and inserted a thousand at a time, runs' heads
    and folds kept for the most recent few thousand runs (others are read back from the
    transaction when they reappear), so memory stays flat in the size of the file."""

    def __init__(self, store: ImportTarget, aggregate: Aggregate[Any] | None,
                 admit: Callable[[Any, Recorded, ev.Event], None] | None) -> None:
        self.store = store
        self.aggregate, self.admit = aggregate, admit
        self.last_pos, self.gprev = store._import_tail()
        self.runs: collections.OrderedDict[str, ImportHead] = collections.OrderedDict()
        self.rows: list[ImportRow] = []
        self.keys: set[tuple[str, str]] = set()
        self.seen: set[str] = set()
        self.folded: dict[str, Folded] = {}
        self.imported = self.skipped = 0

    def _cursor(self, run_id: str) -> ImportHead:
        cur = self.runs.get(run_id)
        if cur is not None:
            self.runs.move_to_end(run_id)
            return cur
        if len(self.runs) >= IMPORT_RUNS:
            self.flush()
            while len(self.runs) >= IMPORT_RUNS // 2:
                self.runs.popitem(last=False)
        head, max_lease = self.store._head_locked(run_id)
        cur = ImportHead(run_id, head, max_lease)
        if self.aggregate is not None and head is not None:
            cur.state = self.store._state_locked(run_id, self.aggregate, head)
        self.runs[run_id] = cur
        return cur

    def add(self, r: Recorded, digest: bytes | None, size: int) -> None:
        run_id = r.run_id
        self.seen.add(run_id)
        cur = self._cursor(run_id)
        if r.seq <= cur.stored_seq:
            if self.store._hash_at(run_id, r.seq) != r.hash:
                raise InvalidInput(
                    f"run {run_id} already exists here with a different event at seq {r.seq}; "
                    "import it into another ledger, or fork it",
                    field="import",
                )
            self.skipped += 1
            return
        if r.seq != cur.seq + 1 or r.prev_hash != cur.hash:
            raise InvalidInput(
                f"imported run {run_id} seq {r.seq} does not continue the stored chain (the "
                f"ledger's run is at seq {cur.seq}); nothing was imported",
                field="import",
            )
        check_imported_envelope(r, self.store.max_payload, self.store._clock())
        event = ev.decode(r.payload)
        if r.schema_version >= ev.CANONICAL_SINCE and ev.encode(event) != r.payload:
            # A live write stores the canonical encoding; anything else (a duplicated key,
            # unknown fields, other spacing) reads differently in different JSON parsers.
            raise InvalidInput(
                f"run {run_id} seq {r.seq}: the payload is not in the form this library writes "
                "(duplicate or unknown keys, or re-formatted JSON); export it again from the ledger",
                field="payload",
            )
        if self.aggregate is not None and cur.state is None:
            cur.state = self.aggregate.initial(run_id)
        if isinstance(event, ev.RunForked):
            self.flush()  # the parent's rows must be readable for the checks below
            check_fork(run_id, r.seq, event, lambda parent: self.store._head_locked(parent)[0])
        if self.admit is not None:
            self.admit(cur.state, r, event)
        if isinstance(event, ev.RunForked) and self.aggregate is not None:
            # A child's fold starts from its parent's history up to the fork point.
            agg = self.aggregate
            prefix = (self.store._lineage_steps(event.parent, event.parent_seq) if agg.lean
                      else self.store.history(event.parent, until_seq=event.parent_seq))
            cur.state = agg.evolve_all(agg.initial(run_id), prefix)
        self._fence(cur, r, event)
        key = r.idempotency_key
        if key is not None:
            if (run_id, key) in self.keys or self.store._key_used(run_id, key):
                raise InvalidInput(
                    f"run {run_id} seq {r.seq} reuses idempotency key {key[:60]!r}, which an earlier "
                    "event of the run already carries; a live write never stores a key twice",
                    field="idempotency_key",
                )
            self.keys.add((run_id, key))
        self.last_pos += 1
        pos = self.last_pos
        self.gprev = global_link(self.gprev, pos, r.hash)
        self.rows.append((pos, r, digest, size, self.gprev))
        if self.aggregate is not None:
            stored = Recorded(run_id, r.seq, pos, r.type, r.actor, r.lease, key, r.recorded_us,
                              r.schema_version, r.payload, r.prev_hash, r.hash)
            if self.aggregate.lean:
                stored = Step(run_id, r.seq, r.type, r.recorded_us, event, r.actor)  # type: ignore[assignment]
            cur.state = self.aggregate.evolve(cur.state, stored)
        cur.seq, cur.hash, cur.dirty = r.seq, r.hash, True
        cur.last_position = pos
        if cur.first_position is None:
            cur.first_position, cur.fresh = pos, True
        self.imported += 1
        if len(self.rows) >= IMPORT_ROWS:
            self.flush()

    def _fence(self, cur: ImportHead, r: Recorded, event: ev.Event) -> None:
        """The store's own fencing, as on a live append: a worker writes under the current
        lease, and lease numbers only grow. And one rule a live write does not need: an
        import writes nothing under a lease this ledger granted before it, since a write
        under it must show the lease's token and an import has none to show."""
        fence = cur.fence
        if r.lease is not None and r.lease == fence.lease and cur.granted_here:
            raise StaleLease(
                f"run {r.run_id} seq {r.seq} is written under lease {r.lease}, which this ledger granted "
                f"to {fence.holder}: a write under it must carry that lease's token, and an import carries "
                "none. The holder writes it live; import a run continued elsewhere into a new ledger",
                lease=r.lease, current_lease=fence.lease, why="imported_under_a_live_lease",
            )
        if r.lease is not None and r.lease != fence.lease:
            raise StaleLease(
                f"run {r.run_id} seq {r.seq} was written under lease {r.lease}, but the run's lease "
                f"at that point is {fence.lease if fence.lease is not None else 'none'}; no live write "
                "could carry it",
                lease=r.lease, current_lease=fence.lease,
            )
        if isinstance(event, ev.LeaseGranted) and event.lease <= fence.max_lease:
            raise StaleLease(
                f"run {r.run_id} seq {r.seq} grants lease {event.lease}, not above the run's "
                f"highest lease {fence.max_lease}; fencing tokens only grow",
                lease=event.lease, current_lease=fence.lease,
            )
        if fence.move(event):
            cur.granted_here = False  # granted by the imported history itself
        elif isinstance(event, ev.RunForked):
            fence.lease = fence.holder = None

    def flush(self) -> None:
        dirty = [cur for cur in self.runs.values() if cur.dirty]
        if not self.rows and not dirty:
            return
        self.store._import_rows(self.rows, dirty)
        self.rows = []
        self.keys.clear()
        for cur in dirty:
            cur.fence.digest_moved = False
            known = [(self.aggregate, cur.state)] if self.aggregate is not None else []
            self.folded[cur.run_id] = self.store._run_hooks(cur.run_id, cur.head(), known)
            if len(self.folded) > IMPORT_RUNS:
                self.folded.pop(next(iter(self.folded)))
            cur.dirty = False
            cur.stored_seq = cur.seq

    def finish(self) -> list[tuple[str, Folded]]:
        self.flush()
        self.store._import_done(self.last_pos, self.gprev)
        return list(self.folded.items())
