"""LedgerSaver with real graphs, real processes and real ledgers (SQLite files, PostgreSQL).

- a StateGraph killed mid-tool (SIGKILL) resumes in a new process from the ledger, and its
  side effect, recorded before it ran and reconciled after the kill, is not doubled;
- two processes on one thread: the revoked one's writes are refused and never reach the
  log or ``list()``, and ``verify`` is clean;
- deleting a thread is recorded, and ``verify`` reports the values as erased (exit 0)
  naming that event; a value deleted behind the ledger's back is damage (exit 4);
- every refusal is typed and writes nothing (no event, no value);
- an ``interrupt()`` raises a blocker whose next action is resuming; resuming clears it.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph.graph")

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations.langgraph import INTERRUPT_BLOCKER, LedgerSaver  # noqa: E402
from handoff.ledger.errors import LeaseHeld, LeaseLost, StaleLease  # noqa: E402
from handoff.watchdog import watch_once  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
TIMEOUT_S = 20.0


def _agent(db: str, run: str, worker: str, where: Path, mode: str) -> list[str]:
    return [sys.executable, "-m", "tests.integrations.lg_agent", db, run, worker, str(where), mode]


def _open(lg: Ledger, run: str) -> str:
    return lg.open(goal="Write the report", target="chat:#ops", owner="alice", run_id=run,
                   heartbeat_timeout_s=TIMEOUT_S, progress_kinds={"executing": ["graph_step"]})


def _snapshot(lg: Ledger, run: str) -> tuple[list, dict]:
    return [(r.seq, r.type, r.payload) for r in lg.log(run)], lg.store.value_digests(run)


def _cli(db: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, *args], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=120)


def test_a_graph_killed_mid_tool_resumes_from_the_ledger_without_doubling_its_side_effect(shared_backend, tmp_path):
    db = shared_backend.address()
    with Ledger(db) as lg:
        run = _open(lg, "report-1")
    first = subprocess.Popen(_agent(db, run, "agent-1", tmp_path, "crash"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert first.stdout.readline().strip() == "WROTE", first.stderr.read()
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    with Ledger(db) as lg:
        before = lg.status(run)
        assert [e["key"] for e in before["pending_effects"]] == ["tool:write_report"]
        saved = [r for r in lg.log(run) if r.type == "graph_checkpoint_saved"]
        assert saved and all(r.actor == "worker:agent-1" for r in saved)
        # the watchdog revokes the silent lease once its heartbeat timeout has passed
        watch_once(lg, name="wd", now_us=lg.clock() + int(TIMEOUT_S * 2 * 1_000_000))
        assert lg.status(run)["state"] == "unknown"
    second = subprocess.run(_agent(db, run, "agent-2", tmp_path, "resume"), capture_output=True, text=True,
                            env=ENV, cwd=ROOT, timeout=120)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout.split("RESULT", 1)[1])
    assert result == ["user: write the report", "model: call write_report", "tool: already written",
                      "model: the report is written"]
    assert (tmp_path / "report.txt").read_text() == "the report\n"  # once
    with Ledger(db) as lg:
        recs = list(lg.log(run))
        settled = [r for r in recs if r.type == "reconciliation_recorded"]
        assert [(r.actor, r.event.outcome) for r in settled] == [("worker:agent-2", "done")]
        # the resumed graph continued from agent-1's last checkpoint, not from the start
        first_cp = [r for r in recs if r.type == "graph_checkpoint_saved" and r.actor == "worker:agent-2"][0]
        assert first_cp.event.parent_id == saved[-1].event.checkpoint_id
        steps = [r for r in recs if r.type == "progress_recorded" and r.event.kind == "graph_step"]
        assert steps and lg.status(run)["pending_effects"] == []
        assert lg.verify() == []


def test_two_processes_on_one_thread_the_revoked_ones_writes_are_refused(shared_backend, tmp_path):
    db = shared_backend.address()
    with Ledger(db) as lg:
        run = _open(lg, "report-2")
    slow = subprocess.Popen(_agent(db, run, "agent-a", tmp_path, "slow"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert slow.stdout.readline().strip() == "WAITING", slow.stderr.read()
        with Ledger(db) as lg:
            revoked = lg.revoke(run, "agent-a stopped answering", by="alice").result.last_seq
        other = subprocess.run(_agent(db, run, "agent-b", tmp_path, "resume"), capture_output=True, text=True,
                               env=ENV, cwd=ROOT, timeout=120)
        assert other.returncode == 0 and "RESULT" in other.stdout, other.stderr
        (tmp_path / "go").write_text("")
        out, err = slow.communicate(timeout=120)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert "REFUSED StaleLease" in out, (out, err)
    with Ledger(db) as lg:
        recs = list(lg.log(run))
        after = [r for r in recs if r.seq > revoked and r.actor == "worker:agent-a"]
        assert after == []  # nothing of agent-a's after the revoke
        graph_a = {r.event.checkpoint_id for r in recs if r.type == "graph_checkpoint_saved" and r.actor == "worker:agent-a"}
        saver = LedgerSaver(lg)
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list({"configurable": {"thread_id": run}})]
        latest = saver.get_tuple({"configurable": {"thread_id": run}})
        assert latest.checkpoint["channel_values"]["messages"][-1] == "model: the report is written"
        assert latest.metadata["source"] == "loop" and listed[0] == latest.config["configurable"]["checkpoint_id"]
        assert set(listed) - graph_a  # agent-b's checkpoints follow agent-a's last good one
        assert lg.verify() == []
    assert (tmp_path / "report.txt").read_text() == "the report\n"


def _put(saver: LedgerSaver, thread: str, parent: dict | None = None, value: str = "v") -> dict:
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent is not None:
        cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    cp = generate_checkpoint(channel_values={"messages": [value]}, channel_versions={"messages": 1})
    return saver.put(cfg, cp, generate_metadata(), {"messages": 1})


def test_a_deleted_thread_verifies_as_erased_and_a_value_deleted_behind_the_ledger_is_damage(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        saver = LedgerSaver(lg)
        first = _put(saver, "t-del")
        saver.put_writes(first, [("messages", "w")], "task-1")
        _put(saver, "t-del", first, "v2")
        kept = _put(LedgerSaver(lg), "t-keep", value="kept")
        saver.delete_thread("t-del")
        assert saver.get_tuple({"configurable": {"thread_id": "t-del"}}) is None
        erasure = [r for r in lg.log("t-del") if r.type == "values_erased"]
        assert len(erasure) == 1 and erasure[0].event.everything and len(erasure[0].event.values) == 3
        assert lg.store.value_digests("t-del") == {}
        report = lg.verify_report()
        assert report["ok"] and report["erased"] == [{"run_id": "t-del", "seq": erasure[0].seq,
                                                      "position": erasure[0].position, "reason": "delete_thread",
                                                      "erased": 3, "listed": 3}]
    done = _cli(db, "verify")
    assert done.returncode == 0, done.stderr
    assert f"values_erased at seq {erasure[0].seq} (delete_thread)" in done.stdout
    with Ledger(db) as lg:
        digest = next(iter(lg.store.value_digests("t-keep")))
        if db.startswith("postgresql"):  # the store deletes only what a recorded erasure names
            assert lg.store.delete_values("t-keep", [digest]) == 0
    _delete_behind_the_ledger(db, "t-keep", digest)
    done = _cli(db, "verify")
    assert done.returncode == 4
    assert "value_missing" in done.stdout and "t-keep" in done.stdout
    assert kept["configurable"]["thread_id"] == "t-keep"


def _delete_behind_the_ledger(db: str, run: str, digest: str) -> None:
    """Delete a value with the database's own client, as damage or an intruder would."""
    if db.startswith("postgresql"):
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            assert conn.execute("DELETE FROM run_values WHERE run_id = %s AND sha256 = %s", (run, digest)).rowcount == 1
        return
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(db.removeprefix("sqlite://"))) as conn, conn:
        assert conn.execute("DELETE FROM run_values WHERE run_id = ? AND sha256 = ?", (run, digest)).rowcount == 1


