"""The reads the CLI and the watchdog need, answered from the views without replaying logs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ledger.sqlite import SqliteStore
from reducers.checkpoint import Checkpoint

from .views import decode_checkpoint


def checkpoint(store: SqliteStore, run_id: str) -> Checkpoint | None:
    """One run's folded checkpoint, from the view (a primary-key lookup and one decode)."""
    with store._lock:
        row = store._conn.execute("SELECT packet FROM checkpoints WHERE run_id=?", (run_id,)).fetchone()
    return None if row is None else decode_checkpoint(row[0])


def runs(
    store: SqliteStore,
    *,
    state: str | None = None,
    owner: str | None = None,
    target: str | None = None,
    include_terminal: bool = False,
) -> Iterator[Checkpoint]:
    """Runs filtered by state / owner / target, oldest first; terminal ones only on request."""
    sql = "SELECT packet FROM checkpoints WHERE 1=1"
    args: list[Any] = []
    if not include_terminal:
        sql += " AND terminal=0"
    for col, val in (("state", state), ("owner", owner), ("target", target)):
        if val is not None:
            sql += f" AND {col}=?"
            args.append(val)
    sql += " ORDER BY rowid"
    with store._lock:
        rows = store._conn.execute(sql, args).fetchall()
    for (blob,) in rows:
        yield decode_checkpoint(blob)


def due_run_ids(store: SqliteStore, now_us: int) -> list[str]:
    """Runs that may need attention at ``now_us``: a range scan of the stall index alone."""
    with store._lock:
        return [r[0] for r in store._conn.execute(
            "SELECT run_id FROM stall_watch INDEXED BY stall_watch_due "
            "WHERE live = 1 AND next_deadline_us IS NOT NULL AND next_deadline_us <= ?",
            (now_us,),
        )]


def stall_candidates(store: SqliteStore, now_us: int) -> list[Checkpoint]:
    """The due runs' checkpoints: the stall index's range scan joined to the packets, one query."""
    with store._lock:
        rows = store._conn.execute(
            "SELECT c.packet FROM stall_watch AS s INDEXED BY stall_watch_due "
            "JOIN checkpoints AS c ON c.run_id = s.run_id "
            "WHERE s.live = 1 AND s.next_deadline_us IS NOT NULL AND s.next_deadline_us <= ?",
            (now_us,),
        ).fetchall()
    return [decode_checkpoint(blob) for (blob,) in rows]


def deliveries(store: SqliteStore, *, now_us: int, status: str | None = None) -> list[dict[str, Any]]:
    """Delivery rows; status "ambiguous" means attempted with no outcome past its timeout."""
    sql = ("SELECT run_id, target, status, key, receipt, attempts, attempted_us, ambiguous_after_us "
           "FROM deliveries")
    args: list[Any] = []
    if status == "ambiguous":
        sql += " WHERE status='attempted' AND ambiguous_after_us < ?"
        args.append(now_us)
    elif status == "pending":
        sql += " WHERE status IN ('ready', 'attempted')"
    elif status is not None:
        sql += " WHERE status=?"
        args.append(status)
    cols = ["run_id", "target", "status", "key", "receipt", "attempts", "attempted_us", "ambiguous_after_us"]
    with store._lock:
        rows = store._conn.execute(sql, args).fetchall()
    out = []
    for r in rows:
        d = dict(zip(cols, r))
        if d["status"] == "attempted" and d["ambiguous_after_us"] is not None and d["ambiguous_after_us"] < now_us:
            d["status"] = "ambiguous"
        out.append(d)
    return out


def owner_load(store: SqliteStore, owner: str, *, exclude: str | None = None) -> int:
    """How many of the owner's runs hold an active lease (the concurrency cap reads this)."""
    with store._lock:
        return store._conn.execute(
            "SELECT count(*) FROM owner_load WHERE owner=? AND run_id IS NOT ?", (owner, exclude)
        ).fetchone()[0]


def leased_signals(store: SqliteStore) -> list[tuple[str, int, int | None, int]]:
    """(run_id, lease, last_heartbeat_us, progress_seq) of every live run under a lease.

    A watcher samples these each pass and times, by its own monotonic clock, how long each
    value has stood still; see handoff.watchdog.Sightings.
    """
    with store._lock:
        return store._conn.execute(
            "SELECT run_id, lease, last_heartbeat_us, progress_seq FROM stall_watch "
            "WHERE live = 1 AND lease IS NOT NULL"
        ).fetchall()
