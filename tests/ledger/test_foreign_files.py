"""A file that is not a ledger is named as such; only a ledger that was damaged is "damaged".

``--db /etc/passwd`` used to be called a damaged ledger to restore from a backup, which
sends a person looking for a backup of a file that never was a ledger. The store tells
the two apart by SQLite's 16-byte header and by the ledger's marker table
(``handoff_meta``): no header and no marker is not a ledger; a marker behind a broken
header, or a readable header over unreadable pages, is a damaged ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess

import pytest

from handoff.facade import Ledger
from handoff.ledger.errors import CorruptLedger, NotALedger
from tests.support import executable


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def ledger_file(tmp_path) -> str:
    path = str(tmp_path / "real.db")
    with Ledger(path) as lg:
        lg.open(goal="g", target="t", owner="alice", run_id="r1")
    return path


def _foreign(tmp_path, kind: str) -> str:
    path = str(tmp_path / f"{kind}.file")
    if kind == "passwd":
        shutil.copy("/etc/passwd", path)
    elif kind == "text":
        with open(path, "w") as f:
            f.write("hello\n")
    elif kind == "mentions":  # names the project and its marker table, as its own docs do
        with open(path, "w") as f:
            f.write("handoff-ledger keeps a handoff_meta table with format = handoff-ledger\n" * 50)
    elif kind == "binary":
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * 64)
    elif kind == "other_sqlite":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        conn.commit()
        conn.close()
    return path


@pytest.mark.parametrize("kind", ["passwd", "text", "mentions", "binary"])
def test_a_file_that_is_not_sqlite_is_not_a_ledger_not_a_damaged_one(tmp_path, kind):
    path = _foreign(tmp_path, kind)
    before = _bytes(path)
    for readonly in (False, True):
        with pytest.raises(NotALedger) as info:
            Ledger(path, readonly=readonly, create=not readonly)
        msg = info.value.message
        assert "not a handoff ledger" in msg and "not a database" in msg, msg
        assert "backup" not in msg and "damaged" not in msg and "verify" not in msg, msg
        assert "--db" in msg and "HANDOFF_DB" in msg, msg  # what to check next
        assert info.value.exit_code == 3
    assert _bytes(path) == before, "a refused open must leave the file as it was"
    assert not os.path.exists(path + "-wal") and not os.path.exists(path + "-shm")


def test_etc_passwd_through_the_real_executable(tmp_path):
    before = _bytes("/etc/passwd")
    proc = subprocess.run([*executable(), "--db", "/etc/passwd", "status", "--json"], capture_output=True,
                          text=True, env={**os.environ, "HANDOFF_DB": ""})
    assert proc.returncode == 3 and proc.stdout == ""
    err = json.loads(proc.stderr)["error"]
    assert err["type"] == "NotALedger" and "not a handoff ledger" in err["message"], err
    assert "backup" not in err["message"]
    assert _bytes("/etc/passwd") == before


def test_another_sqlite_database_is_still_not_a_ledger(tmp_path):
    path = _foreign(tmp_path, "other_sqlite")
    with pytest.raises(NotALedger, match="not a handoff ledger"):
        Ledger(path)


def test_a_ledger_with_a_broken_header_is_damaged(ledger_file):
    with open(ledger_file, "r+b") as f:
        f.write(b"SQLite format 4\x00")
    before = _bytes(ledger_file)
    with pytest.raises(CorruptLedger) as info:
        Ledger(ledger_file)
    assert "damaged" in info.value.message and "backup" in info.value.message
    assert _bytes(ledger_file) == before


def test_a_ledger_cut_short_is_damaged_not_foreign(ledger_file):
    with open(ledger_file, "r+b") as f:
        f.truncate(os.path.getsize(ledger_file) // 3)
    with pytest.raises(CorruptLedger, match="damaged"):
        with Ledger(ledger_file) as lg:
            lg.verify()


def _garble_schema_page(path: str) -> None:
    with open(path, "r+b") as f:  # keep SQLite's 100-byte header, spoil the rest of page 1
        f.seek(100)
        f.write(b"\xff" * 3996)


def test_a_ledger_whose_schema_page_is_spoiled_is_damaged(ledger_file):
    _garble_schema_page(ledger_file)
    with pytest.raises(CorruptLedger, match="damaged"):
        Ledger(ledger_file, readonly=True)


def test_a_foreign_sqlite_file_whose_schema_page_is_spoiled_is_not_a_ledger(tmp_path):
    path = _foreign(tmp_path, "other_sqlite")
    _garble_schema_page(path)
    with pytest.raises(NotALedger, match="no ledger marker"):
        Ledger(path, readonly=True)
