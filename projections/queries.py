"""The reads the CLI and the watchdog need, answered from the views without replaying logs.

Backend-neutral: every read goes through the store's view store (ledger/views.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from handoff.ledger.store import EventStore
from handoff.ledger.views import NOT_NULL, ORDINAL
from handoff.reducers.checkpoint import Checkpoint

from .views import decode_checkpoint

_PACKET = ("packet",)


def checkpoint(store: EventStore, run_id: str) -> Checkpoint | None:
    """One run's folded checkpoint, from the view (a primary-key lookup and one decode)."""
    row = store.views.get("checkpoints", (run_id,), _PACKET)
    return None if row is None else decode_checkpoint(row[0])


def runs(
    store: EventStore,
    *,
    state: str | None = None,
    owner: str | None = None,
    target: str | None = None,
    include_terminal: bool = False,
) -> Iterator[Checkpoint]:
    """Runs filtered by state / owner / target, oldest first; terminal ones only on request."""
    where: dict[str, Any] = {}
    if not include_terminal:
        where["terminal"] = 0
    for col, val in (("state", state), ("owner", owner), ("target", target)):
        if val is not None:
            where[col] = val
    rows = store.views.select("checkpoints", _PACKET, where=where, order=(ORDINAL,))
    for (blob,) in rows:
        yield decode_checkpoint(blob)


def due_run_ids(store: EventStore, now_us: int) -> list[str]:
    """Runs that may need attention at ``now_us``: a range scan of the stall index alone."""
    return [r[0] for r in store.views.select(
        "stall_watch", ("run_id",), where={"live": 1}, between=("next_deadline_us", None, now_us),
    )]


def stall_candidates(store: EventStore, now_us: int) -> list[Checkpoint]:
    """The due runs' checkpoints: the stall index's range scan joined to the packets by key."""
    rows = store.views.select_joined("stall_watch", (), "checkpoints", _PACKET, key="run_id", where={"live": 1},
                                     between=("next_deadline_us", None, now_us))
    return [decode_checkpoint(blob) for (blob,) in rows]


_DELIVERY = ("run_id", "target", "status", "key", "receipt", "attempts", "attempted_us", "ambiguous_after_us")


def deliveries(store: EventStore, *, now_us: int, status: str | None = None) -> list[dict[str, Any]]:
    """Delivery rows; status "ambiguous" means attempted with no outcome past its timeout."""
    filters: dict[str, Any] = {}
    if status == "ambiguous":
        filters = {"where": {"status": "attempted"}, "between": ("ambiguous_after_us", None, now_us - 1)}
    elif status == "pending":
        filters = {"where": {"status": ("ready", "attempted")}}
    elif status is not None:
        filters = {"where": {"status": status}}
    rows = store.views.select("deliveries", _DELIVERY, **filters)
    out = []
    for r in rows:
        d = dict(zip(_DELIVERY, r))
        if d["status"] == "attempted" and d["ambiguous_after_us"] is not None and d["ambiguous_after_us"] < now_us:
            d["status"] = "ambiguous"
        out.append(d)
    return out


def owner_load(store: EventStore, owner: str, *, exclude: str | None = None) -> int:
    """How many of the owner's runs hold an active lease (the concurrency cap reads this)."""
    return store.views.count("owner_load", where={"owner": owner}, where_not={"run_id": exclude})


def leased_signals(store: EventStore) -> list[tuple[str, int, int | None, int]]:
    """(run_id, lease, last_heartbeat_us, progress_seq) of every live run under a lease.

    A watcher samples these each pass and times, by its own monotonic clock, how long each
    value has stood still; see handoff.watchdog.Sightings.
    """
    return store.views.select(  # type: ignore[return-value]
        "stall_watch", ("run_id", "lease", "last_heartbeat_us", "progress_seq"),
        where={"live": 1, "lease": NOT_NULL},
    )


# --- listings a page at a time ----------------------------------------------------------
#
# Every listing is sorted by the order the views first recorded each run (``ORDINAL``):
# the order runs begin in the log, since a run's rows are written by its first event's
# commit (and a rebuild writes them in that order). A row keeps its place when it is
# updated, so a reader paging with a cursor sees every run that existed when it started
# exactly once, and a run created meanwhile at most once, on a later page.

#: Rows read per query while streaming a listing: bounds memory, whatever the ledger holds.
LISTING_PAGE = 500

Cursor = tuple[int]  # the ORDINAL of the last row already seen


def cursor_of(store: EventStore, run_id: str, table: str = "checkpoints") -> Cursor | None:
    """The listing position just after ``run_id`` in ``table``'s order, or None if absent."""
    rows = store.views.select(table, (ORDINAL,), where={"run_id": run_id}, limit=1)
    return (rows[0][0],) if rows else None


def _run_filters(include_terminal: bool, states: tuple[str, ...], owner: str | None,
                 target: str | None) -> dict[str, Any]:
    where: dict[str, Any] = {}
    if not include_terminal:
        where["terminal"] = 0
    if states:
        where["state"] = tuple(states)
    for col, val in (("owner", owner), ("target", target)):
        if val is not None:
            where[col] = val
    return where


def runs_after(store: EventStore, after: Cursor | None = None, *, include_terminal: bool = False,
               states: tuple[str, ...] = (), owner: str | None = None,
               target: str | None = None) -> Iterator[Checkpoint]:
    """Runs matching the filters in listing order, strictly after ``after``; memory flat."""
    where = _run_filters(include_terminal, states, owner, target)
    while True:
        rows = store.views.select("checkpoints", (ORDINAL, "packet"), where=where, order=(ORDINAL,),
                                  after=after, limit=LISTING_PAGE)
        for _, blob in rows:
            yield decode_checkpoint(blob)
        if len(rows) < LISTING_PAGE:
            return
        after = (rows[-1][0],)


def count_runs_after(store: EventStore, after: Cursor | None = None, *, include_terminal: bool = False,
                     states: tuple[str, ...] = (), owner: str | None = None, target: str | None = None) -> int:
    """How many runs ``runs_after`` would still list: counted by the view store, nothing decoded."""
    where = _run_filters(include_terminal, states, owner, target)
    return store.views.count("checkpoints", where=where, order=(ORDINAL,), after=after)


def count_terminal(store: EventStore, *, owner: str | None = None, target: str | None = None) -> int:
    """How many runs have ended (what a listing without ``--all`` leaves out)."""
    where: dict[str, Any] = {"terminal": 1}
    for col, val in (("owner", owner), ("target", target)):
        if val is not None:
            where[col] = val
    return store.views.count("checkpoints", where=where)


def due_after(store: EventStore, now_us: int, after: Cursor | None = None) -> Iterator[Checkpoint]:
    """The runs the stall index says may need attention at ``now_us``, in listing order
    (``after``: a cursor of the stall_watch view, see ``cursor_of``).

    Each page is a range scan of the due index kept in listing order, then its packets by
    key: memory stays flat however many runs are due.
    """
    while True:
        rows = store.views.select("stall_watch", (ORDINAL, "run_id"), where={"live": 1},
                                  between=("next_deadline_us", None, now_us), order=(ORDINAL,),
                                  after=after, limit=LISTING_PAGE)
        ids = [run_id for _, run_id in rows]
        packets = store.views.get_many("checkpoints", ids, _PACKET) if ids else {}
        for run_id in ids:
            if run_id in packets:
                yield decode_checkpoint(packets[run_id][0])
        if len(rows) < LISTING_PAGE:
            return
        after = (rows[-1][0],)
