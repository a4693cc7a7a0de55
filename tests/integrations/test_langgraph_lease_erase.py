"""A leased LangGraph thread is erased only by its holder or by its owner ending the lease.

Worker A holds a thread's lease and saves checkpoints of a growing list (stored, from the
second version on, as the items appended since the parent). What must hold, on SQLite and
PostgreSQL, read back in the same process and in a fresh one:

- a saver without the lease (``delete_thread``, ``prune`` either way, ``delete_for_runs``)
  and ``Ledger.erase_values`` itself are refused with LeaseHeld and write nothing; A's next
  checkpoint then reads back whole;
- the owner naming the lease erases and ends the lease in one write; A's next write is
  refused as stale and writes nothing; naming another lease is refused;
- a write is never stored as a tail of a value the run does not store: a saver whose
  picture of the run is old (another saver erased the thread) is refused in the write's
  transaction (ValueNotStored) and stores the value whole instead; an erasure recorded but
  not yet carried out counts as done, and the deletion that follows it keeps a value a
  checkpoint saved in between stores again;
- ``verify`` reports a checkpoint that continues a value that is gone as damage
  (``checkpoint_values_missing``, exit 4);
- a thread id that is no single line of printable text is refused naming ``thread_id``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.langgraph import LedgerSaver  # noqa: E402
from handoff.ledger.errors import InvalidInput, LeaseHeld, LeaseLost, StaleLease, ValueNotStored  # noqa: E402
from handoff.ledger.store import Actor, value_digest  # noqa: E402
from handoff.reducers import commands as C  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
TIMEOUT_S = 20.0
RUN = "t-leased"
GRAPH_RUN = "graph-run-1"
#: Reads a thread back in a process of its own: its latest checkpoint's messages.
READ_BACK = """
import json, sys
from handoff import Ledger
from handoff.integrations.langgraph import LedgerSaver
with Ledger(sys.argv[1]) as lg:
    t = LedgerSaver(lg).get_tuple({"configurable": {"thread_id": sys.argv[2]}})
    print(json.dumps(None if t is None else t.checkpoint["channel_values"].get("messages")))
