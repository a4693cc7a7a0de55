"""The PostgreSQL ledger's layout: tables, functions, triggers, locks and migrations.

Everything the store creates, and what ``verify`` and ``doctor`` compare the database
with, exactly as created. The functions are formatted for the ledger's schema (their
search_path is pinned to it) with ``psycopg.sql``'s quoting of identifiers.
"""

from __future__ import annotations

import hashlib

from .blobs import CREATE as VALUES_TABLE

try:  # the driver is an optional extra: pip install 'handoff-ledger[postgres]'
    from psycopg import sql as _sql
except ImportError:  # pragma: no cover - exercised only without the extra
    _sql = None  # type: ignore[assignment]


#: Layout version of the database schema (tables, indexes, triggers), kept in handoff_meta.
PG_SCHEMA_VERSION = 6
FORMAT_NAME = "handoff-ledger"
#: Advisory lock namespace (the first key of pg_advisory_xact_lock(int, int)) for runs.
_RUN_LOCK_NS = 0x48414E44  # "HAND"
#: Ledger-wide advisory locks (namespace _LEDGER_NS): every write holds MAINTENANCE shared
#: (a rebuild, an import or a migration holds it exclusive, so it sees no write half done);
#: every write that keeps views holds VIEWS shared, and a decision that reads a view (an
#: owner's load) holds it exclusive; SEAL is held by whoever seals (handoff_seal).
_LEDGER_NS = 0x484C4447  # "HLDG"
_MAINTENANCE, _VIEWS, _SEAL = 1, 2, 3
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

#: Sealing (docs/postgres.md, "Order"): committed events wait in ``unsealed`` until a
#: sealer gives them the next gap-free positions and the ledger-wide chain, in the order
#: of their write ids, under the SEAL lock, which it holds to its commit. ``wait`` false:
#: seal only if nobody else is sealing (a writer tries this inside its own transaction);
#: true: wait for the lock. Returns the positions of ``mine`` that are sealed (all of
#: them, unless ``wait`` was false and the lock was taken). SECURITY DEFINER: a reader
#: that finds unsealed events may seal them (the order is a pure function of what has
#: committed; nobody can choose it), without the right to write the order itself.
#: Schema 4: every look-up in the log is by key, a subquery per queued event (schema 3's
#: joins let a plan cached while the tables were small scan all of events and
#: ledger_order on every seal), and the positions go in with one INSERT. Schema 5: a
#: writer whose events were queued (another session was sealing at its insert) waits for
#: that sealer in a shared lock with every other such writer, and looks again, instead of
#: taking the lock in turn with each of them to find its events sealed.
SEAL_FUNCTION = """CREATE FUNCTION handoff_seal(wait boolean, mine bigint[])
RETURNS TABLE (event_id bigint, event_position bigint) LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {schema}, pg_temp AS $$
DECLARE
  tpos bigint; g bytea; start bigint; r record; tries integer := 0;
  ps bigint[] := ARRAY[]::bigint[]; es bigint[] := ARRAY[]::bigint[]; gs bytea[] := ARRAY[]::bytea[];
BEGIN
  LOOP
    IF NOT EXISTS (SELECT 1 FROM unsealed) OR (cardinality(mine) > 0 AND
       (SELECT count((SELECT 1 FROM ledger_order o WHERE o.event_id = m.id)) FROM unnest(mine) AS m(id))
       = cardinality(mine)) THEN
      RETURN QUERY SELECT x.id, x.pos FROM (SELECT m.id, (SELECT o.position FROM ledger_order o
        WHERE o.event_id = m.id) AS pos FROM unnest(mine) AS m(id)) x WHERE x.pos IS NOT NULL;
      RETURN;
    END IF;
    EXIT WHEN pg_try_advisory_xact_lock({ns}, {seal});
    IF NOT wait THEN
      RETURN;
    END IF;
    tries := tries + 1;
    IF tries > 2 THEN
      PERFORM pg_advisory_xact_lock({ns}, {seal});  -- in line, then: the seal is certain
      EXIT;
    END IF;
    -- Somebody is sealing. Wait until they commit (a shared lock is granted to every
    -- waiter at once when they do) and look again: they have most likely sealed these
    -- events too, and then no waiter takes the lock in turn after them.
    BEGIN
      PERFORM pg_advisory_lock_shared({ns}, {seal});
      PERFORM pg_advisory_unlock_shared({ns}, {seal});
    EXCEPTION WHEN query_canceled OR OTHERS THEN  -- (OTHERS alone leaves out a cancel)
      -- a cancel or a timeout between the two: a session lock must not outlive the call
      IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory'
                 AND l.pid = pg_catalog.pg_backend_pid() AND l.classid = {ns} AND l.objid = {seal}
                 AND l.objsubid = 2 AND l.mode = 'ShareLock') THEN
        PERFORM pg_advisory_unlock_shared({ns}, {seal});
      END IF;
      RAISE;
    END;
  END LOOP;
  SELECT t.position, t.global_hash INTO tpos, g FROM ledger_tail t;
  start := tpos;
  FOR r IN SELECT u.event_id AS id, (SELECT e.hash FROM events e WHERE e.id = u.event_id) AS hash
           FROM unsealed u
           WHERE (SELECT o.position FROM ledger_order o WHERE o.event_id = u.event_id) IS NULL
           ORDER BY u.event_id LOOP
    tpos := tpos + 1;
    g := sha256(g || int8send(tpos) || r.hash);
    ps := ps || tpos; es := es || r.id; gs := gs || g;
  END LOOP;
  INSERT INTO ledger_order (position, event_id, global_hash) SELECT * FROM unnest(ps, es, gs);
  -- Everything queued that now has a position (an import's rows are queued and sealed
  -- in one go) leaves the queue.
  DELETE FROM unsealed u WHERE (SELECT true FROM ledger_order o WHERE o.event_id = u.event_id);
  IF tpos > start THEN
    UPDATE ledger_tail SET position = tpos, global_hash = g;
    PERFORM pg_notify('{channel}', '');
  END IF;
  RETURN QUERY SELECT x.id, x.pos FROM (SELECT m.id, (SELECT o.position FROM ledger_order o
    WHERE o.event_id = m.id) AS pos FROM unnest(mine) AS m(id)) x WHERE x.pos IS NOT NULL;
END $$"""


