"""An interrupted 'handoff export --sqlite' (handoff/sqlite_export.py): nothing half-written.

A new copy is built under a private name and appears at its own name only when complete,
so an export stopped part-way (an exception, Ctrl-C, SIGKILL) leaves no file there. An
export into an existing copy is one transaction: stopped, it leaves the copy as it was,
and the next export brings it fully up to date, runs included.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger.store import Actor
from handoff.sqlite_export import BATCH

WORKER = Actor("worker", "w1")


class Stop(Exception):
    """Raised from the progress callback: the export stops between two batches."""


def _stop(done: int, total: int) -> None:
    raise Stop(f"stopped at {done} of {total}")


def _ledger(path: str) -> Ledger:
    """Two runs, and more events than one batch of the export."""
    lg = Ledger(path, create=True)
    for rid in ("r0", "r1"):
        lg.open(run_id=rid, goal=f"goal of {rid}", target="t", owner="alice")
    _grow(lg, "r1")
    return lg


def _grow(lg: Ledger, run_id: str) -> None:
    lg.store.append(run_id, [ev.ProgressRecorded(kind="tool_outcome", detail=f"step {i}")
                             for i in range(BATCH + BATCH // 2)], actor=WORKER)


def _q(path, sql):
    with sqlite3.connect(path) as c:
        return c.execute(sql).fetchall()


def test_a_new_copy_stopped_part_way_leaves_no_file(tmp_path):
    with _ledger(str(tmp_path / "l.db")) as lg:
        out = tmp_path / "copy.db"
        before = sorted(os.listdir(tmp_path))
        with pytest.raises(Stop):
            lg.export_sqlite(str(out), progress=_stop)
        assert sorted(os.listdir(tmp_path)) == before  # no copy, no private file left over
        doc = lg.export_sqlite(str(out))
        assert doc["events"] == lg.store.last_position() == _q(out, "SELECT count(*) FROM events")[0][0]


def test_an_export_into_a_copy_stopped_part_way_leaves_it_as_it_was(tmp_path):
    with _ledger(str(tmp_path / "l.db")) as lg:
        out = tmp_path / "copy.db"
        lg.export_sqlite(str(out))
        data = out.read_bytes()
        # r0 ends in the first batch of the next export; more than a batch follows.
        lg.close_run("r0", "cancelled", by="alice")
        _grow(lg, "r1")
        with pytest.raises(Stop):
            lg.export_sqlite(str(out), progress=_stop)
        assert out.read_bytes() == data
        # Run again, it copies everything since, and the run that ended has its final row.
        doc = lg.export_sqlite(str(out))
        assert _q(out, "SELECT count(*), max(position) FROM events")[0] == (lg.store.last_position(),) * 2
        assert doc["last_position"] == lg.store.last_position()
        assert _q(out, "SELECT run_id, state FROM runs ORDER BY run_id") == [
            ("r0", "cancelled"), ("r1", lg.checkpoint("r1").state)]
        assert _q(out, "PRAGMA foreign_key_check") == []


_CHILD = """
import sys
from handoff import Ledger

def hold(done, total):
    print(done, flush=True)
    sys.stdin.read()  # until the parent kills this process

with Ledger(sys.argv[1]) as lg:
    lg.export_sqlite(sys.argv[2], progress=hold)
"""


def test_a_new_copy_killed_part_way_leaves_no_file(tmp_path):
    db, out = str(tmp_path / "l.db"), tmp_path / "copy.db"
    _ledger(db).close()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, db, str(out)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert int(child.stdout.readline()) == BATCH  # one batch written, the next not yet
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
        child.stdin.close()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert not out.exists()
    # What the killed export left (a private directory) is no obstacle to the next one.
    with Ledger(db) as lg:
        assert lg.export_sqlite(str(out))["events"] == lg.store.last_position()
