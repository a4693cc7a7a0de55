"""Order for readers and concurrency on PostgreSQL, with real processes over TCP.

- A writer that stalls before COMMIT holds back nobody, and a reader never skips it:
  positions are given when a commit is sealed, so its event comes after those that
  committed first.
- Writer processes on distinct and shared runs plus two tailing readers: seqs contiguous
  per run, no position skipped or repeated by any reader, every acknowledged append
  stored exactly once, verify clean. Bounded by default; bigger under --slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handoff.ledger.postgres import postgres_store as P
from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore
from handoff.ledger.postgres.postgres_schema import SEAL_LOCK
from handoff.ledger.store import Actor
from tests.pg import fresh_url

ROOT = Path(__file__).resolve().parents[2]
W = Actor("worker", "w")
FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"


def agent(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.ledger.pg_agents", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"agent exited early: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


@pytest.fixture
def url():
    u = fresh_url()
    assert "127.0.0.1" in u  # over TCP, as across hosts
    PostgresStore(u).close()  # the schema, created once before the agents race
    return u


def test_a_writer_stalled_before_commit_never_makes_a_reader_skip(url, tmp_path):
    """Writer A inserts and stalls before COMMIT; B writes and commits after it. Positions
    are given at sealing, after a commit, so B is not held back and a reader tailing the
    log sees B; when A commits it is sealed after B, and no position a reader has passed
    is ever filled in or changed afterwards."""
    with PostgresStore(url) as store:
        store.append("before", [ev.HeartbeatRecorded()], actor=W)  # position 1
        stalled, go = tmp_path / "stalled", tmp_path / "go"
        a = agent("staller", url, "run-a", str(stalled), str(go))
        b = None
        try:
            wait_for(stalled, a)  # A has inserted its event and sits before its COMMIT
            b = agent("one", url, "run-b", str(tmp_path / "b.json"))
            assert b.wait(30) == 0, b.communicate()  # B is not held back by A
            assert json.loads((tmp_path / "b.json").read_text()) == [2]
            seen = [(r.position, r.run_id) for r in store.read_all()]
            assert seen == [(1, "before"), (2, "run-b")]
            for _ in range(20):  # however often a reader looks, A is not there yet
                assert [r.run_id for r in store.read_all(after_position=2)] == []
                assert store.last_position() == 2
            assert store.head("run-a") is None
            go.touch()
            assert a.wait(30) == 0, a.communicate()
        finally:
            go.touch()
            for p in (a, b):
                if p is not None and p.poll() is None:
                    p.kill()
        # The tailing reader's next page starts where it stopped and finds A there.
        assert [(r.position, r.run_id) for r in store.read_all(after_position=2)] == [(3, "run-a")]
        assert [(r.position, r.run_id) for r in store.read_all()] == seen + [(3, "run-a")]
        assert store.head("run-a").last_position == 3
        assert store.verify() == []


def test_events_committed_but_not_sealed_are_sealed_by_the_next_reader(url):
    """A writer that dies between its commit and its seal leaves its events waiting; the
    next reader (here a read-only handle, as an auditor's) seals them, in commit order."""
    import psycopg

    with PostgresStore(url) as store:
        store.append("a", [ev.HeartbeatRecorded()], actor=W)
    # What a writer killed after its COMMIT leaves when another session was sealing at its
    # insert (handoff_append found the seal lock taken and left it queued).
    with psycopg.connect(url, autocommit=True) as sealer, psycopg.connect(url, autocommit=True) as conn:
        sealer.execute("BEGIN")
        sealer.execute(SEAL_LOCK)
        conn.execute("INSERT INTO events (id, run_id, seq, type, actor, batch_size, recorded_us, "
                     "schema_version, payload, prev_hash, hash, viewed) SELECT nextval('events_id_seq'), "
                     "run_id, 2, type, actor, 1, recorded_us, schema_version, payload, hash, hash, true "
                     "FROM events WHERE run_id = 'a' AND seq = 1")
        sealer.execute("ROLLBACK")
    with PostgresStore(url, readonly=True) as reader:
        assert reader.unsealed_count() == 1
        assert [(r.run_id, r.seq, r.position) for r in reader.read_all()] == [("a", 1, 1), ("a", 2, 2)]
        assert reader.unsealed_count() == 0
        assert reader.ledger_head()[0] == 2


def test_writer_processes_and_tailing_readers_agree(url, tmp_path):
    writers, each = (16, 150) if FULL else (16, 15)
    total = writers * each
    shared = "shared-1,shared-2"
    procs, outs = [], []
    readers = [agent("reader", url, str(tmp_path / f"reader{i}.json"), str(total), "120") for i in range(2)]
    for i in range(writers):
        out = tmp_path / f"writer{i}.jsonl"
        runs = f"own-{i}" if i % 2 == 0 else shared  # half on runs of their own, half on shared runs
        procs.append(agent("writer", url, str(out), runs, str(each)))
        outs.append(out)
    for p in procs:
        assert p.wait(180) == 0, p.communicate()
    for p in readers:
        assert p.wait(180) == 0, p.communicate()
    acked = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    assert {a["status"] for a in acked} == {"ok"}, "every append was acknowledged"
    assert len(acked) == total

    with PostgresStore(url) as store:
        everything = list(store.read_all())
        assert [r.position for r in everything] == list(range(1, total + 1))
        by_key = {}
        for r in everything:
            assert r.idempotency_key not in by_key, f"event doubled: {r.idempotency_key}"
            by_key[r.idempotency_key] = r
        for a in acked:  # nothing acknowledged is lost, and each sits where its ack said
            r = by_key.pop(a["key"])
            assert (r.run_id, r.seq, [r.position]) == (a["run"], a["seq"], a["positions"])
        assert by_key == {}, "events stored that no writer was told about"
        seqs: dict[str, list[int]] = {}
        for r in everything:
            seqs.setdefault(r.run_id, []).append(r.seq)
        for run, s in seqs.items():
            assert s == list(range(1, len(s) + 1)), f"seqs of {run} are not contiguous"
        assert store.verify() == []
    for i in range(2):
        seen = json.loads((tmp_path / f"reader{i}.json").read_text())
        assert seen == list(range(1, total + 1)), f"reader {i} skipped or repeated a position"


def test_a_value_the_session_carries_is_never_taken_for_a_writes_position(url):
    """A write whose events stayed queued (another session was sealing) reports the
    positions the seal after its COMMIT gave them, never a value the session carries
    over (a SET by a pooler or an earlier client that looks like a position)."""
    import psycopg

    with PostgresStore(url) as store, psycopg.connect(url, autocommit=True) as sealer:
        store.append("a", [ev.HeartbeatRecorded()], actor=W)
        store.ready().execute("SET handoff.sealed = '1:1'")  # carried over: names event 1
        sealer.execute("BEGIN")
        sealer.execute(SEAL_LOCK)
        import threading

        threading.Timer(0.2, sealer.execute, ("ROLLBACK",)).start()
        result = store.append("a", [ev.HeartbeatRecorded()], actor=W)
        assert result.positions == (2,)
        assert [r.position for r in store.read_run("a")] == [1, 2]
