"""Real processes on one ledger file: racing writers, a tailing reader, and kill -9.

Each writer is a separate ``python -c`` process with its own SqliteStore. A writer
records an append as acknowledged (one JSON line in its own ack file) only after
``append`` has returned, so "every acknowledged event is present" is a real claim.
Sizes grow with HANDOFF_TEST_SCALE=full (``pytest --slow``).
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import threading
import time

import pytest

from handoff.ledger.sqlite import SqliteStore
from tests.support import finish, spawn

FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"

_PRELUDE = r"""
import json, os, random, sys, time
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor
from handoff.ledger import events as ev
from handoff.ledger.errors import SeqConflict

def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.001)
"""

#: argv: db wid n ack go. Appends n batches of 1-3 events across a run shared by all
#: writers, one shared with half of them and its own; half the appends pass
#: expected_seq and retry on SeqConflict.
RACE_WRITER = _PRELUDE + r"""
db, wid, n, ack, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rng = random.Random(wid)
store = SqliteStore(db, busy_timeout_s=60)
actor = Actor("worker", f"w{wid}")
wait_for(go)
conflicts = 0
with open(ack, "a") as out:
    for i in range(n):
        run = ("shared", f"pair-{wid % 2}", f"own-{wid}")[i % 3]
        details = [f"{wid}:{i}:{j}" for j in range(rng.randint(1, 3))]
        events = [ev.ProgressRecorded(kind="race", detail=d) for d in details]
        if rng.random() < 0.5:
            while True:
                head = store.head(run)
                try:
                    r = store.append(run, events, actor=actor,
                                     expected_seq=head.last_seq if head else 0)
                    break
                except SeqConflict:
                    conflicts += 1
        else:
            r = store.append(run, events, actor=actor)
        assert r.outcome == "committed" and len(r.positions) == len(events)
        out.write(json.dumps({"run": r.run_id, "first_seq": r.first_seq,
                              "positions": list(r.positions), "details": details}) + "\n")
        out.flush()
store.close()
print(conflicts)
"""

#: argv: db wid go. Opens a ledger that may not exist yet, racing the others to create it.
CREATE_WRITER = _PRELUDE + r"""
db, wid, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
wait_for(go)
store = SqliteStore(db, busy_timeout_s=60)
for i in range(5):
    store.append("created", [ev.ProgressRecorded(kind="create", detail=f"{wid}:{i}")],
                 actor=Actor("worker", f"w{wid}"))
store.close()
"""

#: argv: db wid start stop ack. Appends batches k = start, start + 1, ... under idempotency
#: key w{wid}-k{k} until the file ``stop`` exists, then prints the k it stopped before. Its
#: work never runs out while the test is still killing. A restarted incarnation starts a
#: little before its last ack, so it replays acknowledged keys (duplicates) and the one
#: that was in flight.
IDEM_WRITER = _PRELUDE + r"""
db, wid, start, stop, ack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
store = SqliteStore(db, busy_timeout_s=60)
actor = Actor("worker", f"w{wid}")
k = start
parent = os.getppid()
with open(ack, "a") as out:
    # Until told to stop, or until the test that started it is gone (a killed pytest must
    # not leave writers looping on a machine).
    while not os.path.exists(stop) and os.getppid() == parent:
        run = "kill-shared" if k % 3 == 0 else f"kill-own-{wid}"
        events = [ev.ProgressRecorded(kind="kill", detail=f"{wid}:{k}:{j}") for j in range(1 + k % 3)]
        r = store.append(run, events, actor=actor, idempotency_key=f"w{wid}-k{k}")
        out.write(json.dumps({"k": k, "run": r.run_id, "outcome": r.outcome,
                              "first_seq": r.first_seq, "positions": list(r.positions)}) + "\n")
        out.flush()
        k += 1
store.close()
print(k)
"""


def read_acks(path: str) -> list[dict]:
    """Ack lines; a torn last line (writer killed mid-write) is not an ack."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f.read().split("\n") if line.endswith("}")]


