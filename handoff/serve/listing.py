"""The fleet page's listing: in which orders, with which filters, and how far a search reads.

Every order offered is one an index of the checkpoints view keeps, so the order is the
whole ledger's, not one page's, and a page deep in it costs what its hundred rows cost:

- ``opened`` (the default): the order runs were first recorded (``Ledger.runs_page``);
- ``run``: by run id (the view's primary key);
- ``state``: by state, then run id (``checkpoints_live`` (terminal, state, run_id) for the
  runs not ended, ``checkpoints_state`` (state, run_id) when a state filter lists ended ones).

Ascending only: the view store's ``select`` has no descending order. Liveness, progress,
owner and worker have no index to sort by (docs/serve.md says which would be needed), and
health is judged at the moment the page is drawn, so it cannot be kept in order.

State, owner, worker and queue are filters the view store answers. Text in the goal and
health (other than the stall index's classes, in the default order) are judged run by run
as the listing streams past; a page reads at most ``SCAN_CAP`` runs and says how far it
read and how many it did not reach, so an empty page never passes for "no match".
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

from handoff.ledger.errors import InvalidInput
from handoff.ledger.inputs import check_run_id
from handoff.projections import queries
from handoff.projections.view_rows import decode_checkpoint
from handoff.reducers import stall
from handoff.reducers.transitions import STATES, TERMINAL

from . import pages as pg

#: Rows on a page of the fleet and of needs attention.
PAGE = 100
#: Runs a filtered fleet page judges one by one at most (text in the goal, health).
SCAN_CAP = 5000
#: Health classes the stall index holds: a filter on one of them reads only those runs.
INDEXED_HEALTH = ("unavailable", "stalled", "needs_reconciliation", "needs_worker", "delivery_ambiguous",
                  "unopened")
#: The orders besides ``opened``, each the columns of the index that keeps it (the last is
#: the run id, so the order is total and a keyset cursor can continue it).
SORTS: dict[str, tuple[str, ...]] = {"run": ("run_id",), "state": ("state", "run_id")}
#: What each order is called on the page.
SORT_LABELS = {"opened": "the order runs were opened", "run": "run id", "state": "state, then run id"}


@dataclasses.dataclass
class Listing:
    """One fleet page: its rows; ``next``: the address parameters of the next page (None:
    this is the last); ``more``: runs after this page (None: not counted, a search);
    ``searched``: runs judged one by one for this page (None: no search); ``capped``: the
    search stopped at ``SCAN_CAP``; ``left``: runs the other filters select that the search
    has not reached (None: not counted)."""

    rows: list[dict[str, Any]]
    next: dict[str, str] | None = None
    more: int | None = 0
    searched: int | None = None
    capped: bool = False
    left: int | None = None


def _where(include_terminal: bool, states: tuple[str, ...], owner: str | None, target: str | None,
           worker: str | None) -> dict[str, Any]:
    where: dict[str, Any] = {} if include_terminal else {"terminal": 0}
    if states:
        where["state"] = states
    for col, val in (("owner", owner), ("target", target), ("worker", worker)):
        if val is not None:
            where[col] = val
    return where


def _sorted(lg: Any, order: tuple[str, ...], after: tuple[Any, ...] | None, where: dict[str, Any]
            ) -> Iterator[Any]:
    """Runs in ``order`` strictly after the keyset ``after``, read ``LISTING_PAGE`` at a time."""
    cols = (*order, "packet")
    while True:
        rows = lg.store.views.select("checkpoints", cols, where=where, order=order, after=after,
                                     limit=queries.LISTING_PAGE)
        yield from queries.with_liveness(lg.store, [decode_checkpoint(r[-1]) for r in rows])  # beats kept beside the log
        if len(rows) < queries.LISTING_PAGE:
            return
        after = tuple(rows[-1][:-1])


def _key(cp: Any, sort: str) -> tuple[Any, ...]:
    return tuple(getattr(cp, c) for c in SORTS[sort])


def _cursor_params(cp: Any, sort: str) -> dict[str, str]:
    """The address parameters that continue the listing after ``cp``: its run id, and for
    ``state`` the state it was listed under (it may have moved since)."""
    return {"after": cp.run_id, **({"at": cp.state} if sort == "state" else {})}


def _after_key(p: dict[str, str], sort: str) -> tuple[Any, ...] | None:
    after = p.get("after")
    if after is None:
        return None
    check_run_id(after, "after")
    if sort == "state":
        at = p.get("at", "")
        if at not in STATES:
            raise InvalidInput("a page sorted by state continues after a state and a run: 'at' must be one of "
                               f"{', '.join(STATES)}", field="at")
        return (at, after)
    return (after,)


def fleet(lg: Any, p: dict[str, str], now: int) -> Listing:
    """One page of the fleet with the filters and the order the address names."""
    sort = p.get("sort") or "opened"
    if sort != "opened" and sort not in SORTS:
        raise InvalidInput(f"no order {sort[:40]!r}; the fleet sorts by: opened, {', '.join(SORTS)}", field="sort")
    states = (p["state"],) if p.get("state") else ()
    health = p.get("health")
    text = p.get("q", "").casefold()
    owner, target, worker = p.get("owner"), p.get("queue"), p.get("worker")
    include_terminal = any(s in TERMINAL for s in states)
    where = _where(include_terminal, states, owner, target, worker)
    after = p.get("after")
    key = _after_key(p, sort)

    def stream() -> Iterator[Any]:
        if sort == "opened":
            return lg.iter_runs(after=after, states=states, include_terminal=include_terminal, owner=owner,
                                target=target, worker=worker)
        return _sorted(lg, SORTS[sort], key, where)

    def left_after(cp: Any) -> int:
        if sort == "opened":
            return queries.count_runs_after(lg.store, queries.cursor_of(lg.store, cp.run_id), states=states,
                                            owner=owner, target=target, worker=worker,
                                            include_terminal=include_terminal)
        return lg.store.views.count("checkpoints", where=where, order=SORTS[sort], after=_key(cp, sort))

    if not health and not text:
        if sort == "opened":
            page = lg.runs_page(limit=PAGE, after=after, states=states, include_terminal=include_terminal,
                                owner=owner, target=target, worker=worker)
            items = list(page.items)
            nxt, more = page.next, page.more
            return Listing([pg.fleet_row(cp, stall.classify(cp, now_us=now), now) for cp in items],
                           {"after": nxt} if nxt else None, more)
        items = list(itertools.islice(stream(), PAGE))
        more = left_after(items[-1]) if len(items) == PAGE else 0
        return Listing([pg.fleet_row(cp, stall.classify(cp, now_us=now), now) for cp in items],
                       _cursor_params(items[-1], sort) if more else None, more)
    judged: Any
    from_stall_index = sort == "opened" and health in INDEXED_HEALTH and not states and not any((owner, target, worker))
    if from_stall_index:
        judged = ((cp, h) for cp, h in lg.iter_stalls(now=now, after=after) if h.classification == health)
    else:
        judged = ((cp, stall.classify(cp, now_us=now)) for cp in stream())
    rows: list[dict[str, Any]] = []
    searched = 0
    for cp, h in judged:
        searched += 1
        if (not health or h.classification == health) and (not text or text in cp.goal.casefold()):
            rows.append(pg.fleet_row(cp, h, now))
            if len(rows) == PAGE:
                return Listing(rows, _cursor_params(cp, sort), None, searched)
        if searched >= SCAN_CAP:
            return Listing(rows, _cursor_params(cp, sort), None, searched, capped=True,
                           left=None if from_stall_index else left_after(cp))
    return Listing(rows, None, 0, searched)


def counts(lg: Any, now: int) -> tuple[dict[str, int], int, str]:
    """Runs per health class at the top of the fleet: the stall index's classes (judged at
    ``now``), blocked and awaiting review from the state column, the rest healthy or waiting."""
    total = queries.count_runs_after(lg.store, None)
    out: dict[str, int] = {}
    for _, h in lg.iter_stalls(now=now):
        out[h.classification] = out.get(h.classification, 0) + 1
    out["blocked"] = queries.count_runs_after(lg.store, None, states=("blocked",))
    out["awaiting_owner"] = queries.count_runs_after(lg.store, None, states=("ready_for_review", "succeeded"))
    rest = max(0, total - sum(out.values()))
    return out, total, (f"{rest} more are healthy, unclaimed in the queue or delivering; "
                        "ended runs are listed with state filters")
