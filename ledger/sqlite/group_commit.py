"""Group commit: commands from many threads of one process in one SQLite transaction."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import StoreUnavailable
from .driver import explain

if TYPE_CHECKING:
    from .sqlite_store import SqliteStore


class _Request:
    """One command waiting for a group commit: its work, then its answer or its error."""

    __slots__ = ("done", "error", "folded", "run_id", "value", "work")

    def __init__(self, run_id: str, work: Callable[[], tuple[Any, Any, Any]]) -> None:
        self.run_id = run_id
        self.work = work
        self.done = False
        self.error: BaseException | None = None
        self.value: Any = None
        self.folded: Any = None


class GroupCommit:
    """Commands from many threads in one write transaction and one fsync.

    The first thread to arrive leads: it takes the write lock, runs every queued command
    in a savepoint of its own (a refused command rolls back to it alone, so each is still
    fenced, deduplicated and decided on its own against the state the ones before it
    left), picks up the commands that arrived meanwhile, and commits once. The others
    wait for that commit; no caller hears "committed" before it. One leader at a time:
    commands that arrive during a commit form the next group.
    """

    #: Commands per transaction at most, so a steady stream cannot hold one open forever.
    LIMIT = 256

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[_Request] = []
        self._leading = False
        self._leader: int | None = None  # the thread running a group now

    def submit(self, run_id: str, work: Callable[[], tuple[Any, Any, Any]]) -> tuple[Any, Any]:
        if self._leader == threading.get_ident():
            # A guard or decide callback issuing a command: it would wait for the group it
            # is running. Without group commit SQLite refuses the nested transaction.
            raise StoreUnavailable(
                f"a command on run {run_id} was issued from inside another command's "
                f"transaction on {self._store.path} (a guard or decide callback calling the "
                "Ledger); nothing was written. Issue it after that command has returned"
            )
        req = _Request(run_id, work)
        cv = self._cv
        with cv:
            self._queue.append(req)
            while not req.done:
                if self._leading:
                    cv.wait()
                    continue
                # No leader: this thread leads the next group (which may not reach this
                # request when the queue is longer than LIMIT; then it leads again).
                self._leading, self._leader = True, threading.get_ident()
                cv.release()
                try:
                    self._lead()
                finally:
                    cv.acquire()
                    self._leading, self._leader = False, None
                    cv.notify_all()
        if req.error is not None:
            raise req.error
        return req.value

    def _take(self, room: int) -> list[_Request]:
        with self._cv:
            batch, self._queue = self._queue[:room], self._queue[room:]
        return batch

    def _lead(self) -> None:
        store = self._store
        taken: list[_Request] = []
        with store.lock:
            try:
                batch = self._take(self.LIMIT)
                taken.extend(batch)
                store.begin("appending")
                ran: list[_Request] = []
                while batch:
                    for req in batch:
                        self._run(req, ran)
                        ran.append(req)
                    batch = self._take(self.LIMIT - len(taken))
                    taken.extend(batch)
                # What a lone execute does after its body: commit, once for the group.
                store.finish(True, "committing a group of commands")
            except BaseException as exc:  # the begin or the commit failed: no command stands
                if isinstance(exc, sqlite3.Error):
                    exc = explain(exc, "committing a group of commands", store.path)
                if store.conn.in_transaction:
                    store.conn.execute("ROLLBACK")
                for req in taken:
                    if req.error is None:
                        req.error, req.value, req.folded = exc, None, None
            else:
                for req in taken:
                    if req.error is None and req.folded is not None:
                        store._remember_all(req.run_id, req.folded)
        with self._cv:
            for req in taken:
                req.done = True
            self._cv.notify_all()

    def _run(self, req: _Request, ran: list[_Request]) -> None:
        """One command in a savepoint of its own; ``ran``: the group's commands before it."""
        conn = self._store.conn
        conn.execute("SAVEPOINT handoff_command")
        try:
            result, state, folded = req.work()
        except BaseException as exc:
            req.error = exc
            if conn.in_transaction:
                conn.execute("ROLLBACK TO handoff_command")
                conn.execute("RELEASE handoff_command")
            else:
                # SQLite rolled the whole transaction back (a full disk, an I/O error): the
                # commands before this one went with it, so none of them is acknowledged,
                # and a fresh transaction takes the rest of the group.
                for earlier in ran:
                    if earlier.error is None:
                        earlier.error, earlier.value, earlier.folded = exc, None, None
                self._store.begin("appending")
            return
        conn.execute("RELEASE handoff_command")
        req.value, req.folded = (result, state), folded
