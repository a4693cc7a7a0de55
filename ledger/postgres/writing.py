"""The PostgreSQL write path: a write decided on the client from the run as this session
last knew it (or as a read with no lock finds it), and sent as one message to
``handoff_append``, which writes it only onto that head (docs/architecture.md,
"PostgreSQL: what a write does"). ``Writes`` is the part of PostgresStore that writes;
the rest of the store (connection, transactions, reads) is in ledger/postgres/postgres_store.py."""

from __future__ import annotations

import contextlib
import hashlib
import time

import msgspec
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import events as ev
from .. import plan
from ..errors import LedgerError, StaleLease, StoreUnavailable
from ..store_core import MISSING as _MISSING
from ..store_core import decode_steps
from ..store import (
    GENESIS_HASH,
    Aggregate,
    AppendResult,
    Decision,
    Head,
    LeaseToken,
    Recorded,
    encode_events,
)
from ..verify import not_stored
from .postgres_values import VALUE_NOT_STORED, digest_in
from .rows import as_bytes
from .postgres_schema import ID_BLOCK, NOT_THE_HOLDER
from .view_functions import as_json
from .connection import psycopg  # None without the extra: pip install '.[postgres]'

S = TypeVar("S")

#: A write's read, when the session does not know the run's head: one call
#: (schema.READ_FUNCTION), one JSON value back.
READ = "SELECT handoff_read(%s, %s, %s, %s)::text"
#: The write: the batch, the head it was decided from and the views' rows, to
#: handoff_append (schema.APPEND_FUNCTION), in one message with its COMMIT. Values put
#: while it was decided follow it, kept only if it landed (the run's head then ends in
#: the batch's last hash): a write refused because the run moved stores none.
APPEND = ("BEGIN;\nSELECT handoff_append(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, "
          "%s::jsonb, %s::jsonb);\n")
PUT_IF_LANDED = ("SELECT handoff_put_values(%s, %s, %s::bytea[]) WHERE (SELECT h.last_hash FROM heads h "
                 "WHERE h.run_id = %s) = %s;\n")
COMMIT = "COMMIT"
#: When handoff_append could not seal the batch (another session was sealing), the next
#: round trip waits for that sealer and seals it.
SEAL = "SELECT event_id, event_position FROM handoff_seal(true, %s)"
#: How handoff_append answers a write it did not make because the run is not at the head
#: the write was decided from (or its key is already used): this prefix, then what
#: handoff_read would have answered, to decide again from.
MOVED = "moved:"
#: Runs whose head this session remembers (the least recently used goes first).
KNOWN_RUNS = 4096


class HeadMoved(Exception):
    """handoff_append did not make a write: the run's head is not the one it was decided
    from (another writer came first, or the session's memory of it was old). Nothing was
    written; the write is decided again, from ``read`` (the run as handoff_append found
    it) when there is one. ``known``: it was decided from memory, not from a read."""

    def __init__(self, why: str, read: Any = None, known: bool = False) -> None:
        super().__init__(why)
        self.read, self.known = read, known


