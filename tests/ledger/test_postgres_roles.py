"""The least-privilege roles of a PostgreSQL ledger (``handoff roles --sql``): each role can
do what it needs and nothing more.

Roles are cluster-wide: every test makes its own, with a random prefix (parallel sessions
never collide), as members of the groups the SQL creates, and drops them all at the end.
The server trusts 127.0.0.1, so a URL naming an existing role connects as it.
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Iterator

import pytest

from handoff import Ledger
from handoff.ledger.errors import StoreUnavailable
from handoff.ledger.store import LeaseToken, Liveness
from tests.pg import fresh_url
from tests.support import invoke

GROUPS = ("writer", "watchdog", "auditor")


def _as(url: str, user: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{host}"))


class Roles:
    def __init__(self, url: str, prefix: str) -> None:
        self.owner = url
        self.prefix = prefix

    def login(self, group: str) -> str:
        return f"{self.prefix}_{group}_login"

    def url(self, group: str) -> str:
        return _as(self.owner, self.login(group))


@pytest.fixture
def roles() -> Iterator[Roles]:
    import psycopg

    url = fresh_url()
    with Ledger(url) as lg:  # the owner (postgres) creates the schema and the view tables
        lg.open(run_id="r0", goal="g", target="chat:#ops", owner="alice")
    prefix = "ht" + secrets.token_hex(5)
    made: list[str] = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            out = invoke("--db", url, "roles", "--sql", "--prefix", prefix)
            assert out.exit_code == 0, out.output
            made += [f"{prefix}_{g}" for g in GROUPS]
            conn.execute(out.output)
            conn.execute(out.output)  # idempotent
            for g in GROUPS:
                conn.execute(f"CREATE ROLE {prefix}_{g}_login LOGIN IN ROLE {prefix}_{g}")
                made.append(f"{prefix}_{g}_login")
        yield Roles(url, prefix)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            existing = [r for r in made if conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (r,)).fetchone()]
            if existing:
                conn.execute(f"DROP OWNED BY {', '.join(existing)}")
                conn.execute(f"DROP ROLE {', '.join(existing)}")


def _events(url: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT e.id, e.run_id, e.seq, e.hash, o.position, o.global_hash, e.db_role "
                            "FROM events e LEFT JOIN ledger_order o ON o.event_id = e.id ORDER BY e.id").fetchall()


def test_roles_sql_names_the_schema_and_never_grants_changes_to_the_log():
    from handoff.ledger.postgres import roles_sql

    sql = roles_sql("ledger", "acme")
    assert "CREATE ROLE acme_writer NOLOGIN" in sql and "CREATE ROLE acme_auditor NOLOGIN" in sql
    assert 'REVOKE ALL ON ALL TABLES IN SCHEMA "ledger" FROM acme_writer, acme_watchdog, acme_auditor;' in sql
    assert 'GRANT SELECT ON ALL TABLES IN SCHEMA "ledger" TO acme_writer, acme_watchdog, acme_auditor;' in sql
    assert 'GRANT EXECUTE ON FUNCTION "ledger".handoff_append(' in sql
    assert "INSERT ON" not in sql and "UPDATE ON" not in sql and "DELETE ON" not in sql
    with pytest.raises(Exception, match="prefix"):
        roles_sql("ledger", "Robert'); DROP TABLE events;--")


def test_roles_needs_a_postgresql_ledger(tmp_path):
    out = invoke("--db", str(tmp_path / "l.db"), "roles", "--sql")
    assert out.exit_code == 2 and "PostgreSQL" in out.output


def test_roles_json_gives_the_schema_the_names_and_the_sql():
    import json

    url = fresh_url()
    Ledger(url).close()
    out = invoke("--db", url, "roles", "--sql", "--json", "--prefix", "acme")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["schema"].startswith("t_") and doc["roles"]["auditor"] == "acme_auditor"
    assert f'GRANT USAGE ON SCHEMA "{doc["schema"]}"' in doc["sql"]


@pytest.mark.parametrize("group", ["writer", "watchdog"])
def test_a_writer_appends_and_the_server_names_it(roles, group):
    url = roles.url(group)
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim("r1", "w1")
        lg.transition("r1", lease, "planning", worker="w1")
        lg.progress("r1", lease, "plan_committed", "3 steps", worker="w1")
        assert lg.checkpoint("r1").worker == "w1"
        assert lg.verify() == []
    rows = _events(roles.owner)
    assert {r[-1] for r in rows if r[1] == "r1"} == {roles.login(group)}  # db_role


def test_a_writer_cannot_update_delete_or_truncate_the_log(roles):
    import psycopg

    before = _events(roles.owner)
    with psycopg.connect(roles.url("writer"), autocommit=True) as conn:
        for sql in ("UPDATE events SET actor = 'worker:x'", "DELETE FROM events", "TRUNCATE events",
                    "ALTER TABLE events DISABLE TRIGGER events_no_delete", "DROP TABLE events",
                    "CREATE TABLE sneaky (x int)", "UPDATE ledger_order SET position = position + 1",
                    "DELETE FROM ledger_order", "INSERT INTO ledger_order VALUES (999, 1, '')",
                    "UPDATE ledger_tail SET position = 0", "DELETE FROM unsealed"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
    assert _events(roles.owner) == before
    with Ledger(roles.owner) as lg:
        assert lg.verify() == []


def test_a_writer_keeps_values_beside_the_log_but_cannot_change_one(roles):
    """A LangGraph saver running as a writer stores, reads and (after a recorded erasure)
    deletes values; a value, named by its digest, is never updated."""
    import psycopg

    from handoff.integrations.langgraph import LedgerSaver

    url = roles.url("writer")
    with Ledger(url) as lg:
        saver = LedgerSaver(lg)
        cp = {"v": 1, "id": "c1", "ts": "2025-01-01T00:00:00+00:00", "channel_values": {"m": ["hi"]},
              "channel_versions": {"m": 1}, "versions_seen": {}, "updated_channels": None}
        saver.put({"configurable": {"thread_id": "lg-1", "checkpoint_ns": ""}}, cp,
                  {"source": "loop", "step": 0, "parents": {}}, {"m": 1})
        assert saver.get_tuple({"configurable": {"thread_id": "lg-1"}}).checkpoint["channel_values"] == {"m": ["hi"]}
        with psycopg.connect(url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE run_values SET value = 'x'")
        saver.delete_thread("lg-1")
        assert lg.store.value_digests("lg-1") == {}
        assert lg.verify() == []


def test_an_auditor_reads_but_writes_nothing(roles):
    url = roles.url("auditor")
    before = _events(roles.owner)
    with Ledger(url) as lg:
        assert lg.checkpoint("r0").run_id == "r0"
        assert lg.verify() == []
        assert len(list(lg.export())) == len(before)
        with pytest.raises(StoreUnavailable, match="role may not do this") as caught:
            lg.open(run_id="r2", goal="g", target="chat:#ops", owner="alice")
        assert caught.value.exit_code == 3
        with pytest.raises(StoreUnavailable):
            lg.claim("r0", "w9")
    for args in (("status", "r0"), ("status",), ("log", "r0"), ("verify",), ("export", "--all")):
        out = invoke("--db", url, *args)
        assert out.exit_code == 0, (args, out.output)
    out = invoke("--db", url, "claim", "r0", "--worker", "w9")
    assert out.exit_code == 3 and "Traceback" not in out.output, out.output
    assert _events(roles.owner) == before


def test_a_writers_rebuild_is_refused_typed_and_the_owners_keeps_the_grants(roles):
    url = roles.url("writer")
    with Ledger(url) as lg:
        with pytest.raises(StoreUnavailable, match="owns the ledger") as caught:
            lg.rebuild()
        assert caught.value.exit_code == 3
    out = invoke("--db", url, "rebuild")
    assert out.exit_code == 3 and "owns the ledger" in out.output and "Traceback" not in out.output
    with Ledger(roles.owner) as lg:  # the owner rebuilds: new tables, swapped in
        assert lg.rebuild()
    with Ledger(url) as lg:  # ... which the writer may still keep (default privileges)
        lg.open(run_id="r3", goal="g", target="chat:#ops", owner="alice")
        lg.claim("r3", "w3")
        assert lg.verify() == []
    with Ledger(roles.url("auditor")) as lg:
        assert lg.checkpoint("r3").worker == "w3"


def test_a_schema_name_cannot_end_the_comment_and_add_sql():
    """A schema named with a newline is shown in the script's comment without it; in the
    statements it only appears quoted."""
    from handoff.ledger.postgres import roles_sql

    name = 's\nDROP TABLE events; --'
    sql = roles_sql(name, "handoff")
    first = sql.splitlines()[0]
    assert first.startswith("-- ") and "s?DROP TABLE events" in first  # one comment line
    # Everywhere else the name is a quoted identifier: the newline stays inside the quotes.
    assert sql.count(name) == sql.count(f'"{name}"') > 0


# --- the raw SQL an attacker with a role would send ------------------------------------
#
# Each role, each table, each lock. The writer and the watchdog append only through
# handoff_append (run as the owner, which checks the head, the lease's token and the
# chain); no role may change, lock or create a table, or call the functions that keep the
# heads and the views. Every refusal leaves the log, the heads and the views as they were.

LEDGER_TABLES = ("events", "heads", "ledger_tail", "ledger_order", "unsealed", "handoff_meta",
                 "handoff_lock_maintenance", "handoff_lock_views")


def _first_column(owner_url: str, table: str) -> str | None:
    import psycopg

    with psycopg.connect(owner_url) as conn:
        row = conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                           "AND NOT attisdropped AND attidentity = '' ORDER BY attnum LIMIT 1", (table,)).fetchone()
    return row[0] if row else None


def _tables(owner_url: str) -> list[str]:
    import psycopg

    with psycopg.connect(owner_url) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1")]
    assert set(LEDGER_TABLES) <= set(names) and "stall_watch" in names and "checkpoints" in names
    return names


def _state(owner_url: str) -> tuple:
    """Everything a write may change: the log, the heads and every view table's rows."""
    import psycopg

    with psycopg.connect(owner_url) as conn:
        out = [tuple(_events(owner_url)), tuple(conn.execute("SELECT * FROM heads ORDER BY run_id").fetchall())]
        for t in _tables(owner_url):
            if t not in LEDGER_TABLES:
                out.append(tuple(conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()))
        return tuple(out)


