"""Keeping the views: inline with every append, rebuilt from the log, checked against it.

A projection is a name, the rows it derives from a run's checkpoint (view_rows.py), and the
tables that hold them. Inline upkeep happens inside the append's own write transaction,
so a reader never sees an event without its projection or the reverse; a tracking row
(name, position) says where catch-up or a rebuild left each view, and the backend marks
the writes since that did not keep it (``ViewStore.lagging``). The log stays the only truth: ``rebuild`` drops
and refolds, ``check`` compares, ``catch_up`` brings a late-added projection level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from handoff.ledger.errors import CorruptLedger, InvalidInput
from handoff.ledger.store import EventStore, Hook, Transaction
from handoff.ledger.view_tables import NOT_NULL, ORDINAL, TRACKING, VERSIONS, Index, TableSpec, ViewWriter, columns
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint

from . import view_rows

OnProgress = Callable[[int, int], None] | None

#: What ``check`` says of a view kept by another version of its fold.
NEEDS_REBUILD = ("needs rebuild (fold rule changed): run 'handoff rebuild', or open the ledger "
                 "writable, which refolds it")

__all__ = ["BY_NAME", "NEEDS_REBUILD", "PROJECTIONS", "TRACKING", "VERSIONS", "Projection", "Projector"]


class Projection(msgspec.Struct, frozen=True):
    """One named view: its table, declared in neutral terms, and its row function."""

    name: str
    spec: TableSpec
    rows: Callable[[Checkpoint, int], list[dict[str, Any]]]
    many: bool = False  # rows per run may be 0..n (else exactly one, never deleted)
    #: Bumped when the rows a fold gives change for the same log; a ledger whose views
    #: were kept at another version has them refolded (by catch-up) on a writable open.
    version: int = 1

    @property
    def table(self) -> str:
        return self.spec.name

    @property
    def columns(self) -> tuple[str, ...]:
        return self.spec.column_names

    @property
    def pk(self) -> tuple[str, ...]:
        return self.spec.pk


def _ck_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [view_rows.checkpoint_row(cp, last_position)]


def _stall_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [view_rows.stall_row(cp)]


def _delivery_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [view_rows.delivery_row(cp)] if cp.opened else []


def _owner_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    owner, active = view_rows.owner_active(cp)
    return [{"owner": owner, "run_id": cp.run_id, "lease": cp.lease}] if active else []


PROJECTIONS: tuple[Projection, ...] = (
    Projection(
        name="checkpoints",
        # 2: the packet keeps the latest evidence record of each kind; 3: no last_position
        # column (the run's position lives in the heads table alone; on PostgreSQL a write
        # learns its position only after its commit), and its delivery keeps the contract's
        # public flag, patterns and send settings and the last sanitization check; 4: the
        # watchdog's records and the moves only a lease's end makes no longer advance
        # progress_seq (reducers/transitions.py, ``advances``)
        version=4,
        spec=TableSpec(
            "checkpoints",
            columns(
                run_id="text!", state="text!", terminal="int!", owner="text!", target="text!",
                worker="text", lease="int", progress_seq="int!", last_seq="int!",
                updated_us="int", fork_parent="text", packet="blob!",
            ),
            pk=("run_id",),
            indexes=(
                Index("state", ("state", "run_id")),
                Index("owner", ("owner", "state")),
                Index("target", ("target", "state")),
                Index("live", ("terminal", "state", "run_id")),
            ),
        ),
        rows=_ck_rows,
    ),
    Projection(
        name="stall_watch",
        # 2: the worker, the policy's timeouts and retry budget, and whether a verdict needs
        # the packet: the stall scan judges a due run from this row (reducers/stall.judge);
        # 3: progress_seq and the last progress as fold version 4 of checkpoints counts them
        version=3,
        spec=TableSpec(
            "stall_watch",
            columns(
                run_id="text!", live="int!", state="text!", lease="int", last_heartbeat_us="int",
                lease_since_us="int", progress_seq="int!", last_progress_kind="text",
                last_progress_us="int", retry_count="int!", pending_effects="int!",
                next_deadline_us="int", worker="text", heartbeat_timeout_s="real!",
                progress_timeout_s="real!", retry_budget="int!", needs_packet="int!",
            ),
            pk=("run_id",),
            # The stall scan is a range scan of this partial index: it holds every column the
            # scan filters on and judges liveness by (queries.due_signals; ``live`` too, which
            # SQLite checks again although the index's WHERE implies it), so the due runs'
            # rows, which lie anywhere in the table, are not looked up one page at a time.
            # Progress columns stay out: a progress command that leaves the deadline where it
            # was leaves the index alone; the scan reads them by key for live workers only.
            indexes=(
                Index("due", ("next_deadline_us", "run_id", "state", "lease", "worker", "last_heartbeat_us",
                              "lease_since_us", "heartbeat_timeout_s", "needs_packet", "live"),
                      where=(("live", 1), ("next_deadline_us", NOT_NULL))),
            ),
        ),
        rows=_stall_rows,
    ),
    Projection(
        name="deliveries",
        spec=TableSpec(
            "deliveries",
            columns(
                run_id="text!", target="text!", status="text!", key="text", receipt="text",
                attempts="int!", attempted_us="int", ambiguous_after_us="int",
            ),
            pk=("run_id", "target"),
            indexes=(Index("status", ("status", "ambiguous_after_us")),),
        ),
        rows=_delivery_rows,
        many=True,
    ),
    Projection(
        name="owner_load",
        spec=TableSpec(
            "owner_load",
            columns(owner="text!", run_id="text!", lease="int"),
            pk=("owner", "run_id"),
            indexes=(Index("run", ("run_id",)),),
        ),
        rows=_owner_rows,
        many=True,
    ),
)
BY_NAME = {p.name: p for p in PROJECTIONS}


def _write(w: ViewWriter, p: Projection, t: Any, cp: Checkpoint, last_position: int, *,
           fresh: bool = False, first: bool = False) -> None:
    """``fresh``: into a rebuild's shadow table; ``first``: where the run has no rows yet,
    so there is nothing to replace (a shadow table has no index on run_id until the swap:
    deleting by it would scan the whole table once per run)."""
    if not cp.opened:
        return  # a stream that is not a handoff run (a watcher's beats): no view rows
    rows = p.rows(cp, last_position)
    if fresh:
        w.fill(t, cp.run_id, rows, many=p.many and not first)
    elif p.many:
        w.sync_many(t, cp.run_id, rows)
    else:
        for row in rows:
            w.sync_one(t, row)


def _named(names: Iterable[str] | None) -> list[Projection]:
    if names is None:
        return list(PROJECTIONS)
    out = []
    for n in names:
        if n not in BY_NAME:
            raise InvalidInput(
                f"no projection named {n!r}; the projections are {', '.join(BY_NAME)}", field="projection"
            )
        out.append(BY_NAME[n])
    return out


class _Inline(Hook):
    """The hook a Projector attaches, declaring what the store may rely on: it keeps every
    projection when the projector has them all, and reads no position (no view row holds
    one since view_rows.py's version 3)."""

    reads_position = False

    def __init__(self, projector: Projector) -> None:
        self.keeps_views = {p.name for p in projector.projections} == set(BY_NAME)
        self._inline = projector._inline

    def __call__(self, txn: Transaction, run_id: str, state: Any, last_position: int) -> None:
        self._inline(txn, run_id, state, last_position)


class Projector:
    """Attaches the projections to a store and keeps them inline with every append.

    Backend-neutral: it reads the log through the store's transactions and keeps its
    tables through the store's view store (ledger/view_tables.py), never through SQL."""

    def __init__(self, store: EventStore, names: Iterable[str] | None = None) -> None:
        self.store = store
        self.projections = _named(names)
        self._views = store.views
        self._names = [p.name for p in self.projections]
        self._tables = [(p, self._views.table(p.spec)) for p in self.projections]
        self._ensure_tables()
        store.attach(AGGREGATE, _Inline(self))
        if not store.readonly:
            self.catch_up()

    # --- tables --------------------------------------------------------------------

    def _kept(self, chosen: Iterable[Projection] | None = None) -> dict[str, tuple[TableSpec, int]]:
        return {p.name: (p.spec, p.version) for p in (self.projections if chosen is None else chosen)}

    def _ensure_tables(self) -> None:
        store = self.store
        kept = self._kept()
        #: False when a read-only open found views of another version (an older ledger):
        #: reads that need this version's columns then take a way the old ones allow.
        self.current = True
        if not self._views.needs_prepare(kept):
            return
        if store.readonly:
            self.current = False
            return  # a read-only open answers from the views as they are
        with store.write_transaction("creating projection tables") as txn:
            self._views.prepare(kept)

    # --- inline ----------------------------------------------------------------------

    def _inline(self, txn: Transaction, run_id: str, cp: Checkpoint, last_position: int) -> None:
        """Called by the store inside the append's write transaction."""
        w = txn.views
        for p, t in self._tables:
            _write(w, p, t, cp, last_position)
        # Say which projections this write kept. Neither backend moves a tracking row for
        # it: a write that keeps them all is current by default, and one that does not is
        # marked (PostgreSQL: events.viewed; SQLite: views_unkept, where a projector of
        # some views only names them), so catch-up finds what was never applied.
        w.advance(self._names, last_position, run_id)

    def positions(self) -> dict[str, int]:
        return self._views.positions()

    # --- catch-up --------------------------------------------------------------------

    def catch_up(self, *, progress: OnProgress = None) -> int:
        """Bring any projection whose tracking position lags the log up to date.

        Returns how many runs were refolded. Safe to call at any time.
        """
        store = self.store
        refolded = 0
        behind = self._views.lagging(self._names, store.last_position())
        if not behind:
            return 0
        since = min(behind.values())
        lagging = [(p, t) for p, t in self._tables if p.name in behind]
        with store.write_transaction("catching up projections") as txn:
            last = txn.last_position()
            runs = txn.runs_since(since)
            w = txn.views
            for i, run_id in enumerate(runs):
                head = txn.head(run_id)
                cp = txn.state(run_id, AGGREGATE, head)
                for p, t in lagging:
                    _write(w, p, t, cp, head.last_position)  # type: ignore[union-attr]
                refolded += 1
                if progress and i % 1000 == 0:
                    progress(i, len(runs))
            w.set_positions({p.name: last for p, _ in lagging})
        return refolded

    # --- rebuild -----------------------------------------------------------------------

    def rebuild(self, names: Iterable[str] | None = None, *, batch: int = 500, progress: OnProgress = None) -> dict[str, int]:
        """Drop and refold the named projections (all by default) from position 0.

        Builds into fresh shadow tables, one run at a time and in batches (memory stays
        flat in the size of the log), then swaps them in with one transaction. A rebuild
        killed midway leaves the old tables untouched; the next one starts over.
        Returns {projection: rows written}.
        """
        store = self.store
        vs = self._views
        chosen = _named(names)

        with store.write_transaction("preparing a rebuild") as txn:
            fresh = list(zip(chosen, vs.create_shadows([p.spec for p in chosen])))
            start = txn.last_position()
        with store.read_transaction() as txn:  # the runs this walk will fold: those begun by ``start``
            total = txn.count_runs(begun_by=start)

        def fold_and_write(txn: Transaction, run_ids: list[str], *, first: bool) -> None:
            """``first``: the batches, where each run is written once into empty shadows;
            else the swap, which rewrites the runs that moved meanwhile."""
            w = txn.views
            for run_id in run_ids:
                head = txn.head(run_id)
                if head is None:
                    continue
                cp = txn.fold(run_id, AGGREGATE)
                for p, t in fresh:
                    _write(w, p, t, cp, head.last_position, fresh=True, first=first)

        # Heads are read a page at a time and runs folded in batches: memory stays flat in
        # the number of runs as well as in the number of events.
        done = 0

        def flush(chunk: list[str]) -> None:
            nonlocal done
            with store.write_transaction("rebuilding projections") as txn:
                fold_and_write(txn, chunk, first=True)
            done += len(chunk)
            if progress:
                progress(min(done, total), total)

        chunk: list[str] = []
        for head in store.list_runs():
            if head.first_position > start:
                continue  # begun since the rebuild started: the swap folds those (heads come in
                # the order runs began, which on PostgreSQL may differ a little from positions)
            chunk.append(head.run_id)
            if len(chunk) == batch:
                flush(chunk)
                chunk = []
        if chunk:
            flush(chunk)

        with store.write_transaction("swapping in rebuilt projections") as txn:
            fold_and_write(txn, txn.runs_since(start), first=False)
            return vs.swap_in(self._kept(chosen), txn.last_position())

    # --- check -------------------------------------------------------------------------

    def check(self, names: Iterable[str] | None = None, *, progress: OnProgress = None) -> list[dict[str, Any]]:
        """Compare every kept row with a fresh fold of the log; return each difference.

        A difference is {projection, run_id, column, kept, folded}; kept or folded is
        None where a whole row is missing on that side. A view kept by another version of
        its fold (an older ledger opened read-only) is one difference, run_id None and
        folded ``NEEDS_REBUILD``, not one per row the new rule folds differently. Differences come projection by
        projection, runs in order of first appearance, then the kept rows nothing folds
        to (in table order). Runs are walked a page at a time, each folded once and
        compared with its own rows: memory stays flat however large the views are.
        """
        store = self.store
        vs = self._views
        chosen = list({p.name: p for p in _named(names)}.values())  # each view once, in the order named
        # A read-only open leaves views kept by another version of their fold as they are
        # (a writable open refolds them): comparing their rows with this version's fold
        # would report every run that the rule change touched as damage. Say what they need.
        stale = [] if self.current else vs.outdated(self._kept(chosen))
        if stale:
            chosen = [p for p in chosen if p.name not in stale]
        found: dict[str, list[dict[str, Any]]] = {p.name: [] for p in chosen}
        # Kept rows no fold accounts for, with their ordinals, reported last in table order.
        extra: dict[str, list[tuple[int, str]]] = {p.name: [] for p in chosen}
        with store.read_transaction() as txn:  # one snapshot for the whole walk
            total = txn.count_runs()
            for i, head in enumerate(store.list_runs()):
                run_id = head.run_id
                if progress and i % 1000 == 0:
                    progress(i, total)
                try:
                    cp = store.fold(run_id, AGGREGATE)
                except CorruptLedger as exc:
                    # The log itself is damaged here: say so, per run, and go on.
                    for p in chosen:
                        found[p.name].append(dict(projection=p.name, run_id=run_id, column=None,
                                                  kept=None, folded=f"unfoldable: {exc.message}"))
                    continue
                if not cp.opened:
                    # A watcher's stream: no row may name it.
                    for p in chosen:
                        extra[p.name].extend(
                            (r[0], run_id) for r in vs.select(p.table, (ORDINAL,), where={"run_id": run_id})
                        )
                    continue
                for p in chosen:
                    _compare(vs, p, cp, head.last_position, found[p.name], extra[p.name])
            for p in chosen:  # rows naming a run the log does not hold
                extra[p.name].extend(
                    (ordinal, run_id)
                    for ordinal, run_id in vs.pages(p.table, (ORDINAL, "run_id"), order=(ORDINAL,))
                    if txn.head(run_id) is None
                )
        diffs: list[dict[str, Any]] = [
            dict(projection=name, run_id=None, column=None, kept="rows of another fold version",
                 folded=NEEDS_REBUILD)
            for name in stale
        ]
        for p in chosen:
            diffs.extend(found[p.name])
            diffs.extend(
                dict(projection=p.name, run_id=run_id, column=None, kept="row", folded=None)
                for _, run_id in sorted(extra[p.name])
            )
        return diffs


def _compare(
    vs: Any, p: Projection, cp: Checkpoint, last_position: int,
    found: list[dict[str, Any]], extra: list[tuple[int, str]],
) -> None:
    """One run's kept rows of one view against the rows its fold gives."""
    cols = list(p.columns)
    kept = {}
    for ordinal, *values in vs.select(p.table, (ORDINAL, *cols), where={"run_id": cp.run_id}):
        row = dict(zip(cols, values))
        kept[tuple(row[k] for k in p.pk)] = (ordinal, row)
    for row in p.rows(cp, last_position):
        have = kept.pop(tuple(row[k] for k in p.pk), None)
        if have is None:
            found.append(dict(projection=p.name, run_id=cp.run_id, column=None, kept=None, folded="row"))
            continue
        for c in cols:
            if have[1][c] != row[c]:
                found.append(dict(projection=p.name, run_id=cp.run_id, column=c,
                                  kept=_show(have[1][c]), folded=_show(row[c])))
    extra.extend((ordinal, cp.run_id) for ordinal, _ in kept.values())


def _show(v: Any) -> Any:
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return v
