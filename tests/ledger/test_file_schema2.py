"""File schema 2: a ledger of schema 1 upgraded in place, and writes that keep no tracking row.

The fixture (fixtures/ledger_file1.sql, made by fixtures/make_ledger_file1.py on the code
that wrote schema 1) holds runs in every shape the views tell apart and ends with one
event a bare store wrote, so its views lag the log by one position, as an older tool
could leave them. Under schema 2 an inline write that keeps every projection writes no
tracking row; a write that does not is marked in views_unkept (ledger/sqlite/sqlite_store.py).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.sqlite import sqlite_schema as sq
from handoff.ledger.sqlite import UNKEPT, SqliteStore
from handoff.ledger.store import Actor
from handoff.projections import engine
from handoff.reducers import stall
from handoff.reducers.checkpoint import AGGREGATE
from tests.support import file_from_dump

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "ledger_file1.sql")
NAMES = [p.name for p in engine.PROJECTIONS]
FAR = 2_000_000_000_000_000


@pytest.fixture
def old_file(tmp_path) -> str:
    return file_from_dump(FIXTURE, tmp_path / "file1.db")


def raw(path: str, sql: str, args: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def schema(path: str) -> int:
    return int(raw(path, "SELECT value FROM handoff_meta WHERE key='schema_version'")[0][0])


def events(path: str) -> list[tuple]:
    return raw(path, "SELECT position, run_id, seq, type, actor, lease, idem_key, idem_digest, batch_size, "
                     "recorded_us, schema_version, payload, prev_hash, hash, global_hash FROM events ORDER BY position")


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def verdicts(lg: Ledger, now: int) -> dict[str, stall.Health]:
    want = {}
    for head in lg.store.list_runs():
        cp = lg.store.fold(head.run_id, AGGREGATE)
        h = stall.classify(cp, now_us=now)
        if h.needs_attention and cp.opened:  # a stream that is no run (a watcher's) has no view rows
            want[head.run_id] = h
    return want


def test_the_fixture_is_schema_1_with_views_one_write_behind(old_file):
    assert schema(old_file) == 1 and sq.STORE_SCHEMA_VERSION == 2
    assert not raw(old_file, "SELECT 1 FROM sqlite_master WHERE name=?", (UNKEPT,))
    last = raw(old_file, "SELECT max(position) FROM events")[0][0]
    assert set(raw(old_file, "SELECT position FROM projection_positions")) == {(last - 1,)}
    assert raw(old_file, "SELECT run_id FROM events WHERE position=?", (last,)) == [("bare-run",)]


def test_a_read_only_open_reads_it_as_it_is_and_says_what_to_run(old_file):
    before = file_digest(old_file)
    with Ledger(old_file, readonly=True) as lg:
        assert lg.verify() == []
        last = lg.store.last_position()
        # Schema 1's rule: the views are where their tracking rows say, one write behind.
        assert lg.projector.positions() == {n: last - 1 for n in NAMES}
        assert not lg.projector.current  # stall_watch of version 1: the packets are classified
        got = lg.stalls(now=FAR)
        assert {cp.run_id: h for cp, h in got} == verdicts(lg, FAR)
        assert {cp.run_id for cp, _ in got} >= {"working", "stalled", "lost-effect", "attempted"}
        note = lg.store.diagnostics()["upgrade"]
        assert "file schema 1" in note and "handoff doctor" in note and "write access" in note
        assert lg.store.diagnostics()["file_schema"] == 1
        with pytest.raises(E.StoreUnavailable, match="read-only"):
            lg.open(goal="g", target="t", owner="o", run_id="new")
    assert schema(old_file) == 1 and file_digest(old_file) == before


def test_a_writable_open_upgrades_it_and_keeps_every_event(old_file):
    before = events(old_file)
    with Ledger(old_file, readonly=True) as lg:
        folds = {h.run_id: lg.store.fold(h.run_id, AGGREGATE) for h in lg.store.list_runs()}
        head = lg.store.ledger_head()
    with Ledger(old_file) as lg:
        assert lg.store.file_schema == 2 and "upgrade" not in lg.store.diagnostics()
        assert lg.verify() == [] and lg.store.ledger_head() == head
        assert {h.run_id: lg.store.fold(h.run_id, AGGREGATE) for h in lg.store.list_runs()} == folds
        assert lg.check() == []
        last = lg.store.last_position()
        assert lg.projector.positions() == {n: last for n in NAMES}
        assert lg.projector.current
        assert {cp.run_id: h for cp, h in lg.stalls(now=FAR)} == verdicts(lg, FAR)
        assert lg.status("delivered")["state"] == "delivered"
    assert events(old_file) == before  # every event, hash and chain link as it was
    assert schema(old_file) == 2
    assert raw(old_file, f"SELECT * FROM {UNKEPT}") == []  # the catch-up that followed pruned the mark
    with Ledger(old_file, readonly=True) as lg:
        assert "upgrade" not in lg.store.diagnostics() and lg.projector.current


def test_the_upgrade_marks_only_the_views_that_lag(old_file):
    last = raw(old_file, "SELECT max(position) FROM events")[0][0]
    conn = sqlite3.connect(old_file)
    conn.execute("UPDATE projection_positions SET position=? WHERE name='checkpoints'", (last,))
    conn.execute("UPDATE projection_positions SET position=? WHERE name='owner_load'", (last - 5,))
    conn.commit()
    conn.close()
    store = SqliteStore(old_file)  # writable: upgraded, no projector attached, no catch-up
    try:
        assert schema(old_file) == 2
        assert raw(old_file, f"SELECT position, kept FROM {UNKEPT} ORDER BY position") == [
            (last - 4, "checkpoints,deliveries,stall_watch"), (last, "checkpoints")]
        assert store.views.lagging(NAMES, last) == {"stall_watch": last - 1, "deliveries": last - 1,
                                                    "owner_load": last - 5}
    finally:
        store.close()


def test_an_older_version_refuses_the_upgraded_file(old_file, monkeypatch):
    Ledger(old_file).close()
    monkeypatch.setattr(sq, "STORE_SCHEMA_VERSION", 1)
    with pytest.raises(E.SchemaTooNew, match="file schema 2"):
        SqliteStore(old_file)


def test_writes_that_keep_every_view_mark_nothing_and_a_bare_write_is_caught_up(tmp_path):
    path = str(tmp_path / "l.db")
    with Ledger(path) as lg:
        run = lg.open(goal="g", target="t", owner="o", run_id="r1")
        lease = lg.claim(run, "w")
        # a beat whose attrs changed is logged: an inline write of every view, like the two before
        assert lg.heartbeat(run, lease, attrs={"step": 1}).result.outcome == "committed"
        assert raw(path, f"SELECT count(*) FROM {UNKEPT}") == [(0,)]
        assert set(raw(path, "SELECT position FROM projection_positions")) == {(0,)}  # never moved
        assert lg.projector.positions() == {n: lg.store.last_position() for n in NAMES}
    store = SqliteStore(path)  # bare: no projection kept
    try:
        store.append("r1", [ev.ProgressRecorded(kind="note", detail="bare", advances=False)],
                     actor=Actor("worker", "w"))
        last = store.last_position()
        assert raw(path, f"SELECT position, kept FROM {UNKEPT}") == [(last, "")]
        assert store.views.lagging(NAMES, last) == {n: last - 1 for n in NAMES}
    finally:
        store.close()
    with Ledger(path) as lg:  # catches up on open: the bare write's run is refolded
        assert lg.check() == [] and lg.status("r1")["last_seq"] == 4
        assert lg.projector.positions() == {n: last for n in NAMES}
    assert raw(path, f"SELECT count(*) FROM {UNKEPT}") == [(0,)]


def test_a_bare_write_to_a_ledger_without_views_marks_nothing(tmp_path):
    path = str(tmp_path / "bare.db")
    store = SqliteStore(path)
    try:
        store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
    finally:
        store.close()
    assert raw(path, f"SELECT count(*) FROM {UNKEPT}") == [(0,)]
    with Ledger(path) as lg:  # views made over a non-empty log: unbuilt, so folded whole
        assert lg.check() == []
        assert lg.projector.positions() == {n: 1 for n in NAMES}


@pytest.mark.parametrize("argv", [["doctor"], ["stalls"], ["status", "working"]])
def test_any_command_line_verb_upgrades_an_old_file(old_file, argv):
    """The command line opens an existing ledger without ``create`` (only ``init`` makes
    one): that writable open must still upgrade it, or every verb fails on the missing
    views_unkept table, ``doctor`` (the verb the upgrade note names) included."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", old_file, *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr  # 1: stalls found / unhealthy, never 3
    assert "views_unkept" not in done.stderr
    assert schema(old_file) == sq.STORE_SCHEMA_VERSION


def test_an_open_without_create_upgrades_and_a_read_only_one_does_not(old_file):
    with SqliteStore(old_file, readonly=True) as ro:
        assert ro.file_schema == 1
    assert schema(old_file) == 1
    with SqliteStore(old_file, create=False) as store:
        assert store.file_schema == sq.STORE_SCHEMA_VERSION
    assert schema(old_file) == sq.STORE_SCHEMA_VERSION