@pytest.mark.parametrize("group", GROUPS)
def test_no_role_may_change_or_lock_any_table(roles, group):
    import psycopg

    before = _state(roles.owner)
    refused = 0
    with psycopg.connect(roles.url(group), autocommit=True) as conn:
        for t in _tables(roles.owner):
            col = _first_column(roles.owner, t)
            attacks = [f"UPDATE {t} SET {col} = {col}"] if col else []
            attacks += [f"DELETE FROM {t}", f"TRUNCATE {t}", f"INSERT INTO {t} DEFAULT VALUES",
                       f"SELECT * FROM {t} FOR UPDATE", f"SELECT * FROM {t} FOR NO KEY UPDATE",
                       f"SELECT * FROM {t} FOR SHARE", f"SELECT * FROM {t} FOR KEY SHARE",
                       f"ALTER TABLE {t} DISABLE TRIGGER ALL", f"DROP TABLE {t}"]
            attacks += [f"LOCK TABLE {t} IN {mode} MODE" for mode in (
                "ROW SHARE", "ROW EXCLUSIVE", "SHARE UPDATE EXCLUSIVE", "SHARE", "SHARE ROW EXCLUSIVE",
                "EXCLUSIVE", "ACCESS EXCLUSIVE")]
            for sql in attacks:
                with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql)
                refused += 1
        for sql in ("UPDATE heads SET lease_digest = 'mine'", "UPDATE stall_watch SET live = 0",
                    "DELETE FROM stall_watch", "CREATE TABLE sneaky (x int)",
                    "SELECT handoff_sync_stall_watch('r0', '[]', true)",
                    "SELECT handoff_views('r0', '{\"stall_watch\": {\"r\": [], \"m\": true}}')",
                    "SELECT setval('events_id_seq', 1)"):
            with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        if group == "auditor":  # reads only: no append, no seal
            for sql in ("SELECT handoff_seal(true, '{}')", "SELECT nextval('events_id_seq')"):
                with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql)
    assert refused > 100
    assert _state(roles.owner) == before
    with Ledger(roles.owner) as lg:
        assert lg.verify() == [] and lg.check() == []


