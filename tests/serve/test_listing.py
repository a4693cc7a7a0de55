"""The fleet page's listing against a real server: a sort orders the whole ledger (each page
continues it), and a search judged run by run says how far it read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from handoff import Ledger
from handoff.serve.listing import SCAN_CAP


def _listed(page: str) -> list[str]:
    return re.findall(r'<tr data-run="([^"]+)"', page)


def _next(page: str) -> str | None:
    m = re.search(r'<a id="next" href="\?([^"]+)"', page)
    return None if m is None else m.group(1).replace("&amp;", "&")


def _walk(c: httpx.Client, base: str, query: str) -> list[list[str]]:
    """Every page of a listing, following its next links."""
    pages = []
    while True:
        page = c.get(f"{base}/?{query}")
        assert page.status_code == 200, page.text[:300]
        pages.append(_listed(page.text))
        query = _next(page.text)  # type: ignore[assignment]
        if query is None:
            return pages


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Path) -> str:
    if request.param == "postgres":
        from tests.pg import fresh_url

        return fresh_url()
    return str(tmp_path / "serve.db")


def test_a_sort_orders_every_page_not_one(db: str, served: Any) -> None:
    with Ledger(db) as lg:
        # Opened in the reverse of their ids' order, some moved on: neither sort is the listing's.
        for i in reversed(range(230)):
            lg.open(run_id=f"r{i:03d}", goal=f"goal {i}", target="chat:#a", owner=f"p{i}" if i % 7 == 0 else "alice")
        for i in range(0, 230, 7):  # (each its own owner: an owner holds at most 10 leases)
            lg.transition(f"r{i:03d}", lg.claim(f"r{i:03d}", "w1"), "planning")
        by_state = [cp.run_id for cp in sorted(lg.runs(), key=lambda cp: (cp.state, cp.run_id))]
    s = served(db)
    with httpx.Client() as c:
        pages = _walk(c, s.base, "sort=run")
        assert [len(p) for p in pages] == [100, 100, 30]
        assert sum(pages, []) == [f"r{i:03d}" for i in range(230)]
        first = c.get(s.base + "/?sort=run").text
        assert "next page (130 more)" in first and 'data-sort="run"' in first
        pages = _walk(c, s.base, "sort=state")
        assert sum(pages, []) == by_state and len(set(by_state[:100]) & {f"r{i:03d}" for i in range(0, 230, 7)}) == 33
        # A filter keeps the order: the planning runs, then alice's (every other run).
        assert sum(_walk(c, s.base, "sort=state&state=planning"), []) == by_state[:33]
        assert sum(_walk(c, s.base, "sort=run&owner=alice"), []) == sorted(by_state[33:])
        # Only the orders an index keeps are offered; another is refused, not ignored.
        assert set(re.findall(r'<a href="[^"]*" data-sort="(\w+)">', first)) == {"run", "state"}
        bad = c.get(s.base + "/?sort=beat")
        assert bad.status_code == 400 and "no order &#x27;beat&#x27;" in bad.text
        assert c.get(s.base + "/?sort=state&after=r001&at=nope").status_code == 400


def test_a_search_says_how_far_it_read(tmp_path: Path, served: Any) -> None:
    """Text in the goal is judged run by run: a page reads at most SCAN_CAP runs, and an
    empty first page says it searched that many and how many it did not reach."""
    db = str(tmp_path / "s.db")
    beyond = 40
    with Ledger(db, synchronous="NORMAL") as lg:  # 5,000 runs: the test's own, no crash to survive
        for i in range(SCAN_CAP + beyond):
            lg.open(run_id=f"r{i:05d}", goal="the needle" if i == SCAN_CAP + 10 else f"hay {i}",
                    target="chat:#a", owner="alice")
    s = served(db)
    with httpx.Client() as c:
        first = c.get(s.base + "/?q=needle").text
        assert _listed(first) == [] and "No run matches among the runs this page searched." in first
        note = re.search(r'<p class="note" id="searched"[^>]*>([^<]*)</p>', first).group(1)  # type: ignore[union-attr]
        assert f"Searched {SCAN_CAP:,} runs" in note and f"{beyond:,} more that the other filters select are not " \
            "searched yet" in note, note
        second = c.get(f"{s.base}/?{_next(first)}").text
        assert _listed(second) == [f"r{SCAN_CAP + 10:05d}"] and _next(second) is None
        assert f"Searched every run the other filters select after the previous pages ({beyond:,} on this page)" \
            in second


def test_every_order_shows_the_beat_kept_beside_the_log(tmp_path: Path) -> None:
    """A worker that only beats (no event) is alive in every order the fleet offers, not
    only in the default one: each listing joins the kept beat in."""
    from handoff.serve.listing import SORTS, fleet

    now = [1_800_000_000 * 1_000_000]
    with Ledger(str(tmp_path / "l.db"), clock=lambda: now[0]) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#a", owner="alice", heartbeat_timeout_s=60)
        token = lg.claim(run, "w1")
        for _ in range(6):  # two minutes of beats, none of them in the log
            now[0] += 20_000_000
            assert lg.heartbeat(run, token).result.outcome == "unchanged"
        for sort in ("opened", *SORTS):
            (row,) = fleet(lg, {"sort": sort}, now[0]).rows
            assert (row["health"], row["beat"]) == ("healthy", "0s"), (sort, row)
