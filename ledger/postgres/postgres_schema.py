"""The PostgreSQL ledger's layout: tables, functions, triggers, locks and migrations.

Everything the store creates, and what ``verify`` and ``doctor`` compare the database
with, exactly as created. The functions are formatted for the ledger's schema (their
search_path is pinned to it) with ``psycopg.sql``'s quoting of identifiers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from ..store import GENESIS_HASH, LEASE_TOKEN_DOMAIN, Problem

from .postgres_values import CREATE as VALUES_TABLE
from .postgres_values import DELETE_FUNCTION as DELETE_VALUES
from .postgres_values import PUT_FUNCTION as PUT_VALUES
from .postgres_values import SIGNATURES as VALUES_SIGNATURES
from .postgres_liveness import BEAT_FUNCTION as BEAT
from .postgres_liveness import CREATE as LIVENESS_TABLE
from .postgres_liveness import PUT_FUNCTION as PUT_LIVENESS
from .postgres_liveness import SIGNATURES as LIVENESS_SIGNATURES
from .view_functions import views_function

try:  # the driver is an optional extra: pip install '.[postgres]' from the checkout
    from psycopg import sql as _sql
except ImportError:  # pragma: no cover - exercised only without the extra
    _sql = None  # type: ignore[assignment]


#: Layout version of the database schema (tables, indexes, triggers), kept in handoff_meta.
PG_SCHEMA_VERSION = 12
#: The advisory lock two sessions creating the schema at once meet on (nothing else
#: waits on an advisory lock: see MAINTENANCE_LOCK).
CREATE_LOCK = (0x48414E44, 0)  # "HAND"
#: Write ids come from a sequence in blocks of this size: one nextval per write, taken in
#: its first round trip, numbers the write's events (more blocks for a larger batch).
ID_BLOCK = 1024
#: The tables of the ledger proper. Every other table in the schema is a view table or a
#: projection's tracking/version table, which appends keep inline.
LEDGER_TABLES = ("events", "heads", "ledger_tail", "ledger_order", "unsealed", "handoff_meta")


def ident(name: str) -> str:
    """``name`` quoted as an SQL identifier (a schema's, a database's), by psycopg."""
    return _sql.Identifier(name).as_string()


#: The function and triggers that make the log append-only, exactly as created. verify
#: and doctor compare the database's with these.
REFUSE_FUNCTION = (
    "CREATE FUNCTION handoff_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "RAISE EXCEPTION 'handoff ledger events are append-only: % refused', TG_OP "
    "USING ERRCODE = 'insufficient_privilege'; END $$"
)
APPEND_ONLY_TRIGGERS = {
    "events_no_update": "CREATE TRIGGER events_no_update BEFORE UPDATE ON events "
    "FOR EACH ROW EXECUTE FUNCTION handoff_refuse_change()",
    "events_no_delete": "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
    "FOR EACH ROW EXECUTE FUNCTION handoff_refuse_change()",
    "events_no_truncate": "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
    "FOR EACH STATEMENT EXECUTE FUNCTION handoff_refuse_change()",
}
#: The ledger order is append-only too: a sealed position is never moved.
ORDER_TRIGGERS = {
    "ledger_order_no_update": "CREATE TRIGGER ledger_order_no_update BEFORE UPDATE ON ledger_order "
    "FOR EACH ROW EXECUTE FUNCTION handoff_refuse_change()",
    "ledger_order_no_delete": "CREATE TRIGGER ledger_order_no_delete BEFORE DELETE ON ledger_order "
    "FOR EACH ROW EXECUTE FUNCTION handoff_refuse_change()",
    "ledger_order_no_truncate": "CREATE TRIGGER ledger_order_no_truncate BEFORE TRUNCATE ON ledger_order "
    "FOR EACH STATEMENT EXECUTE FUNCTION handoff_refuse_change()",
}

#: Who wrote each event, said by the server: whatever an INSERT sends for ``db_role``,
#: the row keeps the session's role (a client cannot name another). verify checks it too.
STAMP_FUNCTION = (
    "CREATE FUNCTION handoff_stamp_role() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "NEW.db_role := session_user; RETURN NEW; END $$"
)
ROLE_TRIGGERS = {
    "events_stamp_role": "CREATE TRIGGER events_stamp_role BEFORE INSERT ON events "
    "FOR EACH ROW EXECUTE FUNCTION handoff_stamp_role()",
}

#: The locks every write depends on are taken only inside the functions below, which
#: run as the ledger's owner: a run's lock is its heads row (FOR UPDATE), the seal lock is
#: the ledger_tail row (FOR UPDATE), and the ledger-wide maintenance and views locks are
#: table locks on two empty tables. Row locks need UPDATE on the table and table locks
#: need a privilege on it, which the writer, watchdog and auditor roles do not have, so
#: no role can take one of them without writing, and none can stall a writer by holding
#: one. (Advisory locks, which any session may take, guard nothing here.)
MAINTENANCE_LOCK, VIEWS_LOCK = "handoff_lock_maintenance", "handoff_lock_views"
#: The statement that takes the seal lock (whoever seals holds it to the commit).
SEAL_LOCK = "SELECT 1 FROM ledger_tail FOR UPDATE"

#: Sealing (docs/postgres.md, "Order"): committed events wait in ``unsealed`` until a
#: sealer gives them the next gap-free positions and the ledger-wide chain, in the order
#: of their write ids, under the seal lock, which it holds to its commit. ``wait`` false:
#: seal only if nobody else is sealing; true: wait for the current sealer's commit (no
#: lock kept, nothing written), look again, and seal what is still queued (the waiters
#: wake together, and the first seals for them all). Returns the positions of ``mine``
#: that are sealed (all of them, unless ``wait`` was false and the lock was taken).
#: SECURITY DEFINER: a reader that finds unsealed events may seal them (the order is a pure function of what has
#: committed; nobody can choose it), without the right to write the order itself. Every
#: look-up in the log is by key, a subquery per queued event (joins let a plan cached
#: while the tables were small scan all of events and ledger_order on every seal).
POSITIONS_FUNCTION = """CREATE FUNCTION handoff_positions(fresh bigint[], fresh_hashes bytea[])
RETURNS bigint LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
DECLARE
  tpos bigint; g bytea; start bigint; r record; queued boolean; first bigint; i integer;
  ps bigint[] := ARRAY[]::bigint[]; es bigint[] := ARRAY[]::bigint[]; gs bytea[] := ARRAY[]::bytea[];
