"""'handoff runs' and Ledger.runs_page: the run list with filters, paged.

Each filter's answer is checked against the runs' own packets (the fold), on both
backends for the library, and through the CLI; memory stays flat as the ledger grows.
"""

from __future__ import annotations

import json

import pytest

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput
from handoff.ledger.store import Actor
from handoff.ledger.sqlite import SqliteStore
from handoff.reducers import stall
from tests.ledger.conformance import refused

from tests.support import working_run
from .test_listings import _peak

NOW_US = 4_102_444_800_000_000  # 2100-01-01: every leased run is long silent


@pytest.fixture
def backend_ledger(backend):
    lg = Ledger(store=backend.new_store())
    yield lg
    lg.close()


def _mix(lg: Ledger) -> None:
    """Runs of two owners, two workers and targets; some live, some ended, some unleased."""
    for i in range(12):
        owner, target = ("alice", "chat:#ops") if i % 2 else ("bob", "mail:x")
        rid = f"r{i:02d}"
        lg.open(run_id=rid, goal=f"goal {i}", target=target, owner=owner)
        if i % 3:
            lease = lg.claim(rid, f"w{i % 2}")
            lg.transition(rid, lease, "planning", worker=f"w{i % 2}")
        if i % 4 == 0:
            lg.close_run(rid, "cancelled", by=owner)


def _expected(lg: Ledger, **want):
    out = []
    for cp in lg.iter_runs(include_terminal=True):
        h = stall.classify(cp, now_us=NOW_US).classification
        if all([
            "states" not in want or cp.state in want["states"],
            "owner" not in want or cp.owner == want["owner"],
            "worker" not in want or cp.worker == want["worker"],
            "target" not in want or cp.target == want["target"],
            "health" not in want or h in want["health"],
            "opened_after" not in want or cp.opened_us >= want["opened_after"],
            "opened_before" not in want or cp.opened_us <= want["opened_before"],
            want.get("include_terminal", True) or not cp.terminal,
        ]):
            out.append(cp.run_id)
    return out


@pytest.mark.parametrize("want", [
    {}, {"owner": "alice"}, {"worker": "w1"}, {"target": "mail:x", "owner": "bob"}, {"states": ("planning",)},
    {"health": ("unavailable",)}, {"health": ("unclaimed", "unavailable"), "owner": "bob"},
    {"include_terminal": False}, {"states": ("cancelled",)}, {"opened_after": "mid"}, {"opened_before": "mid"},
])
@pytest.mark.parametrize("limit", [1, 5, 100])
def test_each_filter_lists_what_the_packets_say(backend_ledger, want, limit):
    lg = backend_ledger
    _mix(lg)
    if "opened_after" in want or "opened_before" in want:
        times = sorted(cp.opened_us for cp in lg.iter_runs(include_terminal=True))
        want = {k: times[len(times) // 2] for k in want}
    expected = _expected(lg, **want)
    kw = {"include_terminal": True, **want}
    seen, after = [], None
    while True:
        page = lg.runs_page(limit=limit, after=after, now=NOW_US, **kw)
        seen += [cp.run_id for cp in page.items]
        assert page.more == len(expected) - len(seen)
        if page.next is None:
            break
        after = page.next
    assert seen == expected
    assert [cp.run_id for cp in lg.iter_runs(now=NOW_US, **kw)] == expected


def test_a_health_that_does_not_exist_is_refused(backend_ledger):
    lg = backend_ledger
    _mix(lg)
    with refused(lg.store, InvalidInput, "no health 'stuck'"):
        lg.runs_page(health=("stuck",))
    with refused(lg.store, InvalidInput, "opened_after"):
        lg.runs_page(opened_after="yesterday")


def test_the_cli_lists_filters_and_pages(h):
    with h.ledger() as lg:
        _mix(lg)
        expected = _expected(lg, owner="alice", health=("unavailable",))
    args = ["runs", "--owner", "alice", "--health", "unavailable", "--now", "2100-01-01T00:00:00Z"]
    doc = h.json(*args)
    assert [r["run_id"] for r in doc["runs"]] == expected and doc["next"] is None
    assert all(r["opened_at"] and r["health"] == "unavailable" for r in doc["runs"])
    first = h.json(*args, "--limit", "1")
    assert first["more"] == len(expected) - 1 and first["next"] == expected[0]
    text = h(*args, "--limit", "1").stdout
    assert f"--after {expected[0]}" in text and "--now 2100-01-01T00:00:00Z" not in text.split("--after")[0]
    assert h.json("runs", "--live")["runs"] == [r for r in h.json("runs")["runs"] if r["state"] != "cancelled"]
    assert "no runs match" in h("runs", "--worker", "nobody").stdout


def test_runs_memory_does_not_grow_with_the_number_of_runs(tmp_path):
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
                      (["runs", "--limit", "0", "--json"],
                       ["runs", "--health", "unavailable", "--now", "2100-01-01T00:00:00Z", "--limit", "0", "--json"],
                       ["runs", "--limit", "0", "--format", "csv"])])
    print(f"runs peaks: {peaks}")
    for small, large in zip(*peaks):
        assert large < small * 1.3 + 200_000, peaks
