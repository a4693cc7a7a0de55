"""Listings stream and page: memory does not grow with the ledger, and paging is complete.

Every run is seen exactly once across pages, in a stable order, even when runs are created
and changed between pages; a streamed --json is byte for byte the document json.dumps
would print; and rendering a log five times longer does not take more memory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import cli, output
from handoff.facade import Ledger
from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor
from tests.support import Handoff
from tests.ledger.conformance import assert_unchanged, snapshot

FAR = 4_102_444_800_000_000  # 2100-01-01: every claimed run's heartbeat has timed out


# --- streamed JSON is the same document --------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(head=st.dictionaries(st.sampled_from(["now", "run_id"]), json_values, max_size=2),
       items=st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=3), max_size=4),
       tail=st.dictionaries(st.sampled_from(["next", "more"]), json_values, max_size=2))
def test_a_streamed_document_is_byte_for_byte_what_json_dumps_prints(head, items, tail):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        n = output.stream_json(head, "rows", iter(items), lambda: tail)
    assert n == len(items)
    assert buf.getvalue() == json.dumps({**head, "rows": items, **tail}, indent=2, ensure_ascii=False) + "\n"


def test_a_streamed_table_aligns_each_window_and_counts_rows():
    buf = io.StringIO()
    rows = [[f"r{i}", "x" * (i % 7), None] for i in range(10)]
    with contextlib.redirect_stdout(buf):
        assert output.stream_table(["RUN", "NOTE", "LAST"], iter(rows), window=4) == 10
    lines = buf.getvalue().splitlines()
    assert len(lines) == 11 and lines[0].split() == ["RUN", "NOTE", "LAST"]
    assert all(line.endswith("-") for line in lines[1:])
    assert output.stream_table(["A"], iter([])) == 0


# --- paging is complete --------------------------------------------------------------------


def _open(lg: Ledger, run_id: str, *, claim: bool = False, close: bool = False) -> str | None:
    """Open a run (claimed and closed on request); the lease token when claimed."""
    lg.open(run_id=run_id, goal="g", target="chat:#ops", owner="alice", owner_cap=1000)
    token = lg.claim(run_id, "w1") if claim else None
    if close:
        lg.close_run(run_id, "cancelled", "done with it", by="alice")
    return token


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(["queued", "claimed", "closed"]), min_size=0, max_size=14),
       limit=st.integers(1, 5), include_terminal=st.booleans(),
       between=st.lists(st.tuples(st.sampled_from(["new", "claim", "close"]), st.integers(0, 20)), max_size=6))
def test_runs_pages_see_every_run_exactly_once_while_runs_come_and_change(kinds, limit, include_terminal, between):
    with tempfile.TemporaryDirectory() as d, Ledger(os.path.join(d, "l.db")) as lg:
        for i, k in enumerate(kinds):
            _open(lg, f"r{i:02d}", claim=k == "claimed", close=k == "closed")
        created = [f"r{i:02d}" for i in range(len(kinds))]
        seen: list[str] = []
        after = None
        pages = 0
        while True:
            page = lg.runs_page(limit=limit, after=after, include_terminal=include_terminal)
            assert len(page.items) <= limit
            seen.extend(cp.run_id for cp in page.items)
            pages += 1
            if page.next is None:
                assert page.more == 0
                break
            assert page.next == page.items[-1].run_id and page.more >= 1
            after = page.next
            if between:  # another process writes between two pages
                what, n = between.pop(0)
                if what == "new":
                    rid = f"n{len(created):02d}"
                    _open(lg, rid)
                    created.append(rid)
                elif created:
                    rid = created[n % len(created)]
                    cp = lg.checkpoint(rid)
                    with contextlib.suppress(Exception):  # a refused change is fine too
                        if what == "claim" and cp.lease is None and not cp.terminal:
                            lg.claim(rid, "w2")
                        elif what == "close" and not cp.terminal:
                            lg.close_run(rid, "cancelled", "between pages", by="alice")
            assert pages <= len(created) + 2
        assert len(seen) == len(set(seen)), f"a run was listed twice: {seen}"
        terminal = {rid for rid in created if lg.checkpoint(rid).terminal}
        # Runs that were not terminal when listed are all there; with --all, every run is.
        expected = set(created) if include_terminal else set(created) - terminal
        assert expected <= set(seen) <= set(created)
        assert seen == [rid for rid in created if rid in set(seen)], "not in the order the runs began"


def test_stalls_pages_are_complete_and_judged_at_one_moment(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        for i in range(7):
            _open(lg, f"s{i}", claim=i != 3)
        seen, after = [], None
        while True:
            page = lg.stalls_page(limit=2, after=after, now=FAR)
            seen.extend(cp.run_id for cp, h in page.items)
            assert all(h.needs_attention for _, h in page.items)
            if page.next is None:
                break
            after = page.next
        assert seen == [f"s{i}" for i in range(7) if i != 3]
        assert [cp.run_id for cp, _ in lg.iter_stalls(now=FAR)] == seen
        assert [cp.run_id for cp, _ in lg.iter_stalls(now=FAR, after="s4")] == ["s5", "s6"]


def test_the_cli_pages_status_and_stalls_with_next_and_more(tmp_path):
    h = Handoff(str(tmp_path / "l.db"))
    with h.ledger() as lg:
        for i in range(5):
            _open(lg, f"r{i}", claim=True)
    doc = h.json("status", "--limit", "2")
    assert [r["run_id"] for r in doc["runs"]] == ["r0", "r1"] and doc["next"] == "r1" and doc["more"] == 3
    doc = h.json("status", "--limit", "2", "--after", doc["next"])
    assert [r["run_id"] for r in doc["runs"]] == ["r2", "r3"] and doc["next"] == "r3" and doc["more"] == 1
    doc = h.json("status", "--limit", "2", "--after", doc["next"])
    assert [r["run_id"] for r in doc["runs"]] == ["r4"] and doc["next"] is None and doc["more"] == 0
    text = h("status", "--limit", "3").stdout
    assert "2 more not shown" in text and "--after r2" in text
    assert len(h.json("status", "--limit", "0")["runs"]) == 5
    doc = h.json("stalls", "--now", "2100-01-01T00:00:00Z", "--limit", "4")
    assert len(doc["stalls"]) == 4 and doc["next"] == "r3" and doc["more"] == 1
    text = h("stalls", "--limit", "4", "--now", "2100-01-01T00:00:00Z").stdout
    assert "1 more not shown" in text and "--after r3 (or --limit 0" in text
    with h.ledger() as lg:
        for i in range(3):
            lg.open(run_id=f"q{i}", goal="g", target="t", owner="bob", heartbeat_timeout_s=0.01)
            lg.claim(f"q{i}", "w1")
    time.sleep(0.05)
    text = h("stalls", "--limit", "2").stdout
    assert "--after q1 --now " in text  # without --now, the hint repeats the moment the page was judged at


def test_log_pages_by_seq(tmp_path):
    h = Handoff(str(tmp_path / "l.db"))
    with h.ledger() as lg:
        lease = _open(lg, "r1", claim=True)
        for i in range(5):  # attrs of its own, so the log records each beat (seqs 3 to 7)
            lg.heartbeat("r1", lease, worker="w1", attrs={"step": i})
    doc = h.json("log", "r1", "--limit", "3")
    assert [e["seq"] for e in doc["events"]] == [1, 2, 3] and doc["next"] == 3
    doc = h.json("log", "r1", "--limit", "3", "--after", "3")
    assert [e["seq"] for e in doc["events"]] == [4, 5, 6] and doc["next"] == 6
    doc = h.json("log", "r1", "--limit", "3", "--after", "6")
    assert [e["seq"] for e in doc["events"]] == [7] and doc["next"] is None
    lines = h("log", "r1", "--jsonl", "--no-heartbeats").stdout.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [1, 2]
    assert "--after 2" in h("log", "r1", "--limit", "2").stdout
    assert "not both" in h("log", "r1", "--json", "--jsonl", code=2).stderr


def test_a_cursor_that_names_no_run_is_refused_and_writes_nothing(tmp_path):
    h = Handoff(str(tmp_path / "l.db"))
    with h.ledger() as lg:
        _open(lg, "r1")
        before = snapshot(lg.store)
        with pytest.raises(InvalidInput, match="no run ghost") as info:
            lg.runs_page(after="ghost")
        assert info.value.field == "after"
        with pytest.raises(InvalidInput, match="limit"):
            lg.runs_page(limit=0)
        with pytest.raises(InvalidInput, match="no run ghost"):
            lg.iter_stalls(after="ghost")
    for cmd in (["status", "--after", "ghost"], ["stalls", "--after", "ghost"]):
        r = h(*cmd, code=2)
        assert "no run ghost" in r.stderr and "next" in r.stderr
    with h.ledger() as lg:
        assert_unchanged(lg.store, before)


# --- memory does not grow with the log ------------------------------------------------------


def _long_run(path: str, events: int) -> None:
    store = SqliteStore(path, synchronous="NORMAL")
    w = Actor("worker", "w1")
    store.append("big", [ev.HandoffOpened(goal="g", target="t", owner="o")], actor=Actor("owner", "o"))
    body = [ev.ProgressRecorded(kind="tool_outcome", detail=f"step {i}: ran the tool") for i in range(1000)]
    for _ in range(events // 1000):
        store.append("big", body, actor=w)
    store.close()
    Ledger(path).close()  # projections caught up outside the measurement


def _peak(args: list[str]) -> int:
    """Peak traced Python memory of one in-process CLI call, its output thrown away."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        tracemalloc.start()
        try:
            cli.main.main(args, standalone_mode=False)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--jsonl"]])
