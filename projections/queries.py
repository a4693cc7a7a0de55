"""The reads the CLI and the watchdog need, answered from the views without replaying logs.

Backend-neutral: every read goes through the store's view store (ledger/views.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ledger.store import EventStore
from ledger.views import NOT_NULL, ORDINAL
from reducers.checkpoint import Checkpoint

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
    """The due runs' checkpoints: the stall index's range scan, then the packets by key."""
    with store.read_transaction():  # one snapshot for both lookups
        due = due_run_ids(store, now_us)
        if not due:
            return []
        packets = store.views.get_many("checkpoints", due, _PACKET)
    return [decode_checkpoint(packets[run_id][0]) for run_id in due if run_id in packets]


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
