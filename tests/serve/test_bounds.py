"""What a browser can make the server hold, bounded: live feeds at once (one more is 503
with the reason), batches waiting for one feed (a feed that falls further behind is
dropped with a ``dropped`` event), and the fleet's health counts (judged once a refresh
period, however many pages reload)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from handoff import Ledger
from tests.support import ROOT

REFRESH_S = 1.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def _busy_run(db: str) -> tuple[str, int]:
    with Ledger(db) as lg:
        token = lg.claim(lg.open(run_id="busy", goal="g", target="chat:#ops", owner="alice"), "w1")
        lg.transition("busy", token, "planning")
        return str(token), lg.checkpoint("busy").last_seq


def test_feeds_past_the_limit_are_refused_with_the_reason(tmp_path: Path, served: Any) -> None:
    db = str(tmp_path / "s.db")
    _busy_run(db)
    s = served(db, "--max-feeds", "2", "--refresh", str(REFRESH_S))
    url = s.base + "/runs/busy/feed"
    with httpx.Client(timeout=10) as c:
        with c.stream("GET", url) as one, c.stream("GET", url) as two:
            assert (one.status_code, two.status_code) == (200, 200)
            third = c.get(url)
            assert third.status_code == 503 and "at most 2 live feeds" in third.text
            assert third.headers["retry-after"] == str(int(REFRESH_S))
        # Both closed: their slots come back once the server sees them go (it looks at
        # least once a refresh period), so a new page follows again.
        deadline = time.monotonic() + 3 * REFRESH_S + 5
        while True:
            with c.stream("GET", url) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "a closed feed's slot never came back"
            time.sleep(REFRESH_S / 10)


def test_the_max_feeds_help_states_the_default() -> None:
    from handoff.serve.feed import MAX_FOLLOWERS
    from handoff.servecli import serve

    opt = next(p for p in serve.params if p.name == "max_feeds")
    assert f"default {MAX_FOLLOWERS})" in (opt.help or "")


def _write(db: str, token: str, detail: str) -> None:
    """A step recorded by another process, as a worker records it."""
    subprocess.run([sys.executable, "-c", "import sys; from handoff import Ledger; lg = Ledger(sys.argv[1]); "
                    "lg.progress('busy', sys.argv[2], 'plan_committed', sys.argv[3]); lg.close()", db, token, detail],
                   env=_env(), check=True, timeout=60, cwd=ROOT)


async def _follow_without_reading(db: str, token: str, start: int, queue: int) -> dict[str, Any]:
    """The ASGI app in this process, one feed whose client stops reading after the first
    event (its ``send`` waits), steps recorded meanwhile by other processes."""
    from handoff.serve import Config, make_app

    app = make_app(Config(db=db, name="t", refresh_s=60, feed_queue=queue))
    server = app.state.server
    server.feed.start(asyncio.get_running_loop())  # what the lifespan does
    reading = asyncio.Event()
    sent: list[dict[str, Any]] = []
    first_body = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first_body.set()
            await reading.wait()

    requested = False
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": "/runs/busy/feed", "raw_path": b"/runs/busy/feed", "query_string": f"after={start}".encode(),
             "headers": [(b"host", b"127.0.0.1:8766")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8766),
             "root_path": ""}
    task = asyncio.create_task(app(scope, receive, send))
    try:
        await asyncio.wait_for(first_body.wait(), 30)
        for i in range(queue + 1):  # one batch more than the queue holds
            await asyncio.to_thread(_write, db, token, f"step {i}")
            written = await asyncio.to_thread(server.read, lambda lg: lg.store.last_position())
            deadline = time.monotonic() + 10  # the tail reads every 50 ms; 10 s: a busy machine
            while server.feed.position < written:
                assert time.monotonic() < deadline, "the feed never read the step"
                await asyncio.sleep(0.05)
        dropped, following = server.feed.dropped, server.feed.following
        reading.set()  # the client reads again: it is told, and the stream ends
        await asyncio.wait_for(task, 30)
    finally:
        gone.set()
        if not task.done():
            task.cancel()
        server.feed.stop()
        server.ledger.close()
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    return {"dropped": dropped, "following": following, "body": body}


def test_a_feed_that_falls_behind_is_dropped_with_a_clear_event(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    token, start = _busy_run(db)
    out: dict[str, Any] = {}
    # Its own thread: Playwright's loop may be running in this one (the package's browser).
    t = threading.Thread(target=lambda: out.update(asyncio.run(_follow_without_reading(db, token, start, 2))))
    t.start()
    t.join(120)
    assert not t.is_alive() and out, "the feed did not end"
    assert (out["dropped"], out["following"]) == (1, 0)
    events = re.findall(r"^event: (\w+)", out["body"], flags=re.M)
    assert events == ["status", "dropped"], out["body"][:500]
    assert "fell more than 2 batches" in out["body"] and "reload" in out["body"]


def test_a_follower_that_keeps_up_is_not_dropped(tmp_path: Path) -> None:
    """The bound is per follower: the one that reads keeps every batch."""
    from handoff.serve.feed import DROPPED, Feed

    db = str(tmp_path / "s.db")
    Ledger(db).close()
    out: dict[str, Any] = {}

    async def main() -> None:
        with Ledger(db, create=False) as lg:
            feed = Feed(lg, max_followers=5, queue=2)
            slow, fast = feed.follow("r"), feed.follow("r")
            got = []
            for seq in range(1, 5):
                feed.hand_out({"r": [{"seq": seq}]}, seq)
                got.append((await fast.get())[0]["seq"])
            out.update(got=got, slow=[slow.get_nowait() for _ in range(slow.qsize())], following=feed.following,
                       dropped=feed.dropped, DROPPED=DROPPED)

    t = threading.Thread(target=lambda: asyncio.run(main()))
    t.start()
    t.join(60)
    assert out["got"] == [1, 2, 3, 4]
    assert out["slow"] == [out["DROPPED"]] and (out["following"], out["dropped"]) == (1, 1)


def _total(page: str) -> tuple[int, str | None]:
    """The count of runs at the top of the fleet, and when it was judged."""
    total = int(re.search(r'data-count="total">(\d+)<', page).group(1))  # type: ignore[union-attr]
    counted = re.search(r'id="counted">Counted at ([^;]+);', page)
    return total, None if counted is None else counted.group(1)


def test_health_counts_are_judged_once_a_refresh_period(tmp_path: Path, served: Any) -> None:
    """Kept for the refresh period (a long one here: a new run is not counted yet, and the
    page says when the counts were judged), judged afresh after it (a short one)."""
    db = str(tmp_path / "s.db")
    with Ledger(db) as lg:
        lg.open(run_id="a", goal="g", target="chat:#ops", owner="alice")
    slow, quick = served(db, "--refresh", "600"), served(db, "--refresh", str(REFRESH_S))
    with httpx.Client() as c:
        first, first_q = _total(c.get(slow.base + "/").text), _total(c.get(quick.base + "/").text)
        assert first[0] == first_q[0] == 1 and first[1] is not None
        with Ledger(db) as lg:
            lg.open(run_id="b", goal="g", target="chat:#ops", owner="alice")
        page = c.get(slow.base + "/").text
        assert _total(page) == first  # the same count, judged at the same moment
        assert 'data-run="b"' in page  # the rows are read afresh
        deadline = time.monotonic() + 2 * REFRESH_S + 5
        while _total(c.get(quick.base + "/").text)[0] != 2:
            assert time.monotonic() < deadline, "the counts were not judged again after the refresh period"
            time.sleep(REFRESH_S / 10)
