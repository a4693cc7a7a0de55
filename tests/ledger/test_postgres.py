"""PostgreSQL-only checks. The EventStore contract itself runs on PostgreSQL through its
entry in tests/backends.py (tests/ledger/test_store_conformance.py collects it)."""

from __future__ import annotations

import os

import pytest
from pathlib import Path

from handoff.ledger.errors import StoreUnavailable
from handoff.ledger.postgres import PG_SCHEMA_VERSION, PostgresStore
from handoff.ledger.postgres.postgres_schema import SEAL_LOCK
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
            # A client that inserts with a forged db_role (a copy of row 1 under a new
            # write id, rolled back) gets the server's word for it anyway.
            conn.execute(
                "INSERT INTO events (id, run_id, seq, type, actor, lease, idem_key, idem_digest, batch_size,"
                " recorded_us, schema_version, payload, prev_hash, hash, viewed, db_role)"
                " SELECT id + 1, run_id, 2, type, actor, lease, idem_key, idem_digest, batch_size, recorded_us,"
                " schema_version, payload, prev_hash, hash, viewed, 'someone_else' FROM events")
            assert conn.execute("SELECT db_role FROM events WHERE seq = 2").fetchone()[0] == role
            conn.rollback()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER events_stamp_role ON events")
        problems = [p for p in pg.verify() if p.kind == "trigger_missing"]
        assert len(problems) == 1 and "db_role" in problems[0].message


FIXTURE_V2 = Path(__file__).parent / "fixtures" / "postgres_schema2.sql"


def _load_schema2(drop_stamp: bool = False) -> str:
    """A new schema holding the schema-2 fixture (as 4b13904 wrote it); its address."""
    import psycopg

    url = fresh_url()
    schema = url.rsplit("search_path%3D", 1)[1]
    sql = FIXTURE_V2.read_text().replace("__SCHEMA__", schema).replace(f"CREATE SCHEMA {schema};", "")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)
        if drop_stamp:  # back to what schema 1 created
            conn.execute(f"DROP TRIGGER events_stamp_role ON {schema}.events")
            conn.execute(f"DROP FUNCTION {schema}.handoff_stamp_role()")
            conn.execute(f"UPDATE {schema}.handoff_meta SET value = '1' WHERE key = 'schema_version'")
    return url


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_ledger_is_migrated_and_keeps_every_position_and_hash(version):
    """Schema 1 (no db_role trigger) and 2 (positions under a tail lock) are brought to the
    current schema (3: positions sealed behind the writers; 4: the seal by key) by a writable open: the order, both chains and
    every fold stay, the views need no refold, and new writes continue the order."""
    import psycopg

    from handoff.facade import Ledger

    url = _load_schema2(drop_stamp=version == 1)
    with pytest.raises(StoreUnavailable, match="handoff --db URL init"):  # read-only: no migration
        PostgresStore(url, readonly=True)
    with psycopg.connect(url) as conn:
        before = conn.execute("SELECT position, run_id, seq, hash, global_hash FROM events ORDER BY position").fetchall()
        tail = conn.execute("SELECT position, global_hash FROM ledger_tail").fetchone()
    with Ledger(url) as lg:
        assert lg.store.diagnostics()["schema_version"] == PG_SCHEMA_VERSION == 12
        assert [(r.position, r.run_id, r.seq, r.hash) for r in lg.store.read_all()] == [
            (p, r, s, bytes(h)) for p, r, s, h, _ in before]
        assert lg.store.ledger_head() == (tail[0], bytes(tail[1]))
        assert lg.store.global_hash_at(10) == bytes(before[-1][4])
        spans: dict[str, list[int]] = {}
        for p, r, *_ in before:
            spans.setdefault(r, []).append(p)
        assert [(h.run_id, h.first_position, h.last_position) for h in lg.store.list_runs()] == [
            (r, min(ps), max(ps)) for r, ps in spans.items()]
        assert lg.verify() == [] and lg.check() == []
        assert lg.checkpoint("r1").state == "executing" and lg.checkpoint("r2").last_seq == 3
        lg.open(goal="After the upgrade", target="chat:#ops", owner="carol", run_id="r3")
        assert lg.store.head("r3").first_position == 11
        assert lg.verify() == [] and lg.check() == []
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT value FROM handoff_meta WHERE key = 'schema_version'").fetchone()[0] == str(PG_SCHEMA_VERSION)
        assert {r[0] for r in conn.execute("SELECT DISTINCT db_role FROM events")} == {
            conn.execute("SELECT session_user").fetchone()[0]}


