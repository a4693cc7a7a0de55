"""PostgreSQL's least-privilege roles: the SQL that creates them, for a ledger's schema."""

from __future__ import annotations

import re

from ..errors import InvalidInput
from .postgres_values import SIGNATURES as VALUES_SIGNATURES
from .postgres_liveness import SIGNATURES as LIVENESS_SIGNATURES
from .postgres_schema import APPEND_SIGNATURE, ident

_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def roles_sql(schema: str, prefix: str = "handoff") -> str:
    """The SQL that creates the ledger's least-privilege group roles in ``schema``.

    Three NOLOGIN roles (``<prefix>_writer``, ``<prefix>_watchdog``, ``<prefix>_auditor``);
    make LOGIN roles members of them (``GRANT handoff_writer TO worker_host1``). All three
    read every table. None may write to any table, lock one, or create one: writer and
    watchdog append through ``handoff_append`` (run as the owner, which checks the head,
    the lease's token and the chain, and keeps the heads and the views), and seal through
    ``handoff_seal``; the auditor calls nothing. So a writer cannot move a run's head or
    lease, blind the watchdog by changing a view row, or write as another worker; and no
    role can hold a lock that writes wait on. A projection rebuild, a catch-up of the views
    and an import stay the owner's. Run it as the role that owns the ledger, after
    ``handoff init`` (and again after an upgrade that says so): the default privileges it
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
        # Read everything; write, lock or change nothing (an earlier version of this SQL
        # granted appenders DML on the heads and the views: taken back here).
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {everyone};",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {everyone};",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {everyone};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} REVOKE ALL ON TABLES FROM {everyone};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} REVOKE ALL ON SEQUENCES FROM {everyone};",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT SELECT ON TABLES TO {everyone};",
        # A write's ids (nextval), its one statement, and sealing (run as the owner).
        f"GRANT USAGE ON SEQUENCE {s}.events_id_seq TO {appenders};",
        f"REVOKE ALL ON FUNCTION {s}.{APPEND_SIGNATURE}, {s}.handoff_seal(boolean, bigint[]), "
        f"{s}.handoff_queue(), {s}.handoff_views(text, jsonb) FROM PUBLIC, {everyone};",
        f"GRANT EXECUTE ON FUNCTION {s}.{APPEND_SIGNATURE}, {s}.handoff_seal(boolean, bigint[]) TO {appenders};",
        # Values beside the log: put under their sha256, deleted only as a recorded erasure says.
        f"REVOKE ALL ON FUNCTION {', '.join(f'{s}.{sig}' for sig in VALUES_SIGNATURES)} FROM PUBLIC, {everyone};",
        f"GRANT EXECUTE ON FUNCTION {', '.join(f'{s}.{sig}' for sig in VALUES_SIGNATURES)} TO {appenders};",
        # Liveness beside the log: a beat proves its lease token on the server.
        f"REVOKE ALL ON FUNCTION {', '.join(f'{s}.{sig}' for sig in LIVENESS_SIGNATURES)} FROM PUBLIC, {everyone};",
        f"GRANT EXECUTE ON FUNCTION {', '.join(f'{s}.{sig}' for sig in LIVENESS_SIGNATURES)} TO {appenders};",
        f"REVOKE CREATE ON SCHEMA {s} FROM {everyone};",
        f"-- check: SELECT has_table_privilege('{writer}', {lit}, 'INSERT');  -- false",
        "COMMIT;",
    ]
    return "\n".join(out) + "\n"
