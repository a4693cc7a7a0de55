"""What the ledger holds, read without writing: a run's checkpoint and packet (now or as it
stood, for replay), its log, the listings a page at a time, and events across the ledger.

A listing streams from the projections' views a page at a time (``projections.queries``
says how each is sorted), so memory stays flat whatever the size of the ledger.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput, UnknownRun
from handoff.ledger.inputs import (
    MAX_TIME_US, MIN_TIME_US, check_filter, check_limit, check_run_id, check_seconds, check_seq, check_texts,
    check_time_us,
)
from handoff.ledger.store import WATCHER_PREFIX, EventStore, Recorded
from handoff.projections import Projector, queries
from handoff.reducers import stall
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint, packet

from .names import actor_filter
from .results import DEFAULT_PAGE, Outcome, Page


class Reads:
    """The reads of ``Ledger``; the store, its clock and its projector are the Ledger's."""

    store: EventStore
    clock: Callable[[], int]
    projector: Projector

    def checkpoint(self, run_id: str, *, at_seq: int | None = None, as_of_us: int | None = None) -> Checkpoint:
        check_run_id(run_id)
        if at_seq is not None:
            check_seq(at_seq, "at", low=1)
        if as_of_us is not None:
            check_time_us(as_of_us, "as_of")
        if self.store.head(run_id) is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}; list runs with 'handoff status'")
        if as_of_us is not None:
            at_seq = 0
            for rec in self.store.read_run(run_id):
                if rec.recorded_us > as_of_us:
                    break
                at_seq = rec.seq
            if at_seq == 0:
                raise InvalidInput(f"run {run_id} did not exist yet at that time", field="as_of")
        if at_seq is not None and at_seq < 1:
            raise InvalidInput("--at must be a seq of 1 or more", field="at")
        if at_seq is None:  # as it stands: the beats kept beside the log joined in
            cp = queries.checkpoint(self.store, run_id)
            if cp is not None:
                return cp
            return queries.with_liveness(self.store, [self.store.fold(run_id, AGGREGATE)])[0]
        return self.store.fold(run_id, AGGREGATE, until_seq=at_seq)

    def watchers(self, *, until_us: int | None = None) -> dict[str, tuple[int, float]]:
        """Each watcher's last beat (µs) and beat period, from its own stream in the log.

        With ``until_us`` (replay), only beats recorded at or before that moment count, so
        a replayed packet never claims coverage by a watcher that started later.
        """
        out: dict[str, tuple[int, float]] = {}
        for head in self.store.list_runs(prefix=WATCHER_PREFIX):
            start = 0 if until_us is not None else head.last_seq - 1
            for rec in self.store.read_run(head.run_id, after_seq=start):
                if until_us is not None and rec.recorded_us > until_us:
                    break
                e = rec.event
                if isinstance(e, ev.WatchdogObserved):
                    out[e.watcher] = (rec.recorded_us, e.interval_s)
        return out

    def status(self, run_id: str, *, now: int | None = None, at_seq: int | None = None,
               as_of_us: int | None = None) -> dict[str, Any]:
        """The checkpoint packet (docs/cli.md documents its keys)."""
        if now is not None:
            check_time_us(now, "now")
        cp = self.checkpoint(run_id, at_seq=at_seq, as_of_us=as_of_us)
        when = now if now is not None else (as_of_us if as_of_us is not None else self.clock())
        if at_seq is not None and as_of_us is None and now is None:
            when = cp.last_event_us or when
        replaying = at_seq is not None or as_of_us is not None
        return packet(cp, now_us=when, watchers=self.watchers(until_us=when if replaying else None))

    def runs(self, *, include_terminal: bool = False, state: str | None = None,
             owner: str | None = None, target: str | None = None) -> Iterator[Checkpoint]:
        """Runs from the checkpoints view, oldest first (not terminal unless asked); read a
        page at a time, so memory does not grow with the number of runs."""
        for field, value in (("state", state), ("owner", owner), ("target", target)):
            check_filter(value, field)
        return queries.runs_after(self.store, None, states=() if state is None else (state,), owner=owner,
                                  target=target, include_terminal=include_terminal)

    # --- listings a page at a time (queries.py says how they are sorted) ---------------

    def _cursor(self, after: str | None, view: str = "checkpoints") -> queries.Cursor | None:
        if after is None:
            return None
        check_run_id(after, "after")
        cursor = queries.cursor_of(self.store, after, view)
        if cursor is None:
            raise InvalidInput(f"no run {after} in {self.store.path} to continue after; pass the run id an "
                               "earlier page gave as its next cursor ('next')", field="after")
        return cursor

    def iter_runs(self, *, after: str | None = None, include_terminal: bool = False,
                  states: tuple[str, ...] = (), owner: str | None = None,
                  target: str | None = None, worker: str | None = None, health: tuple[str, ...] = (),
                  opened_after: int | None = None, opened_before: int | None = None,
                  now: int | None = None) -> Iterator[Checkpoint]:
        """Every run matching the filters, oldest first (in the order the ledger first recorded
        them), strictly after the run ``after``. Terminal runs only with
        ``include_terminal`` or when a terminal state is asked for by name.

        ``states``, ``owner``, ``target`` and ``worker`` (the current lease holder) are
        columns of the checkpoints view: the view store filters them (SQL on both
        backends). ``health`` (classifications, judged at ``now``, default the clock) and
        ``opened_after``/``opened_before`` (UTC µs, inclusive) are judged run by run as the
        pages stream past, so memory stays flat either way."""
        states = check_texts(states, "states")
        health = check_texts(health, "health")
        unknown = [h for h in health if h not in stall.CLASSIFICATIONS]
        if unknown:
            raise InvalidInput(f"no health {unknown[0]!r}; it is one of: {', '.join(sorted(stall.CLASSIFICATIONS))}",
                               field="health")
        for field, value in (("owner", owner), ("target", target), ("worker", worker)):
            check_filter(value, field)
        for field, value in (("opened_after", opened_after), ("opened_before", opened_before)):
            if value is not None:
                check_time_us(value, field)
        from handoff.reducers.transitions import TERMINAL

        include_terminal = bool(include_terminal) or any(s in TERMINAL for s in states)
        rows = queries.runs_after(self.store, self._cursor(after), include_terminal=include_terminal,
                                  states=states, owner=owner, target=target, worker=worker)
        if not health and opened_after is None and opened_before is None:
            return rows
        when = check_time_us(now, "now") if now is not None else self.clock()
        low = opened_after if opened_after is not None else MIN_TIME_US
        high = opened_before if opened_before is not None else MAX_TIME_US
        return (cp for cp in rows if cp.opened_us is not None and low <= cp.opened_us <= high
                and (not health or stall.classify(cp, now_us=when).classification in health))

    def runs_page(self, *, limit: int = DEFAULT_PAGE, after: str | None = None, include_terminal: bool = False,
                  states: tuple[str, ...] = (), owner: str | None = None, target: str | None = None,
                  worker: str | None = None, health: tuple[str, ...] = (), opened_after: int | None = None,
                  opened_before: int | None = None, now: int | None = None) -> Page:
        """One page of ``iter_runs`` (the same filters): at most ``limit`` runs, ``next`` to
        continue, ``more`` left. ``handoff runs`` and ``handoff status`` list these."""
        check_limit(limit)
        judged = bool(health) or opened_after is not None or opened_before is not None
        if judged and now is None:
            now = self.clock()  # one moment for the page and for the count of what is left
        stream = self.iter_runs(after=after, include_terminal=include_terminal, states=states, owner=owner,
                                target=target, worker=worker, health=health, opened_after=opened_after,
                                opened_before=opened_before, now=now)
        items = tuple(itertools.islice(stream, limit))
        if len(items) < limit:
            return Page(items, None, 0)
        last = items[-1].run_id
        if judged:
            more = sum(1 for _ in stream)  # judged run by run: counted as they pass, not kept
        else:
            from handoff.reducers.transitions import TERMINAL

            more = queries.count_runs_after(
                self.store, queries.cursor_of(self.store, last), states=tuple(states), owner=owner, target=target,
                worker=worker, include_terminal=bool(include_terminal) or any(s in TERMINAL for s in states))
        return Page(items, last if more else None, more)

    def run_ids(self, prefix: str = "", *, limit: int = 50) -> list[str]:
        """At most ``limit`` run ids beginning with ``prefix``, in id order (what shell
        completion offers): one range scan of an index, whatever the size of the ledger."""
        if not isinstance(prefix, str):
            raise InvalidInput("prefix must be text", field="prefix")
        check_limit(limit)
        return queries.run_ids_starting(self.store, prefix, limit)

    def iter_stalls(self, *, now: int | None = None, after: str | None = None
                    ) -> Iterator[tuple[Checkpoint, stall.Health]]:
        """Every run that needs attention at ``now``, in listing order, after the run ``after``."""
        when = check_time_us(now, "now") if now is not None else self.clock()
        cursor = self._cursor(after, "stall_watch")  # checked here, not at next()
        if self.projector.current:
            return queries.judged_after(self.store, when, cursor)
        due = queries.due_after(self.store, when, cursor)  # views of an older version, read-only
        return ((cp, h) for cp in due if (h := stall.classify(cp, now_us=when)).needs_attention)

    def stalls_page(self, *, limit: int = DEFAULT_PAGE, after: str | None = None, now: int | None = None) -> Page:
        """One page of ``iter_stalls`` (pairs of checkpoint and health), judged at one ``now``."""
        check_limit(limit)
        when = check_time_us(now, "now") if now is not None else self.clock()
        stream = self.iter_stalls(now=when, after=after)
        items = tuple(itertools.islice(stream, limit))
        more = sum(1 for _ in stream)  # the rest, judged at the same moment; counted, not kept
        return Page(items, items[-1][0].run_id if more else None, more)

    def stalls(self, *, now: int | None = None) -> list[tuple[Checkpoint, stall.Health]]:
        """Every run that needs attention at ``now``: a range scan of the stall index, each due
        run judged from its stall view row. A run judged from its row alone comes as a
        ``queries.DueRun``: run_id, state, lease and worker from the row, any other Checkpoint
        attribute read and decoded on first use (docs/python-api.md), so possibly newer than
        the verdict: to act on a verdict, check the run as it then stands with
        ``DueRun.still_as_judged`` (the watchdog does)."""
        when = check_time_us(now, "now") if now is not None else self.clock()
        if self.projector.current:
            return queries.judge_due(self.store, queries.due_signals(self.store, when), when)
        out = []
        for cp in queries.stall_candidates(self.store, when):
            h = stall.classify(cp, now_us=when)
            if h.needs_attention:
                out.append((cp, h))
        return out

    def owner_load(self, owner: str) -> int:
        check_filter(owner, "owner")
        return queries.owner_load(self.store, owner)

    def deliveries(self, *, status: str | None = None, now: int | None = None) -> list[dict[str, Any]]:
        check_filter(status, "status")
        when = check_time_us(now, "now") if now is not None else self.clock()
        return queries.deliveries(self.store, now_us=when, status=status)

    def written(self, out: Outcome) -> list[Recorded]:
        """The events a write stands for: the ones it wrote, or for a replayed key the ones
        the first attempt wrote; empty when it wrote nothing (``unchanged``)."""
        r = out.result
        if r.outcome == "unchanged":  # (a committed write's positions can still be on their way)
            return []
        return list(self.store.read_run(r.run_id, after_seq=r.first_seq - 1, until_seq=r.last_seq))

    def log(self, run_id: str, *, after_seq: int = 0) -> Iterator[Recorded]:
        """The run's events after ``after_seq``, oldest first, read a page at a time."""
        check_run_id(run_id)
        if self.store.head(run_id) is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}")
        return self.store.read_run(run_id, after_seq=after_seq)

    def events(
        self, *, since_position: int | None = None, until_position: int | None = None,
        since_us: int | None = None, until_us: int | None = None, types: tuple[str, ...] = (),
        actors: tuple[str, ...] = (), runs: tuple[str, ...] = (), follow: bool = False, poll_s: float = 0.5,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[Recorded]:
        """Events across the ledger in position order, filtered; read a page at a time, so
        memory stays flat whatever the size of the log. Bounds are inclusive. An actor
        filter is ``kind:name``, or a name alone (any kind). ``runs`` reads only those
        streams (merged by position). With ``follow``, waits for new events (woken by the
        store's ``wait_for_events``, asking ``should_stop`` at least every ``poll_s``) until
        ``should_stop()`` is true or ``until_position`` is passed."""
        for field, value in (("since", since_position), ("until", until_position)):
            if value is not None:
                check_seq(value, field)
        for field, value in (("since", since_us), ("until", until_us)):
            if value is not None:
                check_time_us(value, field)
        for group, values in (("type", types), ("actor", actors), ("run", runs)):
            if not isinstance(values, (tuple, list)):
                raise InvalidInput(f"{group} filters must be a tuple or list of text, got {type(values).__name__}",
                                   field=group)
            for value in values:
                check_filter(value, group)
        for r in runs:
            check_run_id(r, "run")
            if self.store.head(r) is None:
                raise UnknownRun(f"no run {r} in {self.store.path}; list runs with 'handoff status --all'")
        unknown = [t for t in types if t not in ev.EVENT_TYPES]
        if unknown:
            raise InvalidInput(f"no event type {unknown[0]!r}; the types are: {', '.join(sorted(ev.EVENT_TYPES))}",
                               field="type")
        check_seconds(poll_s, "poll_s", low=0.01, high=3600)
        by = actor_filter(actors)

        def wanted(rec: Recorded) -> bool:
            return ((not types or rec.type in types)
                    and by(rec.actor)
                    and (since_us is None or rec.recorded_us >= since_us)
                    and (until_us is None or rec.recorded_us <= until_us))

        after = (since_position - 1) if since_position else 0
        return self._events(after, until_position, runs, wanted, follow, poll_s, should_stop)

    def _events(self, after: int, until: int | None, runs: tuple[str, ...], wanted: Callable[[Recorded], bool],
                follow: bool, poll_s: float, should_stop: Callable[[], bool] | None) -> Iterator[Recorded]:
        import heapq

        seen = dict.fromkeys(runs, 0)  # with --run: the last seq read of each stream
        while True:
            if runs:
                streams = [(r for r in self.store.read_run(run, after_seq=last) if r.position > after)
                           for run, last in seen.items()]
                source: Iterator[Recorded] = heapq.merge(*streams, key=lambda r: r.position)
            else:
                source = self.store.read_all(after_position=after, until_position=until)
            for rec in source:
                if until is not None and rec.position > until:
                    return
                after = rec.position
                if runs:
                    seen[rec.run_id] = rec.seq
                if wanted(rec):
                    yield rec
            if not follow or (until is not None and after >= until) or (should_stop is not None and should_stop()):
                return
            # Sleep until the log grows (LISTEN/NOTIFY on PostgreSQL, a short poll on
            # SQLite), at most poll_s, so should_stop is asked that often.
            self.store.wait_for_events(after, poll_s)
            if should_stop is not None and should_stop():
                return

    def db_role_of(self) -> Callable[[int], str | None]:
        """A lookup, position -> the database role that inserted the event there, reading
        the store a thousand positions at a time (None where the backend records no role:
        SQLite, whose actors are self-declared)."""
        if not self.store.records_roles:
            return lambda position: None
        cache: dict[int, str] = {}

        def role(position: int) -> str | None:
            if position not in cache:
                if len(cache) > 100_000:
                    cache.clear()
                cache.update(self.store.db_roles(position, position + 999))
            return cache.get(position)

        return role

    def terminal_count(self, *, owner: str | None = None) -> int:
        """How many runs have ended: what a listing of live runs leaves out."""
        check_filter(owner, "owner")
        return queries.count_terminal(self.store, owner=owner)
