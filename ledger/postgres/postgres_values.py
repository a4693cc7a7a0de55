"""Values beside the log in PostgreSQL: one table, a row per run and sha256.

The interface is ``EventStore.put_values`` and its siblings (ledger/store.py); this is
only its dialect, mixed into ``PostgresStore``. The roles have no right to the table
(docs/postgres.md, roles): a value goes in through ``handoff_put_values``, which checks
that its name is its sha256 and writes it once, and goes out only through
``handoff_delete_values``, which deletes only what a recorded ``values_erased`` event of
the run names and no graph event after it names again. A put made while a write is decided (an ``execute``'s decide) joins that
write's one message, so a checkpoint's values and its event commit or roll back together.

A write may also name values it needs already stored (a value it continues, one it names
again): a digest sent with no bytes. ``handoff_put_values`` checks those in the write's
transaction and refuses the whole write (SQLSTATE ``HL409``) when one is not stored or a
recorded ``values_erased`` event names it, so nothing continues a value that is gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..verify import not_stored

TABLE = "run_values"
CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id text COLLATE \"C\" NOT NULL, sha256 text NOT NULL, "
          "value bytea NOT NULL, PRIMARY KEY (run_id, sha256))")
PUT_FUNCTION = f"""CREATE FUNCTION handoff_put_values(p_run text, p_digests text[], p_values bytea[])
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $$
DECLARE n integer; gone text;
BEGIN
  IF cardinality(p_digests) <> cardinality(p_values) OR EXISTS (
       SELECT 1 FROM unnest(p_digests, p_values) AS t(d, v) WHERE encode(sha256(t.v), 'hex') <> t.d) THEN
    RAISE EXCEPTION 'handoff: a value of run % is not named by its sha256', p_run
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT t.d INTO gone FROM unnest(p_digests, p_values) AS t(d, v) WHERE t.v IS NULL AND (
      NOT EXISTS (SELECT 1 FROM {TABLE} r WHERE r.run_id = p_run AND r.sha256 = t.d)
      OR EXISTS (SELECT 1 FROM events e WHERE e.run_id = p_run AND e.type = 'values_erased'
                 AND position(convert_to(t.d, 'UTF8') IN e.payload) > 0)) LIMIT 1;
  IF gone IS NOT NULL THEN
    RAISE EXCEPTION 'handoff: value % of run % is not stored', gone, p_run USING ERRCODE = 'HL409';
  END IF;
  INSERT INTO {TABLE} (run_id, sha256, value) SELECT p_run, t.d, t.v FROM unnest(p_digests, p_values) AS t(d, v)
  WHERE t.v IS NOT NULL ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$"""
DELETE_FUNCTION = f"""CREATE FUNCTION handoff_delete_values(p_run text, p_digests text[])
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $$
DECLARE n integer;
BEGIN
  DELETE FROM {TABLE} v WHERE v.run_id = p_run AND v.sha256 = ANY(p_digests)
    AND EXISTS (SELECT 1 FROM events e WHERE e.run_id = p_run AND e.type = 'values_erased'
                AND position(convert_to(v.sha256, 'UTF8') IN e.payload) > 0
                AND NOT EXISTS (SELECT 1 FROM events g WHERE g.run_id = p_run AND g.seq > e.seq
                                AND g.type IN ('graph_checkpoint_saved', 'graph_writes_saved')
                                AND position(convert_to(v.sha256, 'UTF8') IN g.payload) > 0));
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$"""
SIGNATURES = ("handoff_put_values(text, text[], bytea[])", "handoff_delete_values(text, text[])")
#: The SQLSTATE of handoff_put_values' refusal of a write that needs a value not stored.
VALUE_NOT_STORED = "HL409"


def digest_in(message: str) -> str | None:
    """The digest handoff_put_values names in its HL409 refusal."""
    m = re.search(r"value ([0-9a-f]{64}) of run", message)
    return m.group(1) if m else None


class PostgresValues:
    """``put_values``, ``get_values``, ``delete_values`` and ``value_digests`` for
    ``PostgresStore``, which provides what is declared here: its connection (``x``) and
    lock (``_reading``), and the write being decided (``join_values``)."""

    values_join_writes = True
    readonly: bool
    path: str

    if TYPE_CHECKING:
        def _reading(self, doing: str) -> Any: ...
        def x(self, sql: str, args: Any = None) -> Any: ...
        def join_values(self, run_id: str, values: dict[str, bytes | None]) -> bool: ...

    def put_values(self, run_id: str, values: dict[str, bytes]) -> int:
        if not values:
            return 0
        self._writable("storing values")
        if self.join_values(run_id, values):
            return len(values)
        with self._reading("storing values"):
            return int(self.x("SELECT handoff_put_values(%s, %s, %s)",
                              (run_id, list(values), list(values.values()))).fetchone()[0])

    def require_values(self, run_id: str, digests: Iterable[str]) -> None:
        """Refuse (ValueNotStored) the write being decided unless each value is stored and no
        recorded erasure names it: checked by handoff_put_values in that write's own
        transaction. Outside a write, the same check on its own."""
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return
        self._writable("checking values")
        if self.join_values(run_id, dict.fromkeys(wanted)):
            return
        with self._reading("checking values"):
            stored = {d for (d,) in self.x(f"SELECT sha256 FROM {TABLE} WHERE run_id = %s AND sha256 = ANY(%s)",
                                          (run_id, wanted))}
            erasures = [bytes(p) for (p,) in self.x(
                "SELECT payload FROM events WHERE run_id = %s AND type = 'values_erased'", (run_id,))]
        for d in wanted:
            if d not in stored or any(d.encode() in p for p in erasures):
                raise not_stored(run_id, d)

    def get_values(self, run_id: str, digests: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return {}
        with self._reading("reading values"):
            rows = self.x(f"SELECT sha256, value FROM {TABLE} WHERE run_id = %s AND sha256 = ANY(%s)",
                          (run_id, wanted)).fetchall()
        return {d: bytes(v) for d, v in rows}

    def delete_values(self, run_id: str, digests: Iterable[str]) -> int:
        """Delete values a recorded ``values_erased`` event of the run names (no other)."""
        wanted = list(dict.fromkeys(digests))
        if not wanted:
            return 0
        self._writable("deleting values")
        with self._reading("deleting values"):
            return int(self.x("SELECT handoff_delete_values(%s, %s)", (run_id, wanted)).fetchone()[0])

    def value_digests(self, run_id: str) -> dict[str, str]:
        # The server hashes the bytes: verify reads 64 characters per value, not the value.
        with self._reading("reading values"):
            rows = self.x(f"SELECT sha256, encode(sha256(value), 'hex') FROM {TABLE} WHERE run_id = %s",
                          (run_id,)).fetchall()
        return dict(rows)

    def _writable(self, doing: str) -> None:
        if self.readonly:
            from ..errors import StoreUnavailable

            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
