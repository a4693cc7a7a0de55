"""The peer libraries, set up as a careful user would, with the harness's durability.

- **eventsourcing** (``pip install eventsourcing``): an ``Application`` with its SQLite
  persistence module on a file. eventsourcing switches the file to WAL itself but does not
  set ``synchronous``; every connection its pool opens here gets ``PRAGMA
  synchronous=FULL`` (by wrapping ``SQLiteConnectionPool._create_connection``), and
  :func:`es_app` checks both settings before any timing. Snapshotting and the aggregate
  cache stay at their defaults (off), so ``repository.get`` replays the stored events.
- **LangGraph** (``pip install langgraph-checkpoint-sqlite``): ``SqliteSaver`` on a
  ``sqlite3`` connection to a file. ``setup()`` switches it to WAL; the connection then
  gets ``PRAGMA synchronous=FULL`` (checked). ``put`` commits once per call.

Both are imported lazily: a scenario lists them in ``Side(requires=...)`` and the report
says "peer not installed" when they are missing.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from .common import SYNCHRONOUS

ES_REQUIRES = ("eventsourcing",)
LG_REQUIRES = ("langgraph.checkpoint.sqlite",)
ES_NOTE = (
    "eventsourcing Application, SQLite persistence on a file, WAL + synchronous=FULL "
    "(set on every pooled connection)"
)
LG_NOTE = "LangGraph SqliteSaver on a file, WAL + synchronous=FULL; one put per event"

_es_patched = False
_es_classes: dict[str, Any] = {}


def _es_patch() -> None:
    """Give every SQLite connection eventsourcing opens the harness's synchronous level."""
    global _es_patched
    if _es_patched:
        return
    from eventsourcing import sqlite as es_sqlite

    original = es_sqlite.SQLiteConnectionPool._create_connection

    def create(self: Any) -> Any:
        conn = original(self)
        conn._sqlite_conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
        return conn

    es_sqlite.SQLiteConnectionPool._create_connection = create  # type: ignore[method-assign]
    _es_patched = True


def es_classes() -> dict[str, Any]:
    """The aggregate a user would write for an agent run: the same facts handoff-ledger's
    checkpoint keeps for these events (progress seq, last progress, heartbeats, evidence,
    artifacts by path)."""
    if _es_classes:
        return _es_classes
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class AgentRun(Aggregate):
        @event("Opened")
        def __init__(self, goal: str, target: str, owner: str) -> None:
            self.goal, self.target, self.owner = goal, target, owner
            self.progress_seq = 0
            self.last_progress: tuple[str, str] | None = None
            self.heartbeats = 0
            self.evidence: list[tuple[str, str, str]] = []
            self.artifacts: dict[str, tuple[str, int, str]] = {}

        @event("Progress")
        def progress(self, kind: str, detail: str) -> None:
            self.progress_seq += 1
            self.last_progress = (kind, detail)

        @event("Heartbeat")
        def heartbeat(self) -> None:
            self.heartbeats += 1

        @event("Evidence")
        def record_evidence(self, kind: str, outcome: str, detail: str) -> None:
            self.evidence.append((kind, outcome, detail))

        @event("Artifact")
        def record_artifact(self, path: str, kind: str, size: int, sha256: str) -> None:
            self.artifacts[path] = (kind, size, sha256)

    class Runs(Application):
        pass

    _es_classes.update(AgentRun=AgentRun, Runs=Runs)
    return _es_classes


def es_app(path: str) -> Any:
    """A file-backed eventsourcing application with WAL + synchronous=FULL, checked."""
    _es_patch()
    app = es_classes()["Runs"](
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": os.fspath(path)}
    )
    pool = app.recorder.datastore.pool
    conn = pool.get_connection(is_writer=False)
    try:
        c = conn._sqlite_conn
        mode = c.execute("PRAGMA journal_mode").fetchone()[0]
        sync = c.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        pool.put_connection(conn)
    if str(mode).lower() != "wal" or sync != 2:
        raise RuntimeError(f"eventsourcing is not on WAL + synchronous=FULL (got {mode}, {sync})")
    return app


def es_apply(agg: Any, event: Any) -> None:
    """Trigger the eventsourcing event that mirrors one handoff-ledger body event."""
    from handoff.ledger import events as ev

    if isinstance(event, ev.ProgressRecorded):
        agg.progress(event.kind, event.detail)
    elif isinstance(event, ev.HeartbeatRecorded):
        agg.heartbeat()
    elif isinstance(event, ev.EvidenceRecorded):
        agg.record_evidence(event.kind, event.outcome, event.detail)
    elif isinstance(event, ev.ArtifactRecorded):
        agg.record_artifact(event.path, event.kind, event.bytes, event.sha256)
    else:  # opening and ending events: count them as progress notes
        agg.progress(type(event).__name__, "")


def es_new_run(app_or_none: Any = None) -> Any:
    return es_classes()["AgentRun"](goal="benchmark run", target="file:out/result.json", owner="alice")


def lg_saver(path: str, *, synchronous: str = SYNCHRONOUS) -> tuple[Any, sqlite3.Connection]:
    """A LangGraph SqliteSaver on a file with WAL and the given synchronous level, checked."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(os.fspath(path), check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # creates the tables and switches to WAL
    conn.execute(f"PRAGMA synchronous={synchronous}")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    want = {"FULL": 2, "NORMAL": 1, "OFF": 0}[synchronous]
    if str(mode).lower() != "wal" or sync != want:
        raise RuntimeError(f"LangGraph's saver is not on WAL + synchronous={synchronous} (got {mode}, {sync})")
    return saver, conn


def lg_config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


class LgState:
    """The state a LangGraph node would keep for an agent run, checkpointed after each
    event: the same facts as the eventsourcing aggregate, as channel values."""

    def __init__(self) -> None:
        self.step = 0
        self.values: dict[str, Any] = {"progress_seq": 0, "last_progress": None, "heartbeats": 0,
                                       "evidence": 0, "artifacts": {}}
        self.versions: dict[str, int] = {}

    def apply(self, event: Any) -> list[str]:
        from handoff.ledger import events as ev

        v = self.values
        if isinstance(event, ev.ProgressRecorded):
            v["progress_seq"] += 1
            v["last_progress"] = {"kind": event.kind, "detail": event.detail}
            changed = ["progress_seq", "last_progress"]
        elif isinstance(event, ev.HeartbeatRecorded):
            v["heartbeats"] += 1
            changed = ["heartbeats"]
        elif isinstance(event, ev.EvidenceRecorded):
            v["evidence"] += 1
            changed = ["evidence"]
        elif isinstance(event, ev.ArtifactRecorded):
            v["artifacts"][event.path] = {"kind": event.kind, "bytes": event.bytes, "sha256": event.sha256}
            changed = ["artifacts"]
        else:
            v["last_progress"] = {"kind": type(event).__name__, "detail": ""}
            changed = ["last_progress"]
        for c in changed:
            self.versions[c] = self.versions.get(c, 0) + 1
        return changed

    def graph_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
        """(graph checkpoint, metadata, new_versions) for SqliteSaver.put."""
        from langgraph.checkpoint.base import LATEST_VERSION
        from langgraph.checkpoint.base.id import uuid6

        self.step += 1
        ck = {
            "v": LATEST_VERSION,
            "id": str(uuid6(clock_seq=self.step)),
            "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": dict(self.values),
            "channel_versions": dict(self.versions),
            "versions_seen": {},
            "pending_sends": [],
            "updated_channels": None,
        }
        return ck, {"source": "loop", "step": self.step}, dict(self.versions)