SEAL_V3 = Path(__file__).parent / "fixtures" / "postgres_seal3.sql"
#: The advisory lock schemas 3 to 5 sealed under (the fixtures' {ns} and {seal}).
OLD_NS, OLD_SEAL = 0x484C4447, 3


def _four_sealed_two_queued():
    """A ledger of four sealed events on two runs and two more committed but left queued:
    their writer could not seal (another session held the seal lock past the lock
    timeout), as a writer that died between its commit and its seal leaves them. Returns
    its address, its schema and the actor that wrote."""
    import psycopg

    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor

    url = fresh_url()
    w = Actor("worker", "w")
    with PostgresStore(url) as store:
        schema = store.schema_name()
        for i in range(4):
            store.append(f"r{i % 2}", [ev.ProgressRecorded(kind=f"k{i}")], actor=w)
    with psycopg.connect(url, autocommit=True) as other, PostgresStore(url, busy_timeout_s=0.2) as store:
        other.execute("BEGIN")
        other.execute(SEAL_LOCK)
        for run in ("r0", "r1"):
            assert store.append(run, [ev.ProgressRecorded(kind="queued")], actor=w).positions == ()
        other.execute("ROLLBACK")
        assert store.unsealed_count() == 2
    return url, schema, w


def test_a_schema_3_ledger_gets_the_seal_by_key_and_keeps_its_order():
    """Schema 3's seal joined the queue to the whole log (a plan cached while the tables were
    small scanned all of them on every seal); 4 replaces only the function. Events written
    under 3, some still queued at the upgrade, are sealed by the new one in write-id order,
    the chain unbroken, and verify accepts the new body (and would report the old one)."""
    import psycopg

    from handoff.facade import Ledger
    from handoff.ledger import events as ev
    from handoff.ledger.postgres import postgres_schema as P

    url, schema, w = _four_sealed_two_queued()
    old = SEAL_V3.read_text().format(schema=P.ident(schema), ns=OLD_NS, seal=OLD_SEAL,
                                     channel=P.notify_channel(schema))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(old)
        conn.execute("UPDATE handoff_meta SET value = '3' WHERE key = 'schema_version'")
    with pytest.raises(StoreUnavailable, match="handoff --db URL init"):  # read-only: no migration
        PostgresStore(url, readonly=True)
    with Ledger(url) as lg:
        store = lg.store
        assert store.diagnostics()["schema_version"] == PG_SCHEMA_VERSION
        body = store.x("SELECT prosrc FROM pg_proc WHERE proname = 'handoff_positions' "
                        "AND pronamespace = current_schema()::regnamespace").fetchone()[0]
        assert "unnest(ps, es, gs)" in body  # positions are given in one place, by key
        store.seal()
        assert store.unsealed_count() == 0
        assert [(r.position, r.run_id, r.seq) for r in store.read_all()][-2:] == [(5, "r0", 3), (6, "r1", 3)]
        store.append("r1", [ev.ProgressRecorded(kind="after")], actor=w)
        assert store.last_position() == 7
        assert store.verify() == []
    with psycopg.connect(url, autocommit=True) as conn:  # verify would report the old body
        conn.execute(old)
    with PostgresStore(url) as store:
        assert any(p.kind == "trigger_altered" and "handoff_seal" in p.message for p in store.verify())


QUEUE_V4 = Path(__file__).parent / "fixtures" / "postgres_queue4.sql"


