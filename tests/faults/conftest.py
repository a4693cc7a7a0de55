"""Shared pieces of the fault-injection tests: real processes, real files, real signals.

Every test that injects a fault records its evidence with ``evidence.add(...)``: the
record is printed (``pytest -s`` shows it) and collected into one JSON file written at
the end of the session, ``$HANDOFF_FAULTS_REPORT`` or ``<pytest basetemp>/faults-evidence.json``.
docs/reliability.md quotes its figures from that file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import executable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def scale(bounded: int, full: int) -> int:
    """The size of a fault run: bounded by default (what CI runs), full with --slow."""
    return full if os.environ.get("HANDOFF_TEST_SCALE") == "full" else bounded


class Evidence:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def add(self, test: str, **fields: Any) -> dict[str, Any]:
        rec = {"test": test, "scale": os.environ.get("HANDOFF_TEST_SCALE", "bounded"), **fields}
        self.records.append(rec)
        print(f"\nEVIDENCE {test}: " + json.dumps(fields, indent=1, default=str, sort_keys=True))
        return rec


_EVIDENCE = Evidence()


@pytest.fixture
def evidence() -> Evidence:
    return _EVIDENCE


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _EVIDENCE.records:
        return
    path = os.environ.get("HANDOFF_FAULTS_REPORT")
    if not path:
        try:
            base = session.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        except Exception:
            return
        path = os.path.join(str(base), "faults-evidence.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_EVIDENCE.records, f, indent=1, default=str)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"fault evidence: {len(_EVIDENCE.records)} records in {path}")


# --- processes ---------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["HANDOFF_TEST_SCALE"] = os.environ.get("HANDOFF_TEST_SCALE", "bounded")
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra)
    return env


def agent(role: str, *args: object, stdout: Any = subprocess.PIPE, **popen: Any) -> subprocess.Popen[str]:
    """Start ``python -m tests.faults.agents ROLE ARGS...`` as a real process."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.agents", role, *map(str, args)],
        cwd=ROOT, env=child_env(), stdout=stdout, stderr=subprocess.PIPE, text=True, **popen,
    )


def handoff(*args: str | bytes, db: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """The real ``handoff`` executable as a subprocess (bytes arguments pass as raw bytes)."""
    env = child_env(HANDOFF_DB=db)
    return subprocess.run([*executable(), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          errors="replace", timeout=timeout, **kw)


def wait_until(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """JSON lines; a torn last line (the writer was killed mid-write) is not a record."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            out.append(json.loads(line))
    return out


def kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.communicate(timeout=30)
    except Exception:
        pass


@pytest.fixture
def procs():
    """Processes a test started; whatever is still alive at the end is killed (by pid)."""
    started: list[subprocess.Popen[Any]] = []
    yield started
    for p in started:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)  # a stopped process cannot exit until continued
            except ProcessLookupError:
                pass
            kill(p)


# --- the ledger as data --------------------------------------------------------------


def log_digest(db: str) -> list[tuple[Any, ...]]:
    """Every stored event's envelope and hash, read with a plain sqlite3 connection."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT position, run_id, seq, type, actor, lease, idem_key, hash FROM events ORDER BY position"
        ).fetchall()
    finally:
        conn.close()


def run_evidence(lg: Any, run_id: str, *, old_lease: Any = None) -> dict[str, Any]:
    """The seed's evidence for one run: last heartbeat, last progress seq, lease, state
    transitions, recovery decisions and final disposition, read back from the log."""
    from handoff.ledger import events as ev
    from handoff.reducers.checkpoint import iso

    cp = lg.checkpoint(run_id)
    transitions, decisions, leases = [], [], []
    for rec in lg.log(run_id):
        e = rec.event
        if isinstance(e, ev.StateChanged):
            transitions.append(f"{e.from_state}->{e.to_state}@{rec.seq}")
        elif isinstance(e, ev.RecoveryDecided):
            decisions.append(f"{e.action}({e.classification}, progress_seq {e.progress_seq})@{rec.seq}")
        elif isinstance(e, ev.LeaseGranted):
            leases.append(f"granted {e.lease} to {e.worker}@{rec.seq}")
        elif isinstance(e, (ev.LeaseRevoked, ev.LeaseReleased)):
            leases.append(f"{rec.type.split('_')[1]} {e.lease}@{rec.seq}")
        elif isinstance(e, ev.ReconciliationRecorded):
            decisions.append(f"reconciliation {e.key}={e.outcome}@{rec.seq}")
    w = cp.watch
    return {
        "run_id": run_id,
        "last_heartbeat": iso(w.last_heartbeat_us) if w.last_heartbeat_us else None,
        "last_progress_seq": cp.progress_seq,
        "last_progress_kind": w.last_progress.kind if w.last_progress else None,
        "lease_token": cp.lease,
        "old_lease": None if old_lease is None else int(str(old_lease).partition(".")[0]),  # never the token
        "lease_history": leases,
        "state_transitions": transitions,
        "recovery_decisions": decisions,
        "final_state": cp.state,
        "final_disposition": cp.state + (f" (blocked: {cp.blockers[-1].reason})" if cp.blockers else ""),
        "last_seq": cp.last_seq,
    }