#: Every inserted event is sealed by its own INSERT's trigger when nobody else is sealing,
#: and joins the sealing queue when somebody is (SECURITY DEFINER: a writer needs no right
#: to the order or the queue, so it can neither skip them nor fill the queue with what it
#: likes; the seal's advisory lock, like any, needs no right: docs/postgres.md, roles). Schema 5: sealing
#: here, in the statement that inserts, costs a writer no function call of its own, no
#: queue row and no read after its commit; it holds the seal lock from its insert to its
#: commit, as the in-transaction seal of schema 4 did from just before it. Events queued
#: by others (committed: this statement's snapshot sees no uncommitted row of theirs) are
#: sealed first when their write ids are lower, in write-id order, exactly as handoff_seal
#: orders them. The statement's first write id and its position are left in the
#: transaction's ``handoff.sealed`` setting ("id:position") for the writer to read before
#: its COMMIT; the writer counts on the later ones following only when its ids are one
#: block (nothing else comes between), and otherwise reads them. An import
#: (``handoff.importing`` on) writes the order itself: its rows are queued.
QUEUE_FUNCTION = """CREATE FUNCTION handoff_queue() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {schema}, pg_temp AS $$
DECLARE
  tpos bigint; g bytea; r record; mine bigint; queued boolean;
  ps bigint[] := ARRAY[]::bigint[]; es bigint[] := ARRAY[]::bigint[]; gs bytea[] := ARRAY[]::bytea[];
BEGIN
  IF current_setting('handoff.importing', true) = 'on' OR NOT pg_try_advisory_xact_lock({ns}, {seal}) THEN
    INSERT INTO unsealed SELECT n.id FROM new_rows n;
    PERFORM set_config('handoff.sealed', '', true);
    RETURN NULL;
  END IF;
  SELECT t.position, t.global_hash INTO tpos, g FROM ledger_tail t;
  queued := EXISTS (SELECT 1 FROM unsealed);
  IF NOT queued THEN
    -- the common case: nothing waits, this statement's rows take the next positions
    mine := tpos + 1;
    FOR r IN SELECT n.id, n.hash FROM new_rows n ORDER BY n.id LOOP
      tpos := tpos + 1;
      g := sha256(g || int8send(tpos) || r.hash);
      ps := ps || tpos; es := es || r.id; gs := gs || g;
    END LOOP;
  ELSE
    FOR r IN SELECT q.id, q.hash FROM (
               SELECT u.event_id AS id, (SELECT e.hash FROM events e WHERE e.id = u.event_id) AS hash
               FROM unsealed u
               WHERE (SELECT o.position FROM ledger_order o WHERE o.event_id = u.event_id) IS NULL
               UNION ALL SELECT n.id, n.hash FROM new_rows n) q
             ORDER BY q.id LOOP
      tpos := tpos + 1;
      g := sha256(g || int8send(tpos) || r.hash);
      ps := ps || tpos; es := es || r.id; gs := gs || g;
    END LOOP;
    mine := ps[array_position(es, (SELECT min(n.id) FROM new_rows n))];
  END IF;
  INSERT INTO ledger_order (position, event_id, global_hash) SELECT * FROM unnest(ps, es, gs);
  IF queued THEN
    -- Everything queued that now has a position (an import's rows too) leaves the queue.
    DELETE FROM unsealed u WHERE (SELECT true FROM ledger_order o WHERE o.event_id = u.event_id);
  END IF;
  UPDATE ledger_tail SET position = tpos, global_hash = g;
  PERFORM pg_notify('{channel}', '');
  PERFORM set_config('handoff.sealed', (SELECT min(n.id) FROM new_rows n)::text || ':' || mine::text, true);
  RETURN NULL;
END $$"""
QUEUE_TRIGGERS = {
    "events_queue": "CREATE TRIGGER events_queue AFTER INSERT ON events REFERENCING NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION handoff_queue()",
}