def test_a_writer_cannot_write_under_another_workers_lease(roles):
    """U1: the heads (and so the token digests) are out of a writer's reach, and the append
    function checks the lease's token itself: a write under another worker's lease without
    its token, or a lease moved without a grant, is refused by the server and writes
    nothing. The real holder goes on writing."""
    import psycopg

    from handoff.ledger import events as ev
    from tests.pg import append_call

    with Ledger(roles.owner) as lg:
        lease = lg.claim("r0", "w1")
    before = _state(roles.owner)
    with psycopg.connect(roles.url("writer"), autocommit=True) as conn:
        beat = ev.HeartbeatRecorded()
        attempts = [
            append_call(conn, "r0", beat, lease=lease.lease),  # the number alone
            append_call(conn, "r0", beat, lease=lease.lease, secret="guessed-secret"),  # a wrong secret
            # the lease moved to the thief's own digest without a grant above the highest
            append_call(conn, "r0", beat, move=(lease.lease, "thief", "ab" * 32)),
        ]
        for sql, args in attempts:
            with conn.transaction(), pytest.raises(psycopg.Error) as caught:
                conn.execute(sql, args)
            assert caught.value.sqlstate == "HL401", caught.value
        with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE heads SET lease_digest = %s WHERE run_id = 'r0'", ("ab" * 32,))
    assert _state(roles.owner) == before
    with Ledger(roles.url("writer")) as lg:
        lg.heartbeat("r0", lease, worker="w1")  # the holder is unaffected
        assert lg.verify() == []
        # Liveness beside the log: the holder's beat is kept through handoff_beat, as the
        # writer; a guessed secret moves neither the row nor, through put, a future beat in.
        assert lg.heartbeat("r0", lease, worker="w1").result.outcome == "unchanged"
        live = lg.store.liveness(["r0"])
        forged = LeaseToken(f"{lease.lease}.{'A' * 43}")
        assert lg.store.beat("r0", forged, b"", mark_us=10**12) is None
        lg.store.put_liveness(Liveness("r0", lease.lease, 2**60, 9, 2**60, b"", 1), forged)
        assert lg.store.liveness(["r0"]) == live
    with psycopg.connect(roles.url("writer"), autocommit=True) as conn:
        with conn.transaction(), pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE liveness SET beat_us = beat_us + 1000000000 WHERE run_id = 'r0'")


