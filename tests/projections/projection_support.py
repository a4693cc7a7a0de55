"""Shared helpers for the projection tests: table dumps, bulk histories.
(A clock and subprocesses: tests/support.py.)

Named ``projection_support`` (not ``helpers``) because these test directories have no
``__init__.py``: pytest imports each file by its basename, and a package here named
``projections`` would shadow the real one.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from handoff import Actor, Ledger
from handoff.ledger import events as ev
from handoff.ledger.store import lease_digest
from handoff.projections import engine
from tests.support import Clock

FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"
BUILDER = Actor("operator", "builder")


def table_names() -> list[str]:
    return [p.table for p in engine.PROJECTIONS]


def effective_positions(path: str) -> list[tuple[str, int]]:
    """Each projection's position as the store reads it (name order): how far it is current.
    Since file schema 2 inline writes move no tracking row, so the rows themselves say only
    where the last catch-up or rebuild left each view (ledger/sqlite/sqlite_view_store.py, _effective)."""
    from handoff.ledger.sqlite import SqliteStore

    store = SqliteStore(path, readonly=True)
    try:
        return sorted(store.views.positions().items())
    finally:
        store.close()


def dump(path: str, tables: list[str] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection table's rows ORDER BY its primary key, read over a fresh connection.

    Also the projections' effective positions, and the rowids of the one-row-per-run tables (``runs`` lists
    oldest first by rowid), so an order that differs between inline and rebuilt shows too.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        for p in engine.PROJECTIONS:
            if tables is not None and p.table not in tables:
                continue
            cols = ", ".join(p.columns)
            out[p.table] = conn.execute(
                f"SELECT {cols} FROM {p.table} ORDER BY {', '.join(p.pk)}"
            ).fetchall()
        for t in ("checkpoints", "stall_watch"):  # one row per run, never deleted
            if tables is None or t in tables:
                out[f"{t}:rowids"] = conn.execute(f"SELECT rowid, run_id FROM {t} ORDER BY rowid").fetchall()
        out[engine.TRACKING] = effective_positions(path)
        return out
    finally:
        conn.close()


def schema_objects(path: str) -> dict[str, set[str]]:
    """The index names on each projection table (rebuild must recreate every one)."""
    conn = sqlite3.connect(path)
    try:
        out: dict[str, set[str]] = {}
        for t in table_names():
            out[t] = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name=? "
                "AND name NOT LIKE 'sqlite_autoindex%'", (t,))}
        return out
    finally:
        conn.close()


def leftover_tables(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE '%\\_\\_new' ESCAPE '\\'")]
    finally:
        conn.close()


def integrity(path: str) -> str:
    conn = sqlite3.connect(path)
    try:
        return "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


#: The token of lease 1 in every run ``build_log`` writes (one secret for all: these are fixtures).
BULK_SECRET = "bulk-lease-secret-for-projection-tests"
BULK_TOKEN = f"1.{BULK_SECRET}"


def run_events(i: int, n: int) -> list[ev.Event]:
    """A plausible history of ``n`` (>= 8) events for run number ``i``, ending four ways."""
    policy = ev.Policy(heartbeat_timeout_s=60.0 + i % 7, progress_timeout_s=300.0, owner_cap=100_000)
    out: list[ev.Event] = [
        ev.HandoffOpened(goal=f"goal {i}", target=f"chat:#t{i % 3}", owner=f"owner{i % 5}", policy=policy),
        ev.LeaseGranted(worker=f"w{i % 4}", lease=1, token_digest=lease_digest(BULK_SECRET)),
        ev.StateChanged(from_state="queued", to_state="planning"),
        ev.ProgressRecorded(kind="plan_committed"),
        ev.StateChanged(from_state="planning", to_state="executing"),
    ]
    ending: list[ev.Event]
    kind = i % 4
    if kind == 0:
        ending = []
    elif kind == 1:
        ending = [ev.LeaseReleased(lease=1, reason="done for now")]
    elif kind == 2:
        ending = [ev.RunClosed(disposition="cancelled", by="owner"),
                  ev.StateChanged(from_state="executing", to_state="cancelled"),
                  ev.LeaseReleased(lease=1, reason="closed")]
    else:
        ending = [ev.BlockerRaised(blocker_id=1, reason="needs a key", next_action="ask ops"),
                  ev.StateChanged(from_state="executing", to_state="blocked")]
    k = 0
    while len(out) + len(ending) < n:
        out.append(ev.HeartbeatRecorded() if k % 3 else ev.ProgressRecorded(kind="tool_outcome", detail=str(k)))
        k += 1
    return out + ending


def build_log(lg: Ledger, runs: int, per_run: int, *, prefix: str = "bulk", clock: Clock | None = None) -> int:
    """Append ``runs`` runs of ``per_run`` events each through the ledger's store (inline
    projections included), one append per run. Returns the last position."""
    for i in range(runs):
        if clock is not None:
            clock.advance(us=1_000)
        lg.store.append(f"{prefix}-{i:05d}", run_events(i, per_run), actor=BUILDER)
    return lg.store.last_position()

