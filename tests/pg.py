"""The PostgreSQL server the tests use: one database per test session, one schema per store.

The server is named by ``HANDOFF_TEST_PG`` (default: the local server, user postgres,
trust authentication). The first test that needs it creates a database with a random
name; the session's end drops it (tests/conftest.py). Each fresh store gets a schema of
its own in that database, which is much cheaper than a database per test.

Unreachable: under ``CI=true`` the test FAILS (a CI run must never pass by skipping the
backend); elsewhere it skips, saying why.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse

import pytest

SERVER = os.environ.get("HANDOFF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
_state: dict[str, str | None] = {"db": None, "error": None}


def _admin():
    import psycopg

    return psycopg.connect(SERVER, autocommit=True, connect_timeout=3)


def _with_db(url: str, db: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + db))


def database_url() -> str:
    """The session's own database (created on first use), or skip / fail if there is no server."""
    if _state["db"] is None and _state["error"] is None:
        try:
            import psycopg  # noqa: F401 - the extra may be missing
        except ImportError as exc:
            _state["error"] = f"psycopg is not installed ({exc}); pip install -e '.[test,postgres]'"
        else:
            name = "handoff_test_" + secrets.token_hex(6)
            try:
                with _admin() as conn:
                    conn.execute(f"CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0")  # the store needs UTF8
                _state["db"] = name
            except Exception as exc:  # psycopg.OperationalError and friends
                _state["error"] = f"PostgreSQL at {SERVER} is unreachable: {str(exc).strip()[:200]}"
    if _state["error"] is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {_state['error']}: the PostgreSQL backend must be tested in CI")
        pytest.skip(_state["error"])
    return _with_db(SERVER, _state["db"])  # type: ignore[arg-type]


def fresh_url() -> str:
    """An address naming a new, empty schema in the session's database."""
    import psycopg

    url = database_url()
    schema = "t_" + secrets.token_hex(6)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=" + urllib.parse.quote(f"-csearch_path={schema}")


def drop_database() -> None:
    name = _state["db"]
    if name is None:
        return
    _state["db"] = None
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def append_call(conn, run_id: str, event, *, actor: str = "worker:w", lease: int | None = None,
                secret: str | None = None, move=None, rows=None) -> tuple[str, tuple]:
    """handoff_append's call and arguments for one batch on ``run_id`` after its head as
    ``conn`` reads it, built by hand as a client (or an attacker) would: the chain hash
    computed as the library does. ``move``: (new lease, holder, digest) to move the lease
    to. Lets a test hold a write inside its transaction, or send one the library would
    never send. ``event`` may be a list (one batch); ``rows``, given the batch's rows
    ([write id, seq, type, key, digest, payload, prev, hash], hex), returns the rows to
    send instead."""
    import json

    from handoff.ledger import events as ev
    from handoff.ledger.postgres.postgres_schema import APPEND_SIGNATURE
    from handoff.ledger.store import GENESIS_HASH, chain_hash, encode_events

    head = conn.execute("SELECT last_seq, last_hash, lease, lease_holder, max_lease, last_position "
                        "FROM heads WHERE run_id = %s", (run_id,)).fetchone() or (0, GENESIS_HASH, None, None, 0, 0)
    at = 1_900_000_000_000_000
    (first_id,) = conn.execute("SELECT nextval('events_id_seq')").fetchone()
    batch, prev = [], bytes(head[1])
    for i, (tag, payload) in enumerate(encode_events(event if isinstance(event, list) else [event], 1 << 20)):
        seq = head[0] + 1 + i
        h = chain_hash(prev, run_id, seq, tag, actor, lease, None, at, ev.SCHEMA_VERSION, payload)
        batch.append([first_id + i, seq, tag, None, None, payload.hex(), prev.hex(), h.hex()])
        prev = h
    new_lease, holder, digest = move if move is not None else (head[2], head[3], None)
    prev = bytes(head[1])
    rows = json.dumps(rows(batch) if rows is not None else batch)
    args = (run_id, head[0], prev, secret, lease, actor, at, ev.SCHEMA_VERSION, False, rows,
            new_lease, holder, max(head[4], new_lease or 0), digest, move is not None, None, None)
    return f"SELECT {APPEND_SIGNATURE.split('(')[0]}({', '.join(['%s'] * 17)})", args
