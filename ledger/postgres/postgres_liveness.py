"""Liveness beside the log in PostgreSQL: one row per run that a heartbeat moves in place.

The interface is ``EventStore.beat``, ``liveness`` and ``put_liveness`` (ledger/store.py);
this is only its dialect, mixed into ``PostgresStore``. The roles have no right to the table
(docs/postgres.md, roles): a beat goes in through ``handoff_beat``, which hashes the lease
token's secret on the server and moves the row only while that digest is the run's current
lease's (the heads row is read ``FOR SHARE``, so a revoke committing meanwhile is waited for
and then refuses the beat), and a logged beat's row through ``handoff_put_liveness``, which checks
the token the same way and never moves a row back to an older lease. Both set ``synchronous_commit`` off for
their own transaction: a beat lost in a crash is silence, which is what a crash is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import StoreUnavailable
from ..store import LeaseToken, Liveness

TABLE = "liveness"
CREATE = (f"CREATE TABLE IF NOT EXISTS {TABLE} (run_id text COLLATE \"C\" PRIMARY KEY, lease bigint NOT NULL, "
          "beat_us bigint NOT NULL, beats bigint NOT NULL, logged_us bigint NOT NULL, attrs bytea NOT NULL, "
          "quiet_us bigint NOT NULL)")
BEAT_FUNCTION = f"""CREATE FUNCTION handoff_beat(p_run text, p_lease bigint, p_secret text, p_attrs bytea,
  p_now bigint, p_mark bigint)
RETURNS TABLE (beat_us bigint, beats bigint, logged_us bigint, quiet_us bigint, last_seq bigint, last_hash bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $$
DECLARE h_seq bigint; h_hash bytea;
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  SELECT h.last_seq, h.last_hash INTO h_seq, h_hash FROM heads h WHERE h.run_id = p_run AND h.lease = p_lease
    AND h.lease_digest IS NOT NULL
    AND h.lease_digest = encode(sha256('\\x{{domain}}'::bytea || convert_to(p_secret, 'UTF8')), 'hex') FOR SHARE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY UPDATE {TABLE} l SET beat_us = p_now, beats = l.beats + 1
    WHERE l.run_id = p_run AND l.lease = p_lease AND l.attrs = p_attrs AND l.beat_us >= p_now - l.quiet_us
      AND p_now >= l.beat_us
      AND l.logged_us > p_now - p_mark
    RETURNING l.beat_us, l.beats, l.logged_us, l.quiet_us, h_seq, h_hash;
END $$"""
PUT_FUNCTION = f"""CREATE FUNCTION handoff_put_liveness(p_run text, p_lease bigint, p_secret text, p_beat bigint,
  p_beats bigint, p_logged bigint, p_attrs bytea, p_quiet bigint, p_one_more boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $$
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  -- Only the holder of the run's current lease (its token, hashed here) may store its row:
  -- no role can make a revoked, never-granted or another worker's lease look alive.
  PERFORM 1 FROM heads h WHERE h.run_id = p_run AND h.lease = p_lease AND h.lease_digest IS NOT NULL
    AND h.lease_digest = encode(sha256('\\x{{domain}}'::bytea || convert_to(p_secret, 'UTF8')), 'hex') FOR SHARE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  INSERT INTO {TABLE} AS l (run_id, lease, beat_us, beats, logged_us, attrs, quiet_us)
    VALUES (p_run, p_lease, p_beat, p_beats, p_logged, p_attrs, p_quiet)
  ON CONFLICT (run_id) DO UPDATE SET
    beat_us = CASE WHEN excluded.lease = l.lease AND NOT p_one_more THEN greatest(l.beat_us, excluded.beat_us)
                   ELSE excluded.beat_us END,
    beats = CASE WHEN excluded.lease <> l.lease THEN excluded.beats WHEN p_one_more THEN l.beats + 1
                 ELSE greatest(l.beats, excluded.beats) END,
    lease = excluded.lease, logged_us = excluded.logged_us, attrs = excluded.attrs, quiet_us = excluded.quiet_us
  WHERE excluded.lease >= l.lease;
END $$"""
SIGNATURES = ("handoff_beat(text, bigint, text, bytea, bigint, bigint)",
              "handoff_put_liveness(text, bigint, text, bigint, bigint, bigint, bytea, bigint, boolean)")


def _not_granted(exc: StoreUnavailable) -> bool:
    """The role may not execute the liveness functions (a ledger upgraded to schema 12 whose
    roles SQL was not run again): the beat then goes through ``handoff_append``."""
    return "permission denied" in str(exc.details.get("cause", exc.message)).lower()


class PostgresLiveness:
    """``beat``, ``liveness`` and ``put_liveness`` for ``PostgresStore``, which provides its
    connection (``x``), lock (``_reading``) and clock."""

    readonly: bool
    _in_txn: bool

    if TYPE_CHECKING:
        def _reading(self, doing: str) -> Any: ...
        def x(self, sql: str, args: Any = None) -> Any: ...
        def _clock(self) -> int: ...

    def beat(self, run_id: str, token: LeaseToken, attrs: bytes, *,
             mark_us: int) -> tuple[Liveness, int, bytes] | None:
        if self.readonly or self._in_txn:
            return None  # the command path says why, or joins the open transaction
        try:
            with self._reading("recording a heartbeat"):
                row = self.x("SELECT * FROM handoff_beat(%s, %s, %s, %s, %s, %s)",
                             (run_id, token.lease, token.secret, attrs, self._clock(), mark_us)).fetchone()
        except StoreUnavailable as exc:
            if not _not_granted(exc):
                raise
            return None  # a role the roles SQL has not granted handoff_beat yet: every beat is logged
        if row is None:
            return None
        return Liveness(run_id, token.lease, row[0], row[1], row[2], attrs, row[3]), row[4], bytes(row[5])

    def liveness(self, run_ids: Iterable[str]) -> dict[str, Liveness]:
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        with self._reading("reading liveness"):
            rows = self.x(f"SELECT run_id, lease, beat_us, beats, logged_us, attrs, quiet_us FROM {TABLE} "
                          "WHERE run_id = ANY(%s)", (ids,)).fetchall()
        return {r[0]: Liveness(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6]) for r in rows}

    def put_liveness(self, live: Liveness, token: LeaseToken, *, one_more: bool = False) -> None:
        if self.readonly or token.lease != live.lease:
            return
        try:
            with self._reading("recording liveness"):
                self.x("SELECT handoff_put_liveness(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                       (live.run_id, live.lease, token.secret, live.beat_us, live.beats, live.logged_us, live.attrs,
                        live.quiet_us, one_more))
        except StoreUnavailable as exc:
            if not _not_granted(exc):
                raise
