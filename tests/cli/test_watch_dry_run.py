"""``watch --once --dry-run`` shows what the watchdog would do and records nothing.

``watch --once --now T`` used to record real decisions (it revoked a live worker's
lease) although the docs said it showed what the watchdog would do. A dry run runs the
same classification, plan and write transaction, and rolls the transaction back; the
whole file (log, heads, every projection table) is the same afterwards. ``--now``
without ``--dry-run`` is refused unless ``--commit`` says the decisions are meant.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess

import pytest

from handoff.render import iso as _iso
from handoff.facade import Ledger
from handoff.watchdog import watch_once
from tests.support import executable, working_run


FAR = "2100-01-01T00:00:00Z"


def _tables(db: str) -> dict[str, list[tuple]]:
    """Every row of every table, read on a connection of its own."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {n: conn.execute(f'SELECT * FROM "{n}" ORDER BY rowid').fetchall() for n in names}
    finally:
        conn.close()


def _file(db: str) -> bytes:
    with open(db, "rb") as f:
        return f.read()


def _hx(db: str, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    proc = subprocess.run([*executable(), "--db", db, *args], capture_output=True, text=True, env=env)
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture
def db(tmp_path) -> str:
    path = str(tmp_path / "l.db")
    with Ledger(path) as lg:
        lease = working_run(lg, "live", heartbeat_timeout_s=60, progress_timeout_s=3600)
        lg.heartbeat("live", lease, worker="w1")  # alive now; silent only as of the far future
        working_run(lg, "idle", owner="bob", heartbeat_timeout_s=3600, progress_timeout_s=1)
    return path


def test_dry_run_at_a_future_time_records_nothing_and_says_what_it_would_do(db):
    tables, raw = _tables(db), _file(db)
    doc = json.loads(_hx(db, "watch", "--once", "--name", "wd", "--now", FAR, "--dry-run", "--json").stdout)
    assert doc["dry_run"] is True and doc["watcher"] == "wd"
    got = {(a["run_id"], a["action"]): a for a in doc["actions"]}
    assert got[("live", "revoke_lease")]["outcome"] == "would_commit"
    assert got[("live", "revoke_lease")]["seq"] is None and got[("live", "revoke_lease")]["lease"] == 1
    assert {a["outcome"] for a in doc["actions"]} == {"would_commit"}
    assert _tables(db) == tables, "a dry run changed a table"
    assert _file(db) == raw, "a dry run changed the ledger file's bytes"
    with Ledger(db) as lg:
        assert lg.status("live")["lease"] == 1 and lg.status("live")["monitored"]["watchers"] == []
        assert lg.verify() == [] and lg.check() == []

    text = _hx(db, "watch", "--once", "--name", "wd", "--now", FAR, "--dry-run").stdout
    assert "dry run: live unavailable -> revoke_lease" in text and "[would record this]" in text
    assert "nothing recorded" in text
    assert _tables(db) == tables

    # What the dry run announced is what a real pass at that time then records.
    real = json.loads(_hx(db, "watch", "--once", "--name", "wd", "--now", FAR, "--commit", "--json").stdout)
    assert "dry_run" not in real
    assert {(a["run_id"], a["action"], a["key"]) for a in real["actions"]} == {
        (a["run_id"], a["action"], a["key"]) for a in doc["actions"]}
    assert {a["outcome"] for a in real["actions"]} == {"committed"}
    with Ledger(db) as lg:
        assert lg.status("live")["lease"] is None


@pytest.mark.parametrize("args, says", [
    (["--now", FAR], "--dry-run"),
    (["--now", FAR, "--dry-run", "--commit"], "choose one"),
    (["--commit"], "--commit only goes with --now"),
])
def test_now_without_an_explicit_choice_is_refused_and_writes_nothing(db, args, says):
    tables = _tables(db)
    proc = _hx(db, "watch", "--once", "--name", "wd", *args, code=2)
    assert says in proc.stderr, proc.stderr
    assert _tables(db) == tables


def test_dry_run_needs_once(db):
    tables = _tables(db)
    proc = _hx(db, "watch", "--name", "wd", "--dry-run", code=2)
    assert "--once" in proc.stderr
    assert _tables(db) == tables


def test_the_api_dry_run_reports_duplicates_after_a_real_pass(db):
    with Ledger(db) as lg:
        later = lg.checkpoint("idle").last_event_us + 5_000_000  # idle stalls; live is still fresh
        first = watch_once(lg, name="wd", now_us=later)
        assert [(a.run_id, a.action, a.outcome) for a in first] == [
            ("idle", "observe", "committed"), ("idle", "mark_stalled", "committed")]
        before = list(lg.store.read_all())
        seen: list = []
        again = watch_once(lg, name="wd", now_us=later, dry_run=True, on_action=seen.append)
        assert [(a.action, a.outcome) for a in again] == [("observe", "duplicate"), ("mark_stalled", "duplicate")]
        assert [a.seq for a in again] == [a.seq for a in first] and seen == again
        assert list(lg.store.read_all()) == before


def test_dry_run_of_a_stall_previews_both_actions(db):
    """A stalled run gets an observation and a mark; the preview names both and writes neither."""
    with Ledger(db) as lg:
        when = lg.checkpoint("idle").last_event_us + 5_000_000
        tables = _tables(db)
        got = watch_once(lg, name="wd", now_us=when, dry_run=True)
        assert [(a.run_id, a.action, a.outcome) for a in got] == [
            ("idle", "observe", "would_commit"), ("idle", "mark_stalled", "would_commit")]
        assert _tables(db) == tables
    text = _hx(db, "watch", "--once", "--name", "wd", "--now", _iso(when), "--dry-run").stdout
    assert text.count("[would record this]") == 2 and "a pass would record 2 actions" in text
