"""The WAL-reset mitigation: no checkpoint ever runs beside a commit (docs/architecture.md)."""

import os
import sqlite3

from handoff.ledger import events as ev
from handoff.ledger.sqlite import WAL_CHECKPOINT_BYTES, SqliteStore
from handoff.ledger.store import Actor

OWNER = Actor("owner", "alice")


def _open(store, run_id="r1"):
    store.append(run_id, [ev.HandoffOpened(goal="g", target="t", owner="alice")], actor=OWNER)


def test_automatic_checkpoints_are_off(store):
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_our_wal_checkpoint_needs_the_writer_lock(db_path):
    """While another connection holds the write lock, a WAL checkpoint cannot start.

    That is the property that closes the bug's window: the bug needs a commit to land
    while a second checkpoint is running, and our checkpoints hold the writer lock.
    """
    store = SqliteStore(db_path)
    _open(store)
    other = sqlite3.connect(db_path, isolation_level=None, timeout=0.1)
    other.execute("BEGIN IMMEDIATE")
    try:
        busy, _, _ = store.wal_checkpoint(wait=False)
        assert busy == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    busy, frames, copied = store.wal_checkpoint(wait=False)
    assert busy == 0 and frames == copied  # every frame copied back (RESTART mode)
    store.close()


def test_wal_stays_bounded_under_many_commits(db_path):
    store = SqliteStore(db_path, synchronous="NORMAL")
    _open(store)
    big = "x" * 4000
    for i in range(3000):
        store.append("r1", [ev.ProgressRecorded(kind="note", detail=big)], actor=Actor("worker", "w"))
    # Checked every 64 commits once past the threshold: the WAL never grows far beyond it
    # (RESTART reuses the file from its start; journal_size_limit trims a larger one).
    assert os.path.getsize(db_path + "-wal") < 3 * WAL_CHECKPOINT_BYTES
    assert store.conn.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_CHECKPOINT_BYTES
    assert store.verify() == []
    store.close()