def test_a_writers_batch_out_of_order_is_refused_and_nothing_is_written(roles):
    """handoff_append takes a batch's seqs, chain links and write ids from the client: a
    writer sending them out of order (ids that would seal the run's events in another
    order than their seqs, a seq skipped in the middle, an event that does not name the
    one before it) is refused with invalid_parameter_value, and writes nothing. The same
    batch in order is written, and verify finds the log sound."""
    import psycopg

    from handoff.ledger import events as ev
    from tests.pg import append_call

    batch = [ev.ProgressRecorded(kind=k) for k in ("a", "b", "c")]

    def ids_reversed(rows):
        ids = [r[0] for r in rows][::-1]
        return [[i, *r[1:]] for i, r in zip(ids, rows)]

    def seq_skipped(rows):
        return [rows[0], [rows[1][0], rows[1][1] + 5, *rows[1][2:]], rows[2]]

    def link_broken(rows):
        return [rows[0], rows[1], [*rows[2][:6], "00" * 32, rows[2][7]]]

    before = _state(roles.owner)
    with psycopg.connect(roles.url("writer"), autocommit=True) as conn:
        for tamper in (ids_reversed, seq_skipped, link_broken):
            sql, args = append_call(conn, "r0", batch, rows=tamper)
            with conn.transaction(), pytest.raises(psycopg.Error) as caught:
                conn.execute(sql, args)
            assert caught.value.sqlstate == "22023", (tamper.__name__, caught.value)
            assert "does not chain its events in order" in str(caught.value)
        assert _state(roles.owner) == before
        sql, args = append_call(conn, "r0", batch)
        conn.execute(sql, args)
    with Ledger(roles.owner) as lg:
        assert [r.type for r in lg.store.read_run("r0")][-3:] == ["progress_recorded"] * 3
        positions = [r.position for r in lg.store.read_run("r0")]
        assert positions == sorted(positions)
        assert lg.verify() == []


