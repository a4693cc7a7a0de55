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

from . import events as ev
from .store import GENESIS_HASH, Problem, Recorded, chain_hash

if TYPE_CHECKING:
    from .postgres import PostgresStore

PAGE = 10_000


def _walk(store: PostgresStore, run_id: str | None) -> Iterator[tuple[Recorded, int]]:
    """Every event with its write id: the sealed ones in ledger order, then those
    committed but still waiting for a position (position 0), in write-id order. A run's
    events come in seq order either way (a later seq is never sealed before an earlier)."""
    from .postgres import _RUN_COLUMNS, _rec

    x = store._x
    base = (f"SELECT {_RUN_COLUMNS}, e.id FROM events e LEFT JOIN ledger_order o ON o.event_id = e.id ")
    if run_id is not None:
        for r in x(base + "WHERE e.run_id = %s ORDER BY e.seq", (run_id,)):
            yield _rec(r), r[12]
        return
    cursor = 0
    while True:
        rows = x(base.replace("LEFT JOIN", "JOIN") + "WHERE o.position > %s ORDER BY o.position LIMIT %s",
                 (cursor, PAGE)).fetchall()
        for r in rows:
            yield _rec(r), r[12]
        if len(rows) < PAGE:
            break
        cursor = rows[-1][2]
    for r in x(base + "WHERE o.position IS NULL ORDER BY e.id"):
        yield _rec(r), r[12]


