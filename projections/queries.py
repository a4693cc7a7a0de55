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


# --- listings a page at a time ----------------------------------------------------------
#
# Every listing is sorted by where each run begins in the log (its first event's global
# position), then by run id: a key no rebuild changes and that a new run can only extend,
# so a reader paging with a cursor sees every run that existed when it started exactly
# once, and a run created meanwhile at most once (on a later page). The heads table is the
# outer loop (CROSS JOIN fixes the order) so SQLite walks its first-position index instead
# of sorting every match for each page.

#: Rows read per query while streaming a listing: bounds memory, whatever the ledger holds.
LISTING_PAGE = 500

Cursor = tuple[int, str]  # (first position, run id) of the last run already seen


def cursor_of(store: SqliteStore, run_id: str) -> Cursor | None:
    """The listing position just after ``run_id``, or None when no such run exists."""
    with store._lock:
        row = store._conn.execute("SELECT first_position FROM heads WHERE run_id=?", (run_id,)).fetchone()
    return None if row is None else (row[0], run_id)


def _run_filters(include_terminal: bool, states: tuple[str, ...], owner: str | None,
                 target: str | None) -> tuple[str, list[Any]]:
    sql, args = "", []
    if not include_terminal:
        sql += " AND c.terminal=0"
    if states:
        sql += f" AND c.state IN ({', '.join('?' * len(states))})"
        args.extend(states)
    for col, val in (("owner", owner), ("target", target)):
        if val is not None:
            sql += f" AND c.{col}=?"
            args.append(val)
    return sql, args


def _paged(store: SqliteStore, sql: str, args: list[Any], after: Cursor | None) -> Iterator[tuple[bytes, Cursor]]:
    """(packet, cursor) rows of a listing query, LISTING_PAGE at a time, from ``after`` on."""
    cursor = after if after is not None else (-(1 << 62), "")
    while True:
        with store._lock:
            rows = store._conn.execute(
                sql + " AND (h.first_position, h.run_id) > (?, ?) ORDER BY h.first_position, h.run_id LIMIT ?",
                [*args, *cursor, LISTING_PAGE],
            ).fetchall()
        for packet, pos, run_id in rows:
            yield packet, (pos, run_id)
        if len(rows) < LISTING_PAGE:
            return
        cursor = (rows[-1][1], rows[-1][2])


_RUNS = ("SELECT c.packet, h.first_position, h.run_id FROM heads AS h "
         "CROSS JOIN checkpoints AS c ON c.run_id = h.run_id WHERE 1=1")


def runs_after(store: SqliteStore, after: Cursor | None = None, *, include_terminal: bool = False,
               states: tuple[str, ...] = (), owner: str | None = None,
               target: str | None = None) -> Iterator[Checkpoint]:
    """Runs matching the filters in listing order, strictly after ``after``; memory flat."""
    where, args = _run_filters(include_terminal, states, owner, target)
    for packet, _ in _paged(store, _RUNS + where, args, after):
        yield decode_checkpoint(packet)


def count_runs_after(store: SqliteStore, after: Cursor | None = None, *, include_terminal: bool = False,
                     states: tuple[str, ...] = (), owner: str | None = None, target: str | None = None) -> int:
    """How many runs ``runs_after`` would still list: counted in SQL, nothing decoded."""
    where, args = _run_filters(include_terminal, states, owner, target)
    cursor = after if after is not None else (-(1 << 62), "")
    with store._lock:
        return store._conn.execute(
            "SELECT count(*) FROM heads AS h CROSS JOIN checkpoints AS c ON c.run_id = h.run_id WHERE 1=1"
            + where + " AND (h.first_position, h.run_id) > (?, ?)", [*args, *cursor],
        ).fetchone()[0]


def due_after(store: SqliteStore, now_us: int, after: Cursor | None = None) -> Iterator[Checkpoint]:
    """The runs the stall index says may need attention at ``now_us``, in listing order."""
    sql = ("SELECT c.packet, h.first_position, h.run_id FROM heads AS h "
           "CROSS JOIN stall_watch AS s ON s.run_id = h.run_id CROSS JOIN checkpoints AS c ON c.run_id = h.run_id "
           "WHERE s.live = 1 AND s.next_deadline_us IS NOT NULL AND s.next_deadline_us <= ?")
    for packet, _ in _paged(store, sql, [now_us], after):
        yield decode_checkpoint(packet)