@pytest.mark.parametrize("group", GROUPS)
def test_no_role_holding_any_lock_it_may_take_stalls_a_writer(roles, group):
    """U3: a role that holds every lock it can take (every advisory lock key the ledger
    ever used, an ACCESS SHARE lock on every table, an open snapshot, and for an appender
    a seal call with nothing to seal) delays no write: the locks writes wait on are rows
    and tables no role may lock. The writer's lock timeout is short, so a wait would fail."""
    import psycopg

    old_keys = [(0x484C4447, k) for k in (1, 2, 3)] + [(0x48414E44, k) for k in range(-3, 4)]
    with Ledger(roles.owner) as lg:
        lease = lg.claim("r0", "w1")
    with psycopg.connect(roles.url(group)) as holder:  # its transaction stays open to the end
        holder.execute("SET lock_timeout = '2s'")
        for ns, key in old_keys:
            holder.execute("SELECT pg_advisory_lock(%s, %s), pg_advisory_xact_lock(%s, %s)", (ns, key, ns, key))
        for t in _tables(roles.owner):
            holder.execute(f"LOCK TABLE {t} IN ACCESS SHARE MODE")
        if group != "auditor":
            holder.execute("SELECT handoff_seal(true, '{}')")
        with Ledger(roles.url("writer"), busy_timeout_s=1.0) as lg:
            lg.heartbeat("r0", lease, worker="w1")
            lg.open(run_id="r9", goal="g", target="chat:#ops", owner="alice")
            lease9 = lg.claim("r9", "w9")
            lg.transition("r9", lease9, "planning", worker="w9")
            assert lg.verify() == []
            assert lg.store.unsealed_count() == 0


def test_a_value_not_named_by_its_sha256_is_refused_and_nothing_is_stored(roles):
    """handoff_put_values checks each value's name against its sha256 on the server: a
    writer calling it by hand with a forged name stores nothing, and the log is as it was."""
    import hashlib

    import psycopg

    before = _state(roles.owner)
    with psycopg.connect(roles.url("writer"), autocommit=True) as conn:
        good = hashlib.sha256(b"real").hexdigest()
        with conn.transaction(), pytest.raises(psycopg.errors.InvalidParameterValue, match="sha256"):
            conn.execute("SELECT handoff_put_values('r0', %s, %s)", ([good, "ab" * 32], [b"real", b"forged"]))
        assert conn.execute("SELECT count(*) FROM run_values").fetchone()[0] == 0
    assert _state(roles.owner) == before


def test_a_role_not_yet_granted_the_liveness_functions_still_beats_through_the_log(roles):
    """A ledger upgraded to schema 12 whose roles SQL has not been run again: the writer may
    append but not call handoff_beat or handoff_put_liveness. Its beats are then logged, one
    event each, as before the liveness table existed, instead of failing and fencing it."""
    import psycopg

    from handoff.ledger.postgres.postgres_liveness import SIGNATURES

    with Ledger(roles.owner) as lg:
        lease = lg.claim("r0", "w1")
        before = len(list(lg.log("r0")))
    with psycopg.connect(roles.owner, autocommit=True) as conn:
        conn.execute(f"REVOKE EXECUTE ON FUNCTION {', '.join(SIGNATURES)} FROM {roles.prefix}_writer")
    with Ledger(roles.url("writer")) as lg:
        outs = [lg.heartbeat("r0", lease, worker="w1").result.outcome for _ in range(3)]
        assert outs == ["committed"] * 3
        assert len(list(lg.log("r0"))) == before + 3 and lg.verify() == []
