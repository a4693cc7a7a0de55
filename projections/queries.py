"""The reads the CLI and the watchdog need, answered from the views without replaying logs.

Backend-neutral: every read goes through the store's view store (ledger/view_tables.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from handoff.ledger.store import EventStore
from handoff.ledger.view_tables import NOT_NULL, ORDINAL
from handoff.reducers import liveness, stall
from handoff.reducers.checkpoint import Checkpoint
from handoff.reducers.stall import Health

from .view_rows import decode_checkpoint

_PACKET = ("packet",)


def checkpoint(store: EventStore, run_id: str) -> Checkpoint | None:
    """One run's checkpoint as it stands: the view's fold (a primary-key lookup and one
    decode) with the last beat kept beside the log (``with_liveness``)."""
    cp = packet_of(store, run_id)
    return None if cp is None else with_liveness(store, [cp])[0]


def packet_of(store: EventStore, run_id: str) -> Checkpoint | None:
    """One run's checkpoint from the view alone, as the log leaves it (no liveness joined)."""
    row = store.views.get("checkpoints", (run_id,), _PACKET)
    return None if row is None else decode_checkpoint(row[0])


def with_liveness(store: EventStore, cps: list[Checkpoint]) -> list[Checkpoint]:
    """The runs as they stand now: each leased run's checkpoint joined with its liveness
    row (reducers/liveness.overlay), read together. Not for a run as of an earlier seq."""
    ids = [cp.run_id for cp in cps if cp.lease is not None]
    if not ids:
        return cps
    live = store.liveness(ids)
    if not live:
        return cps
    return [liveness.overlay(cp, live.get(cp.run_id)) for cp in cps]


def with_live_beats(store: EventStore, rows: list[tuple[Any, ...]], run: int, lease: int,
                    beat: int) -> list[tuple[Any, ...]]:
    """Stall-view rows with the last beat kept beside the log in place of the log's, where
    it is later and of the row's lease (columns by index: run id, lease, last beat)."""
    ids = [r[run] for r in rows if r[lease] is not None]
    live = store.liveness(ids) if ids else {}
    if not live:
        return rows
    out = []
    for r in rows:
        b = liveness.overlay_beat(r[lease], r[beat], live.get(r[run]))
        out.append(r if b == r[beat] else (*r[:beat], b, *r[beat + 1:]))
    return out


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
    yield from with_liveness(store, [decode_checkpoint(blob) for (blob,) in rows])


def due_run_ids(store: EventStore, now_us: int) -> list[str]:
    """Runs that may need attention at ``now_us``: a range scan of the stall index alone."""
    return [r[0] for r in store.views.select(
        "stall_watch", ("run_id",), where={"live": 1}, between=("next_deadline_us", None, now_us),
    )]


def stall_candidates(store: EventStore, now_us: int) -> list[Checkpoint]:
    """The due runs' checkpoints: the stall index's range scan joined to the packets by key.
    (The stall scan itself judges from the view rows: ``due_signals`` and ``judge_due``.)"""
    rows = store.views.select_joined("stall_watch", (), "checkpoints", _PACKET, key="run_id", where={"live": 1},
                                     between=("next_deadline_us", None, now_us))
    return with_liveness(store, [decode_checkpoint(blob) for (blob,) in rows])


#: The stall view's columns the scan reads from the due index: stall.judge_liveness's
#: signals first (a row is judged as it comes), then the run and whether its verdict needs
#: the packet. The progress signals are read from the table, for the runs still alive.
_SCAN = (*stall.LIVENESS, "run_id", "needs_packet")
_RUN, _NEEDS = len(stall.LIVENESS), len(stall.LIVENESS) + 1
_PROGRESS = tuple("retry_count" if c == "repeats" else c for c in stall.PROGRESS)
#: Where a scanned row and a progress read hold the signals a DueRun answers from.
_STATE, _LEASE, _WORKER, _BEAT = (stall.LIVENESS.index(c) for c in ("state", "lease", "worker", "last_heartbeat_us"))
_PROGRESS_SEQ = stall.PROGRESS.index("progress_seq")


