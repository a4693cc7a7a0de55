"""'handoff log' without RUN (Ledger.events): the ledger in position order, filtered, followed.

On every backend the events come through the storage interface only (read_all, or
read_run per --run merged by position), so what each filter returns is compared with a
plain filter of read_all. The CLI's four outputs carry the same rows; --follow is a real
process that sees an event written after it started and stops on SIGINT; memory stays flat.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import time

import pytest

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput, UnknownRun
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor
from handoff.watchdog import watch_once
from tests.cli.test_listings import _peak
from tests.ledger.conformance import assert_unchanged, refused, snapshot
from tests.support import Clock, Handoff, executable


def _two_runs(lg: Ledger, clock: Clock) -> None:
    """Two runs written in turns, a fork, and a watcher's beat: an incident across streams.

    Each beat carries attrs of its own, so the log records every one (a beat that only says
    "alive" again is kept beside the log): the streams interleave event by event."""
    lg.open(run_id="a", goal="First", target="chat:#ops", owner="alice", heartbeat_timeout_s=5)
    lg.open(run_id="b", goal="Second", target="chat:#ops", owner="bob")
    ta = lg.claim("a", "w1")
    tb = lg.claim("b", "w2")
    for i in range(3):
        clock.advance(2)
        assert lg.heartbeat("a", ta, attrs={"step": i}).result.outcome == "committed"
        assert lg.heartbeat("b", tb, attrs={"step": i}).result.outcome == "committed"
    lg.transition("b", tb, "planning")
    clock.advance(10)
    watch_once(lg, name="ops", now_us=clock(), interval_s=5)  # revokes a's lease
    lg.fork("b", 5, new_run_id="b.f", by="bob")


@pytest.fixture
def across(backend):
    clock = Clock()
    lg = backend.ledger(clock)
    _two_runs(lg, clock)
    return lg, backend


def test_position_order_and_every_filter_match_a_plain_read(across):
    lg, _ = across
    every = list(lg.store.read_all())
    assert [r.position for r in lg.events()] == [r.position for r in every]
    assert {r.run_id for r in every} == {"a", "b", "b.f", "watcher:ops"}

    def same(got, keep):
        assert [r.position for r in got] == [r.position for r in every if keep(r)]

    same(lg.events(types=("lease_revoked", "run_forked")), lambda r: r.type in ("lease_revoked", "run_forked"))
    same(lg.events(actors=("watchdog:ops",)), lambda r: r.actor == "watchdog:ops")
    same(lg.events(actors=("w2", "owner:alice")), lambda r: r.actor in ("worker:w2", "owner:alice"))
    same(lg.events(runs=("b.f", "a")), lambda r: r.run_id in ("a", "b.f"))
    same(lg.events(runs=("a",), types=("heartbeat_recorded",)), lambda r: r.run_id == "a" and r.type == "heartbeat_recorded")
    same(lg.events(since_position=4, until_position=9), lambda r: 4 <= r.position <= 9)
    t1, t2 = every[5].recorded_us, every[10].recorded_us
    same(lg.events(since_us=t1, until_us=t2), lambda r: t1 <= r.recorded_us <= t2)
    same(lg.events(since_position=10**6), lambda r: False)


def test_refusals_are_typed_and_write_nothing(across):
    lg, _ = across
    with refused(lg.store, InvalidInput, "no event type 'lease_stolen'"):
        list(lg.events(types=("lease_stolen",)))
    with refused(lg.store, UnknownRun, "no run ghost"):
        list(lg.events(runs=("ghost",)))
    with refused(lg.store, InvalidInput, "since"):
        list(lg.events(since_us=10**20))
    with refused(lg.store, InvalidInput, "tuple or list"):
        list(lg.events(runs="a"))


def test_the_cli_prints_the_same_rows_four_ways(across):
    lg, backend = across
    if not backend.shared:
        pytest.skip(f"{backend.name}: another process cannot open this ledger")
    address = backend.address()
    clock = Clock()
    _two_runs(backend.ledger(clock, address), clock)
    h = Handoff(address)
    doc = h.json("log")
    rows = doc["events"]
    assert doc["next"] is None and [r["position"] for r in rows] == sorted(r["position"] for r in rows)
    assert set(rows[0]) == {"run_id", "seq", "position", "at", "actor", "lease", "type", "key", "summary", "data", "db_role"}
    jsonl = [json.loads(line) for line in h("log", "--jsonl").stdout.splitlines()]
    assert jsonl == rows
    table = [c["position"] for c in csv.DictReader(io.StringIO(h("log", "--csv").stdout))]
    assert table == [str(r["position"]) for r in rows]
    parsed = list(csv.DictReader(io.StringIO(h("log", "--csv", "--run", "b.f").stdout)))
    assert [json.loads(p["data"]) for p in parsed] == [r["data"] for r in rows if r["run_id"] == "b.f"]
    text = h("log", "--no-heartbeats").stdout.splitlines()
    said = ["DB", "ROLE"] if lg.store.records_roles else []  # the server's word on who inserted each
    assert text[0].split() == ["POSITION", "TIME", "RUN", "SEQ", "ACTOR", "LEASE", "TYPE", "SUMMARY", *said]
    assert len(text) == 1 + sum(r["type"] != "heartbeat_recorded" for r in rows)
    # Pages: --limit, then --since the position the last line names.
    page = h.json("log", "--limit", "5")
    assert [r["position"] for r in page["events"]] == [r["position"] for r in rows[:5]]
    rest = h.json("log", "--since", str(page["next"]))
    assert page["events"] + rest["events"] == rows
    assert f"--since {page['next']}" in h("log", "--limit", "5").stdout.splitlines()[-1]
    # A time bound is inclusive, as a position is.
    at = rows[7]["at"]
    assert [r["position"] for r in h.json("log", "--since", at)["events"]][0] <= rows[7]["position"]
    assert all(r["at"] <= at for r in h.json("log", "--until", at)["events"])


@pytest.mark.parametrize("args, words", [
    (["log", "a", "--since", "3"], "leave out RUN"),
    (["log", "a", "--follow"], "leave out RUN"),
    (["log", "--after", "3"], "--since POSITION"),
    (["log", "--follow", "--json"], "--jsonl or --csv"),
    (["log", "--csv", "--jsonl"], "not both"),
    (["log", "--type", "lease_stolen"], "no event type"),
    (["log", "--since", "yesterday"], "ISO 8601"),
])
def test_cli_usage_errors_exit_2_and_write_nothing(tmp_path, args, words):
    clock = Clock()
    h = Handoff(str(tmp_path / "ledger.db"))
    with Ledger(h.db, clock=clock) as lg:
        _two_runs(lg, clock)
        before = snapshot(lg.store)
    assert words in h(*args, code=2).stderr
    with Ledger(h.db) as lg:
        assert_unchanged(lg.store, before)


def test_follow_prints_events_written_after_it_started_and_stops_on_sigint(tmp_path):
    db = str(tmp_path / "ledger.db")
    with Ledger(db) as lg:
        lg.open(run_id="a", goal="First", target="chat:#ops", owner="alice")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    proc = subprocess.Popen([*executable(), "--db", db, "log", "--follow", "--jsonl", "--type", "lease_granted"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # it has read the log to its end and waits
        with Ledger(db) as lg:
            lg.claim("a", "w1")
            lg.open(run_id="b", goal="Second", target="chat:#ops", owner="bob")
            lg.claim("b", "w2")
        got = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [(g["run_id"], g["data"]["worker"]) for g in got] == [("a", "w1"), ("b", "w2")]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert out == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_follow_with_a_limit_ends_after_that_many(tmp_path):
    db = str(tmp_path / "ledger.db")
    with Ledger(db) as lg:
        lg.open(run_id="a", goal="First", target="chat:#ops", owner="alice")
        lg.claim("a", "w1")
    h = Handoff(db)
    rows = [json.loads(line) for line in h("log", "--follow", "--limit", "2", "--jsonl").stdout.splitlines()]
    assert [r["type"] for r in rows] == ["handoff_opened", "lease_granted"]


def _many(path: str, events: int) -> None:
    store = SqliteStore(path, synchronous="NORMAL")
    body = [ev.ProgressRecorded(kind="tool_outcome", detail=f"step {i}: ran the tool") for i in range(1000)]
    for i in range(events // 1000):
        run = f"r{i % 4}"
        if store.head(run) is None:
            store.append(run, [ev.HandoffOpened(goal="g", target="t", owner="o")], actor=Actor("owner", "o"))
        store.append(run, body, actor=Actor("worker", "w1"))
    store.close()
    Ledger(path).close()


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sizes")
    small, large = str(tmp / "small.db"), str(tmp / "large.db")
    _many(small, 2_000)
    _many(large, 10_000)
    return small, large


# The output writers are those of 'log RUN' (tests/cli/test_listings.py measures JSON
# and JSONL there); here the reading across streams is measured, with the table and CSV.
@pytest.mark.parametrize("fmt", [[], ["--csv"]])
def test_memory_stays_flat_whatever_the_size_of_the_log(two_sizes, fmt):
    small, large = two_sizes
    p_small = _peak(["--db", small, "log", *fmt])
    p_large = _peak(["--db", large, "log", *fmt])
    print(f"log (all runs) {fmt}: peak {p_small / 1e6:.2f} MB at 2k events, {p_large / 1e6:.2f} MB at 10k")
    assert p_large < p_small * 1.3 + 200_000, (p_small, p_large)


def test_status_says_what_it_hides_and_how_to_see_it(tmp_path):
    clock = Clock()
    h = Handoff(str(tmp_path / "ledger.db"))
    with Ledger(h.db, clock=clock) as lg:
        _two_runs(lg, clock)
        lg.close_run("b.f", "cancelled", by="bob")
        lg.close_run("a", "no_op", by="alice")
    text = h("status").stdout
    assert "b " in text and "b.f" not in text
    last = text.strip().splitlines()[-1]
    assert "2 runs that ended" in last and "--all" in last
    assert h.json("status")["hidden_terminal"] == 2
    doc = h.json("status", "--all")
    assert doc["hidden_terminal"] == 0 and {r["run_id"] for r in doc["runs"]} == {"a", "b", "b.f"}
    assert "that ended" not in h("status", "--all").stdout
    assert h.json("status", "--owner", "alice")["hidden_terminal"] == 1
    with Ledger(h.db, clock=clock) as lg:
        lg.close_run("b", "cancelled", by="bob")
    assert h("status").stdout.splitlines()[:1] == ["no runs that are not terminal match"]


def test_csv_shows_a_formula_as_text_and_keeps_the_event_exact(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    with Ledger(h.db) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim("r1", "w1")
        lg.transition("r1", lease, "planning", worker="w1")
        lg.transition("r1", lease, "executing", worker="w1", key="@SUM(A1)")
        lg.effect_start("r1", lease, '=HYPERLINK("http://127.0.0.1:9")', "a send", worker="w1")
    rows = {r["type"]: r for r in csv.DictReader(io.StringIO(h("log", "--csv", "--run", "r1").stdout))}
    effect = rows["side_effect_started"]
    assert effect["summary"].startswith("'=HYPERLINK") and rows["state_changed"]["key"] == "'@SUM(A1)"
    assert json.loads(effect["data"])["key"] == '=HYPERLINK("http://127.0.0.1:9")'  # the event, exactly
    assert effect["actor"] == "worker:w1" and rows["lease_granted"]["summary"] == "w1 holds lease 1"
