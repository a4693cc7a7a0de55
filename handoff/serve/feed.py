"""The live feed behind the run page: one reader of the ledger's tail, any number of followers.

One thread per server waits on the store's ``wait_for_events`` (SQLite: a read of the last
position every 50 ms, the cheap change check; PostgreSQL: the ledger's LISTEN/NOTIFY
channel, with a poll as the fallback), reads only what is new by position, and hands each
run's new events to the browsers following that run. Fifty pages on one busy run cost one
read of the tail, not fifty.

What a follower receives is what ``handoff log`` shows of an event (seq, time, actor,
type, one-line summary), without the idempotency key: nothing here carries a secret.

Both ends are bounded, so a browser cannot make the server hold more than it chose to:
at most ``max_followers`` feeds at once (one more is refused, and the page answers 503
with the reason), and at most ``queue`` batches waiting for one follower. A follower that
falls further behind (a stalled tab, a slow link) is dropped: its waiting batches are
discarded and it receives ``DROPPED``, which the page turns into a ``dropped`` event
saying to reload. What it missed is still in the log; a reload reads it from there.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from handoff.render import iso_ms, summarize
from handoff.reducers.checkpoint import iso

#: How long the tail waits in one call before it looks at whether to stop.
WAIT_S = 0.5
#: Batches one follower may have waiting before it is dropped (each batch is what one
#: read of the tail brought for its run: at least 50 ms of the run's events on SQLite).
QUEUE = 64
#: Feeds a server serves at once, unless started with another ``--max-feeds``.
MAX_FOLLOWERS = 100
#: What a dropped follower's queue holds: the page says so and stops following.
DROPPED = None


class FeedFull(Exception):
    """Every live feed this server serves is taken: the page answers 503 with this message."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"this server follows at most {limit} live feeds at once (handoff serve --max-feeds); "
                         "close another run page, or try again when one is closed")
        self.message = str(self)


def event_row(rec: Any) -> dict[str, Any]:
    """An event as the run page lists it: no idempotency key, no payload."""
    return {"seq": rec.seq, "at": iso_ms(iso(rec.recorded_us)), "actor": rec.actor, "lease": rec.lease,
            "type": rec.type, "summary": summarize(rec.event)}


class Feed:
    """The tail reader and its followers, on the server's ``Ledger`` (safe to share between
    threads). One ``Ledger`` per process, not one per thread: opening a second one on the
    same SQLite file would read the file's header with a plain open() and close(), and a
    close() drops every POSIX lock the process holds on that file, the other
    connection's included (SQLite's "How To Corrupt", 2.2)."""

    def __init__(self, ledger: Any, *, max_followers: int = MAX_FOLLOWERS, queue: int = QUEUE) -> None:
        self.ledger = ledger
        self.max_followers, self.queue = max_followers, queue
        self.followers: dict[str, set[asyncio.Queue[list[dict[str, Any]] | None]]] = {}
        self.following = 0  # followers of every run together
        self.dropped = 0  # followers dropped for falling behind, since the server started
        self.position = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._tail, name="handoff-serve-feed", daemon=True)
        self._thread.start()
        self.ready.wait(10)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def follow(self, run_id: str) -> asyncio.Queue[list[dict[str, Any]] | None]:
        """A new follower's queue (on the event loop's thread); FeedFull past the limit."""
        if self.following >= self.max_followers:
            raise FeedFull(self.max_followers)
        q: asyncio.Queue[list[dict[str, Any]] | None] = asyncio.Queue(maxsize=self.queue)
        self.followers.setdefault(run_id, set()).add(q)
        self.following += 1
        return q

    def unfollow(self, run_id: str, q: asyncio.Queue[list[dict[str, Any]] | None]) -> None:
        qs = self.followers.get(run_id)
        if qs is not None and q in qs:
            qs.discard(q)
            self.following -= 1
            if not qs:
                self.followers.pop(run_id, None)

    def _drop(self, run_id: str, q: asyncio.Queue[list[dict[str, Any]] | None]) -> None:
        """A follower that fell ``queue`` batches behind: what it had waiting is discarded
        (the log keeps it), its slot freed, and ``DROPPED`` is all it reads next."""
        self.unfollow(run_id, q)
        while not q.empty():
            q.get_nowait()
        q.put_nowait(DROPPED)
        self.dropped += 1

    def hand_out(self, batch: dict[str, list[dict[str, Any]]], position: int) -> None:
        """Give each follower its run's new events (on the event loop's thread)."""
        self.position = position
        for run_id, rows in batch.items():
            for q in list(self.followers.get(run_id, ())):
                try:
                    q.put_nowait(rows)
                except asyncio.QueueFull:
                    self._drop(run_id, q)

    def _tail(self) -> None:
        lg = self.ledger
        try:
            last = lg.store.last_position()
            self.position = last
            self.ready.set()
            while not self._stop.is_set():
                now = lg.store.wait_for_events(last, WAIT_S)
                if now <= last:
                    continue
                batch: dict[str, list[dict[str, Any]]] = {}
                for rec in lg.store.read_all(after_position=last, until_position=now):
                    if rec.run_id in self.followers:  # decode only what someone follows
                        batch.setdefault(rec.run_id, []).append(event_row(rec))
                last = now
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.call_soon_threadsafe(self.hand_out, batch, now)
        finally:
            self.ready.set()