def verify_snapshot(store: PostgresStore, run_id: str | None,
                    progress: Callable[[int, int], None] | None) -> list[Problem]:
    from .postgres import _b, global_link

    x = store._x
    problems: list[Problem] = []
    broken: set[str] = set()
    seen: dict[str, tuple[int, bytes]] = {}
    spans: dict[str, tuple[int, int]] = {}
    fences: dict[str, tuple[int | None, str | None, int]] = {}
    digests: dict[str, str | None] = {}
    tail = x("SELECT position FROM ledger_tail").fetchone()
    total = tail[0] if tail is not None else x("SELECT coalesce(max(position), 0) FROM ledger_order").fetchone()[0]
    expected_pos = None
    for rec, wid in _walk(store, run_id):
        if run_id is None and rec.position:
            if expected_pos is not None and rec.position != expected_pos:
                problems.append(Problem("position_gap", rec.run_id, rec.seq, rec.position,
                                        f"positions jump from {expected_pos - 1} to {rec.position}: "
                                        "events are missing"))
            expected_pos = rec.position + 1
        if progress is not None and rec.position and rec.position % 10_000 == 0:
            progress(rec.position, total)
        if rec.run_id in broken:
            continue
        last_seq, prev = seen.get(rec.run_id, (0, GENESIS_HASH))
        problem = None
        if rec.seq != last_seq + 1:
            problem = ("seq_gap", f"seq {rec.seq} follows seq {last_seq}")
        elif rec.prev_hash != prev:
            problem = ("broken_link", "prev_hash does not match the previous event's hash")
        elif rec.hash != chain_hash(rec.prev_hash, rec.run_id, rec.seq, rec.type, rec.actor, rec.lease,
                                    rec.idempotency_key, rec.recorded_us, rec.schema_version, rec.payload):
            problem = ("bad_hash", "the event's content does not match its hash")
        else:
            try:
                event = ev.decode(rec.payload)
                if ev.tag_of(event) != rec.type:
                    problem = ("type_mismatch", f"type column {rec.type} but payload is {ev.tag_of(event)}")
            except Exception as exc:  # msgspec errors, bad UTF-8
                problem = ("undecodable", f"payload cannot be decoded: {exc}")
        if problem:
            broken.add(rec.run_id)
            problems.append(Problem(problem[0], rec.run_id, rec.seq, rec.position, problem[1]))
            continue
        seen[rec.run_id] = (rec.seq, rec.hash)
        span = spans.get(rec.run_id)
        spans[rec.run_id] = (wid if span is None else span[0], wid)
        if rec.type in ("lease_granted", "lease_released", "lease_revoked"):
            lease, holder, top = fences.get(rec.run_id, (None, None, 0))
            e = ev.decode(rec.payload)
            if isinstance(e, ev.LeaseGranted):
                lease, holder, top = e.lease, e.worker, max(top, e.lease)
                digests[rec.run_id] = e.token_digest or None
            elif e.lease == lease:
                lease, holder = None, None
                digests[rec.run_id] = None
            fences[rec.run_id] = (lease, holder, top)

    # The ledger-wide chain, and the tail row every append moves.
    prev, cursor, last_g = GENESIS_HASH, 0, GENESIS_HASH
    gaps = run_id is not None
    chain_ok = True
    while chain_ok:
        rows = x("SELECT o.position, e.run_id, e.seq, e.hash, o.global_hash FROM ledger_order o "
                 "LEFT JOIN events e ON e.id = o.event_id WHERE o.position > %s "
                 "ORDER BY o.position LIMIT %s", (cursor, PAGE)).fetchall()
        for position, rid, seq, h, g in rows:
            if gaps and position != cursor + 1:
                problems.append(Problem("position_gap", rid, seq, position,
                                        f"positions jump from {cursor} to {position}: events are missing"))
                gaps = False
            cursor = position
            if h is None:
                problems.append(Problem("position_gap", None, None, position,
                                        f"position {position} names an event that is not in the log: "
                                        "an event was removed behind the store"))
                chain_ok = False
                break
            if _b(g) != global_link(prev, position, _b(h)):
                problems.append(Problem("global_chain", rid, seq, position,
                                        "the ledger-wide chain breaks here: events were reordered, moved "
                                        "between positions, inserted or removed behind the store"))
                chain_ok = False
                break
            prev = last_g = _b(g)
        if len(rows) < PAGE:
            break
    tail = x("SELECT position, global_hash FROM ledger_tail").fetchone()
    if tail is None:
        problems.append(Problem("tail_mismatch", None, None, None,
                                f"the ledger_tail row is gone (the log ends at {cursor}): it was deleted "
                                "behind the store; new writes cannot be sealed until it is restored"))
        tail = (None, None)
    tail_pos, tail_g = tail
    if tail_pos is not None and chain_ok and (tail_pos, _b(tail_g)) != (cursor, last_g):
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

    heads = {h.run_id: h for h in store._list_runs(None, public=False)} if run_id is None else (
        {run_id: h} if (h := store._head_row(run_id)[0]) else {})
    for rid, (last_seq, last_hash) in seen.items():
        if rid in broken:
            continue
        h = heads.get(rid)
        if h is None or h.last_seq != last_seq or h.last_hash != last_hash:
            problems.append(Problem("head_mismatch", rid, last_seq, None,
                                    f"the heads table says seq {h.last_seq if h else None}, the log ends "
                                    f"at seq {last_seq}: events were removed or added behind the store"))
            continue
        if (h.first_position, h.last_position) != spans[rid]:
            problems.append(Problem("head_mismatch", rid, last_seq, None,
                                    f"the heads table places the run at write ids {h.first_position}-"
                                    f"{h.last_position}, the log at {spans[rid][0]}-{spans[rid][1]}: the "
                                    "heads row was edited behind the store"))
            continue
        want = fences.get(rid, (None, None, 0))
        row = x("SELECT lease, lease_holder, max_lease, lease_digest FROM heads WHERE run_id=%s", (rid,)).fetchone()
        if tuple(row[:3]) != want:
            problems.append(Problem("fence_mismatch", rid, last_seq, None,
                                    f"the heads table fences with lease {row[0]} (holder {row[1]}, highest "
                                    f"{row[2]}) but the log's lease events say {want[0]} (holder {want[1]}, "
                                    f"highest {want[2]}): writes would be checked against a forged lease"))
            continue
        if row[3] != digests.get(rid):
            problems.append(Problem("fence_mismatch", rid, last_seq, None,
                                    f"the heads table holds another lease token digest than the grant of lease "
                                    f"{want[0]} in the log: a token nobody was given would be accepted as the "
                                    "holder's (the heads row was edited behind the store)"))
    for rid, h in heads.items():
        if rid not in seen and rid not in broken:
            problems.append(Problem("head_mismatch", rid, None, None,
                                    f"run {rid} has a head at seq {h.last_seq} but no events"))
    problems.extend(store._append_only())
    return problems