def test_a_schema_4_ledger_is_sealed_by_handoff_append_and_keeps_its_order():
    """Schema 4's insert trigger only queued events (the writer then called the seal); so
    does 6's, with handoff_append sealing in the writer's transaction, under a seal lock
    (a row lock) no role may take. Events queued under 4 at the
    upgrade are sealed first, in write-id order, by the first write after it; the chain
    is unbroken; verify accepts the new bodies and would report the old queue function."""
    import psycopg

    from handoff.facade import Ledger
    from handoff.ledger import events as ev
    from handoff.ledger.postgres import postgres_schema as P

    url, schema, w = _four_sealed_two_queued()
    old = QUEUE_V4.read_text().format(schema=P.ident(schema), ns=OLD_NS, seal=OLD_SEAL,
                                      channel=P.notify_channel(schema))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(old)
    with pytest.raises(StoreUnavailable, match="handoff --db URL init"):  # read-only: no migration
        PostgresStore(url, readonly=True)
    with Ledger(url) as lg:
        store = lg.store
        assert store.diagnostics()["schema_version"] == PG_SCHEMA_VERSION == 12
        body = store.x("SELECT prosrc FROM pg_proc WHERE proname = 'handoff_queue' "
                        "AND pronamespace = current_schema()::regnamespace").fetchone()[0]
        assert "INSERT INTO unsealed" in body and "advisory" not in body  # the trigger only queues
        seal = store.x("SELECT prosrc FROM pg_proc WHERE proname = 'handoff_seal' "
                        "AND pronamespace = current_schema()::regnamespace").fetchone()[0]
        assert "FOR UPDATE SKIP LOCKED" in seal and "advisory" not in seal
        result = store.append("r1", [ev.ProgressRecorded(kind="after")], actor=w)
        assert result.positions == (7,)  # sealed in its own insert, after the two queued ones
        assert store.unsealed_count() == 0
        assert [(r.position, r.run_id, r.seq) for r in store.read_all()][-3:] == [
            (5, "r0", 3), (6, "r1", 3), (7, "r1", 4)]
        assert store.verify() == []
    with psycopg.connect(url, autocommit=True) as conn:  # verify would report the old body
        conn.execute(old.split("DROP FUNCTION")[0])
    with PostgresStore(url) as store:
        assert any(p.kind == "trigger_altered" and "handoff_seal" in p.message for p in store.verify())


def test_a_write_whose_hooks_kept_only_some_views_leaves_them_to_catch_up():
    """events.viewed says a write kept every projection; a store with another hook (or a
    projector of a few projections) marks nothing, and the next Ledger refolds the run."""
    from handoff.facade import Ledger
    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor
    from handoff.projections.engine import BY_NAME, Projector

    url = fresh_url()
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        assert lg.store.views.lagging(list(BY_NAME), 0) == {}
    with PostgresStore(url) as store:
        Projector(store, names=["checkpoints"])  # keeps one view of four
        store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert set(store.views.lagging(list(BY_NAME), 0)) == set(BY_NAME)
    with Ledger(url) as lg:  # its catch-up refolds the run for every projection
        assert lg.store.views.lagging(list(BY_NAME), 0) == {}
        assert lg.check() == [] and lg.checkpoint("r1").last_seq == 2