class DueRun:
    """A run the stall scan found, as its stall view row saw it, standing in for its Checkpoint.

    ``run_id``, ``state``, ``lease`` and ``worker`` come from the row its verdict was
    judged from; any other attribute of a Checkpoint reads the run's packet from the
    checkpoints view and decodes it, once, on first use (``checkpoint`` gives it whole).
    So a scan that only needs verdicts decodes nothing, and a caller that opens a run pays
    for that run alone. The packet is read when first opened: use it while the ledger is open.

    The packet may then be newer than the verdict (a beat, a progress, a new lease since
    the scan): whoever acts on the verdict must compare the run as it stands with
    ``still_as_judged``, the signals the verdict was judged from, never with the packet.
    """

    __slots__ = ("_cp", "_row", "_store", "_progress")

    terminal = False  # the scan reads live rows only

    def __init__(self, store: EventStore, row: tuple[Any, ...], progress: tuple[Any, ...] | None = None) -> None:
        self._store = store
        self._row = row
        self._progress = progress  # the progress columns its verdict read, if it read them
        self._cp: Checkpoint | None = None

    def still_as_judged(self, now: Checkpoint, *, heartbeat: bool = True) -> bool:
        """Does ``now`` (the run as it stands) still show what this run's verdict was judged
        from: the same lease, the same last heartbeat (unless ``heartbeat`` is False: an
        action that does not rest on the worker's silence), and the same progress token when
        the verdict read it. Only the signals a verdict rests on, so a watchdog's own first
        action (an observation) does not make its second look moved."""
        row = self._row
        if now.lease != row[_LEASE]:
            return False
        if heartbeat and now.watch.last_heartbeat_us != row[_BEAT]:
            return False
        return self._progress is None or now.progress_seq == self._progress[_PROGRESS_SEQ]

    run_id = property(lambda self: self._row[_RUN])
    state = property(lambda self: self._row[_STATE])
    lease = property(lambda self: self._row[_LEASE])
    worker = property(lambda self: self._row[_WORKER])

    @property
    def checkpoint(self) -> Checkpoint:
        cp = self._cp
        if cp is None:
            cp = checkpoint(self._store, self.run_id)
            if cp is None:  # view rows are never deleted; a rebuilt view holds every run
                from handoff.ledger.errors import UnknownRun

                raise UnknownRun(f"run {self.run_id} has no checkpoint row in {self._store.path}; "
                                 "run 'handoff rebuild' if the views were damaged")
            self._cp = cp
        return cp

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.checkpoint, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DueRun):
            other = other.checkpoint
        return self.checkpoint == other

    def __hash__(self) -> int:
        return hash(self.run_id)

    def __repr__(self) -> str:
        return f"DueRun({self.run_id!r}, state={self.state!r}, lease={self.lease!r})"


def due_signals(store: EventStore, now_us: int) -> list[tuple[Any, ...]]:
    """The due runs' stall rows (``_SCAN``), in the due index's order: one range scan of an
    index that holds every column read, each row's last beat then joined with the one kept
    beside the log. (The index's deadlines come from the log's beats, which are never later
    than the kept ones: a run due by the kept beat is always among these rows.)"""
    rows = store.views.select("stall_watch", _SCAN, where={"live": 1},
                              between=("next_deadline_us", None, now_us))
    return with_live_beats(store, rows, _RUN, _LEASE, _BEAT)


def judge_due(store: EventStore, rows: list[tuple[Any, ...]], now_us: int) -> list[tuple[Any, Health]]:
    """Judge due rows at ``now_us``; keep the runs that need attention, in the rows' order.

    A row is judged by its liveness signals (reducers/stall.judge_liveness); the runs whose
    worker is alive are then judged by their progress columns, read together by key. A row
    whose ``needs_packet`` says the verdict reads more has its run's packet read (together
    with the others') and classified whole: those come back as Checkpoints, the rest as
    ``DueRun``s, their packets left unread."""
    judge_liveness = stall.judge_liveness
    out: list[Any] = []
    add = out.append
    later: list[int] = []  # places in ``out`` of the rows judged after the first pass
    alive: list[str] = []
    full: list[str] = []
    for r in rows:
        if r[_NEEDS]:
            full.append(r[_RUN])
        else:
            h = judge_liveness(r, now_us)
            if h is not None:
                if h.needs_attention:
                    add((DueRun(store, r), h))
                continue
            alive.append(r[_RUN])
        later.append(len(out))
        add(r)
    if not later:
        return out
    views = store.views
    cps = {cp.run_id: cp for cp in with_liveness(store, [decode_checkpoint(v[0]) for v in views.get_many(
        "checkpoints", full, _PACKET).values()])} if full else {}
    progress = views.get_many("stall_watch", alive, _PROGRESS) if alive else {}
    for i in later:
        r = out[i]
        out[i] = None
        if r[_NEEDS]:
            cp = cps.get(r[_RUN])
            if cp is not None and (h := stall.classify(cp, now_us=now_us)).needs_attention:
                out[i] = (cp, h)
        elif (p := progress.get(r[_RUN])) is not None and (h := stall.judge_progress(r, p, now_us)).needs_attention:
            out[i] = (DueRun(store, r, tuple(p)), h)
    return [x for x in out if x is not None]


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
    rows = store.views.select(
        "stall_watch", ("run_id", "lease", "last_heartbeat_us", "progress_seq"),
        where={"live": 1, "lease": NOT_NULL},
    )
    return with_live_beats(store, rows, 0, 1, 2)  # type: ignore[return-value]


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
                 target: str | None, worker: str | None = None) -> dict[str, Any]:
    where: dict[str, Any] = {}
    if not include_terminal:
        where["terminal"] = 0
    if states:
        where["state"] = tuple(states)
    for col, val in (("owner", owner), ("target", target), ("worker", worker)):
        if val is not None:
            where[col] = val
    return where