"""


def _open(lg: Ledger, run: str = RUN) -> str:
    return lg.open(goal="Answer the ticket", target="chat:#ops", owner="alice", run_id=run,
                   heartbeat_timeout_s=TIMEOUT_S, progress_kinds={"executing": ["graph_step"]})


def _step(saver: LedgerSaver, thread: str, parent: dict | None, items: list[str]) -> dict:
    """One checkpoint of the growing list ``items`` (version = its length)."""
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    version = f"{len(items):04d}"
    cp = generate_checkpoint(channel_values={"messages": list(items)}, channel_versions={"messages": version})
    return saver.put(cfg, cp, {"source": "loop", "step": len(items), "run_id": GRAPH_RUN}, {"messages": version})


def _grow(saver: LedgerSaver, thread: str, n: int = 3) -> tuple[dict, list[str]]:
    items: list[str] = []
    cfg = None
    for i in range(n):
        items.append(f"message {i} " + "x" * 64)
        cfg = _step(saver, thread, cfg, items)
    assert cfg is not None
    return cfg, items


def _saved(lg: Ledger, run: str) -> list:
    return [r.event for r in lg.log(run) if r.type == "graph_checkpoint_saved"]


def _snapshot(lg: Ledger, run: str) -> tuple[list, dict]:
    return [(r.seq, r.type, r.payload) for r in lg.log(run)], lg.store.value_digests(run)


def _latest(saver: LedgerSaver, thread: str) -> list[str] | None:
    t = saver.get_tuple({"configurable": {"thread_id": thread}})
    return None if t is None else t.checkpoint["channel_values"].get("messages")


def _read_back(db: str, thread: str) -> list[str] | None:
    done = subprocess.run([sys.executable, "-c", READ_BACK, db, thread], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _cli(db: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, *args], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=120)


def _erase_as_owner(lg: Ledger, run: str) -> None:
    digests = sorted(lg.store.value_digests(run))
    lg.erase_values(run, reason="cleanup", values=digests, everything=True)


#: Every way a saver without the lease (or the owner through the Ledger) could erase.
ERASERS = {
    "delete_thread": lambda saver, lg: saver.delete_thread(RUN),
    "prune_delete": lambda saver, lg: saver.prune([RUN], strategy="delete"),
    "prune_keep_latest": lambda saver, lg: saver.prune([RUN], strategy="keep_latest"),
    "delete_for_runs": lambda saver, lg: saver.delete_for_runs([GRAPH_RUN]),
    "erase_values": lambda saver, lg: _erase_as_owner(lg, RUN),
}


@pytest.mark.parametrize("how", sorted(ERASERS))
def test_a_saver_without_the_lease_cannot_erase_a_leased_thread(shared_backend, how):
    db = shared_backend.address()
    with Ledger(db) as lg, Ledger(db) as other_lg:
        _open(lg)
        with lg.lease(RUN, worker="agent-a") as lease:
            a = LedgerSaver(lg, lease=lease)
            cfg, items = _grow(a, RUN)
            assert [bool(e.extends) for e in _saved(lg, RUN)] == [False, True, True]  # a list stored as tails
            before = _snapshot(lg, RUN)
            with pytest.raises(LeaseHeld, match=f"held by agent-a under lease {lease.number}") as refused:
                ERASERS[how](LedgerSaver(other_lg), other_lg)
            assert "end_lease" in refused.value.message  # it says how the owner may do it
            assert _snapshot(lg, RUN) == before
            items.append("message 3")
            _step(a, RUN, cfg, items)
            assert _latest(a, RUN) == items
        assert lg.verify() == []
    assert _read_back(db, RUN) == items


def test_the_owner_naming_the_lease_erases_it_and_the_holders_next_write_is_stale(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg, Ledger(db) as owner_lg:
        _open(lg)
        with pytest.raises(LeaseLost):  # the block ends knowing its lease was taken
            with lg.lease(RUN, worker="agent-a") as lease:
                a = LedgerSaver(lg, lease=lease)
                cfg, items = _grow(a, RUN)
                owner = LedgerSaver(owner_lg)
                before = _snapshot(lg, RUN)
                with pytest.raises(StaleLease, match="not run t-leased's current lease"):
                    owner.delete_thread(RUN, end_lease=lease.number + 1)
                with pytest.raises(InvalidInput, match="not both"):
                    lg.erase_values(RUN, reason="cleanup", everything=True, lease=str(lease.token),
                                    end_lease=lease.number)
                assert _snapshot(lg, RUN) == before
                last = before[0][-1][0]
                owner.delete_thread(RUN, end_lease=lease.number)
                ended = [(r.seq, r.type, r.actor) for r in lg.log(RUN, after_seq=last)]
                assert ended == [(last + 1, "lease_revoked", "owner:alice"), (last + 2, "values_erased", "owner:alice")]
                assert lg.checkpoint(RUN).lease is None and lg.store.value_digests(RUN) == {}
                after = _snapshot(lg, RUN)
                with pytest.raises(StaleLease):
                    _step(a, RUN, cfg, [*items, "late"])
                assert _snapshot(lg, RUN) == after
        assert _latest(LedgerSaver(lg), RUN) is None
        assert lg.verify() == []
    assert _read_back(db, RUN) is None
    done = _cli(db, "verify")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_saver_that_missed_an_erasure_stores_its_value_whole_not_as_a_tail_of_nothing(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg, Ledger(db) as other_lg:
        a = LedgerSaver(lg)  # no lease: the owner's saver, as LangGraph's own savers write
        cfg, items = _grow(a, RUN)
        LedgerSaver(other_lg).delete_thread(RUN)  # another saver: a's index and held values are old
        items.append("message 3")
        _step(a, RUN, cfg, items)
        assert _latest(a, RUN) == items and _latest(LedgerSaver(other_lg), RUN) == items
        assert not _saved(lg, RUN)[-1].extends  # stored whole, after the refusal told it to re-read
        assert lg.verify() == []
    assert _read_back(db, RUN) == items
    assert _cli(db, "verify").returncode == 0


def _continue(lg: Ledger, run: str, base: str, parent: str, **kw: object) -> None:
    tail = b"msgpack\x00" + bytes([0x91, 0xA1]) + b"z"  # ["z"], appended to the base's list
    cp = generate_checkpoint(channel_values={}, channel_versions={"messages": "0099"})
    lg.save_graph_checkpoint(run, thread_id=run, checkpoint_id=cp["id"],
                             checkpoint={k: v for k, v in cp.items() if k != "channel_values"}, metadata={},
                             values={"messages": value_digest(tail)}, new_values=[tail], parent_id=parent,
                             extends={"messages": "0003"}, bases={"messages": base}, **kw)


def test_a_write_continuing_a_value_not_stored_is_refused_in_its_transaction(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        a = LedgerSaver(lg)
        cfg, _ = _grow(a, RUN)
        parent = cfg["configurable"]["checkpoint_id"]
        base = _saved(lg, RUN)[-1].values["messages"]
        # An erasure recorded but not yet carried out: the value is still stored, and the
        # write is refused all the same (the deletion may follow at any moment).
        lg.execute(RUN, C.EraseValues(reason="cleanup", values=(base,)), actor=Actor("owner", "langgraph"))
        assert base in lg.store.value_digests(RUN)
        before = _snapshot(lg, RUN)
        with pytest.raises(ValueNotStored, match="Re-read the run and store the value whole") as refused:
            _continue(lg, RUN, base, parent)
        assert refused.value.details["why"] == "value_not_stored"
        assert _snapshot(lg, RUN) == before  # no event, and the tail's value not stored
        with pytest.raises(ValueNotStored, match="does not store"):  # never stored at all
            _continue(lg, RUN, "0" * 64, parent)
        with pytest.raises(InvalidInput, match="bases gives no sha256") as no_base:
            _continue(lg, RUN, "", parent)
        assert no_base.value.details["field"] == "bases"
        assert _snapshot(lg, RUN) == before
        # The store's check asked on its own, outside a write: the same answers.
        with pytest.raises(ValueNotStored, match="does not store"):
            lg.store.require_values(RUN, [base])
        lg.store.require_values(RUN, [_saved(lg, RUN)[0].values["messages"]])


def test_a_value_saved_again_between_an_erasures_record_and_its_deletion_is_kept(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        cfg, items = _grow(LedgerSaver(lg), RUN, 1)
        digest = _saved(lg, RUN)[0].values["messages"]
        blob = lg.values(RUN, [digest])[digest]
        # An erasure recorded, its deletion not yet made; meanwhile a checkpoint stores the
        # same value again, whole (a new graph on the thread, from the same input).
        lg.execute(RUN, C.EraseValues(reason="delete_thread", values=(digest,), everything=True),
                   actor=Actor("owner", "langgraph"))
        cp = generate_checkpoint(channel_values={}, channel_versions={"messages": "0001"})
        lg.save_graph_checkpoint(RUN, thread_id=RUN, checkpoint_id=cp["id"],
                                 checkpoint={k: v for k, v in cp.items() if k != "channel_values"}, metadata={},
                                 values={"messages": digest}, new_values=[blob])
        assert lg.store.delete_values(RUN, [digest]) == 0  # the deletion that follows keeps it
        assert _latest(LedgerSaver(lg), RUN) == items
        assert lg.verify() == []
    assert _read_back(db, RUN) == items


def test_verify_reports_a_checkpoint_continuing_a_value_that_is_gone(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        cfg, items = _grow(LedgerSaver(lg), RUN)
        first, second, third = _saved(lg, RUN)
        # The owner erases the value the latest checkpoint continues, not the checkpoint:
        # recorded, so the value is not damage, but the checkpoint no longer reads whole.
        erasure = lg.erase_values(RUN, reason="cleanup", values=[second.values["messages"]])
        assert _latest(LedgerSaver(lg), RUN) is None or _latest(LedgerSaver(lg), RUN) != items
        problems = lg.verify()
        assert [(p.kind, p.run_id, p.seq) for p in problems] == [
            ("checkpoint_values_missing", RUN, _seq_of(lg, RUN, third.checkpoint_id))]
        assert f"erased at seq {erasure.result.last_seq}" in problems[0].message
    done = _cli(db, "verify")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "checkpoint_values_missing" in done.stdout and RUN in done.stdout
    done = _cli(db, "verify", RUN)
    assert done.returncode == 4 and "checkpoint_values_missing" in done.stdout


def test_verify_reports_a_tail_stored_against_an_erased_value_as_an_older_saver_wrote_it(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        cfg, _ = _grow(LedgerSaver(lg), RUN)
        LedgerSaver(lg).delete_thread(RUN)
        # What a saver before the in-transaction check stored: a tail of the erased list
        # (the command itself, without the check the Ledger now makes around it).
        tail = b"msgpack\x00" + bytes([0x91, 0xA1]) + b"z"
        lg.store.put_values(RUN, {value_digest(tail): tail})
        lg.execute(RUN, C.SaveGraphCheckpoint(thread_id=RUN, checkpoint_id="cp-after", checkpoint={
            "channel_versions": {"messages": "0004"}}, metadata={}, values={"messages": value_digest(tail)},
            parent_id=cfg["configurable"]["checkpoint_id"], extends={"messages": "0003"}),
            actor=Actor("owner", "langgraph"))
        assert lg.verify_report()["erased"]  # the erasure itself is no damage ...
        assert [p.kind for p in lg.verify()] == ["checkpoint_values_missing"]  # ... the orphaned tail is
    done = _cli(db, "verify")
    assert done.returncode == 4 and "checkpoint_values_missing" in done.stdout


def _seq_of(lg: Ledger, run: str, checkpoint_id: str) -> int:
    (seq,) = (r.seq for r in lg.log(run) if r.type == "graph_checkpoint_saved"
              and r.event.checkpoint_id == checkpoint_id)
    return seq


@pytest.mark.parametrize("thread", ["\x00", "t1\n", "a\tb", "t\u202e1"])
def test_a_thread_id_that_is_not_one_printable_line_is_refused_naming_the_thread_id(shared_backend, thread):
    db = shared_backend.address()
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        before = lg.store.ledger_head()
        cp = generate_checkpoint(channel_values={"messages": ["a"]}, channel_versions={"messages": "0001"})
        with pytest.raises(InvalidInput, match="thread_id") as refused:
            saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp, {}, {"messages": "0001"})
        assert refused.value.details["field"] == "thread_id" and "target" not in refused.value.message
        with pytest.raises(InvalidInput, match="thread_id"):
            saver.get_tuple({"configurable": {"thread_id": thread}})
        assert lg.store.ledger_head() == before


#: handoff_put_values as schema 10 made it: it stored what it was given and checked nothing
#: a write needs stored already.
PUT_VALUES_V10 = """CREATE OR REPLACE FUNCTION handoff_put_values(p_run text, p_digests text[], p_values bytea[])
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE n integer;
BEGIN
  IF cardinality(p_digests) <> cardinality(p_values) OR EXISTS (
       SELECT 1 FROM unnest(p_digests, p_values) AS t(d, v) WHERE encode(sha256(t.v), 'hex') <> t.d) THEN
    RAISE EXCEPTION 'handoff: a value of run % is not named by its sha256', p_run
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  INSERT INTO run_values (run_id, sha256, value) SELECT p_run, t.d, t.v FROM unnest(p_digests, p_values) AS t(d, v)
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$"""
#: handoff_delete_values as schema 10 made it: it deleted a value a later event names again.
DELETE_VALUES_V10 = """CREATE OR REPLACE FUNCTION handoff_delete_values(p_run text, p_digests text[])
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE n integer;
BEGIN
  DELETE FROM run_values v WHERE v.run_id = p_run AND v.sha256 = ANY(p_digests)
    AND EXISTS (SELECT 1 FROM events e WHERE e.run_id = p_run AND e.type = 'values_erased'
                AND position(convert_to(v.sha256, 'UTF8') IN e.payload) > 0);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$"""


def test_a_postgresql_ledger_of_schema_10_checks_needed_values_after_its_upgrade():
    pytest.importorskip("psycopg")
    import psycopg

    from handoff.ledger.postgres import PG_SCHEMA_VERSION
    from handoff.ledger.postgres import postgres_schema as P
    from handoff.ledger.postgres.postgres_liveness import SIGNATURES as LIVENESS_SIGNATURES
    from tests.pg import fresh_url

    url = fresh_url()
    with Ledger(url) as lg:
        cfg, _ = _grow(LedgerSaver(lg), RUN)
        schema = lg.store.x("SELECT current_schema()").fetchone()[0]
        # A run whose lease was granted before the upgrade: schema 10 kept no liveness row for it.
        held = lg.open(goal="beats across the upgrade", target="chat:#ops", owner="alice")
        token = lg.claim(held, "w-held")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PUT_VALUES_V10.format(schema=P.ident(schema)))
        conn.execute(DELETE_VALUES_V10.format(schema=P.ident(schema)))
        conn.execute(f"DROP INDEX {P.ident(schema)}.events_erasures")  # schema 10 had none
        # Nor had it heartbeats kept beside the log (schema 12): no table, no functions.
        conn.execute(f"DROP TABLE {P.ident(schema)}.liveness")
        for sig in LIVENESS_SIGNATURES:
            conn.execute(f"DROP FUNCTION {P.ident(schema)}.{sig}")
        conn.execute("UPDATE handoff_meta SET value = '10' WHERE key = 'schema_version'")
    with Ledger(url) as lg:
        assert lg.store.diagnostics()["schema_version"] == PG_SCHEMA_VERSION == 12
        assert lg.verify() == []  # the functions are the ones this version makes
        # The upgrade's liveness works for the lease it found: its first beat has no row to
        # move, so it is logged and starts one; the next is kept beside the log.
        first, second = (lg.heartbeat(held, token).result for _ in range(2))
        assert (first.outcome, second.outcome) == ("committed", "unchanged"), (first, second)
        live = lg.store.liveness([held])[held]
        assert (live.lease, live.beats) == (token.lease, 2), live
        assert lg.store.x("SELECT 1 FROM pg_indexes WHERE indexname = 'events_erasures' "
                          "AND schemaname = current_schema()").fetchone() is not None
        base = _saved(lg, RUN)[-1].values["messages"]
        lg.erase_values(RUN, reason="cleanup", values=[base])
        before = _snapshot(lg, RUN)
        with pytest.raises(ValueNotStored, match="does not store"):
            _continue(lg, RUN, base, cfg["configurable"]["checkpoint_id"])
        assert _snapshot(lg, RUN) == before
        for name in ("handoff_put_values", "handoff_delete_values"):
            body = lg.store.x("SELECT prosrc FROM pg_proc WHERE proname = %s AND pronamespace = "
                              "current_schema()::regnamespace", (name,)).fetchone()[0]
            assert ("HL409" in body) if name == "handoff_put_values" else ("g.seq > e.seq" in body)