#: The opening of every write: the ledger's shared lock, the run's lock, then the write's
#: block of ids, in that order (ids taken under the run's lock grow with the run's seqs,
#: so sealing in write-id order keeps each run's order). SECURITY INVOKER.
BEGIN_FUNCTION = """CREATE FUNCTION handoff_begin_write(run_key integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared({ns}, {maintenance});
  PERFORM pg_advisory_xact_lock({run_ns}, run_key);
  RETURN nextval('events_id_seq');
END $$"""
#: A guessed write (_guess) decided from the head this session's last write left; before
#: it inserts anything, the server proves the head is still that one (seq and hash) or
#: refuses with SQLSTATE HL409, and the savepoint before it undoes the guess. A head that
#: moved: another writer, an import, a restored backup. SECURITY INVOKER.
EXPECT_FUNCTION = """CREATE FUNCTION handoff_expect_head(run text, at_seq bigint, at_hash bytea)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM heads h WHERE h.run_id = run AND h.last_seq = at_seq AND h.last_hash = at_hash) THEN
    RAISE EXCEPTION 'handoff: run % is no longer at seq % as this session last wrote it', run, at_seq
      USING ERRCODE = 'HL409', HINT = 'the write is decided again from the head as it is; nothing was written';
  END IF;
END $$"""
#: SQLSTATE of handoff_expect_head's refusal.
HEAD_MOVED = "HL409"


def queue_function(schema: str) -> str:
    return QUEUE_FUNCTION.format(schema=ident(schema), ns=_LEDGER_NS, seal=_SEAL,
                                 channel=notify_channel(schema))


def begin_function() -> str:
    return BEGIN_FUNCTION.format(ns=_LEDGER_NS, maintenance=_MAINTENANCE, run_ns=_RUN_LOCK_NS)


def expect_function() -> str:
    return EXPECT_FUNCTION


def _or_replace(create: str) -> str:
    return create.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def seal_function(schema: str) -> str:
    """The seal function as created in ``schema`` (its search_path is pinned there)."""
    return SEAL_FUNCTION.format(schema=ident(schema), ns=_LEDGER_NS, seal=_SEAL,
                                channel=notify_channel(schema))


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel a ledger's sealers signal on: an empty wake-up, sent
    once per seal that gave out positions (not once per write: a notifying commit takes
    a lock shared by the whole cluster; docs/postgres.md, "Wake-ups")."""
    return "handoff_" + hashlib.sha256(schema.encode()).hexdigest()[:16]


_SCHEMA = [
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
    REFUSE_FUNCTION,
    *APPEND_ONLY_TRIGGERS.values(),
    *ORDER_TRIGGERS.values(),
    STAMP_FUNCTION,
    *ROLE_TRIGGERS.values(),
    VALUES_TABLE,
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
    # 5: an insert seals itself when the seal lock is free (QUEUE_FUNCTION), and a write
    # sent in one round trip proves the head it decided from (BEGIN_FUNCTION).
    4: ["{requeue}", "{reseal}", "{begin}", "{expect}"],
    # 6: values beside the log (blobs.py); writers get INSERT, SELECT, DELETE on it (roles.py).
    5: [VALUES_TABLE],
}


