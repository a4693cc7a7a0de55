"""Helpers the scenario modules share: the durability settings, the raw sqlite3
reference table, and deterministic event streams.

Every database here is a file in the run's scratch directory, in journal_mode=WAL with
synchronous=FULL, for handoff-ledger, the raw reference and the peers (benchmarks/peers.py)
alike: a commit is on disk (fsync of the WAL) before it is acknowledged. Fixtures that
are only read (folds, rebuilds, status) are built with synchronous=NORMAL or OFF, which
is never timed. Checkpointing is left to each side's
own policy: handoff-ledger turns automatic checkpoints off and truncates the WAL itself
past 8 MiB; the raw reference keeps SQLite's default (a passive checkpoint past 1,000
pages). Either way the checkpoint cost falls inside the timed region.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from collections.abc import Callable

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor, new_lease_secret

JOURNAL_MODE = "wal"
SYNCHRONOUS = "FULL"
DURABILITY = (
    "file-backed databases, journal_mode=WAL, synchronous=FULL for every writer "
    "(handoff-ledger, raw sqlite3, eventsourcing, LangGraph), checked with PRAGMA before timing"
)

OWNER = Actor("owner", "bench-owner")
WORKER = Actor("worker", "bench-worker")

RAW_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events ("
    "run_id TEXT NOT NULL, seq INTEGER NOT NULL, payload BLOB NOT NULL, "
    "PRIMARY KEY (run_id, seq))"
)
RAW_INSERT = "INSERT INTO events (run_id, seq, payload) VALUES (?, ?, ?)"

#: The raw side's own msgspec codecs: same bytes as ledger.events.encode, no ledger code.
raw_encoder = msgspec.json.Encoder()
raw_decoder = msgspec.json.Decoder(ev.AnyEvent)


def _check(conn: sqlite3.Connection, who: str) -> None:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if str(mode).lower() != JOURNAL_MODE or sync != 2:  # 2 == FULL
        raise RuntimeError(
            f"{who} is not running with journal_mode=WAL, synchronous=FULL "
            f"(got {mode}, {sync}); the comparison would be unfair"
        )


def open_store(path: str | os.PathLike[str]) -> SqliteStore:
    store = SqliteStore(path, synchronous=SYNCHRONOUS)
    _check(store.conn, "handoff-ledger")
    return store


def raw_connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A plain connection with the same durability settings, autocommit mode, and the
    reference table: (run_id, seq, payload) with PRIMARY KEY (run_id, seq)."""
    conn = sqlite3.connect(os.fspath(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    conn.execute(RAW_SCHEMA)
    _check(conn, "the raw sqlite3 reference")
    return conn


def raw_count(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM events").fetchone()[0]


def step_events(n: int, tag: str = "") -> list[ev.Event]:
    """Small progress events (about 80 bytes encoded), distinct so no two payloads match."""
    return [
        ev.ProgressRecorded(kind="tool_call", detail=f"{tag}step {i}: ran the test suite")
        for i in range(n)
    ]


def mixed_events(n: int, tag: str = "") -> list[ev.Event]:
    """A realistic run body: progress, heartbeats, evidence and artifacts in rotation."""
    out: list[ev.Event] = []
    for i in range(n):
        k = i % 4
        if k == 0:
            out.append(ev.ProgressRecorded(kind="tool_call", detail=f"{tag}step {i}: edited a file"))
        elif k == 1:
            out.append(ev.HeartbeatRecorded())
        elif k == 2:
            out.append(
                ev.EvidenceRecorded(kind="pytest", outcome="pass", detail=f"{tag}{i} passed in 1.2s")
            )
        else:
            out.append(
                ev.ArtifactRecorded(
                    path=f"out/{tag}artifact-{i}.json", kind="report", bytes=1024 + i,
                    sha256=f"{i:064x}",
                )
            )
    return out


def mean_payload_bytes(events: list[ev.Event]) -> float:
    return sum(len(ev.encode(e)) for e in events) / len(events)


def open_run(store: SqliteStore, run_id: str, *, lease: int | None = None) -> str | None:
    """Write the contract (and optionally grant a lease) so the run looks like a real one;
    return the lease's token, which every write under it carries."""
    store.append(
        run_id,
        [ev.HandoffOpened(goal="benchmark run", target="file:out/result.json", owner=OWNER.name)],
        actor=OWNER,
        expected_seq=0,
    )
    if lease is None:
        return None
    secret, digest = new_lease_secret()
    store.append(run_id, [ev.LeaseGranted(worker=WORKER.name, lease=lease, token_digest=digest)], actor=OWNER)
    return f"{lease}.{secret}"


def path_in(d: Path, name: str) -> str:
    return os.fspath(d / name)


# --- realistic runs ----------------------------------------------------------------------
#
# The larger scenarios (folds, projection rebuild, status and stall scans) need logs that
# look like real agent runs. Their opening and closing events are produced once by the
# real decide rules (a scratch in-memory Ledger playing the commands), so every event is
# one the library itself would write; the body between them is the mix a working agent
# records: progress, heartbeats, evidence and artifacts (a bounded set of paths, as a
# run rewrites its outputs).


def _template_runs() -> dict[str, list[ev.Event]]:
    import tempfile

    from handoff.facade import Ledger

    out: dict[str, list[ev.Event]] = {}
    with tempfile.TemporaryDirectory() as d:
        result = os.path.join(d, "result.json")
        with open(result, "w") as f:
            f.write('{"ok": true}\n')
        with Ledger(":memory:") as lg:
            # live: opened, claimed, planned, executing
            lg.open(goal="benchmark run", target="file:out/result.json", owner="alice", run_id="t-live")
            lease = lg.claim("t-live", "w1")
            lg.transition("t-live", lease, "planning", worker="w1")
            lg.progress("t-live", lease, "plan_committed", "3 steps", worker="w1")
            lg.transition("t-live", lease, "executing", worker="w1")
            out["start"] = [r.event for r in lg.log("t-live")]
            # delivered: verify, evidence, result artifact, submit, deliver once
            lg.transition("t-live", lease, "verifying", worker="w1")
            lg.evidence("t-live", "pytest", "pass", "412 passed", lease=lease)
            lg.artifact("t-live", lease, result, kind="result", worker="w1")
            lg.submit("t-live", lease, "report drafted", worker="w1")
            lg.deliver("t-live", "deliver-1", by="alice")
            lg.delivered("t-live", "deliver-1", "msg-123")
            out["delivered"] = [r.event for r in lg.log("t-live")][len(out["start"]):]
            # closed: an owner cancels a run still being worked on
            lg.open(goal="benchmark run", target="file:out/result.json", owner="alice", run_id="t-closed")
            lease = lg.claim("t-closed", "w1")
            lg.transition("t-closed", lease, "planning", worker="w1")
            n0 = sum(1 for _ in lg.log("t-closed"))
            lg.close_run("t-closed", "cancelled", "superseded", by="alice")
            out["cancelled"] = [r.event for r in lg.log("t-closed")][n0:]
    return out


_TEMPLATES: dict[str, list[ev.Event]] = {}


def templates() -> dict[str, list[ev.Event]]:
    if not _TEMPLATES:
        _TEMPLATES.update(_template_runs())
    return _TEMPLATES


def body_events(n: int, tag: str = "") -> list[ev.Event]:
    """What a working agent records: 40% progress, 30% heartbeats, 15% evidence,
    15% artifacts (16 paths, rewritten), in a fixed rotation."""
    out: list[ev.Event] = []
    for i in range(n):
        k = i % 20
        if k < 8:
            out.append(ev.ProgressRecorded(kind="tool_outcome", detail=f"{tag}step {i}: ran the tool"))
        elif k < 14:
            out.append(ev.HeartbeatRecorded())
        elif k < 17:
            out.append(ev.EvidenceRecorded(kind="pytest", outcome="pass", detail=f"{tag}{i} passed in 1.2s"))
        else:
            out.append(ev.ArtifactRecorded(path=f"/work/out/{tag}part-{i % 16}.json", kind="report",
                                           bytes=1024 + i, sha256=f"{i:064x}"))
    return out


def run_events(n: int, ending: str | None = None, tag: str = "") -> list[ev.Event]:
    """A run of exactly ``n`` events: the opening, a working body, and optionally an
    ending ("delivered" or "cancelled")."""
    t = templates()
    start = t["start"]
    end = t[ending] if ending else []
    body = n - len(start) - len(end)
    if body < 0:
        raise ValueError(f"a run of {n} events is too short for its opening and ending")
    return list(start) + body_events(body, tag) + list(end)


class Clock:
    """A settable store clock (µs), so a fixture can place events in time."""

    def __init__(self, now_us: int) -> None:
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us


# --- child processes -------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def child_argv(task: str, args: dict, module: str = "benchmarks.child") -> list[str]:
    import json
    import sys

    return [sys.executable, "-m", module, task, json.dumps(args)]


def spawn(task: str, args: dict, *, stdin: bool = False, module: str = "benchmarks.child"):  # -> Popen
    """Start ``python -m MODULE TASK ARGS`` from the repository root."""
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        child_argv(task, args, module), cwd=str(REPO), env=env, stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
    )


def reap(proc) -> dict:  # the child's JSON report
    """Read a child's one-line JSON report and wait for it."""
    import json

    out = proc.stdout.read()
    proc.stdout.close()
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {proc.args[3:5]} exited with {proc.returncode}")
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"benchmark child {proc.args[3:5]} printed no report")
    return json.loads(lines[-1])


def run_child(task: str, args: dict) -> dict:
    return reap(spawn(task, args))


def expect(what: str, got: int, want: int) -> None:
    """The untimed check after a trial: a side that did not do its work fails the run."""
    if got != want:
        raise RuntimeError(f"benchmark did not do its work: {what} is {got}, expected {want}")


def raw_batch(make_work: Callable[[int, int], list[tuple[str, list[ev.Event]]]], rows_per_txn: int | None = None):
    """The raw reference for batched writes: ``executemany`` of (run_id, seq, payload),
    one transaction per run's batch, or per ``rows_per_txn`` rows spanning consecutive
    runs. ``make_work(runs, per_run)`` gives the same (run_id, events) pairs the
    handoff-ledger side appends."""
    from .harness import Trial  # the harness does not import this module: no cycle

    def prepare(ctx):  # -> Trial
        runs, per_run = ctx.params["runs"], ctx.params["per_run"]
        conn = raw_connect(path_in(ctx.dir, "raw.db"))
        work = make_work(runs, per_run)
        group = max(1, (rows_per_txn or per_run) // per_run)
        chunks = [work[i : i + group] for i in range(0, len(work), group)]

        def run() -> None:
            execute, executemany, encode = conn.execute, conn.executemany, raw_encoder.encode
            for chunk in chunks:
                execute("BEGIN IMMEDIATE")
                for run_id, events in chunk:
                    executemany(RAW_INSERT, [(run_id, seq, encode(e)) for seq, e in enumerate(events, 1)])
                execute("COMMIT")

        return Trial(run, lambda: expect("row count", raw_count(conn), runs * per_run), conn.close)

    return prepare


def fill_round_robin(store: SqliteStore, conn: sqlite3.Connection, bodies: dict[str, list[ev.Event]],
                     batch: int, *, tick: Callable[[], None] | None = None) -> None:
    """Write each run's events to a ledger and to the raw table alike, ``batch`` at a time,
    run after run, so one run's rows are spread through both files as in a live ledger.
    ``tick`` runs before each round (to move a fixture's clock). Untimed fixture work."""
    longest = max(len(events) for events in bodies.values())
    for start in range(0, longest, batch):
        if tick is not None:
            tick()
        for run_id, events in bodies.items():
            chunk = events[start : start + batch]
            if not chunk:
                continue
            store.append(run_id, chunk, actor=WORKER)
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                RAW_INSERT, [(run_id, start + i + 1, raw_encoder.encode(e)) for i, e in enumerate(chunk)]
            )
            conn.execute("COMMIT")
    store.wal_checkpoint()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
