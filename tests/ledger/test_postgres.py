"""PostgreSQL-only checks. The EventStore contract itself runs on PostgreSQL through its
entry in tests/backends.py (tests/ledger/test_store_conformance.py collects it)."""

from __future__ import annotations

import os

from handoff.ledger.postgres import PostgresStore
from tests.pg import fresh_url


def test_copies_between_backends_keep_positions_and_both_chains(tmp_path):
    from handoff.ledger import events as ev
    from handoff.ledger.sqlite import SqliteStore
    from handoff.ledger.store import Actor

    w = Actor("worker", "w")
    with PostgresStore(fresh_url()) as pg:
        for i in range(5):
            pg.append(f"r{i % 2}", [ev.ProgressRecorded(kind=f"k{i}")], actor=w, idempotency_key=f"k{i}")
        position, ghash, runs = pg.backup_to(str(tmp_path / "backup.db"))
        assert (position, ghash, runs) == (*pg.ledger_head(), 2)
        with SqliteStore(tmp_path / "backup.db") as copy:
            assert list(copy.read_all()) == list(pg.read_all())
            assert copy.verify() == []
            with PostgresStore(fresh_url()) as back:  # and from SQLite back to PostgreSQL
                back.import_records(copy.read_for_export())
                assert back.ledger_head() == pg.ledger_head()
                assert list(back.read_all()) == list(pg.read_all())
                assert back.verify() == []


def test_the_log_refuses_update_delete_and_truncate_even_for_its_owner():
    import psycopg
    import pytest

    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor

    url = fresh_url()
    with PostgresStore(url) as pg:
        pg.append("r", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        before = list(pg.read_all())
        with psycopg.connect(url, autocommit=True) as conn:
            for sql in ("UPDATE events SET actor='worker:x'", "DELETE FROM events", "TRUNCATE events"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                    conn.execute(sql)
            conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_delete")
        assert list(pg.read_all()) == before
        assert [p.kind for p in pg.verify()] == ["trigger_disabled"]


def test_import_into_a_postgresql_address_imports_there(tmp_path):
    """handoff import --db postgresql://... imports in one server transaction; no file is
    built or published anywhere (the private-file path is for a SQLite file only)."""
    from handoff import Ledger, import_into

    with Ledger(str(tmp_path / "src.db")) as src:
        src.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        src.claim("r1", "w1")
        lines = list(src.export())
    url = fresh_url()
    assert import_into(url, lines) == {"imported": 2, "skipped": 0, "runs": 1}
    with Ledger(url) as dst:
        assert dst.checkpoint("r1").worker == "w1" and dst.verify() == []
    assert sorted(os.listdir(tmp_path)) == ["src.db"]


def test_db_role_is_said_by_the_server_not_the_client():
    """Whatever an INSERT names as db_role, the row keeps the session's role; a ledger
    whose stamping trigger was dropped is reported by verify."""
    import psycopg

    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor

    url = fresh_url()
    with PostgresStore(url) as pg:
        pg.append("r", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        with psycopg.connect(url) as conn:
            role = conn.execute("SELECT session_user").fetchone()[0]
            assert conn.execute("SELECT db_role FROM events").fetchone()[0] == role
            # A client that inserts with a forged db_role (a copy of row 1 at a new
            # position, rolled back) gets the server's word for it anyway.
            conn.execute(
                "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, batch_size,"
                " recorded_us, schema_version, payload, prev_hash, hash, global_hash, db_role)"
                " SELECT 2, run_id, 2, type, actor, lease, idem_key, idem_digest, batch_size, recorded_us,"
                " schema_version, payload, prev_hash, hash, global_hash, 'someone_else' FROM events")
            assert conn.execute("SELECT db_role FROM events WHERE position = 2").fetchone()[0] == role
            conn.rollback()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER events_stamp_role ON events")
        problems = [p for p in pg.verify() if p.kind == "trigger_missing"]
        assert len(problems) == 1 and "db_role" in problems[0].message


def test_a_schema_1_ledger_is_migrated_to_stamp_db_role():
    """A ledger made before the stamping trigger (schema 1) gets it on a writable open."""
    import psycopg

    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor

    url = fresh_url()
    PostgresStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:  # back to what schema 1 created
        conn.execute("DROP TRIGGER events_stamp_role ON events")
        conn.execute("DROP FUNCTION handoff_stamp_role()")
        conn.execute("UPDATE handoff_meta SET value = '1' WHERE key = 'schema_version'")
    with PostgresStore(url) as pg:
        pg.append("r", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert pg.verify() == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT value FROM handoff_meta WHERE key = 'schema_version'").fetchone()[0] == "2"
