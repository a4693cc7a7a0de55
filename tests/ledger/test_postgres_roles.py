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
from click.testing import CliRunner

from handoff import Ledger, cli
from handoff.ledger.errors import StoreUnavailable
from tests.pg import fresh_url

GROUPS = ("writer", "watchdog", "auditor")


def _as(url: str, user: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def _cli(db: str, *args: str):
    return CliRunner().invoke(cli.main, ["--db", db, *args])


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
            out = _cli(url, "roles", "--sql", "--prefix", prefix)
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
    assert 'GRANT SELECT, INSERT ON "ledger".events TO acme_writer, acme_watchdog;' in sql
    assert ('REVOKE UPDATE, DELETE, TRUNCATE ON "ledger".events, "ledger".ledger_order FROM acme_writer, '
            'acme_watchdog, acme_auditor;') in sql
    assert 'GRANT SELECT ON "ledger".ledger_tail, "ledger".ledger_order TO acme_writer, acme_watchdog;' in sql
    with pytest.raises(Exception, match="prefix"):
        roles_sql("ledger", "Robert'); DROP TABLE events;--")


def test_roles_needs_a_postgresql_ledger(tmp_path):
    out = _cli(str(tmp_path / "l.db"), "roles", "--sql")
    assert out.exit_code == 2 and "PostgreSQL" in out.output


def test_roles_json_gives_the_schema_the_names_and_the_sql():
    import json

    url = fresh_url()
    Ledger(url).close()
    out = _cli(url, "roles", "--sql", "--json", "--prefix", "acme")
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
        # the second and third writes were guessed (the role may call the functions that
        # open a write and prove its head) and none was refused
        assert lg.store.diagnostics()["guessed_writes"] == {"sent": 2, "refused": 0}
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
        out = _cli(url, *args)
        assert out.exit_code == 0, (args, out.output)
    out = _cli(url, "claim", "r0", "--worker", "w9")
    assert out.exit_code == 3 and "Traceback" not in out.output, out.output
    assert _events(roles.owner) == before


def test_a_writers_rebuild_is_refused_typed_and_the_owners_keeps_the_grants(roles):
    url = roles.url("writer")
    with Ledger(url) as lg:
        with pytest.raises(StoreUnavailable, match="CREATE on the schema") as caught:
            lg.rebuild()
        assert caught.value.exit_code == 3
    out = _cli(url, "rebuild")
    assert out.exit_code == 3 and "CREATE on the schema" in out.output and "Traceback" not in out.output
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
