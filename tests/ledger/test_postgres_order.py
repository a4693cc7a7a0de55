"""Order for readers and concurrency on PostgreSQL, with real processes over TCP.

- A writer that has taken its place and stalls before COMMIT holds back every later
  write: a reader never sees a later event without the stalled one before it; it waits.
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

from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore
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


def test_a_writer_stalled_before_commit_holds_back_every_later_event(url, tmp_path):
    with PostgresStore(url) as store:
        store.append("before", [ev.HeartbeatRecorded()], actor=W)  # position 1
        stalled, go = tmp_path / "stalled", tmp_path / "go"
        a = agent("staller", url, "run-a", str(stalled), str(go))
        try:
            wait_for(stalled, a)
            assert stalled.read_text() == "2", "A took position 2 and now sits before its COMMIT"
            b = agent("one", url, "run-b", str(tmp_path / "b.json"))
            time.sleep(1.0)
            # B decided and now waits for A: it has not committed, and nothing after
            # position 1 is visible to a reader, however often it looks.
            assert b.poll() is None, "B committed while A was still open"
            for _ in range(20):
                assert [r.position for r in store.read_all(after_position=1)] == []
                assert store.last_position() == 1
            go.touch()
            assert a.wait(30) == 0, a.communicate()
            assert b.wait(30) == 0, b.communicate()
        finally:
            go.touch()
            for p in (a, locals().get("b")):
                if p is not None and p.poll() is None:
                    p.kill()
        seen = [(r.position, r.run_id) for r in store.read_all(after_position=1)]
        assert seen == [(2, "run-a"), (3, "run-b")]
        assert json.loads((tmp_path / "b.json").read_text()) == [3]
        assert store.verify() == []


def test_writer_processes_and_tailing_readers_agree(url, tmp_path):
    writers, each = (16, 150) if FULL else (8, 40)
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