def check_log(store: SqliteStore) -> list:
    """Global and per-run order are gapless; the chain and the file are sound."""
    records = list(store.read_all())
    assert [r.position for r in records] == list(range(1, len(records) + 1))
    by_run: dict[str, list[int]] = collections.defaultdict(list)
    for r in records:
        by_run[r.run_id].append(r.seq)
    for run, seqs in by_run.items():
        assert seqs == list(range(1, len(seqs) + 1)), run
        assert store.head(run).last_seq == len(seqs)
    assert store.verify() == []
    assert store.integrity_check() == "ok"
    return records


# --- racing writers and a tailing reader ---------------------------------------------------


class Tail(threading.Thread):
    """Tails read_all(after_position=last) on its own connection while writers run,
    checking every position and every run's seq arrives in order, none skipped, and
    that verify() stays clean on the live ledger."""

    def __init__(self, db: str) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.stop = threading.Event()
        self.last = 0
        self.polls = 0
        self.verifies = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            store = SqliteStore(self.db, busy_timeout_s=60)
            seq: dict[str, int] = collections.defaultdict(int)
            while True:
                stopping = self.stop.is_set()
                for rec in store.read_all(after_position=self.last):
                    assert rec.position == self.last + 1, f"skipped {self.last + 1}..{rec.position - 1}"
                    assert rec.seq == seq[rec.run_id] + 1, f"{rec.run_id} seq {rec.seq}"
                    self.last, seq[rec.run_id] = rec.position, rec.seq
                self.polls += 1
                if self.polls % 25 == 0:
                    assert store.verify() == [], "verify() flagged a live, healthy ledger"
                    self.verifies += 1
                if stopping:
                    break
                time.sleep(0.002)
            store.close()
        except BaseException as exc:
            self.error = exc