class Writes:
    """The write path of a PostgresStore (mixed into it: the same object, its connection
    and its lock)."""

    def _duplicate(self, run_id: str, key: str, digest: bytes, actor: str,
                   row: Sequence[Any] | None) -> tuple[int, int, list[int], list[int | None]] | None:
        """The earlier batch a repeated key names: (first seq, last seq, its write ids,
        their positions, None where one still waits to be sealed)."""
        if row is None:
            return None
        seq, first_id, stored, size, by, ids, positions = row
        plan.check_repeat(run_id, key, digest, actor, as_bytes(stored), by, seq)
        return seq, seq + size - 1, list(ids), list(positions)

    def _positions_of(self, ids: Sequence[int]) -> tuple[int, ...]:
        """The ledger positions of these write ids, sealing them first if they still wait
        (outside any transaction)."""
        rows = dict(self.x("SELECT event_id, event_position FROM handoff_seal(true, %s)", (list(ids),)).fetchall())
        return tuple(rows[i] for i in ids if i in rows)

    def _ids(self, base: int, n: int) -> list[int]:
        """Write ids for a batch of ``n`` events: the block taken with the write's first
        round trip, and more blocks for a batch larger than one (rare: a long stream)."""
        ids = list(range(base, base + min(n, ID_BLOCK)))
        if n > ID_BLOCK:
            blocks = -(-(n - ID_BLOCK) // ID_BLOCK)
            for (b,) in self.x("SELECT nextval('events_id_seq') FROM generate_series(1, %s)", (blocks,)):
                ids.extend(range(b, b + ID_BLOCK))
            ids = ids[:n]
        return ids

    def _stamp(
        self, run_id: str, head: Head | None, max_lease: int, batch: Sequence[ev.Event],
        encoded: list[tuple[str, bytes]], actor: str, lease: int | None, key: str | None,
        digest: bytes | None, ids: list[int], now: int,
    ) -> tuple[plan.Stamped, Head, list[Recorded]]:
        """The batch stamped (plan.stamp) under its write ids, the new head and what the
        fold sees (Recorded.position is the write id until the order is sealed)."""
        done = plan.stamp(run_id, head, max_lease, batch, encoded, actor, lease, key, digest, now,
                          lambda parent: self._head_locked(parent)[0])
        now = done.now
        written = [Recorded(run_id, seq, ids[i], tag, actor, lease, k, now, ev.SCHEMA_VERSION, payload, prev, h)
                   for i, (seq, tag, k, _, payload, prev, h) in enumerate(done.events)]
        fence = done.fence
        first = head.first_position if head else ids[0]
        new_head = Head(run_id, done.last_seq, done.last_hash, fence.lease, fence.holder, first, ids[-1])
        return done, new_head, written

    def _message(self, sql: str, args: Sequence[Any]) -> list[list[Any]]:
        """Run several statements as ONE simple-query message, their values bound by
        psycopg on the client (ClientCursor), and return each one's rows. One message:
        the server runs none of it before it has all of it, so a client that stalls or is
        cut off mid-send holds no lock (a pipeline would leave the session 'active',
        waiting for the rest)."""
        cur = psycopg.ClientCursor(self.ready())
        cur.execute(sql, args)
        out = []
        while True:
            out.append(cur.fetchall() if cur.description is not None else [])
            if not cur.nextset():
                return out

    def _write(
        self, run_id: str, aggregate: Aggregate[Any] | None, actor: str, idempotency_key: str | None,
        digest: bytes | None, token: LeaseToken | None, planner: Callable[..., Any], doing: str,
    ) -> tuple[AppendResult, Any]:
        """A write: decided from the run's head, written only onto that head.

        When this session knows the run's head (its own last write or read of it) and the
        fold there, the write is decided from that and sent at once: one round trip. Else,
        or when handoff_append finds the run elsewhere, it is decided from a read: the
        read comes back with the refusal, or is asked for first (one round trip more).
        Each refusal is decided again from the head as it now is, until the write lands or
        the lock timeout (``busy_timeout_s``) has passed. A check that fails on what the
        session remembered (a lease, a transition), and a decision that there is nothing
        to add, are made again on a read before they are answered: only the server's head
        refuses a write or calls it unchanged.

        The events are stamped with the time the write was asked for, not the time its
        read came back: a heartbeat whose read a partition held up proves the worker was
        alive when it beat, not when the network healed. A write decided again is stamped
        anew (another write landed on the run in between)."""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        deadline = time.monotonic() + self.busy_timeout_s
        now = self._clock()
        read: Any = None
        from_memory = True
        while True:
            try:
                with self._reading(doing):
                    return self._write_once(run_id, aggregate, actor, idempotency_key, digest, token, planner,
                                            now, read, from_memory, doing)
            except HeadMoved as moved:
                read, from_memory = moved.read, False
                now = self._clock()
                if moved.known:
                    self._known_moved += 1
                    continue
                self._decided_again += 1
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"run {run_id} kept changing under this write for {self.busy_timeout_s:g}s "
                        f"({moved}) while {doing} on {self.path}; nothing was written. Retry, or raise "
                        "the timeout (--busy-timeout)") from None

    def _known(self, run_id: str, aggregate: Aggregate[Any] | None
               ) -> tuple[Head, int, str | None, Any, dict[str, bytes] | None] | None:
        """The run as this session last saw it: (head, highest lease, the lease's token
        digest, the fold there, a digest of each view table's rows its last write there
        sent), when it knows the head and the fold is at it."""
        seen = self._seen.get(run_id)
        if seen is None or self._spare is None:
            return None
        head, max_lease, lease_digest, views = seen
        state = None
        if aggregate is not None:
            cached = self._cached(aggregate, run_id)
            if cached is None or cached[1] != head.last_seq or cached[2] != head.last_hash:
                return None
            state = cached[3]
        return head, max_lease, lease_digest, state, views

    def _saw(self, run_id: str, head: Head | None, max_lease: int, lease_digest: str | None,
             views: dict[str, bytes] | None = None) -> None:
        if head is None:
            self._seen.pop(run_id, None)
            return
        self._seen[run_id] = (head, max_lease, lease_digest, views)
        self._seen.move_to_end(run_id)
        while len(self._seen) > KNOWN_RUNS:
            self._seen.popitem(last=False)

    def _write_once(
        self, run_id: str, aggregate: Aggregate[Any] | None, actor: str, key: str | None,
        digest: bytes | None, token: LeaseToken | None, planner: Callable[..., Any], now: int, read: Any,
        from_memory: bool, doing: str,
    ) -> tuple[AppendResult, Any]:
        lean = aggregate is not None and aggregate.lean
        known = self._known(run_id, aggregate) if read is None and from_memory else None
        if known is not None:
            head, max_lease, lease_digest, state, _ = known
            base = None
        else:
            if read is None:
                cached = self._cached(aggregate, run_id) if aggregate is not None else None
                read = msgspec.json.decode(self._message(READ, [run_id, key, cached[1] if cached else 0, lean])[0][0][0])
            base, head, max_lease, lease_digest, dup_row, state = self._read_back(run_id, aggregate, read)
            self._saw(run_id, head, max_lease, lease_digest)
            self._spare = (base, base + ID_BLOCK)
            if dup_row is not None:
                dup = self._duplicate(run_id, key, digest, actor, dup_row)
                positions = tuple(dup[3]) if None not in dup[3] else self._positions_of(dup[2])
                return AppendResult(run_id, "duplicate", dup[0], dup[1], positions), state
        self._guards, self._values = [], {}
        try:
            try:
                if token is not None:
                    plan.check_token(run_id, head, max_lease, token, lease_digest)
                planned = planner(head, max_lease, state)
            except LedgerError:
                if known is None:
                    raise
                raise HeadMoved("a check failed on the run as this session last saw it", known=True) from None
            if isinstance(planned, AppendResult):
                if known is not None:  # "nothing to add" is said only of the run as the server has it
                    raise HeadMoved("nothing to add to the run as this session last saw it", known=True)
                return planned, state
            events, lease_n = planned
            encoded = encode_events(events, self.max_payload)
            ids = self._take_ids(len(encoded))
            if ids is None:  # not enough write ids left in this session's block: read for more
                raise HeadMoved("no write ids left", known=True)
            done, new_head, written = self._stamp(run_id, head, max_lease, events, encoded, actor, lease_n, key,
                                                  digest, ids, now)
            self._view_rows = {}
            self._pending = (run_id, new_head, head, written)
            forking = head is None and isinstance(events[0], ev.RunForked)
            new_state = (aggregate.evolve_all(state, written)
                         if aggregate is not None and not forking else _MISSING)
            folded = self._run_hooks(run_id, new_head, self._after_write(
                run_id, head, written, [(aggregate, new_state)] if new_state is not _MISSING else []))
            if new_state is _MISSING and aggregate is not None:  # (a fork's: folded before the
                # commit, so that nothing after it reads: a read that failed there would
                # report a committed write as refused)
                new_state = next((st for agg, st in folded[1] if agg is aggregate), _MISSING)
                if new_state is _MISSING:
                    new_state = self._after_write(run_id, head, written, [], [aggregate])[0][1]
            views, guards, values = self._view_rows, self._guards, self._values
        finally:
            self._view_rows = self._guards = self._pending = self._values = None
        sent, digests = self._changed(views, known)
        try:
            sealed = self._send_write(run_id, head, ids, token, lease_n, done, sent, guards, values, known, doing)
        except BaseException:
            self._seen.pop(run_id, None)
            raise
        self._spare = (ids[-1] + 1, self._spare[1]) if self._spare is not None and len(ids) <= ID_BLOCK else None
        fence = done.fence
        self._saw(run_id, new_head, fence.max_lease, fence.digest if fence.digest_moved else lease_digest, digests)
        return self._committed(run_id, aggregate, new_head, folded, new_state, len(ids),
                               self._positions_after(sealed, ids))

    @staticmethod
    def _changed(views: dict[str, Any] | None, known: Any) -> tuple[str | None, dict[str, bytes]]:
        """The view rows a write sends, as the JSON handoff_views reads (None: none), and a
        digest of each table's rows, which the session remembers of the write. Sent are the
        tables whose rows differ from what this session's last write to the run sent, when
        the write is decided from the head that write left: the rows of a run's views are
        a function of its log, and handoff_append writes only onto that head, so the rows
        there are the ones sent then; sending them again costs the server an upsert per
        table that changes nothing (a progress command leaves the run's deliveries and its
        owner's load as they were). Digests, not the rows: a packet is kilobytes, and the
        session remembers thousands of runs."""
        if not views:
            return None, {}
        before = known[4] if known is not None else None
        parts, digests = [], {}
        for table, entry in views.items():
            body = msgspec.json.encode(entry)
            digests[table] = digest = hashlib.blake2b(body, digest_size=16).digest()
            if not before or before.get(table) != digest:
                parts.append(msgspec.json.encode(table) + b":" + body)
        return (b"{" + b",".join(parts) + b"}").decode() if parts else None, digests

    def _read_back(self, run_id: str, aggregate: Aggregate[Any] | None,
                   got: Sequence[Any]) -> tuple[int, Head | None, int, str | None, Any, Any]:
        """What handoff_read answered (or handoff_append, refusing): (a block of write ids,
        the head, its highest lease, the lease's token digest, the key's earlier batch,
        the fold at the head). The fold is remembered there: a write decided again from
        the next refusal's read folds on from it."""
        base, h, dup_row, steps = got
        head, max_lease, lease_digest = (None, 0, None) if h is None else (
            Head(run_id, h[0], bytes.fromhex(h[1]), h[2], h[3], h[4], h[5]), h[6], h[7])
        lean = aggregate is not None and aggregate.lean
        if not lean:
            steps = None
        elif steps is None:
            steps = []
        if steps is not None:
            steps = [(r[0], r[1], r[2], bytes.fromhex(r[3]), bytes.fromhex(r[4]), r[5]) for r in steps]
        dup = None
        if dup_row is not None:
            pairs = dup_row[5] or []
            dup = (dup_row[0], dup_row[1], bytes.fromhex(dup_row[2]) if dup_row[2] else None, dup_row[3],
                   dup_row[4], [p[0] for p in pairs], [p[1] for p in pairs])
        state: Any = None
        if aggregate is not None:
            cached = self._cached(aggregate, run_id)
            state = self._state_from(run_id, aggregate, head, cached, steps) if steps is not None else _MISSING
            if state is _MISSING:
                state = self._state_locked(run_id, aggregate, head)
            if head is not None:
                self._remember(aggregate, run_id, head.last_seq, head.last_hash, state)
        return base, head, max_lease, lease_digest, dup, state

    def _take_ids(self, n: int) -> list[int] | None:
        """Write ids for a batch of ``n`` events from this session's block (the one its last
        read took), or None when too few are left. A batch larger than a block takes more
        blocks (rare: a long stream)."""
        if self._spare is None:
            return None
        first, end = self._spare
        if n > ID_BLOCK:
            return self._ids(first, n) if first == end - ID_BLOCK else None
        if first + n > end:
            return None
        return list(range(first, first + n))

    def _after_write(self, run_id: str, head: Head | None, written: list[Recorded],
                     known: list[tuple[Aggregate[Any], Any]],
                     wanted: Sequence[Aggregate[Any]] | None = None) -> list[tuple[Aggregate[Any], Any]]:
        """Each aggregate's state after a write that is not stored yet: the hooks run
        before the one message that stores it, so the fold of what it adds is made here,
        from the run as read (at ``head``) and the rows written."""
        out = list(known)
        for aggregate in (wanted if wanted is not None else [agg for agg, _ in self._hooks]):
            if any(agg is aggregate for agg, _ in out):
                continue
            if head is None and written and written[0].type == "run_forked":
                fork = written[0].event
                assert isinstance(fork, ev.RunForked)
                before = aggregate.evolve_all(aggregate.initial(run_id), (
                    self._lineage_steps(fork.parent, fork.parent_seq) if aggregate.lean
                    else self.history(fork.parent, until_seq=fork.parent_seq)))
            else:
                before = self._state_locked(run_id, aggregate, head)
            out.append((aggregate, aggregate.evolve_all(before, written)))
        return out

    def view_rows(self, table: str, run_id: str, rows: Sequence[Any], many: bool) -> bool:
        """Keep a view table's rows for a run with the write being made (its hooks call
        this through the view store): they go to the server with the batch, in the same
        call. False outside a write (the caller writes them itself)."""
        pending = self._view_rows
        if pending is None:
            return False
        entry = pending.get(table)
        if entry is None:
            pending[table] = {"r": list(rows), "m": many}
        else:
            entry["r"].extend(rows)
            entry["m"] = entry["m"] or many
        return True

    def view_read(self, table: str, where: dict[str, Any], where_not: dict[str, Any], count: int) -> None:
        """A count of a view's rows that the write being decided read (an owner's load):
        handoff_append counts again under the views lock and refuses the write if the
        number changed, so no two writes decide on the same stale count."""
        if self._guards is not None:
            self._guards.append({"t": table, "w": where, "n": where_not, "c": count})

    def join_values(self, run_id: str, values: dict[str, bytes | None]) -> bool:
        """Values put while a write is decided go with its message, after its events, in
        its transaction (handoff_put_values): a refused write stores neither. A digest
        without bytes is one the write needs stored already (require_values), unless the
        write stores it itself. False outside a write (the caller stores them on their own)."""
        if self._values is None:
            return False
        joined: dict[str, Any] = self._values.setdefault(run_id, {})
        for digest, value in values.items():
            if value is not None or digest not in joined:
                joined[digest] = value
        return True

    @property
    def deciding(self) -> bool:
        """Whether a write is being decided (a view read now is one it depends on)."""
        return self._guards is not None

    def _send_write(self, run_id: str, head: Head | None, ids: list[int], token: LeaseToken | None,
                    lease: int | None, done: plan.Stamped, views: str | None,
                    guards: list[Any] | None, values: dict[str, dict[str, bytes]] | None, known: Any,
                    doing: str) -> tuple[str, dict[int, int]]:
        """The write's one message: handoff_append, the values if it landed, COMMIT; then,
        only when handoff_append could not seal the batch, the seal. Returns what
        handoff_append answered ("first id:position" when it sealed the batch) and the
        positions the seal gave; raises HeadMoved when handoff_append found the run
        elsewhere."""
        fence = done.fence
        rows = done.events
        batch = [[ids[i], r[0], r[1], r[2], r[3].hex() if r[3] is not None else None, r[4].hex(), r[5].hex(),
                  r[6].hex()] for i, r in enumerate(rows)]
        args = [run_id, head.last_seq if head else 0, head.last_hash if head else GENESIS_HASH,
                token.secret if token is not None else None, lease, done.actor, done.now, ev.SCHEMA_VERSION,
                self._keeps_views, as_json(batch), fence.lease, fence.holder, fence.max_lease, fence.digest,
                fence.digest_moved, views, as_json(guards) if guards else None]
        sql = APPEND
        for run, vs in (values or {}).items():
            sql += PUT_IF_LANDED
            args += [run, list(vs), list(vs.values()), run_id, done.last_hash]
        conn = self.ready()
        try:
            results = self._message(sql + COMMIT, args)
        except psycopg.Error as exc:
            status = conn.info.transaction_status
            if conn.closed or conn.broken or status == psycopg.pq.TransactionStatus.UNKNOWN:
                raise self._unknown(doing, exc) from exc
            if status == psycopg.pq.TransactionStatus.IDLE:
                raise self._unknown(doing, exc) from exc
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
            if exc.sqlstate == VALUE_NOT_STORED:
                raise not_stored(run_id, digest_in(str(exc))) from None
            if exc.sqlstate == NOT_THE_HOLDER:
                raise StaleLease(
                    f"the server refused the write to run {run_id}: {str(exc).splitlines()[0]}; "
                    "nothing was written. Claim the run again for a new lease",
                    run_id=run_id, lease=lease, why="refused_by_server") from None
            raise
        # BEGIN; SELECT handoff_append(...); [the values;] COMMIT
        answer = results[1][0][0]
        if answer.startswith(MOVED):
            raise HeadMoved(f"run {run_id} is not at seq {head.last_seq if head else 0}",
                            read=msgspec.json.decode(answer[len(MOVED):]), known=known is not None)
        if answer:
            return str(answer), {}
        try:  # committed and queued: seal it, behind whoever is sealing
            return "", dict(self.x(SEAL, (ids,)).fetchall())
        except (psycopg.Error, LedgerError):
            # Committed; the seal timed out, or the connection went and a new one could not
            # be had (the next write or read seals it): its positions are not known here,
            # and no error may say the write was not made.
            return "", {}

    def _positions_after(self, sealed: tuple[str, dict[int, int]], ids: Sequence[int]) -> tuple[int, ...] | None:
        """The committed write's positions: where its insert sealed it, else where the seal
        after the commit put it. None when that could not be had (the write is committed
        and waits in the queue for the next writer or reader to seal it)."""
        at_insert, got = sealed
        first_id, _, first = at_insert.partition(":")
        # Counted on only when it names this write's first id and the ids are one block:
        # nothing else was sealed between them.
        if first and first_id == str(ids[0]) and ids[-1] - ids[0] == len(ids) - 1:
            return tuple(range(int(first), int(first) + len(ids)))
        if len(got) < len(ids):  # sealed by another session since: read them
            try:
                got = dict(self.x("SELECT event_id, position FROM ledger_order WHERE event_id = ANY(%s)",
                                  (list(ids),)).fetchall())
            except (psycopg.Error, LedgerError):  # (committed: see _send_write)
                return None
        return tuple(got[i] for i in ids) if all(i in got for i in ids) else None

    def _committed(self, run_id: str, aggregate: Aggregate[Any] | None, new_head: Head,
                   folded: tuple[Head | None, list[tuple[Aggregate[Any], Any]]], new_state: Any,
                   n: int, positions: tuple[int, ...] | None) -> tuple[AppendResult, Any]:
        if folded[0] is not None:
            self._remember_all(run_id, (new_head, folded[1]))
        if aggregate is not None and new_state is not _MISSING:
            self._remember(aggregate, run_id, new_head.last_seq, new_head.last_hash, new_state)
        first = new_head.last_seq - n + 1
        return AppendResult(run_id, "committed", first, new_head.last_seq, positions or ()), new_state

    def _state_from(self, run_id: str, aggregate: Aggregate[S], head: Head | None,
                    cached: tuple[Any, int, bytes, Any] | None, rows: list[Sequence[Any]]) -> Any:
        """The fold at the head from the steps the first round trip brought, or _MISSING
        when they are not enough (a fork's lineage, a cached fold off the chain, a write
        that landed between the two reads)."""
        if head is None:
            return aggregate.initial(run_id)
        if cached is not None and cached[1] > 0:
            if not rows or rows[0][0] != cached[1] or as_bytes(rows[0][4]) != cached[2]:
                return _MISSING
            state, rows = cached[3], rows[1:]
        else:
            if rows and rows[0][1] == "run_forked":
                return _MISSING
            state = aggregate.initial(run_id)
        if not rows:
            return state if (cached is not None and cached[1] == head.last_seq) else _MISSING
        if rows[-1][0] != head.last_seq:
            return _MISSING
        steps = decode_steps(run_id, [(r[0], r[1], r[2], as_bytes(r[3]), r[4], r[5]) for r in rows])
        if steps is None:
            return _MISSING
        return aggregate.evolve_all(state, steps)

    def _append(self, req: plan.Request) -> AppendResult:
        def decide(head: Head | None, max_lease: int, state: Any) -> Any:
            plan.check_fence(req.run_id, head, req.expected_seq, None)
            return req.events, req.lease

        # With hooks attached, fold for the first of them in the same round trips (its
        # steps come with the first one), so the hooks need no read of their own.
        folded_for = self._hooks[0][0] if self._hooks else None
        with self.lock:
            result, _ = self._write(req.run_id, folded_for, req.actor, req.key, req.digest, req.token, decide,
                                    "appending")
        return result

    def _execute(self, req: plan.Request, aggregate: Aggregate[S],
                 decide: Callable[[S, Head | None], Decision]) -> tuple[AppendResult, S]:
        def planned(head: Head | None, max_lease: int, state: Any) -> Any:
            decision = decide(state, head)
            if not decision.events:
                return plan.unchanged(req.run_id, head)
            plan.check_decision(req.run_id, decision, req.token, head, max_lease)
            return decision.events, decision.lease

        with self.lock:
            return self._write(req.run_id, aggregate, req.actor, req.key, req.digest, req.token, planned,
                               "committing a command")
