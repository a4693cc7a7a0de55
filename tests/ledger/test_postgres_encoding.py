"""A PostgreSQL database whose encoding is not UTF8 is refused, typed, and left as it was.

On SQL_ASCII the driver hands text back as bytes and the server neither checks nor
converts it, so a ledger there cannot promise that what it reads is what was written. The
store refuses at connect (StoreUnavailable, exit 3) before it reads or creates anything.
The client side is the store's own: it asks for UTF8 whatever PGCLIENTENCODING says.

Each test module run creates one SQL_ASCII database with a random name and drops it at
the end, even when a test fails. No server: skip with the reason, or fail under CI=true
(tests/pg.py).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from handoff.ledger.errors import StoreUnavailable
from handoff.ledger.postgres.connection import _require_utf8
from handoff.ledger.postgres.postgres_store import PostgresStore
from tests import pg
from tests.support import executable

UNICODE = "Résumé ✓ 日本語"  # outside Latin-1 and ASCII both


@pytest.fixture(scope="module")
def ascii_db():
    """(name, url) of a new SQL_ASCII database, dropped at the end whatever happened."""
    pg.database_url()  # skips, or fails under CI=true, when there is no server
    name = "handoff_enc_" + secrets.token_hex(6)
    with pg._admin() as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
                     "TEMPLATE template0")
    try:
        yield name, pg._with_db(pg.SERVER, name)
    finally:
        with pg._admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def snapshot(url: str) -> list[tuple[str, ...]]:
    """Everything a ledger could leave in the database: schemas, relations, functions,
    types and triggers outside the system's own, and the ledger's rows where it has them.
    On SQL_ASCII the driver returns text as bytes, so every value is compared as its repr."""
    import psycopg

    def text(v: object) -> str:
        return v.decode() if isinstance(v, bytes) and v.isascii() else repr(v)

    own = "NOT IN ('pg_catalog', 'information_schema', 'pg_toast')"
    with psycopg.connect(url, autocommit=True) as conn:
        rows = [tuple(map(text, r)) for r in conn.execute(
            f"SELECT 'schema', nspname, '' FROM pg_namespace WHERE nspname {own} "
            "AND nspname NOT LIKE 'pg_temp%' AND nspname NOT LIKE 'pg_toast_temp%' "
            f"UNION ALL SELECT 'rel', n.nspname, c.relname FROM pg_class c "
            f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname {own} "
            f"UNION ALL SELECT 'fn', n.nspname, p.proname FROM pg_proc p "
            f"JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname {own} "
            f"UNION ALL SELECT 'type', n.nspname, t.typname FROM pg_type t "
            f"JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname {own} "
            "UNION ALL SELECT 'trigger', tgrelid::regclass::text, tgname FROM pg_trigger "
            "WHERE NOT tgisinternal"
        )]
        for schema, in conn.execute("SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                                    "ON n.oid = c.relnamespace WHERE c.relname = 'events'"):
            schema = text(schema)
            for table in ("handoff_meta", "events", "ledger_tail", "heads"):
                rows += [(table, *map(text, r)) for r in conn.execute(
                    f'SELECT * FROM "{schema}".{table} ORDER BY 1, 2')]
    return sorted(rows)


def assert_refusal(exc: BaseException | str, name: str) -> None:
    text = exc if isinstance(exc, str) else str(exc)
    assert f"database {name} " in text and "uses encoding SQL_ASCII" in text, text
    assert "needs a UTF8 database" in text and "exactly as it was written" in text, text
    assert "Nothing was created or written" in text, text
    assert f'CREATE DATABASE "{name}_utf8" ENCODING \'UTF8\' TEMPLATE template0' in text, text
    assert f'to reuse the name "{name}", first save what this database holds, with pg_dump' in text, text


# --- init on a SQL_ASCII database ----------------------------------------------------


@pytest.mark.parametrize("how", ["store", "ledger"])
def test_init_on_a_sql_ascii_database_is_refused_typed_and_creates_nothing(ascii_db, how):
    from handoff.facade import Ledger

    name, url = ascii_db
    before = snapshot(url)
    assert not [r for r in before if r[0] != "schema"]  # an empty database: only schema public
    with pytest.raises(StoreUnavailable) as caught:
        if how == "store":
            PostgresStore(url)  # create=True: what init does
        else:
            Ledger(url)
    assert_refusal(caught.value, name)
    assert caught.value.exit_code == 3
    assert caught.value.details == {"database": name, "server_encoding": "SQL_ASCII"}
    assert snapshot(url) == before


def test_the_cli_init_exits_3_with_the_message_on_stderr_and_creates_nothing(ascii_db):
    name, url = ascii_db
    before = snapshot(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    proc = subprocess.run([*executable(), "--db", url, "init"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert_refusal(proc.stderr, name)
    assert snapshot(url) == before


# --- an existing ledger restored into a SQL_ASCII database ---------------------------


@pytest.fixture(scope="module")
def restored(ascii_db):
    """A ledger with a run, made in a UTF8 database and restored (pg_dump | psql) into the
    SQL_ASCII one, as a backup restored into a wrongly created database would be."""
    from handoff.facade import Ledger

    tools = [shutil.which("pg_dump"), shutil.which("psql")]
    if None in tools:
        reason = "pg_dump and psql are needed to restore a ledger into the SQL_ASCII database"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    name, url = ascii_db
    source = pg.fresh_url()
    with Ledger(source) as lg:
        lg.open(run_id="r1", goal=UNICODE, target="chat:#ops", owner="alice")
    with PostgresStore(source) as store:
        schema = store.schema_name()
    dump = subprocess.run([tools[0], "--no-owner", "-n", schema, "-d", pg.database_url()],
                          capture_output=True, text=True, timeout=120, check=True).stdout
    subprocess.run([tools[1], "-q", "-v", "ON_ERROR_STOP=1", "-d", url], input=dump,
                   capture_output=True, text=True, timeout=120, check=True)
    sep = "&" if "?" in url else "?"
    return name, f"{url}{sep}options=-csearch_path%3D{schema}"


@pytest.mark.parametrize("how", ["writable", "no-create", "readonly", "ledger"])
def test_opening_an_existing_ledger_on_sql_ascii_is_refused_typed_and_changes_nothing(restored, how):
    from handoff.facade import Ledger

    name, url = restored
    before = snapshot(url)
    assert any(r[0] == "events" for r in before)  # the restored ledger is there
    with pytest.raises(StoreUnavailable) as caught:
        if how == "writable":
            PostgresStore(url)
        elif how == "no-create":
            PostgresStore(url, create=False)
        elif how == "readonly":
            PostgresStore(url, readonly=True)
        else:
            Ledger(url)
    assert_refusal(caught.value, name)
    assert snapshot(url) == before


def test_the_cli_on_an_existing_ledger_exits_3_with_the_message_on_stderr(restored):
    name, url = restored
    before = snapshot(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    for args in (["status"], ["log", "r1"], ["init"]):
        proc = subprocess.run([*executable(), "--db", url, *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 3, (args, proc.stdout + proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert_refusal(proc.stderr, name)
    assert snapshot(url) == before


# --- the client encoding is the store's, not the environment's -----------------------


@pytest.mark.parametrize("setting", ["env LATIN1", "env SQL_ASCII", "address LATIN1"])
def test_text_round_trips_on_utf8_whatever_client_encoding_the_user_asks_for(monkeypatch, setting):
    """PGCLIENTENCODING (or client_encoding in the address) used to reach the store's
    session: LATIN1 failed a write with a raw UnicodeEncodeError, SQL_ASCII any open with
    a TypeError. The store now asks for UTF8 itself, which wins over both."""
    from handoff.facade import Ledger

    url = base = pg.fresh_url()
    where, encoding = setting.split()
    if where == "env":
        monkeypatch.setenv("PGCLIENTENCODING", encoding)
    else:
        url += f"&client_encoding={encoding}"
    with Ledger(url) as lg:
        assert lg.store._conn.info.encoding == "utf-8"
        run = lg.open(run_id="r1", goal=UNICODE, target=f"chat:#{UNICODE}", owner=f"ålice {UNICODE}")
        lease = lg.claim(run, f"wörker {UNICODE}")
        lg.transition(run, lease, "planning")
        lg.progress(run, lease, "plan_committed", detail=UNICODE)
    monkeypatch.delenv("PGCLIENTENCODING", raising=False)
    with Ledger(base) as lg:  # read back in a plain UTF8 session
        st = lg.status("r1")
        assert (st["goal"], st["target"], st["owner"], st["worker"]) == (
            UNICODE, f"chat:#{UNICODE}", f"ålice {UNICODE}", f"wörker {UNICODE}")
        assert lg.check() == []


def test_a_session_that_still_is_not_utf8_is_refused_typed():
    """Belt and braces: should anything between (a pooler) answer the store's UTF8 with
    another client encoding, the open is refused, typed, not failed on the first text."""
    info = SimpleNamespace(dbname="handoff", encoding="iso8859-1",
                           parameter_status={"server_encoding": "UTF8", "client_encoding": "LATIN1"}.get)
    with pytest.raises(StoreUnavailable) as caught:
        _require_utf8(SimpleNamespace(info=info), "postgresql://me@db/handoff")
    assert "client encoding LATIN1" in str(caught.value) and "UTF8" in str(caught.value)
    assert caught.value.exit_code == 3
