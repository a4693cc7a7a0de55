"""Helpers the scenario modules share: the durability settings, the raw sqlite3
reference table, and deterministic event streams.

Every database here is a file in the run's scratch directory, in journal_mode=WAL with
synchronous=FULL, for handoff-ledger and for the raw reference alike: a commit is on
disk (fsync of the WAL) before it is acknowledged. Checkpointing is left to each side's
own policy: handoff-ledger turns automatic checkpoints off and truncates the WAL itself
past 8 MiB; the raw reference keeps SQLite's default (a passive checkpoint past 1,000
pages). Either way the checkpoint cost falls inside the timed region.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import msgspec

from ledger import events as ev
from ledger.sqlite import SqliteStore
from ledger.store import Actor

JOURNAL_MODE = "wal"
SYNCHRONOUS = "FULL"
DURABILITY = (
    "file-backed databases, journal_mode=WAL, synchronous=FULL on both handoff-ledger "
    "and the raw sqlite3 reference"
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
    _check(store.db.conn, "handoff-ledger")
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


def open_run(store: SqliteStore, run_id: str, *, lease: int | None = None) -> None:
    """Write the contract (and optionally grant a lease) so the run looks like a real one."""
    store.append(
        run_id,
        [ev.HandoffOpened(goal="benchmark run", target="file:out/result.json", owner=OWNER.name)],
        actor=OWNER,
        expected_seq=0,
    )
    if lease is not None:
        store.append(run_id, [ev.LeaseGranted(worker=WORKER.name, lease=lease)], actor=OWNER)


def path_in(d: Path, name: str) -> str:
    return os.fspath(d / name)