def test_log_memory_does_not_grow_with_the_run(tmp_path, fmt):
    small, large = str(tmp_path / "small.db"), str(tmp_path / "large.db")
    _long_run(small, 2_000)
    _long_run(large, 10_000)
    p_small = _peak(["--db", small, "log", "big", *fmt])
    p_large = _peak(["--db", large, "log", "big", *fmt])
    print(f"log {fmt}: peak {p_small / 1e6:.2f} MB at 2k events, {p_large / 1e6:.2f} MB at 10k")
    assert p_large < p_small * 1.3 + 200_000, (p_small, p_large)


def test_listing_memory_does_not_grow_with_the_number_of_runs(tmp_path):
    peaks = []
    for n in (700, 2_800):  # both above LISTING_PAGE (500), the most a listing holds at once
        path = str(tmp_path / f"{n}.db")
        store = SqliteStore(path, synchronous="NORMAL")
        for i in range(n):
            store.append(f"r{i:05d}", [ev.HandoffOpened(goal="g", target="t", owner="o"),
                                        ev.LeaseGranted(worker="w1", lease=1)], actor=Actor("owner", "o"))
        store.close()
        Ledger(path).close()
        peaks.append([_peak(["--db", path, *cmd]) for cmd in
                      (["status", "--limit", "0", "--json"], ["stalls", "--now", "2100-01-01T00:00:00Z",
                                                               "--limit", "0", "--json"])])
    print(f"status/stalls peaks: {peaks}")
    for small, large in zip(*peaks):
        assert large < small * 1.3 + 200_000, peaks
