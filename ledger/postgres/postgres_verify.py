"""``verify`` for the PostgreSQL store: the SQLite store's walk, on this database.

Runs inside one REPEATABLE READ snapshot (``PostgresStore.verify`` opens it), so a
concurrent writer cannot make the heads look ahead of the events walked. It checks each
run's chain and seqs, payloads, heads (seq, hash, span, fence and token digest) against
the log, the ledger-wide chain and its gap-free positions, the tail row against the
last event, and that the append-only triggers are present, enabled and unaltered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .. import verify
from ..store import Problem, Recorded
from .rows import RUN_COLUMNS, as_bytes, recorded_row

if TYPE_CHECKING:
    from .postgres_store import PostgresStore

PAGE = 10_000


def _walk(store: PostgresStore, run_id: str | None) -> Iterator[tuple[Recorded, int]]:
    """Every event with its write id: the sealed ones in ledger order, then those
    committed but still waiting for a position (position 0), in write-id order. A run's
    events come in seq order either way (a later seq is never sealed before an earlier)."""
    x = store.x
    base = (f"SELECT {RUN_COLUMNS}, e.id FROM events e LEFT JOIN ledger_order o ON o.event_id = e.id ")
    if run_id is not None:
        for r in x(base + "WHERE e.run_id = %s ORDER BY e.seq", (run_id,)):
            yield recorded_row(r), r[12]
        return
    cursor = 0
    while True:
        rows = x(base.replace("LEFT JOIN", "JOIN") + "WHERE o.position > %s ORDER BY o.position LIMIT %s",
                 (cursor, PAGE)).fetchall()
        for r in rows:
            yield recorded_row(r), r[12]
        if len(rows) < PAGE:
            break
        cursor = rows[-1][2]
    for r in x(base + "WHERE o.position IS NULL ORDER BY e.id"):
        yield recorded_row(r), r[12]


def verify_snapshot(store: PostgresStore, run_id: str | None,
                    progress: Callable[[int, int], None] | None) -> list[Problem]:
    x = store.x
    tail = x("SELECT position FROM ledger_tail").fetchone()
    total = tail[0] if tail is not None else x("SELECT coalesce(max(position), 0) FROM ledger_order").fetchone()[0]
    found = verify.walk(_walk(store, run_id), whole=run_id is None, total=total, progress=progress)
    problems = found.problems

    # The ledger-wide chain, and the tail row every append moves.
    def page(after: int) -> list[verify.Link]:
        return [(p, rid, seq, as_bytes(h), as_bytes(g)) for p, rid, seq, h, g in x(
            "SELECT o.position, e.run_id, e.seq, e.hash, o.global_hash FROM ledger_order o "
            "LEFT JOIN events e ON e.id = o.event_id WHERE o.position > %s "
            "ORDER BY o.position LIMIT %s", (after, PAGE)).fetchall()]

    broken, cursor, last_g = verify.chain(page, PAGE, gaps=run_id is not None)
    problems += broken
    tail = x("SELECT position, global_hash FROM ledger_tail").fetchone()
    if tail is None:
        problems.append(Problem("tail_mismatch", None, None, None,
                                f"the ledger_tail row is gone (the log ends at {cursor}): it was deleted "
                                "behind the store; new writes cannot be sealed until it is restored"))
        tail = (None, None)
    tail_pos, tail_g = tail
    if tail_pos is not None and last_g is not None and (tail_pos, as_bytes(tail_g)) != (cursor, last_g):
        problems.append(Problem("tail_mismatch", None, None, tail_pos,
                                f"the ledger_tail row says position {tail_pos}, the log ends at {cursor}: "
                                "events were removed or the tail was edited behind the store"))

    # Every event is either sealed or waiting for its position, never neither.
    lost = x("SELECT e.run_id, e.seq FROM events e WHERE NOT EXISTS (SELECT 1 FROM ledger_order o "
             "WHERE o.event_id = e.id) AND NOT EXISTS (SELECT 1 FROM unsealed u WHERE u.event_id = e.id) "
             + ("AND e.run_id = %s " if run_id is not None else "") + "LIMIT 1",
             (run_id,) if run_id is not None else None).fetchone()
    if lost is not None:
        problems.append(Problem("unordered", lost[0], lost[1], None,
                                f"event {lost[0]} seq {lost[1]} has no ledger position and is not waiting "
                                "for one: the ledger order was edited behind the store"))

    heads = {h.run_id: h for h in store.heads_in_order(None, public=False)} if run_id is None else (
        {run_id: h} if (h := store._head_locked(run_id)[0]) else {})

    def fence_of(rid: str) -> tuple:
        return tuple(x("SELECT lease, lease_holder, max_lease, lease_digest FROM heads WHERE run_id=%s",
                       (rid,)).fetchone())

    problems += verify.check_heads(found, heads, fence_of, "write ids")
    problems.extend(store.trigger_problems())
    return problems