BEGIN
  -- The one place positions are given, the caller holding the seal lock: every queued
  -- event without one, and ``fresh`` (a writer's own, not queued, with their hashes), in
  -- write-id order.
  queued := EXISTS (SELECT 1 FROM unsealed);
  SELECT t.position, t.global_hash INTO tpos, g FROM ledger_tail t;
  start := tpos;
  IF NOT queued THEN  -- (the common case: only the writer's own, already in write-id order)
    FOR i IN 1 .. coalesce(cardinality(fresh), 0) LOOP
      tpos := tpos + 1;
      g := sha256(g || int8send(tpos) || fresh_hashes[i]);
      ps[i] := tpos; gs[i] := g;
    END LOOP;
    es := fresh; first := CASE WHEN cardinality(fresh) > 0 THEN start + 1 END;
  ELSE
  FOR r IN SELECT q.id, q.hash FROM (
             SELECT u.event_id AS id, (SELECT e.hash FROM events e WHERE e.id = u.event_id) AS hash
             FROM unsealed u
             WHERE queued AND (SELECT o.position FROM ledger_order o WHERE o.event_id = u.event_id) IS NULL
             UNION ALL SELECT f.id, f.hash FROM unnest(fresh, fresh_hashes) AS f(id, hash)) q
           ORDER BY q.id LOOP
    tpos := tpos + 1;
    g := sha256(g || int8send(tpos) || r.hash);
    ps := ps || tpos; es := es || r.id; gs := gs || g;
    IF r.id = fresh[1] THEN
      first := tpos;
    END IF;
  END LOOP;
  END IF;
  INSERT INTO ledger_order (position, event_id, global_hash) SELECT * FROM unnest(ps, es, gs);
  IF queued THEN
    -- Everything queued that now has a position (an import's rows too) leaves the queue.
    DELETE FROM unsealed u WHERE (SELECT true FROM ledger_order o WHERE o.event_id = u.event_id);
  END IF;
  IF tpos > start THEN
    UPDATE ledger_tail SET position = tpos, global_hash = g;
    PERFORM pg_notify('{channel}', '');
  END IF;
  RETURN first;
END $$"""
SEAL_FUNCTION = """CREATE FUNCTION handoff_seal(wait boolean, mine bigint[])
RETURNS TABLE (event_id bigint, event_position bigint) LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {schema}, pg_temp AS $$
DECLARE
  tries integer := 0;
BEGIN
  LOOP
    EXIT WHEN NOT EXISTS (SELECT 1 FROM unsealed) OR (cardinality(mine) > 0 AND
      (SELECT count((SELECT 1 FROM ledger_order o WHERE o.event_id = m.id)) FROM unnest(mine) AS m(id))
      = cardinality(mine));
    PERFORM 1 FROM ledger_tail FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
      PERFORM handoff_positions('{{}}', '{{}}');
      EXIT;
    END IF;
    EXIT WHEN NOT wait;
    tries := tries + 1;
    IF tries > 2 THEN
      PERFORM 1 FROM ledger_tail FOR UPDATE;  -- in line behind the sealer (lock_timeout applies)
      PERFORM handoff_positions('{{}}', '{{}}');
      EXIT;
    END IF;
    -- Somebody is sealing: wait for its commit without taking anything that writes (a
    -- share lock on the tail waits for the sealer's update of it, and goes with this
    -- block), then look again. Every waiter wakes at once; the first seals for them all,
    -- and the others find their events sealed and commit nothing.
    BEGIN
      LOCK TABLE ledger_tail IN SHARE MODE;
      RAISE EXCEPTION USING ERRCODE = 'HL100';
    EXCEPTION WHEN SQLSTATE 'HL100' THEN
      NULL;
    END;
  END LOOP;
  RETURN QUERY SELECT x.id, x.pos FROM (SELECT m.id, (SELECT o.position FROM ledger_order o
    WHERE o.event_id = m.id) AS pos FROM unnest(mine) AS m(id)) x WHERE x.pos IS NOT NULL;
END $$"""


#: Every inserted event joins the sealing queue, by its INSERT's statement trigger
#: (SECURITY DEFINER: a writer has no right to the queue, so it can neither skip it nor
#: fill it with what it likes). handoff_append then seals, in its own transaction, when
#: nobody else is sealing (handoff_seal, the one place positions are given); an import
#: writes the order itself, and its closing seal takes its rows off the queue.
QUEUE_FUNCTION = """CREATE FUNCTION handoff_queue() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {schema}, pg_temp AS $$
BEGIN
  IF current_setting('handoff.appending', true) IS DISTINCT FROM 'on' THEN
    INSERT INTO unsealed SELECT n.id FROM new_rows n;
  END IF;
  RETURN NULL;
END $$"""
QUEUE_TRIGGERS = {
    "events_queue": "CREATE TRIGGER events_queue AFTER INSERT ON events REFERENCING NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION handoff_queue()",
}

#: The one way a session writes events: the client decides from the run's head as it
#: knows it (its last write or read; else it reads first, with no lock) and sends the
#: batch here with the head it decided from. Run as the owner (SECURITY DEFINER; the
#: roles have no right to events, heads or the view tables), it takes the ledger's shared
#: lock, the views lock (shared, or exclusive when the decision read a view: ``guards``,
#: each view count the decision saw, checked again here), and the run's heads row. When
#: the head is not the one decided from, a view count changed, or the batch's key is
#: already used, it writes nothing and answers "moved:" and what handoff_read answers
#: (the client decides again from that, in the same number of round trips as a read).
#: It refuses with HL401 a write under a lease that does not show that lease's token;
#: checks the batch continues the run's chain and that the lease only moves by a grant
#: above the highest or a release; then moves the head, keeps the views
#: (``handoff_views``) and inserts the events and seals them (handoff_positions) unless
#: another session is sealing (then its trigger queues them). Returns "first write id:its
#: position" when they were sealed, else "". Fencing and idempotency are decided inside
#: the transaction that writes: the head they were decided from is the head written onto.
APPEND_FUNCTION = """CREATE FUNCTION handoff_append(
  p_run text, p_seq bigint, p_hash bytea, p_secret text, p_lease bigint,
  p_actor text, p_at bigint, p_schema integer, p_viewed boolean, p_rows jsonb,
  p_head_lease bigint, p_holder text, p_max_lease bigint, p_digest text, p_digest_moved boolean,
  p_views jsonb, p_guards jsonb)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
  h record; g jsonb; c record; q text; got bigint; n integer; r jsonb; p_ids bigint[]; p_seqs bigint[];
  p_types text[]; p_keys text[]; p_digests bytea[]; p_payloads bytea[]; p_prevs bytea[]; p_hashes bytea[];
BEGIN
  -- The batch: one row per event, [write id, seq, type, key, digest, payload, prev, hash],
  -- the byte strings in hex (one JSON text: what a client binds cheapest). One event, the
  -- common write, is read with plain expressions (no query to plan and run).
  n := coalesce(jsonb_array_length(p_rows), 0);
  IF n = 1 THEN
    r := p_rows->0;
    p_ids := ARRAY[(r->>0)::bigint]; p_seqs := ARRAY[(r->>1)::bigint]; p_types := ARRAY[r->>2];
    p_keys := ARRAY[r->>3]; p_digests := ARRAY[decode(r->>4, 'hex')]; p_payloads := ARRAY[decode(r->>5, 'hex')];
    p_prevs := ARRAY[decode(r->>6, 'hex')]; p_hashes := ARRAY[decode(r->>7, 'hex')];
  ELSIF n > 1 THEN
    SELECT array_agg((t.r->>0)::bigint ORDER BY o), array_agg((t.r->>1)::bigint ORDER BY o),
           array_agg(t.r->>2 ORDER BY o), array_agg(t.r->>3 ORDER BY o), array_agg(decode(t.r->>4, 'hex') ORDER BY o),
           array_agg(decode(t.r->>5, 'hex') ORDER BY o), array_agg(decode(t.r->>6, 'hex') ORDER BY o),
           array_agg(decode(t.r->>7, 'hex') ORDER BY o)
      INTO p_ids, p_seqs, p_types, p_keys, p_digests, p_payloads, p_prevs, p_hashes
      FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS t(r, o);
  END IF;
  LOCK TABLE handoff_lock_maintenance IN ROW SHARE MODE;
  IF p_guards IS NOT NULL THEN
    LOCK TABLE handoff_lock_views IN EXCLUSIVE MODE;
    FOR g IN SELECT * FROM jsonb_array_elements(p_guards) LOOP
      IF to_regprocedure(format('handoff_sync_%s(text, jsonb, boolean)', g->>'t')) IS NULL THEN
        RAISE EXCEPTION 'handoff: % is not a view table', g->>'t' USING ERRCODE = 'invalid_parameter_value';
      END IF;
      q := format('SELECT count(*) FROM %I WHERE true', g->>'t');
      FOR c IN SELECT * FROM jsonb_each_text(g->'w') LOOP
        q := q || format(' AND %I IS NOT DISTINCT FROM %L', c.key, c.value);
      END LOOP;
      FOR c IN SELECT * FROM jsonb_each_text(g->'n') LOOP
        q := q || format(' AND %I IS DISTINCT FROM %L', c.key, c.value);
      END LOOP;
      EXECUTE q INTO got;
      IF got <> (g->>'c')::bigint THEN  -- the view changed since the write read it
        RETURN 'moved:' || handoff_read(p_run, p_keys[1], p_seq, true)::text;
      END IF;
    END LOOP;
  ELSIF p_views IS NOT NULL THEN
    LOCK TABLE handoff_lock_views IN ROW SHARE MODE;
  END IF;
  IF n < 1 OR n <> cardinality(p_seqs) OR n <> cardinality(p_payloads) OR n <> cardinality(p_hashes)
     OR p_seqs[1] <> p_seq + 1 OR p_seqs[n] <> p_seq + n THEN
    RAISE EXCEPTION 'handoff: a batch for run % does not follow seq %', p_run, p_seq
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Inside the batch, seqs follow one another, each event names the one before it, and the
  -- write ids ascend (a run's events are sealed in write-id order). (Nested: a one-event
  -- batch, the common write, runs no query for it.)
  IF n > 1 THEN
    IF EXISTS (SELECT 1 FROM generate_series(2, n) AS i WHERE p_seqs[i] <> p_seqs[i - 1] + 1
               OR p_prevs[i] <> p_hashes[i - 1] OR p_ids[i] <= p_ids[i - 1]) THEN
      RAISE EXCEPTION 'handoff: a batch for run % does not chain its events in order', p_run
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
  END IF;
  SELECT * INTO h FROM heads WHERE run_id = p_run FOR UPDATE;
  IF NOT FOUND THEN
    IF p_seq <> 0 OR p_prevs[1] <> '\\x{genesis}'::bytea THEN
      RETURN 'moved:' || handoff_read(p_run, p_keys[1], p_seq, true)::text;
    END IF;
    IF p_lease IS NOT NULL THEN
      RAISE EXCEPTION 'handoff: run % has no lease %', p_run, p_lease USING ERRCODE = 'HL401';
    END IF;
    INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, first_position,
                       last_position, lease_digest)
    VALUES (p_run, p_seqs[n], p_hashes[n], p_head_lease, p_holder, p_max_lease, p_ids[1], p_ids[n],
            CASE WHEN p_digest_moved THEN p_digest END)
    ON CONFLICT (run_id) DO NOTHING;
    IF NOT FOUND THEN  -- another session began the run first
      RETURN 'moved:' || handoff_read(p_run, p_keys[1], p_seq, true)::text;
    END IF;
  ELSE
    IF h.last_seq <> p_seq OR h.last_hash <> p_hash OR p_prevs[1] <> h.last_hash OR p_ids[1] <= h.last_position THEN
      RETURN 'moved:' || handoff_read(p_run, p_keys[1], p_seq, true)::text;
    END IF;
    IF p_keys[1] IS NOT NULL THEN  -- (apart: a write without a key plans no query here)
      IF EXISTS (SELECT 1 FROM events e WHERE e.run_id = p_run AND e.idem_key = p_keys[1]) THEN
        RETURN 'moved:' || handoff_read(p_run, p_keys[1], p_seq, true)::text;
      END IF;
    END IF;
    IF p_lease IS NOT NULL AND (h.lease IS DISTINCT FROM p_lease OR h.lease_digest IS NULL OR p_secret IS NULL
        OR h.lease_digest <> encode(sha256('\\x{domain}'::bytea || convert_to(p_secret, 'UTF8')), 'hex')) THEN
      RAISE EXCEPTION 'handoff: the write does not show the token of lease % of run %', p_lease, p_run
        USING ERRCODE = 'HL401';
    END IF;
    IF p_max_lease < h.max_lease
       OR (p_head_lease IS DISTINCT FROM h.lease AND p_head_lease IS NOT NULL AND p_head_lease <= h.max_lease)
       OR (p_digest_moved AND p_digest IS NOT NULL AND p_head_lease IS NOT DISTINCT FROM h.lease)
       OR (NOT p_digest_moved AND p_head_lease IS DISTINCT FROM h.lease) THEN
      RAISE EXCEPTION 'handoff: a write to run % moves its lease other than by a grant or a release', p_run
        USING ERRCODE = 'HL401';
    END IF;
    UPDATE heads SET last_seq = p_seqs[n], last_hash = p_hashes[n], lease = p_head_lease,
      lease_holder = p_holder, max_lease = p_max_lease, last_position = p_ids[n],
      lease_digest = CASE WHEN p_digest_moved THEN p_digest ELSE lease_digest END
    WHERE run_id = p_run;
  END IF;
  IF p_views IS NOT NULL THEN
    PERFORM handoff_views(p_run, p_views);
  END IF;
  PERFORM set_config('handoff.appending', 'on', true);  -- (the trigger leaves these rows to the seal below)
  INSERT INTO events (id, run_id, seq, type, actor, lease, idem_key, idem_digest, batch_size, recorded_us,
                      schema_version, payload, prev_hash, hash, viewed)
  SELECT u.id, p_run, u.seq, u.type, p_actor, p_lease, u.k, u.d, n, p_at, p_schema, u.payload, u.prev,
         u.hash, p_viewed
  FROM unnest(p_ids, p_seqs, p_types, p_keys, p_digests, p_payloads, p_prevs, p_hashes)
    AS u(id, seq, type, k, d, payload, prev, hash) ORDER BY u.id;
  PERFORM set_config('handoff.appending', 'off', true);
  -- Sealed now when nobody else is sealing (what waits in the queue, then these, in
  -- write-id order), committed with them: one flush. Else queued, for the seal after the
  -- COMMIT.
  PERFORM 1 FROM ledger_tail FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    INSERT INTO unsealed SELECT unnest(p_ids);
    RETURN '';
  END IF;
  got := handoff_positions(p_ids, p_hashes);
  RETURN p_ids[1]::text || ':' || got::text;
END $$"""
#: A write's first round trip, one statement (its plans cached for the session): a block of
#: write ids, the run's head, the key's earlier batch (its first seq and write id, the
#: request's digest, size and actor, every event's write id and position, null while it
#: waits to be sealed), and, when asked, the run's events from ``p_after`` (the cached
#: fold's last seq) as (seq, type, recorded_us, payload, hash, actor). Byte strings in
#: hex. Run as the caller: it reads what every role may read, and takes no lock.
READ_FUNCTION = """CREATE FUNCTION handoff_read(p_run text, p_key text, p_after bigint, p_steps boolean)
RETURNS jsonb LANGUAGE plpgsql SET search_path = {schema}, pg_temp AS $$
BEGIN
  RETURN jsonb_build_array(
    nextval('events_id_seq'),
    (SELECT jsonb_build_array(h.last_seq, encode(h.last_hash, 'hex'), h.lease, h.lease_holder, h.first_position,
                              h.last_position, h.max_lease, h.lease_digest) FROM heads h WHERE h.run_id = p_run),
    CASE WHEN p_key IS NOT NULL THEN (
      SELECT jsonb_build_array(d.seq, d.id, encode(d.idem_digest, 'hex'), d.batch_size, d.actor,
        (SELECT jsonb_agg(jsonb_build_array(e.id, o.position) ORDER BY e.seq) FROM events e
         LEFT JOIN ledger_order o ON o.event_id = e.id
         WHERE e.run_id = d.run_id AND e.seq BETWEEN d.seq AND d.seq + d.batch_size - 1))
      FROM events d WHERE d.run_id = p_run AND d.idem_key = p_key) END,
    CASE WHEN p_steps THEN (
      SELECT jsonb_agg(jsonb_build_array(e.seq, e.type, e.recorded_us, encode(e.payload, 'hex'),
                                         encode(e.hash, 'hex'), e.actor) ORDER BY e.seq)
      FROM events e WHERE e.run_id = p_run AND e.seq >= p_after) END);
END $$"""
#: The SQLSTATE of handoff_append's refusal of a write under a lease that does not show
#: the lease's token.
NOT_THE_HOLDER = "HL401"
#: handoff_append's arguments, as GRANT and REVOKE name the function.
APPEND_SIGNATURE = ("handoff_append(text, bigint, bytea, text, bigint, text, bigint, integer, boolean, jsonb, "
                    "bigint, text, bigint, text, boolean, jsonb, jsonb)")
#: Functions run as the owner are executable by nobody else until the roles SQL grants
#: them (a function is executable by PUBLIC when created): made so at creation and by
#: the migration to schema 6.
REVOKED = [
    f"REVOKE ALL ON FUNCTION {APPEND_SIGNATURE} FROM PUBLIC",
    "REVOKE ALL ON FUNCTION handoff_seal(boolean, bigint[]), handoff_queue() FROM PUBLIC",
    "REVOKE ALL ON FUNCTION handoff_views(text, jsonb) FROM PUBLIC",
    "REVOKE ALL ON FUNCTION handoff_positions(bigint[], bytea[]) FROM PUBLIC",
    *(f"REVOKE ALL ON FUNCTION {sig} FROM PUBLIC" for sig in VALUES_SIGNATURES),
]
#: The same for the functions of schema 12 (kept apart: the migration to schema 6 runs
#: ``REVOKED`` before these exist).
LIVENESS_REVOKED = [f"REVOKE ALL ON FUNCTION {sig} FROM PUBLIC" for sig in LIVENESS_SIGNATURES]
#: The view writes of an append (handoff_views), made anew from the view tables there are
#: (ledger/postgres/postgres_view_store.py makes each table's handoff_sync_<table>) whenever one is made.
VIEWS_FUNCTION_EMPTY = views_function(())


def _format(create: str, schema: str) -> str:
    return create.format(schema=ident(schema), channel=notify_channel(schema), genesis=GENESIS_HASH.hex(),
                         domain=LEASE_TOKEN_DOMAIN.hex())


def functions(schema: str) -> dict[str, tuple[str, bool]]:
    """Every function the ledger's writes and triggers call, as created in ``schema``:
    {name: (CREATE statement, runs as the owner)}. Creation, migration, ``verify`` and
    ``doctor`` all take them from here."""
    return {
        "handoff_refuse_change": (REFUSE_FUNCTION, False),
        "handoff_stamp_role": (STAMP_FUNCTION, False),
        "handoff_positions": (_format(POSITIONS_FUNCTION, schema), False),
        "handoff_seal": (_format(SEAL_FUNCTION, schema), True),
        "handoff_queue": (_format(QUEUE_FUNCTION, schema), True),
        "handoff_append": (_format(APPEND_FUNCTION, schema), True),
        "handoff_read": (_format(READ_FUNCTION, schema), False),
        "handoff_put_values": (_format(PUT_VALUES, schema), True),
        "handoff_delete_values": (_format(DELETE_VALUES, schema), True),
        "handoff_beat": (_format(BEAT, schema), True),
        "handoff_put_liveness": (_format(PUT_LIVENESS, schema), True),
    }


def or_replace(create: str) -> str:
    return create.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel a ledger's sealers signal on: an empty wake-up, sent
    once per seal that gave out positions (not once per write: a notifying commit takes
    a lock shared by the whole cluster; docs/postgres.md, "Wake-ups")."""
    return "handoff_" + hashlib.sha256(schema.encode()).hexdigest()[:16]


#: A run's values_erased events without its other events: every write that continues a
#: value checks them in handoff_put_values, so the check costs the erasures, not the run.
ERASURES_INDEX = "CREATE INDEX IF NOT EXISTS events_erasures ON events (run_id) WHERE type = 'values_erased'"

SCHEMA = [
    "CREATE TABLE handoff_meta (key text PRIMARY KEY, value text NOT NULL)",
    f"CREATE SEQUENCE events_id_seq INCREMENT BY {ID_BLOCK}",
    # The log. id: the write id (insertion order within a run; not the ledger order).
    # db_role: the role that inserted the row, filled in by the server. viewed: the write
    # kept the inline views (an append by a store without them leaves catch-up work).
    "CREATE TABLE events ("
    " id bigint PRIMARY KEY, run_id text COLLATE \"C\" NOT NULL, seq bigint NOT NULL,"
    " type text NOT NULL, actor text NOT NULL, lease bigint, idem_key text, idem_digest bytea,"
    " batch_size integer NOT NULL, recorded_us bigint NOT NULL, schema_version integer NOT NULL,"
    " payload bytea NOT NULL, prev_hash bytea NOT NULL, hash bytea NOT NULL,"
    " db_role text NOT NULL DEFAULT session_user, viewed boolean NOT NULL DEFAULT false,"
    " CONSTRAINT events_run_seq UNIQUE (run_id, seq))",
    "CREATE UNIQUE INDEX events_idem ON events (run_id, idem_key) WHERE idem_key IS NOT NULL",
    "CREATE INDEX events_unviewed ON events (id) WHERE NOT viewed",
    ERASURES_INDEX,
    # The ledger order: each committed event's gap-free position and the ledger-wide
    # chain there, written by the sealer behind the writers.
    "CREATE TABLE ledger_order (position bigint PRIMARY KEY, event_id bigint NOT NULL UNIQUE,"
    " global_hash bytea NOT NULL)",
    # Committed events waiting for a position.
    "CREATE TABLE unsealed (event_id bigint PRIMARY KEY)",
    # One row: the last sealed position and the ledger-wide hash there (moved by sealers).
    "CREATE TABLE ledger_tail (one boolean PRIMARY KEY DEFAULT true CHECK (one),"
    " position bigint NOT NULL, global_hash bytea NOT NULL)",
    # first_position / last_position: the run's first and last write ids.
    "CREATE TABLE heads (run_id text COLLATE \"C\" PRIMARY KEY, last_seq bigint NOT NULL,"
    " last_hash bytea NOT NULL, lease bigint, lease_holder text, max_lease bigint NOT NULL,"
    " first_position bigint NOT NULL, last_position bigint NOT NULL, lease_digest text)",
    "CREATE INDEX heads_first ON heads (first_position)",
    # Empty: their table locks are the ledger-wide locks (MAINTENANCE_LOCK, VIEWS_LOCK).
    f"CREATE TABLE {MAINTENANCE_LOCK} ()",
    f"CREATE TABLE {VIEWS_LOCK} ()",
    REFUSE_FUNCTION,
    *APPEND_ONLY_TRIGGERS.values(),
    *ORDER_TRIGGERS.values(),
    STAMP_FUNCTION,
    *ROLE_TRIGGERS.values(),
    VALUES_TABLE,
    LIVENESS_TABLE,
]

#: Migrations from an older schema version: {from_version: [statements]}, run in one
#: transaction by the first writable open, every write excluded. "{seal}" stands for the
#: seal function in the ledger's schema, "{reseal}" for it replacing an older one.
MIGRATIONS: dict[int, list[str]] = {
    1: [STAMP_FUNCTION, *ROLE_TRIGGERS.values()],  # 2: db_role stamped by a trigger, not a default
    # 3: positions sealed behind the writers. The positions so far become the ledger
    # order (and the write ids: ids and positions agree for every event sealed so far).
    2: [
        "ALTER TABLE events RENAME COLUMN position TO id",
        "CREATE TABLE ledger_order (position bigint PRIMARY KEY, event_id bigint NOT NULL UNIQUE,"
        " global_hash bytea NOT NULL)",
        "INSERT INTO ledger_order SELECT id, id, global_hash FROM events",
        "ALTER TABLE events DROP COLUMN global_hash",
        "ALTER TABLE events ADD COLUMN viewed boolean NOT NULL DEFAULT true",
        "ALTER TABLE events ALTER COLUMN viewed SET DEFAULT false",
        "CREATE INDEX events_unviewed ON events (id) WHERE NOT viewed",
        "CREATE TABLE unsealed (event_id bigint PRIMARY KEY)",
        f"CREATE SEQUENCE events_id_seq INCREMENT BY {ID_BLOCK}",
        "SELECT setval('events_id_seq', (SELECT coalesce(max(id), 0) + 1 FROM events), false)",
        *ORDER_TRIGGERS.values(),
        "{seal}",
        "{queue}",
        *QUEUE_TRIGGERS.values(),
        # Tables made here inherit the schema's default privileges, which the roles SQL
        # of schema 2 set to SELECT, INSERT, UPDATE, DELETE for its appenders: nobody but
        # the owner may change the order, the queue or the tail (the tail's UPDATE was a
        # writer's right under schema 2). Readers keep SELECT.
        "DO $$ DECLARE r record; BEGIN FOR r IN SELECT DISTINCT grantee FROM "
        "information_schema.role_table_grants WHERE table_schema = current_schema() AND "
        "table_name IN ('ledger_order', 'unsealed', 'ledger_tail') AND grantee <> current_user LOOP "
        "EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ledger_order, unsealed, ledger_tail "
        "FROM %I', r.grantee); END LOOP; END $$",
        "REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ledger_order, unsealed, ledger_tail FROM PUBLIC",
        # Tracking rows gain the write-id mark (ids and positions agree so far).
        "DO $$ BEGIN IF to_regclass('projection_positions') IS NOT NULL THEN "
        "ALTER TABLE projection_positions ADD COLUMN IF NOT EXISTS id_mark bigint NOT NULL DEFAULT 0; "
        # A projection behind the log at the upgrade stays behind: marked unbuilt past its position.
        "UPDATE projection_positions SET id_mark = CASE WHEN position < (SELECT position FROM ledger_tail) "
        "THEN -1 ELSE position END; END IF; END $$",
    ],
    # 4: the seal looks every queued event up by key (SEAL_FUNCTION); same order, same chain.
    3: ["{reseal}"],
    # 5: an insert seals itself when the seal lock is free (QUEUE_FUNCTION).
    4: ["{requeue}", "{reseal}"],
    # 6: every write goes through handoff_append, run as the owner, and the locks writes
    # wait on are row and table locks no role may take (docs/postgres.md, roles). The
    # roles lose every direct right to write: run 'handoff roles --sql' again.
    5: [
        "DROP FUNCTION IF EXISTS handoff_begin_write(integer)",
        "DROP FUNCTION IF EXISTS handoff_expect_head(text, bigint, bytea)",
        f"CREATE TABLE IF NOT EXISTS {MAINTENANCE_LOCK} ()",
        f"CREATE TABLE IF NOT EXISTS {VIEWS_LOCK} ()",
        VALUES_TABLE,
        "{positions}", "{requeue}", "{reseal}", "{append}", "{read}", "{put_values}", "{delete_values}", VIEWS_FUNCTION_EMPTY,
        "DO $$ DECLARE r record; BEGIN FOR r IN SELECT DISTINCT grantee FROM "
        "information_schema.role_table_grants WHERE table_schema = current_schema() AND "
        "privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE') AND grantee <> current_user LOOP "
        "EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA %I FROM %I', "
        "current_schema(), r.grantee); END LOOP; END $$",
        *REVOKED,
    ],
    # 7: handoff_append answers a write decided from an old head with the run as it is
    # ("moved:" and handoff_read's answer) instead of refusing it, so a write decided from
    # what the session knew costs one round trip, and one decided again two.
    # handoff_positions takes the writer's hashes (no lookup of its own events).
    6: ["DROP FUNCTION IF EXISTS handoff_positions(bigint[])", "{positions}", "{reseal}", "{append}",
        "REVOKE ALL ON FUNCTION handoff_positions(bigint[], bytea[]) FROM PUBLIC"],
    # 8: a seal with nothing queued chains the writer's own events without looking in the
    # queue or the log; handoff_views holds each table's upsert instead of calling it.
    7: ["{positions}", "{views}"],
    # 9: handoff_append refuses a batch whose seqs, chain links or write ids do not follow
    # one another inside it.
    8: ["{append}"],
    # 10: handoff_append reads a one-event batch and checks a write without a key with
    # plain expressions, no query (same checks, same answers).
    9: ["{append}"],
    # 11: handoff_put_values refuses a write that needs a value the run does not store
    # (a digest sent without bytes: erased, or never written) with HL409, in that write's
    # transaction; handoff_delete_values keeps a value a graph event after its erasure names.
    # The run's erasures get an index of their own, so that check reads them alone.
    10: ["{put_values}", "{delete_values}", ERASURES_INDEX],
    # 12: heartbeats kept beside the log: the liveness table, moved only through handoff_beat
    # (the lease token checked on the server) and handoff_put_liveness. Roles SQL grants them.
    11: [LIVENESS_TABLE, "{beat}", "{put_liveness}", *LIVENESS_REVOKED,
         # Whoever may append may beat: the roles SQL of an earlier version granted
         # handoff_append, so its grantees get the two new functions now (running the roles
         # SQL again grants the same).
         "DO $$ DECLARE r record; BEGIN FOR r IN SELECT DISTINCT grantee FROM "
         "information_schema.role_routine_grants WHERE routine_schema = current_schema() AND "
         "routine_name = 'handoff_append' AND privilege_type = 'EXECUTE' AND grantee <> current_user LOOP "
         f"EXECUTE format('GRANT EXECUTE ON FUNCTION {', '.join(LIVENESS_SIGNATURES)} TO %I', r.grantee); "
         "END LOOP; END $$"],
}


def migration_step(sql: str, schema: str) -> str:
    """A MIGRATIONS statement as run: "{seal}" / "{reseal}", "{queue}" / "{requeue}" and
    "{append}" stand for those functions as this version makes them in the ledger's schema
    (made, or replacing an older body)."""
    name = {"{seal}": "handoff_seal", "{queue}": "handoff_queue", "{append}": "handoff_append", "{read}": "handoff_read",
            "{positions}": "handoff_positions",
            "{reseal}": "handoff_seal", "{requeue}": "handoff_queue", "{put_values}": "handoff_put_values",
            "{delete_values}": "handoff_delete_values", "{beat}": "handoff_beat",
            "{put_liveness}": "handoff_put_liveness"}.get(sql)
    return sql if name is None else or_replace(functions(schema)[name][0])




def _norm(sql: str) -> str:
    return " ".join(sql.replace(";", " ").split()).lower()


def layout_problems(x: Callable[..., Any]) -> list[Problem]:
    """What differs between the database and the layout made here: a trigger that keeps
    the log append-only (or stamps, or queues) missing, altered or disabled; a function
    the writes and triggers call changed, dropped, or no longer run as its owner with a
    pinned search_path. ``x`` runs a statement on the store's connection."""
    have = {
        name: (defn, enabled)
        for name, defn, enabled in x(
            "SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled FROM pg_trigger t "
            "WHERE t.tgrelid IN ('events'::regclass, 'ledger_order'::regclass) AND NOT t.tgisinternal"
        )
    }
    schema = x("SELECT current_schema()").fetchone()[0]
    have = {n: (d.replace(f" ON {schema}.events ", " ON events ")
                .replace(f" ON {schema}.ledger_order ", " ON ledger_order ").replace(f'"{schema}".', ""), e)
            for n, (d, e) in have.items()}
    out = []
    advice = ("Someone changed the database behind the store; check the log against a head "
              "digest kept elsewhere, and restore from a backup")
    for name, sql in {**APPEND_ONLY_TRIGGERS, **ORDER_TRIGGERS, **ROLE_TRIGGERS, **QUEUE_TRIGGERS}.items():
        if name not in have:
            what = ("events can be changed or deleted without any error" if name in APPEND_ONLY_TRIGGERS
                    else "sealed positions can be moved or deleted without any error" if name in ORDER_TRIGGERS
                    else "new events are no longer queued for a position" if name in QUEUE_TRIGGERS
                    else "a client can now write any role into db_role")
            out.append(Problem("trigger_missing", None, None, None,
                               f"the trigger {name} is gone: {what}. {advice}"))
            continue
        defn, enabled = have[name]
        if _norm(defn) != _norm(sql):
            out.append(Problem("trigger_altered", None, None, None,
                               f"the append-only trigger {name} is not the one the store created: it "
                               f"may no longer refuse changes. {advice}"))
        elif enabled != "O":
            out.append(Problem("trigger_disabled", None, None, None,
                               f"the append-only trigger {name} is disabled (ALTER TABLE ... DISABLE "
                               f"TRIGGER or session_replication_role): it refuses nothing. {advice}"))
    for fn, (create, definer) in functions(schema).items():
        row = x("SELECT prosrc, prosecdef, proconfig FROM pg_proc WHERE proname = %s "
                      "AND pronamespace = current_schema()::regnamespace", (fn,)).fetchone()
        pinned = row is not None and (not definer or (
            row[1] and any(c.startswith("search_path=") for c in (row[2] or []))))
        if row is None or _norm(row[0]) != _norm(create.split("$$")[1]) or not pinned:
            out.append(Problem("trigger_altered", None, None, None,
                               f"the function {fn}, which the ledger's triggers and writes call, was changed or "
                               f"dropped. {advice}"))
    return out

