"""PostgreSQL's least-privilege roles: the SQL that creates them, for a ledger's schema."""

from __future__ import annotations

import re

from ..errors import InvalidInput
from .blobs import TABLE as VALUES
from .schema import LEDGER_TABLES as _LEDGER_TABLES
from .schema import ident

_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")
#: The tables of the ledger proper. Every other table in the schema is a view table or a
#: projection's tracking/version table, which appends keep inline.
_LEDGER_TABLES = ("events", "heads", "ledger_tail", "ledger_order", "unsealed", "handoff_meta")


def roles_sql(schema: str, prefix: str = "handoff") -> str:
    """The SQL that creates the ledger's least-privilege group roles in ``schema``.

    Three NOLOGIN roles (``<prefix>_writer``, ``<prefix>_watchdog``, ``<prefix>_auditor``);
    make LOGIN roles members of them (``GRANT handoff_writer TO worker_host1``). Writer and
    watchdog may append (INSERT on ``events``, never UPDATE, DELETE or TRUNCATE; the
    heads, tail and view tables kept inline); the auditor only reads. None may create
    tables, so a projection rebuild (shadow tables swapped in) stays the owner's. Run it
    as the role that owns the ledger, after ``handoff init``: the default privileges it
    sets apply to the tables that role creates later (a rebuild's, a new projection's).
    Idempotent: running it twice changes nothing.
    """
    if not _ROLE_NAME.fullmatch(prefix):
        raise InvalidInput(f"a role prefix is lower-case letters, digits and _, not {prefix!r}", field="prefix")
    if not schema or "\x00" in schema:
        raise InvalidInput(f"{schema!r} is not a schema name", field="schema")
    s = ident(schema)
    writer, watchdog, auditor = (f"{prefix}_{r}" for r in ("writer", "watchdog", "auditor"))
    appenders = f"{writer}, {watchdog}"
    everyone = f"{writer}, {watchdog}, {auditor}"
    lit = "'" + f"{s}.events".replace("'", "''") + "'"
    # The name in a comment line: a control character (a newline) would end the comment and
    # turn the rest of a crafted schema name into SQL.
    shown = re.sub(r"[\x00-\x1f\x7f]", "?", schema)
    out = [
        f"-- handoff-ledger least-privilege roles for schema {shown} (docs/postgres.md, roles).",
        "-- Run as the role that owns the ledger's tables, after 'handoff init'.",
        "BEGIN;",
    ]
    for role, what in ((writer, "workers and the CLI: open, claim, append"),
                       (watchdog, "the watchdog: reads and appends (expiries, stalls)"),
                       (auditor, "auditors and dashboards: reads only")):
        out += [
            f"-- {role}: {what}",
            "DO $$ BEGIN",
            f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN",
            f"    CREATE ROLE {role} NOLOGIN;",
            "  END IF;",
            "END $$;",
        ]
    out += [
        "DO $$ BEGIN",
        f"  EXECUTE format('GRANT CONNECT ON DATABASE %I TO {everyone}', current_database());",
        "END $$;",
        f"GRANT USAGE ON SCHEMA {s} TO {everyone};",
        # View tables, tracking and version tables: whatever the schema holds besides the ledger.
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {appenders};",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {auditor};",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {s} TO {appenders};",
        # The ledger proper: exactly what an append needs.
        *(f"REVOKE ALL ON {s}.{t} FROM {appenders};" for t in _LEDGER_TABLES),
        f"GRANT SELECT, INSERT ON {s}.events TO {appenders};",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.heads TO {appenders};",
        f"GRANT SELECT ON {s}.ledger_tail, {s}.ledger_order TO {appenders};",
        f"GRANT SELECT ON {s}.unsealed TO {appenders};",
        # Values beside the log: written once, read, deleted after a recorded erasure; never changed.
        f"REVOKE UPDATE, TRUNCATE ON {s}.{VALUES} FROM {appenders};",
        # Sealing and queueing run as the owner (SECURITY DEFINER): callers need EXECUTE only.
        f"REVOKE ALL ON FUNCTION {s}.handoff_seal(boolean, bigint[]), {s}.handoff_queue() FROM PUBLIC;",
        f"GRANT EXECUTE ON FUNCTION {s}.handoff_seal(boolean, bigint[]) TO {everyone};",
        f"GRANT EXECUTE ON FUNCTION {s}.handoff_queue() TO {appenders};",
        # A write's locks and ids, and a guessed write's proof of its head (run as the caller).
        f"REVOKE ALL ON FUNCTION {s}.handoff_begin_write(integer), "
        f"{s}.handoff_expect_head(text, bigint, bytea) FROM PUBLIC;",
        f"GRANT EXECUTE ON FUNCTION {s}.handoff_begin_write(integer), "
        f"{s}.handoff_expect_head(text, bigint, bytea) TO {appenders};",
        f"GRANT SELECT ON {s}.handoff_meta TO {appenders};",
        # Tables the owner creates later (a rebuild's swapped-in tables, a new projection).
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {appenders};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT ON TABLES TO {auditor};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE ON SEQUENCES TO {appenders};",
        # Belt and braces: the log is never changed, whoever granted what before.
        f"REVOKE UPDATE, DELETE, TRUNCATE ON {s}.events, {s}.ledger_order FROM {everyone};",
        f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {s}.ledger_order, {s}.unsealed, {s}.ledger_tail "
        f"FROM {everyone};",
        f"REVOKE CREATE ON SCHEMA {s} FROM {everyone};",
        f"-- check: SELECT has_table_privilege('{writer}', {lit}, 'DELETE');  -- false",
        "COMMIT;",
    ]
    return "\n".join(out) + "\n"
