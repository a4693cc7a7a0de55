"""The functions that keep a view table's rows inside a write (PostgreSQL).

The writer, watchdog and auditor roles have no right to change a view table: a write's
view rows go to the server with its batch, to ``handoff_append`` (run as the ledger's
owner), which keeps them through ``handoff_views`` in the same transaction: it holds the
body of each table's ``handoff_sync_<table>`` (which a catch-up calls on its own). So a
role can change a run's view rows only by appending to that run, as the inline
projections would, and never blind the watchdog by editing one.
The functions are made by the owner with the tables (ledger/postgres/postgres_view_store.py), have
static SQL (their plans are cached per session), and are executable by nobody else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from ..view_tables import TableSpec

PREFIX = "handoff_sync_"
#: The tables a ledger's handoff_sync_ functions keep (those whose table still exists),
#: with each function's body.
EXISTING = (
    "SELECT substr(p.proname, length('handoff_sync_') + 1), p.prosrc FROM pg_proc p "
    "WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'handoff\\_sync\\_%' "
    "AND to_regclass(quote_ident(substr(p.proname, length('handoff_sync_') + 1))) IS NOT NULL"
)


def sync_function(spec: TableSpec, table: str) -> str:
    """``handoff_sync_<table>(run, rows, many)``: upsert the rows (a row left unchanged is
    not written), and with ``many`` first delete the run's rows that are not among them.
    ``table`` is an identifier the view store has checked."""
    cols = list(spec.column_names)
    pk = list(spec.pk)
    rest = [c for c in cols if c not in pk]
    match = " AND ".join(f"r.{c} = t.{c}" for c in pk)
    if rest:
        conflict = (f"DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in rest)} "
                    f"WHERE ROW({', '.join('t.' + c for c in rest)}) IS DISTINCT FROM "
                    f"ROW({', '.join('excluded.' + c for c in rest)})")
    else:
        conflict = "DO NOTHING"
    return f"""CREATE OR REPLACE FUNCTION {PREFIX}{table}(p_run text, p_rows jsonb, p_many boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF p_many THEN
    DELETE FROM {table} t WHERE t.run_id = p_run AND NOT EXISTS (
      SELECT 1 FROM jsonb_populate_recordset(NULL::{table}, p_rows) r WHERE {match});
  END IF;
  INSERT INTO {table} AS t ({', '.join(cols)})
  SELECT {', '.join('r.' + c for c in cols)}
  FROM jsonb_populate_recordset(NULL::{table}, p_rows) WITH ORDINALITY AS r ORDER BY r.ordinality
  ON CONFLICT ({', '.join(pk)}) {conflict};
END $$"""


def views_function(bodies: Iterable[tuple[str, str]]) -> str:
    """``handoff_views(run, views)``: each table's rows kept as its sync function keeps
    them, that function's body written out here (a call per table per write costs more
    than its statements); a table this ledger does not have is refused (the write then
    fails whole: no view is left behind). ``bodies``: (table, its sync function's body)."""
    whens = "".join(f"      WHEN '{t}' THEN\n"
                    f"        DECLARE p_rows jsonb := v->'r'; p_many boolean := (v->>'m')::boolean;"
                    f"{body.rstrip()};\n"
                    for t, body in sorted(bodies))
    refuse = ("RAISE EXCEPTION 'handoff: % is not a view table of this ledger', k\n"
              "        USING ERRCODE = 'invalid_parameter_value';")
    keep = f"    CASE k\n{whens}      ELSE {refuse}\n    END CASE;" if whens else f"    {refuse}"
    return f"""CREATE OR REPLACE FUNCTION handoff_views(p_run text, p_views jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE k text; v jsonb;
BEGIN
  FOR k, v IN SELECT * FROM jsonb_each(p_views) LOOP
{keep}
  END LOOP;
END $$"""


def as_json(value: Any) -> str:
    """A write's batch, view rows or a decision's view counts as the JSON the functions
    read. Byte strings must already be bytea's hex text (``hexed``): the functions read
    them so, and msgspec would write base64."""
    return msgspec.json.encode(value).decode()


def hexed(row: dict[str, Any]) -> dict[str, Any]:
    """A view row with its byte strings as bytea's hex text (what jsonb_populate_recordset
    reads into a bytea column); the row itself when it has none."""
    for v in row.values():  # (a loop, not any() over a generator: every write's rows pass here)
        if type(v) in _BYTES:
            return {k: "\\x" + bytes(v).hex() if type(v) in _BYTES else v for k, v in row.items()}
    return row


_BYTES = (bytes, bytearray, memoryview)
