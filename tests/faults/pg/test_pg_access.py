"""Bad addresses and missing privileges on PostgreSQL: one-line errors, nothing changed.

- a wrong password (on the private cluster, where roles other than the superuser must
  give one: the shared server trusts 127.0.0.1, so it cannot refuse a password), a
  database that does not exist, a database that holds something else, a ledger of a
  newer schema: exit 3 with one line naming the problem, the password never printed,
  nothing created or changed;
- a role without write privilege (the auditor of ``handoff roles --sql``) cannot append,
  revoke or rebuild: exit 3, the log unchanged;
- a superuser who disables the triggers and edits the log behind the ledger's back is
  found by ``handoff verify``: exit 4.
"""

from __future__ import annotations

import secrets

import psycopg

from handoff import Ledger
from tests.faults.conftest import handoff
from tests.faults.test_hostile import invoke
from tests.ledger.test_postgres_roles import roles  # noqa: F401 - the fixture


class _Ran:
    def __init__(self, res) -> None:
        self.returncode, self.stdout, self.stderr = res.exit_code, res.stdout, res.stderr


def cli(*args: str, db: str) -> _Ran:
    """The CLI in this process (click's runner): the same code, exit code and stderr as the
    executable, without a second of interpreter start-up per call. One call per test goes
    through the real executable (``handoff``) to show the shell sees the same."""
    return _Ran(invoke(["--db", db, *args]))


def _tables(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute("SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN "
                         "('pg_catalog', 'information_schema') ORDER BY 1, 2").fetchall()


def _one_line_exit_3(r, *words: str) -> str:
    assert r.returncode == 3, (r.returncode, r.stderr)
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    for w in words:
        assert w in line, line
    return line


def test_a_wrong_password_is_refused_in_one_line_and_never_printed(private_cluster, evidence):
    name = "pw_" + secrets.token_hex(4)
    right, wrong = "right-" + secrets.token_hex(6), "wrong-" + secrets.token_hex(6)
    with psycopg.connect(private_cluster.url, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
        c.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{right}'")
        c.execute(f"ALTER DATABASE {name} OWNER TO {name}")
    base = private_cluster.url.rsplit("/", 1)[0].replace("postgres@", f"{name}:%s@") + f"/{name}"
    try:
        before = _tables(private_cluster.url.rsplit("/", 1)[0] + f"/{name}")
        for verb in (("init",), ("status",), ("open", "--goal", "g", "--target", "chat:#ops", "--owner", "alice")):
            r = cli(*verb, db=base % wrong)
            line = _one_line_exit_3(r, "password authentication failed", "***")
            assert wrong not in r.stderr + r.stdout and right not in r.stderr
        shell = handoff("status", db=base % wrong)  # what a shell agent sees: the same line, exit 3
        assert shell.returncode == 3 and shell.stderr.strip() == r.stderr.strip() and wrong not in shell.stderr
        assert _tables(private_cluster.url.rsplit("/", 1)[0] + f"/{name}") == before == []
        ok = cli("init", db=base % right)  # the right one works, so the refusal was the password's
        assert ok.returncode == 0, ok.stderr
        evidence.add("pg_access_wrong_password", exit=r.returncode, error=line[:200])
    finally:
        with psycopg.connect(private_cluster.url, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            c.execute(f"DROP ROLE IF EXISTS {name}")


def test_a_database_that_does_not_exist_is_not_created(pg_url, evidence):
    missing = "handoff_missing_" + secrets.token_hex(4)
    url = pg_url.split("?")[0].rsplit("/", 1)[0] + "/" + missing
    for verb in (("init",), ("status",)):
        line = _one_line_exit_3(cli(*verb, db=url), f'database "{missing}" does not exist')
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (missing,)).fetchone()[0] == 0
    evidence.add("pg_access_wrong_database", error=line[:200])


def test_a_database_holding_something_else_is_not_a_ledger_and_is_left_alone(pg_url, evidence):
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        c.execute("INSERT INTO customers VALUES (1, 'ann')")
    before = _tables(pg_url)
    for verb in (("init",), ("status",), ("open", "--goal", "g", "--target", "chat:#ops", "--owner", "alice")):
        r = cli(*verb, "--json", db=pg_url)
        assert r.returncode == 3 and '"NotALedger"' in r.stderr, r.stderr
    assert _tables(pg_url) == before
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert c.execute("SELECT * FROM customers").fetchall() == [(1, "ann")]
    evidence.add("pg_access_not_a_ledger", error="NotALedger", tables_unchanged=True)


def test_a_ledger_of_a_newer_schema_is_refused_and_left_alone(pg_url, evidence):
    with Ledger(pg_url) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")
    with psycopg.connect(pg_url, autocommit=True) as c:
        # handoff_meta is documented (docs/postgres.md): the format mark and schema version.
        c.execute("UPDATE handoff_meta SET value = '99' WHERE key = 'schema_version'")
        rows = c.execute("SELECT id, hash FROM events ORDER BY id").fetchall()
    for verb in (("status",), ("evidence", run, "--kind", "k", "--outcome", "pass", "--by", "alice"), ("init",)):
        r = cli(*verb, "--json", db=pg_url)
        assert r.returncode == 3 and '"SchemaTooNew"' in r.stderr, r.stderr
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert c.execute("SELECT id, hash FROM events ORDER BY id").fetchall() == rows
        assert c.execute("SELECT value FROM handoff_meta WHERE key = 'schema_version'").fetchone()[0] == "99"
    evidence.add("pg_access_newer_schema", error="SchemaTooNew")


def test_a_role_without_write_privilege_cannot_append_revoke_or_rebuild(roles, evidence):  # noqa: F811
    with Ledger(roles.owner) as lg:
        lg.claim("r0", "w1")
        before = [(r.position, r.hash) for r in lg.store.read_all()]
    url = roles.url("auditor")
    refused = {}
    for name, verb in (("append", ("evidence", "r0", "--kind", "k", "--outcome", "pass", "--by", "alice")),
                       ("revoke", ("revoke", "r0", "--reason", "audit", "--by", "alice")),
                       ("rebuild", ("rebuild",))):
        r = cli(*verb, "--json", db=url)
        assert r.returncode == 3 and '"StoreUnavailable"' in r.stderr, (name, r.stderr)
        refused[name] = r.returncode
    with Ledger(roles.owner) as lg:
        assert [(r.position, r.hash) for r in lg.store.read_all()] == before
        assert lg.checkpoint("r0").worker == "w1"
    evidence.add("pg_access_no_write_privilege", refused=refused)


def test_a_superuser_edit_with_triggers_disabled_is_found_by_verify(pg_url, evidence):
    with Ledger(pg_url) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")
        lg.evidence(run, "check", "pass", "honest", by="alice")
    assert cli("verify", db=pg_url).returncode == 0
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("ALTER TABLE events DISABLE TRIGGER USER")
        c.execute("UPDATE events SET actor = 'owner:mallory' WHERE run_id = %s AND seq = 2", (run,))
        c.execute("ALTER TABLE events ENABLE TRIGGER USER")
    r = handoff("verify", db=pg_url)
    assert r.returncode == 4, (r.stdout, r.stderr)
    evidence.add("pg_access_superuser_edit", exit=r.returncode, report=(r.stdout + r.stderr).strip()[:200])