def test_racing_writers_with_a_tailing_reader(tmp_path):
    db = str(tmp_path / "race.db")
    SqliteStore(db).close()
    go = str(tmp_path / "go")
    writers, n = 8, (400 if FULL else 60)
    acks = [str(tmp_path / f"ack-{w}.jsonl") for w in range(writers)]
    procs = [spawn(RACE_WRITER, db, w, n, acks[w], go) for w in range(writers)]
    tail = Tail(db)
    tail.start()
    open(go, "w").close()
    try:
        conflicts = sum(int(finish(p).strip() or 0) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        tail.stop.set()
        tail.join(60)
    if tail.error:
        raise tail.error

    with SqliteStore(db) as store:
        records = check_log(store)
    assert tail.last == len(records), "the tail missed the end of the log"
    assert tail.verifies >= 1
    by_pos = {r.position: r for r in records}
    acked = [a for path in acks for a in read_acks(path)]
    assert len(acked) == writers * n
    details = []
    for a in acked:
        got = [by_pos[p] for p in a["positions"]]
        assert [r.run_id for r in got] == [a["run"]] * len(got)
        assert [r.seq for r in got] == list(range(a["first_seq"], a["first_seq"] + len(got)))
        assert [r.event.detail for r in got] == a["details"]
        details += a["details"]
    # Every event in the log was acknowledged exactly once, and nothing else is there.
    assert len(details) == len(set(details)) == len(records)
    assert sorted(r.event.detail for r in records) == sorted(details)
    assert conflicts >= 0


def test_processes_racing_to_create_the_ledger(tmp_path):
    db = str(tmp_path / "new.db")
    go = str(tmp_path / "go")
    procs = [spawn(CREATE_WRITER, db, w, go) for w in range(8)]
    time.sleep(0.3)  # let them all reach the starting line
    open(go, "w").close()
    for p in procs:
        finish(p)
    with SqliteStore(db) as store:
        records = check_log(store)
        assert len(records) == 40
        assert sorted(r.event.detail for r in records) == sorted(f"{w}:{i}" for w in range(8) for i in range(5))
        meta = dict(store.conn.execute("SELECT key, value FROM handoff_meta"))
        assert meta["format"] == "handoff-ledger"


# --- kill -9 ----------------------------------------------------------------------------------


def test_sigkilled_writers_lose_nothing_acknowledged_and_duplicate_nothing(tmp_path):
    rng = random.Random(int(os.environ.get("HANDOFF_KILL_SEED", "20240229")))
    db = str(tmp_path / "kill.db")
    SqliteStore(db).close()
    writers, target_kills = (8, 60) if FULL else (4, 20)
    acks = [str(tmp_path / f"ack-{w}.jsonl") for w in range(writers)]
    stop = str(tmp_path / "stop")

    def last_acked(w: int) -> int:
        return max((a["k"] for a in read_acks(acks[w])), default=-1)

    def start(w: int) -> tuple[subprocess.Popen[str], int]:
        """A new incarnation of writer ``w``, a little before its last ack, and the key it must
        acknowledge to be past everything an earlier one may have written (the in-flight key)."""
        last = last_acked(w)
        return spawn(IDEM_WRITER, db, w, max(0, last - 2), stop, acks[w]), last + 1

    def working(among: list[int]) -> list[int]:
        """Wait until one of the writers ``among`` has acknowledged that key; return those that have."""
        while True:
            for w in among:
                assert procs[w][0].poll() is None, f"writer {w} ended on its own:\n{procs[w][0].communicate()[1]}"
            ready = [w for w in among if last_acked(w) >= procs[w][1]]
            if ready:
                return ready
            assert time.monotonic() < deadline, (f"only {kills} of {target_kills} kills landed within {limit_s}s: "
                                                 f"writers {among} appended nothing since their restart")
            time.sleep(0.005)

    procs = {w: start(w) for w in range(writers)}
    kills = 0
    # Kills are counted, not timed: the writers work until told to stop, and a kill lands
    # only on a writer that has appended since it (re)started, so a busy machine (slow
    # interpreter starts) makes the test longer, never emptier. The deadline only stops a
    # test whose writers hang.
    limit_s = 1800 if FULL else 600
    deadline = time.monotonic() + limit_s
    try:
        while kills < target_kills:
            time.sleep(rng.uniform(0.02, 0.3))
            w = rng.choice(working(list(procs)))  # a writer still starting up is not mid-append
            proc = procs[w][0]
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            kills += 1
            procs[w] = start(w)
        # Each writer gets past every key an earlier incarnation may have written, then stops.
        for w in procs:
            working([w])
        open(stop, "w").close()
        ends = {w: int(finish(proc).strip()) for w, (proc, _) in procs.items()}
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    with SqliteStore(db) as store:
        records = check_log(store)
    firsts = {r.idempotency_key: r for r in records if r.idempotency_key}
    # Every planned batch is there exactly once, whole.
    assert sorted(firsts) == sorted(f"w{w}-k{k}" for w in range(writers) for k in range(ends[w]))
    assert len(records) == sum(1 + k % 3 for w in range(writers) for k in range(ends[w]))
    details = [r.event.detail for r in records]
    assert len(details) == len(set(details)), "a retried batch was written twice"
    by_pos = {r.position: r for r in records}
    replays = 0
    for w in range(writers):
        for a in read_acks(acks[w]):
            # Every acknowledgement, first or replayed, names the one stored copy.
            rec = firsts[f"w{w}-k{a['k']}"]
            assert a["positions"][0] == rec.position and a["first_seq"] == rec.seq
            assert a["run"] == rec.run_id
            assert [by_pos[p].event.detail for p in a["positions"]] == [
                f"{w}:{a['k']}:{j}" for j in range(1 + a["k"] % 3)
            ]
            replays += a["outcome"] == "duplicate"
    assert replays > 0, "restarts never replayed an acknowledged key"