def test_a_write_sends_only_the_view_rows_that_changed_and_the_views_stay_those_of_the_log():
    """A session that knows a run's head from its own last write sends only the view rows
    that differ from what that write sent (a progress command leaves deliveries and the
    owner's load as they were): counted by an insert statement trigger on each view table (an
    upsert fires it once). Another
    session's write, a rebuild in between, and a release that changes the owner's load leave
    every view equal to a fresh fold of the log (Ledger.check)."""
    import psycopg

    from handoff.facade import Ledger

    url = fresh_url()
    tables = ("checkpoints", "stall_watch", "deliveries", "owner_load")
    with Ledger(url) as lg, Ledger(url) as other:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.transition(run, lease, "planning")
        lg.transition(run, lease, "executing")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE touched (t text)")
            conn.execute("CREATE FUNCTION note_touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "INSERT INTO touched VALUES (TG_TABLE_NAME); RETURN NULL; END $$")

            def watch() -> None:  # (a rebuild swaps new tables in: watch those)
                for t in tables:
                    conn.execute(f"CREATE TRIGGER touch_{t} AFTER INSERT ON {t} "
                                 "FOR EACH STATEMENT EXECUTE FUNCTION note_touch()")

            watch()

            def touched() -> dict[str, int]:
                got = dict(conn.execute("SELECT t, count(*) FROM touched GROUP BY t").fetchall())
                conn.execute("DELETE FROM touched")
                return got

            for i in range(3):
                lg.progress(run, lease, "tool_outcome", f"step {i}", key=f"p{i}")
            assert touched() == {"checkpoints": 3, "stall_watch": 3}
            # What the session keeps of the rows it sent: a 16-byte digest a table, not the
            # packet (thousands of runs are remembered).
            kept = lg.store._seen[run][3]
            assert set(kept) == set(tables) and {len(d) for d in kept.values()} == {16}
            other.progress(run, lease, "tool_outcome", "from another session", key="o1")
            other.rebuild()
            watch()
            touched()
            lg.progress(run, lease, "tool_outcome", "after the other session", key="p3")
            # The run moved under lg's memory: decided again from a read, every table sent.
            assert set(touched()) == set(tables)
            lg.release(run, lease, "handing over")  # the owner's load changes, the deliveries not
            assert set(touched()) == {"checkpoints", "stall_watch", "owner_load"}
        assert lg.check() == [] and other.check() == []
        assert lg.status(run)["progress_seq"] == other.status(run)["progress_seq"]
        assert lg.status(run)["lease"] is None


def test_a_schema_7_ledger_gets_handoff_views_that_holds_each_tables_upsert():
    """Schema 7's handoff_views called each table's sync function; the migration to 8
    makes it anew from those functions' bodies, and writes keep every view as before."""
    import psycopg

    from handoff.facade import Ledger

    url = fresh_url()
    with Ledger(url) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        tables = [r[0] for r in lg.store.x(
            "SELECT substr(proname, 14) FROM pg_proc WHERE proname LIKE 'handoff\\_sync\\_%' "
            "AND pronamespace = current_schema()::regnamespace ORDER BY 1")]
    assert tables == ["checkpoints", "deliveries", "owner_load", "stall_watch"]
    calls = "".join(f"      WHEN '{t}' THEN PERFORM handoff_sync_{t}(p_run, v->'r', (v->>'m')::boolean);\n"
                    for t in tables)
    old = ("CREATE OR REPLACE FUNCTION handoff_views(p_run text, p_views jsonb) RETURNS void LANGUAGE plpgsql AS $$ "
           "DECLARE k text; v jsonb; BEGIN FOR k, v IN SELECT * FROM jsonb_each(p_views) LOOP CASE k\n" + calls +
           "      ELSE RAISE EXCEPTION 'not a view table'; END CASE; END LOOP; END $$")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(old)
        conn.execute("UPDATE handoff_meta SET value = '7' WHERE key = 'schema_version'")
    with Ledger(url) as lg:
        assert lg.store.diagnostics()["schema_version"] == PG_SCHEMA_VERSION == 12
        body = lg.store.x("SELECT prosrc FROM pg_proc WHERE proname = 'handoff_views' "
                          "AND pronamespace = current_schema()::regnamespace").fetchone()[0]
        assert "handoff_sync_" not in body and all(f"INSERT INTO {t} AS t" in body for t in tables)
        lease = lg.claim(run, "w1")
        lg.transition(run, lease, "planning")
        assert lg.check() == [] and lg.verify() == []
        assert lg.status(run)["state"] == "planning" and lg.status(run)["lease"] is not None
