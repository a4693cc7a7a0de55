"""``check`` names every difference between the kept views and a fresh fold: a changed
column, a missing row, an extra row of a run, a row for a run the log does not hold, a row
naming a watcher's stream, a run that cannot be folded. It walks the runs a page at a
time, so the walk is exercised here with pages of two runs."""

from __future__ import annotations

import sqlite3

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger.sqlite import sqlite_store
from handoff.ledger.store import Actor
from handoff.projections.engine import BY_NAME, NEEDS_REBUILD
from handoff.reducers.checkpoint import Evidence

from tests.support import Clock


def _tamper(path: str, *sql: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for stmt in sql:
        conn.execute(stmt)
    conn.close()


def test_check_names_each_kind_of_difference_in_order(clocked_lg, monkeypatch):
    monkeypatch.setattr(sqlite_store, "PAGE", 2)
    for run in ("a", "b", "c", "d", "e"):
        clocked_lg.open(goal="g", target="chat:#ops", owner="alice", run_id=run)
    clocked_lg.claim("b", "w1")
    clocked_lg.watcher_beat("wd-1", 30)
    assert clocked_lg.check() == []
    _tamper(
        clocked_lg.store.path,
        "UPDATE checkpoints SET state = 'executing' WHERE run_id = 'c'",   # a changed column
        "DELETE FROM stall_watch WHERE run_id = 'a'",                      # a missing row
        "INSERT INTO owner_load VALUES ('mallory', 'b', 9)",               # an extra row of a run
        "INSERT INTO owner_load VALUES ('alice', 'ghost', 1)",             # a run the log lacks
        "INSERT INTO deliveries (run_id, target, status, attempts) "
        "VALUES ('watcher:wd-1', 'x', 'ready', 0)",                        # a watcher's stream
    )
    assert clocked_lg.check() == [
        {"projection": "checkpoints", "run_id": "c", "column": "state", "kept": "executing", "folded": "queued"},
        {"projection": "stall_watch", "run_id": "a", "column": None, "kept": None, "folded": "row"},
        {"projection": "deliveries", "run_id": "watcher:wd-1", "column": None, "kept": "row", "folded": None},
        {"projection": "owner_load", "run_id": "b", "column": None, "kept": "row", "folded": None},
        {"projection": "owner_load", "run_id": "ghost", "column": None, "kept": "row", "folded": None},
    ]
    clocked_lg.rebuild()
    assert clocked_lg.check() == []


def test_a_run_that_cannot_be_folded_is_reported_once_per_view_and_the_walk_goes_on(clocked_lg, monkeypatch):
    monkeypatch.setattr(sqlite_store, "PAGE", 2)
    for run in ("a", "b", "c"):
        clocked_lg.open(goal="g", target="chat:#ops", owner="alice", run_id=run)
    clocked_lg.store.append("b", [ev.ProgressRecorded(kind="note", detail="x")], actor=Actor("operator", "op"))
    _tamper(
        clocked_lg.store.path,
        "DROP TRIGGER events_no_update",
        "UPDATE events SET payload = x'7b' WHERE run_id = 'b' AND seq = 2",
        "UPDATE checkpoints SET owner = 'bob' WHERE run_id = 'c'",
    )
    diffs = clocked_lg.check()
    assert [(d["projection"], d["run_id"]) for d in diffs if d["run_id"] == "b"] == [
        ("checkpoints", "b"), ("stall_watch", "b"), ("deliveries", "b"), ("owner_load", "b"),
    ]
    assert all(d["folded"].startswith("unfoldable: event b seq 2 (position") for d in diffs if d["run_id"] == "b")
    assert [d for d in diffs if d["run_id"] != "b"] == [
        {"projection": "checkpoints", "run_id": "c", "column": "owner", "kept": "bob", "folded": "alice"},
    ]


def test_views_kept_by_an_older_fold_are_refolded_on_the_next_writable_open(tmp_path):
    """Version 1 of the checkpoints view kept every evidence record in the packet. A
    ledger written then is read correctly as it is (read-only: delivery still ready), and
    its views are refolded to the current version by the first writable open."""
    import msgspec

    from handoff.projections import queries, view_rows

    path = str(tmp_path / "ledger.db")
    result = tmp_path / "report.md"
    result.write_text("the report")
    clocked_lg = Ledger(path, clock=Clock(step_us=0))
    clocked_lg.open(goal="g", target="chat:#ops", owner="alice", run_id="r1")
    lease = clocked_lg.claim("r1", "w1")
    clocked_lg.transition("r1", lease, "planning", worker="w1")
    clocked_lg.progress("r1", lease, "plan_committed", "p", worker="w1")
    clocked_lg.transition("r1", lease, "executing", worker="w1")
    clocked_lg.transition("r1", lease, "verifying", worker="w1")
    clocked_lg.artifact("r1", lease, str(result), worker="w1")
    clocked_lg.evidence("r1", "tests", "fail", "1 failed", lease=lease)
    clocked_lg.evidence("r1", "tests", "pass", "all passed", lease=lease)
    clocked_lg.submit("r1", lease, "done", worker="w1")
    current = queries.checkpoint(clocked_lg.store, "r1")
    clocked_lg.close()
    # What version 1 kept: both records, in order, and no version table.
    with Ledger(path, readonly=True) as ro:
        every = tuple(
            Evidence(r.event.kind, r.event.outcome, r.event.detail, r.seq)
            for r in ro.store.read_run("r1") if r.type == "evidence_recorded"
        )
    assert [e.outcome for e in every] == ["fail", "pass"] and len(current.evidence) == 1
    old_packet = view_rows.encode_checkpoint(msgspec.structs.replace(current, evidence=every))
    _tamper(path, "DROP TABLE projection_versions")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE checkpoints SET packet = ? WHERE run_id = 'r1'", (old_packet,))
    conn.close()

    with Ledger(path, readonly=True) as ro:
        status = ro.status("r1")
        assert [e["outcome"] for e in status["evidence"]] == ["fail", "pass"]  # kept as it was
        assert status["delivery"]["status"] == "ready"  # the latest outcome per kind still counts
        # Kept by another version of the fold: one "needs rebuild" per view, not a
        # difference per row that the new fold gives otherwise.
        assert [(d["projection"], d["run_id"], d["folded"]) for d in ro.check()] == [
            (name, None, NEEDS_REBUILD) for name in BY_NAME]

    with Ledger(path) as rw:  # a writable open refolds what an older version kept
        assert rw.check() == []
        assert [e["outcome"] for e in rw.status("r1")["evidence"]] == ["pass"]
        assert rw.status("r1")["delivery"]["status"] == "ready"
    conn = sqlite3.connect(path)
    assert dict(conn.execute("SELECT name, version FROM projection_versions"))["checkpoints"] == BY_NAME["checkpoints"].version
    conn.close()
