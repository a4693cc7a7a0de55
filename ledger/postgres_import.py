"""Imports into a PostgreSQL ledger: the SQLite store's streamed import, on this database.

The checks an import makes (chains continue, envelopes as a live write would make them,
lease fencing, one key per run, the caller's ``admit`` rules, inline views kept) are
written once, in ``ledger.sqlite._Import``; this module hands it the few things it asks
of a store, in PostgreSQL's terms, and moves the ledger's tail row at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import events as ev
from .sqlite import _Import
from .store import Aggregate, Head, Recorded

if TYPE_CHECKING:
    from .postgres import PostgresStore

from .postgres import _INSERT, ID_BLOCK  # noqa: E402 - postgres imports this module lazily


class _Conn:
    """``execute`` / ``executemany`` with SQLite's ``?`` placeholders, on the store's connection."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    #: The import's statements that read PostgreSQL's layout differently (the rest are
    #: the same SQL with other placeholders).
    _OWN = {
        "SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1":
            "SELECT position, global_hash FROM ledger_tail",
    }

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self._store._x(self._OWN.get(sql, sql).replace("?", "%s"), args)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._store._ready().cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), rows)


class _Store:
    """What ``_Import`` asks of its store."""

    def __init__(self, store: PostgresStore) -> None:
        self._pg = store
        self._conn = _Conn(store)
        self.max_payload = store.max_payload
        self._clock = store._clock

    def _head_locked(self, run_id: str) -> tuple[Head | None, int]:
        return self._pg._head_row(run_id)

    def _state_locked(self, run_id: str, aggregate: Aggregate[Any], head: Head | None) -> Any:
        return self._pg._state(run_id, aggregate, head)

    def _check_fork(self, run_id: str, seq: int, fork: ev.RunForked) -> None:
        self._pg._check_fork(run_id, seq, fork)

    def _lineage_steps(self, run_id: str, until_seq: int | None) -> Iterator[Any]:
        return self._pg._lineage_steps(run_id, until_seq)

    def history(self, run_id: str, *, until_seq: int | None = None) -> Iterator[Recorded]:
        return self._pg.history(run_id, until_seq=until_seq)

    def _after_insert(self, rows: list[tuple[Any, ...]]) -> None:
        pass

    def _run_hooks(self, run_id: str, head: Head, known: list[tuple[Aggregate[Any], Any]]) -> Any:
        return self._pg._run_hooks(run_id, head, known)


class PgImport(_Import):
    """One import inside a write transaction that excludes every other write and holds
    the seal lock: imported events are sealed as they are inserted, at the positions
    the import computed (the next ones after the sealed tail), with their write ids
    drawn from the ledger's sequence."""

    def __init__(self, store: PostgresStore, aggregate: Aggregate[Any] | None,
                 admit: Callable[[Any, Recorded, ev.Event], None] | None) -> None:
        super().__init__(_Store(store), aggregate, admit)  # type: ignore[arg-type]
        self.pg = store
        self._free: list[int] = []
        self._new: set[str] = set()

    def _next_id(self) -> int:
        if not self._free:
            (base,) = self.pg._x("SELECT nextval('events_id_seq')").fetchone()
            self._free = list(range(base + ID_BLOCK - 1, base - 1, -1))
        return self._free.pop()

    def add(self, r: Recorded, digest: bytes | None, size: int) -> None:
        if self._cursor(r.run_id).first_position is None:
            self._new.add(r.run_id)  # its span starts in this import: set in write ids at flush
        super().add(r, digest, size)

    def flush(self) -> None:
        if self.rows:
            viewed = self.pg._keeps_views
            events, order = [], []
            for row in self.rows:
                run_id, wid = row[1], self._next_id()
                cur = self.runs[run_id]
                cur.last_position = wid
                if run_id in self._new:
                    cur.first_position = wid
                    self._new.discard(run_id)
                events.append((wid, *row[1:14], viewed))
                order.append((row[0], wid, bytes(row[14])))
            with self.pg._ready().cursor() as cur:
                cur.executemany(_INSERT, events)
                cur.executemany("INSERT INTO ledger_order (position, event_id, global_hash) VALUES (%s,%s,%s)",
                                order)
            self.rows = []
            self.keys.clear()
        super().flush()

    def finish(self) -> list[tuple[str, tuple[Head | None, list[tuple[Aggregate[Any], Any]]]]]:
        out = super().finish()
        self.pg._x("UPDATE ledger_tail SET position=%s, global_hash=%s", (self.last_pos, bytes(self.gprev)))
        # The insert trigger queued the imported events, which already have their
        # positions: the seal (as the owner) takes them off the queue.
        self.pg._x("SELECT count(*) FROM handoff_seal(true, '{}')")
        return out