def runs_after(store: EventStore, after: Cursor | None = None, *, include_terminal: bool = False,
               states: tuple[str, ...] = (), owner: str | None = None,
               target: str | None = None, worker: str | None = None) -> Iterator[Checkpoint]:
    """Runs matching the filters in listing order, strictly after ``after``; memory flat.
    Every filter here is a column of the checkpoints view, so the view store answers it."""
    where = _run_filters(include_terminal, states, owner, target, worker)
    while True:
        rows = store.views.select("checkpoints", (ORDINAL, "packet"), where=where, order=(ORDINAL,),
                                  after=after, limit=LISTING_PAGE)
        yield from with_liveness(store, [decode_checkpoint(blob) for _, blob in rows])
        if len(rows) < LISTING_PAGE:
            return
        after = (rows[-1][0],)


def count_runs_after(store: EventStore, after: Cursor | None = None, *, include_terminal: bool = False,
                     states: tuple[str, ...] = (), owner: str | None = None, target: str | None = None,
                     worker: str | None = None) -> int:
    """How many runs ``runs_after`` would still list: counted by the view store, nothing decoded."""
    where = _run_filters(include_terminal, states, owner, target, worker)
    return store.views.count("checkpoints", where=where, order=(ORDINAL,), after=after)


def run_ids_starting(store: EventStore, prefix: str, limit: int) -> list[str]:
    """At most ``limit`` run ids that begin with ``prefix``, in id order: one range scan of
    the checkpoints view's primary key (shell completion asks this on every Tab)."""
    high = prefix + "\U0010ffff" if prefix else None
    rows = store.views.select("checkpoints", ("run_id",), between=("run_id", prefix or None, high),
                              order=("run_id",), limit=limit)
    return [r[0] for r in rows]


def count_terminal(store: EventStore, *, owner: str | None = None, target: str | None = None) -> int:
    """How many runs have ended (what a listing without ``--all`` leaves out)."""
    where: dict[str, Any] = {"terminal": 1}
    for col, val in (("owner", owner), ("target", target)):
        if val is not None:
            where[col] = val
    return store.views.count("checkpoints", where=where)


def judged_after(store: EventStore, now_us: int, after: Cursor | None = None) -> Iterator[tuple[Any, Health]]:
    """The runs that need attention at ``now_us``, judged as ``judge_due`` does, in listing
    order (``after``: a cursor of the stall_watch view, see ``cursor_of``), a page at a time."""
    while True:
        rows = store.views.select("stall_watch", (ORDINAL, *_SCAN), where={"live": 1},
                                  between=("next_deadline_us", None, now_us), order=(ORDINAL,),
                                  after=after, limit=LISTING_PAGE)
        yield from judge_due(store, with_live_beats(store, [r[1:] for r in rows], _RUN, _LEASE, _BEAT), now_us)
        if len(rows) < LISTING_PAGE:
            return
        after = (rows[-1][0],)


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
        yield from with_liveness(store, [decode_checkpoint(packets[run_id][0]) for run_id in ids if run_id in packets])
        if len(rows) < LISTING_PAGE:
            return
        after = (rows[-1][0],)
