"""SqliteStore on a real file: what only a file can do (the conformance suite runs on it
through tests/backends.py and tests/ledger/test_store_conformance.py).

Raw ``sqlite3`` connections stand in for other processes and for tamperers; nothing
is mocked.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import time

import pytest

from handoff.ledger import events as ev
from handoff.ledger.errors import (
    CorruptLedger,
    InvalidInput,
    NotALedger,
    SchemaTooNew,
    SeqConflict,
    StaleLease,
    StoreUnavailable,
)
from handoff.ledger.sqlite import APPEND_ONLY_TRIGGERS, WAL_CHECKPOINT_BYTES, SqliteStore
from handoff.ledger.store import AppendResult, Decision, lease_digest
from tests.ledger.conformance import (
    token_secret,
    OWNER,
    W1,
    W2,
    WATCHDOG,
    Count,
    assert_unchanged,
    hb,
    refused,
    snapshot,
    step,
    up_to,
)


# --- helpers ---------------------------------------------------------------------------


def raw(path, **kw) -> sqlite3.Connection:
    return sqlite3.connect(os.fspath(path), isolation_level=None, **kw)


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def populated(path) -> SqliteStore:
    """A ledger with two interleaved runs: a (5 events) and b (4 events)."""
    s = SqliteStore(path)
    s.append("a", [step(1), step(2)], actor=W1)  # a1 a2   pos 1-2
    s.append("b", [step(1)], actor=W2)  # b1      pos 3
    s.append("a", [step(3)], actor=W1)  # a3      pos 4
    s.append("b", [step(2), step(3), step(4)], actor=W2)  # b2-b4   pos 5-7
    s.append("a", [step(4), step(5)], actor=W1)  # a4 a5   pos 8-9
    return s


# --- append-only, by trigger ---------------------------------------------------------


@pytest.mark.parametrize(
    "sql, word",
    [
        ("UPDATE events SET payload = x'00' WHERE position = 2", "UPDATE"),
        ("UPDATE events SET seq = seq + 1", "UPDATE"),
        ("DELETE FROM events", "DELETE"),
        ("DELETE FROM events WHERE position = 3", "DELETE"),
    ],
)
def test_raw_update_and_delete_hit_the_trigger(db_path, sql, word):
    s = populated(db_path)
    before = snapshot(s)
    conn = raw(db_path)
    with pytest.raises(sqlite3.IntegrityError, match=f"append-only: {word} refused"):
        conn.execute(sql)
    conn.close()
    assert_unchanged(s, before)
    assert s.verify() == []
    s.close()


# --- the file itself ---------------------------------------------------------------------


def test_new_ledger_file_is_private(tmp_path):
    old = os.umask(0)  # even with a permissive umask
    try:
        path = tmp_path / "private.db"
        s = SqliteStore(path)
        s.append("r", [hb()], actor=W1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for side in ("-wal", "-shm"):
        side_path = f"{path}{side}"
        if os.path.exists(side_path):
            assert stat.S_IMODE(os.stat(side_path).st_mode) == 0o600, side
    s.close()


def test_reopen_keeps_log_heads_leases_and_keys(db_path):
    s = SqliteStore(db_path)
    secret = token_secret("r", 3)
    s.append("r", [ev.LeaseGranted(worker="w1", lease=3, token_digest=lease_digest(secret))], actor=OWNER)
    three = f"3.{secret}"
    first = s.append("r", [step(1), step(2)], actor=W1, lease=three, idempotency_key="k")
    before = snapshot(s)
    s.close()
    s = SqliteStore(db_path)
    assert_unchanged(s, before)
    assert s.append("r", [step(1), step(2)], actor=W1, lease=three, idempotency_key="k") == AppendResult(
        "r", "duplicate", first.first_seq, first.last_seq, first.positions
    )
    s.append("r", [hb()], actor=W1, lease=three)  # the digest survived the reopen
    with refused(s, StaleLease, match="only grow"):
        s.append("r", [ev.LeaseGranted(worker="w2", lease=3)], actor=OWNER)
    s.append("r", [ev.LeaseRevoked(lease=3, reason="r")], actor=WATCHDOG)
    s.close()
    s = SqliteStore(db_path)
    with refused(s, StaleLease, match="has ended"):
        s.append("r", [hb()], actor=W1, lease=three)
    assert s.verify() == [] and s.integrity_check() == "ok"
    s.close()


def test_two_handles_on_one_file_see_and_fence_each_other(db_path):
    s1, s2 = SqliteStore(db_path), SqliteStore(db_path)
    try:
        one, two = (f"{n}.{token_secret('r', n)}" for n in (1, 2))
        s1.append("r", [ev.LeaseGranted(worker="w1", lease=1, token_digest=lease_digest(token_secret("r", 1)))],
                  actor=OWNER)
        s2.append("r", [ev.LeaseGranted(worker="w2", lease=2, token_digest=lease_digest(token_secret("r", 2)))],
                  actor=OWNER)
        with refused(s1, StaleLease, match="has ended"):
            s1.append("r", [hb()], actor=W1, lease=one)
        with refused(s1, SeqConflict, match="at seq 2"):
            s1.append("r", [hb()], actor=W1, expected_seq=1)
        agg = Count()
        assert s1.execute("r", agg, up_to(3), actor=W1)[1] == 3
        s2.append("r", [hb(), hb()], actor=W2, lease=two)
        # s1's cached fold must be brought forward past s2's writes.
        result, state = s1.execute("r", agg, up_to(10), actor=W1)
        assert (state, result.last_seq) == (6, 6)
        assert list(s1.read_all()) == list(s2.read_all())
    finally:
        s1.close()
        s2.close()


class CommitThenInterleave(SqliteStore):
    """A real store that lets another handle write right after its next COMMIT returns."""

    after_commit = None

    def finish(self, ok, doing):
        super().finish(ok, doing)
        callback, self.after_commit = self.after_commit, None
        if ok and callback is not None:
            callback()


def test_execute_caches_the_state_of_its_own_commit_not_a_later_head(db_path):
    s1, s2 = CommitThenInterleave(db_path), SqliteStore(db_path)
    try:
        agg = Count()
        s1.after_commit = lambda: s2.append("r", [hb()], actor=W2)
        _, state = s1.execute("r", agg, lambda s, h: Decision((hb(),)), actor=W1)
        assert state == 1  # what s1's own command left; s2 wrote after it
        _, state = s1.execute("r", agg, lambda s, h: Decision(()), actor=W1)
        assert state == 2 == s1.fold("r", Count())
    finally:
        s1.close()
        s2.close()


# --- opening what is not a ledger --------------------------------------------------------


def test_foreign_sqlite_database_is_not_a_ledger_and_is_left_alone(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(NotALedger, match="notes") as info:
        SqliteStore(path)
    assert info.value.exit_code == 3
    assert digest(path) == before, "refusing a foreign database must not rewrite it"
    assert sorted(os.listdir(tmp_path)) == ["other.db"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["notes"]
    conn.close()


@pytest.mark.parametrize(
    "content",
    [b"this is not a database at all\n" * 200, os.urandom(8192), b"SQLite format 3\x00" + b"\xff" * 4000],
    ids=["text", "random", "bad-header"],
)
def test_garbage_file_is_refused_untouched(tmp_path, content):
    path = tmp_path / "garbage.db"
    path.write_bytes(content)
    with pytest.raises((NotALedger, CorruptLedger)):
        SqliteStore(path)
    with pytest.raises((NotALedger, CorruptLedger)):
        SqliteStore(path, readonly=True)
    assert path.read_bytes() == content


def test_empty_file_without_create_is_not_a_ledger_and_stays_empty(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(NotALedger, match="empty"):
        SqliteStore(path, create=False)
    assert path.stat().st_size == 0
    # ... and with create (the default) it becomes one.
    with SqliteStore(path) as s:
        s.append("r", [hb()], actor=W1)


def test_meta_table_without_the_format_mark_is_not_a_ledger(tmp_path):
    path = tmp_path / "fake.db"
    conn = raw(path)
    conn.execute("CREATE TABLE handoff_meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO handoff_meta VALUES ('format', 'something-else')")
    conn.close()
    before = digest(path)
    with pytest.raises(NotALedger, match="format mark"):
        SqliteStore(path)
    assert digest(path) == before


def test_newer_schema_is_refused_and_not_touched(db_path):
    populated(db_path).close()
    conn = raw(db_path)
    conn.execute("UPDATE handoff_meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    before = digest(db_path)
    for kw in ({}, {"readonly": True}, {"create": False}):
        with pytest.raises(SchemaTooNew, match="99") as info:
            SqliteStore(db_path, **kw)
        assert info.value.exit_code == 3
    assert digest(db_path) == before


def test_missing_ledger_without_create_is_unavailable(tmp_path):
    path = tmp_path / "absent.db"
    for kw in ({"create": False}, {"readonly": True}):
        with pytest.raises(StoreUnavailable, match="no ledger"):
            SqliteStore(path, **kw)
    assert os.listdir(tmp_path) == []


def test_directory_or_missing_parent_is_refused(tmp_path):
    with pytest.raises(NotALedger, match="regular file"):
        SqliteStore(tmp_path)
    with pytest.raises(StoreUnavailable, match="cannot create"):
        SqliteStore(tmp_path / "no" / "such" / "dir.db")


def test_invalid_synchronous_is_invalid_input(db_path):
    with pytest.raises(InvalidInput, match="FULL or NORMAL"):
        SqliteStore(db_path, synchronous="OFF")  # type: ignore[arg-type]
    assert not os.path.exists(db_path)


# --- read-only ---------------------------------------------------------------------------


def _assert_read_only_refuses(ro: SqliteStore, before) -> None:
    with refused(ro, StoreUnavailable, match="read-only"):
        ro.append("a", [hb()], actor=W1)
    with refused(ro, StoreUnavailable, match="read-only"):
        ro.execute("a", Count(), up_to(99), actor=W1)


def test_readonly_store_reads_but_never_writes(db_path):
    populated(db_path).close()
    ro = SqliteStore(db_path, readonly=True)
    before = snapshot(ro)
    assert len(before[0]) == 9 and ro.verify() == []
    _assert_read_only_refuses(ro, before)
    # Not just a flag: the connection itself is opened with mode=ro, so even with the
    # Python-side guard lifted SQLite refuses, and the error is still StoreUnavailable.
    ro.readonly = False
    _assert_read_only_refuses(ro, before)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        ro.conn.execute("INSERT INTO handoff_meta VALUES ('x', 'y')")
    ro.close()
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 9
    conn.close()


def test_readonly_path_with_uri_characters(tmp_path):
    odd = tmp_path / "we?ird#dir %41"
    odd.mkdir()
    path = odd / "ledger.db"
    populated(path).close()
    with SqliteStore(path, readonly=True) as ro:
        assert ro.last_position() == 9
    # The ?/# in the directory must not have been read as a URI query: nothing new
    # appeared beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_chmod_read_only_file_is_unavailable(db_path):
    populated(db_path).close()
    os.chmod(db_path, 0o444)
    try:
        s = SqliteStore(db_path)
        before = snapshot(s)
        with refused(s, StoreUnavailable, match="read-only"):
            s.append("a", [hb()], actor=W1)
        assert_unchanged(s, before)
        s.close()
    finally:
        os.chmod(db_path, 0o600)


# --- locked, full ------------------------------------------------------------------------


def test_locked_past_the_timeout_is_unavailable(db_path):
    populated(db_path).close()
    s = SqliteStore(db_path, busy_timeout_s=0.2)
    before = snapshot(s)
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        with refused(s, StoreUnavailable, match="locked") as info:
            s.append("a", [hb()], actor=W1)
        assert time.monotonic() - t0 < 3
        assert info.value.exit_code == 3
        with refused(s, StoreUnavailable, match="locked"):
            s.execute("a", Count(), up_to(99), actor=W1)
        # Reads still work under a writer's lock (WAL).
        assert s.head("a").last_seq == 5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert_unchanged(s, before)
    assert s.append("a", [hb()], actor=W1).first_seq == 6
    s.close()


def test_disk_full_refuses_cleanly_and_recovers(db_path):
    s = populated(db_path)
    conn = s.conn  # max_page_count is per connection: set it on the store's own
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages + 24}")
    acked = []
    with pytest.raises(StoreUnavailable, match="full") as info:
        for i in range(200):
            batch = [step(i, detail=f"{i}-{j}-" + "x" * 3000) for j in range(4)]
            acked.append((s.append("big", batch, actor=W1), batch))
    assert info.value.exit_code == 3
    # A refused batch wrote none of its four events; every acknowledged one is there.
    before = snapshot(s)
    events, heads = before[0], {h.run_id: h for h in before[1]}
    assert len(events) == 9 + 4 * len(acked)
    for result, batch in acked:
        got = [r.event for r in events if r.position in result.positions]
        assert got == batch
    assert acked, "the limit should let a few batches in before the disk fills"
    assert heads["big"].last_seq == 4 * len(acked)
    with refused(s, StoreUnavailable, match="full"):
        s.append("big", [step(0, detail="y" * 20000)], actor=W1)
    conn.execute("PRAGMA max_page_count=1073741823")
    s.append("big", [step(0, detail="y" * 20000)], actor=W1)
    assert s.verify() == [] and s.integrity_check() == "ok"
    s.close()
    with SqliteStore(db_path) as again:
        assert again.last_position() == len(events) + 1


# --- pragmas -------------------------------------------------------------------------------


@pytest.mark.parametrize("sync, code", [(None, 2), ("FULL", 2), ("NORMAL", 1)])
def test_connection_pragmas(db_path, sync, code):
    kw = {} if sync is None else {"synchronous": sync}
    with SqliteStore(db_path, **kw) as s:
        conn = s.conn
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == code
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert conn.execute("PRAGMA trusted_schema").fetchone()[0] == 0


def test_wal_is_checkpointed_under_the_writer_lock(db_path):
    s = SqliteStore(db_path, synchronous="NORMAL")
    payload = "z" * 150_000
    for i in range(70):  # > 64 commits and > 8 MiB of WAL
        s.append("w", [step(i, detail=payload)], actor=W1)
    wal = os.path.getsize(f"{db_path}-wal")
    # RESTART checkpoints reuse the WAL from its start; journal_size_limit caps the file.
    assert wal <= WAL_CHECKPOINT_BYTES, f"WAL not checkpointed ({wal} bytes)"
    # A reader pinning the WAL makes the opportunistic checkpoint give up, not fail
    # the append that triggered it (that append has already committed).
    reader = raw(db_path)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM events").fetchone()
    try:
        for i in range(70):
            s.append("w", [step(i, detail=payload)], actor=W1)
    finally:
        reader.execute("ROLLBACK")
        reader.close()
    assert s.head("w").last_seq == 140
    busy, frames, copied = s.wal_checkpoint()
    assert busy == 0 and frames == copied
    assert s.verify() == [] and s.integrity_check() == "ok"
    s.close()


# --- tampering: verify names the first bad position ------------------------------------


def _tamper(path, *sql: str) -> None:
    """Edit behind the store, then put the triggers back (a missing one is its own problem)."""
    conn = raw(path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("DROP TRIGGER events_no_delete")
    for stmt in sql:
        conn.execute(stmt)
    for name in ("events_no_update", "events_no_delete"):
        conn.execute(APPEND_ONLY_TRIGGERS[name])
    conn.close()


def test_verify_detects_an_edited_payload(db_path):
    populated(db_path).close()
    forged = ev.encode(ev.ProgressRecorded(kind="step-3", detail="forged"))
    conn = raw(db_path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET payload = ? WHERE position = 4", (forged,))
    conn.execute(APPEND_ONLY_TRIGGERS["events_no_update"])
    conn.close()
    with SqliteStore(db_path) as s:
        problems = s.verify()
        assert problems[0].kind == "bad_hash"
        assert (problems[0].run_id, problems[0].seq, problems[0].position) == ("a", 3, 4)
        assert [p.run_id for p in problems] == ["a"], "run b is intact"
        assert s.verify("b") == []
        assert s.verify("a")[0].position == 4


def test_verify_detects_a_deleted_row(db_path):
    populated(db_path).close()
    _tamper(db_path, "DELETE FROM events WHERE position = 5")  # b2
    with SqliteStore(db_path) as s:
        problems = s.verify()
        assert problems[0].kind == "position_gap"
        assert (problems[0].run_id, problems[0].position) == ("b", 6)
        assert any(p.kind == "seq_gap" and p.run_id == "b" and p.seq == 3 for p in problems)
        assert all(p.run_id == "b" for p in problems)
        assert s.verify("b")[0].kind == "seq_gap"


def test_verify_detects_a_changed_seq(db_path):
    populated(db_path).close()
    _tamper(db_path, "UPDATE events SET seq = 40 WHERE position = 8")  # a4 -> a40
    with SqliteStore(db_path) as s:
        problems = s.verify()
        assert (problems[0].kind, problems[0].run_id, problems[0].seq, problems[0].position) == (
            "seq_gap", "a", 40, 8,
        )


def test_verify_detects_a_truncated_run(db_path):
    populated(db_path).close()
    _tamper(db_path, "DELETE FROM events WHERE position = 9")  # a5, the last event
    with SqliteStore(db_path) as s:
        problems = s.verify()
        assert [(p.kind, p.run_id) for p in problems] == [("head_mismatch", "a")]


def test_insert_or_replace_is_refused_or_caught_by_verify(db_path):
    # REPLACE deletes the old row without firing DELETE triggers (SQLite runs them
    # only with recursive_triggers on, which is per connection): the trigger guard
    # does not stop it, so verify() must.
    populated(db_path).close()
    conn = raw(db_path)
    row = list(conn.execute("SELECT * FROM events WHERE position = 3").fetchone())
    cols = [d[0] for d in conn.execute("SELECT * FROM events LIMIT 0").description]
    row[cols.index("payload")] = ev.encode(ev.ProgressRecorded(kind="step-1", detail="swapped"))
    try:
        conn.execute(
            f"INSERT OR REPLACE INTO events ({', '.join(cols)}) "
            f"VALUES ({', '.join('?' * len(cols))})",
            row,
        )
    except sqlite3.IntegrityError:
        replaced = False
    else:
        replaced = True
    conn.close()
    with SqliteStore(db_path) as s:
        problems = [(p.kind, p.run_id, p.position) for p in s.verify()]
        assert problems == ([("bad_hash", "b", 3)] if replaced else [])


def test_integrity_check_is_ok(db_path):
    with populated(db_path) as s:
        assert s.integrity_check() == "ok"
        assert s.verify() == []


def test_execute_folds_the_rows_it_wrote_exactly_as_a_reader_sees_them(db_path):
    """execute() evolves from the rows it just inserted instead of reading them back;
    those records must be identical, field for field, to what read_run returns."""
    from handoff.ledger.store import Aggregate, Decision

    class Collect(Aggregate[tuple]):
        def initial(self, run_id):
            return ()

        def evolve(self, state, recorded):
            return state + (recorded,)

    s = SqliteStore(db_path)
    agg = Collect()
    opened = ev.HandoffOpened(goal="g", target="t", owner="alice")
    s.execute("x", agg, lambda st, head: Decision((opened,)), actor=OWNER)
    _, state = s.execute(
        "x", agg, lambda st, head: Decision((step(1), step(2))), actor=OWNER, idempotency_key="k"
    )
    assert list(state) == list(s.read_run("x"))
    s.close()


def test_a_ledger_is_not_created_through_a_dangling_link(tmp_path):
    """SQLite would follow a link to a missing file and create it with the umask's mode
    (0644) instead of 0600, wherever the link points: refused, nothing created."""
    victim = tmp_path / "elsewhere" / "victim.db"
    victim.parent.mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(victim)
    with pytest.raises(InvalidInput, match="symbolic link"):
        SqliteStore(str(link))
    assert not victim.exists() and sorted(os.listdir(victim.parent)) == []