def _unchanged(lg: Ledger, run: str, before: tuple[list, dict]) -> None:
    """The log is as it was, and the values too: a put's values are written in its event's
    own transaction, on both backends."""
    assert lg.store.values_join_writes
    assert _snapshot(lg, run) == before


def test_a_stale_or_absent_lease_is_refused_and_writes_nothing(shared_backend):
    db = shared_backend.address()
    with Ledger(db) as lg:
        run = _open(lg, "t-fence")
        with pytest.raises(LeaseLost):  # the block ends knowing its lease was taken
            with lg.lease(run, worker="agent-a") as lease:
                saver = LedgerSaver(lg, lease=lease)
                first = _put(saver, run)
                before = _snapshot(lg, run)
                with pytest.raises(LeaseHeld, match="held by agent-a"):  # a saver without the lease
                    _put(LedgerSaver(lg), run, first, "intruder")
                _unchanged(lg, run, before)
                lg.revoke(run, "replaced", by="alice")
                before = _snapshot(lg, run)
                with pytest.raises(StaleLease, match="has ended"):
                    _put(saver, run, first, "late")
                with pytest.raises(StaleLease, match="is lost"):  # the block knows by now
                    saver.put_writes(first, [("messages", "late write")], "task-late")
                _unchanged(lg, run, before)
        assert lg.verify() == []


class _Asked(TypedDict):
    answer: str


def test_an_interrupt_is_a_blocker_and_resuming_clears_it(shared_backend):
    db = shared_backend.address()

    def ask(state: _Asked) -> dict:
        return {"answer": interrupt("which format?")}

    g = StateGraph(_Asked)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    with Ledger(db) as lg:
        run = _open(lg, "t-ask")
        with lg.lease(run, worker="agent-a") as lease:
            graph = g.compile(checkpointer=LedgerSaver(lg, lease=lease))
            config = {"configurable": {"thread_id": run}}
            graph.invoke({"answer": ""}, config)
            p = lg.status(run)
            assert p["state"] == "blocked"
            (b,) = p["blockers"]
            assert b["reason"].startswith(INTERRUPT_BLOCKER) and "which format?" in b["reason"]
            assert "Command(resume=...)" in b["next_action"]
            out = graph.invoke(Command(resume="markdown"), config)
            assert out == {"answer": "markdown"}
            p = lg.status(run)
            assert p["state"] == "executing" and p["blockers"] == []
        assert lg.verify() == []
