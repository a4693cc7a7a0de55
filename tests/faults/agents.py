"""The processes the fault tests start: ``python -m tests.faults.agents ROLE ARGS...``.

Each role is a small, real client of the ledger (the Python API, the CLI, or plain
sqlite3 for the hostile ones). A role writes what it did as JSON lines to a file the
test names, and records an acknowledgement only after the ledger call has returned,
so "every acknowledged write is stored" is a claim about real acks.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from handoff.facade import Ledger  # noqa: E402
from handoff.ledger.errors import LedgerError, StaleLease, TerminalRun  # noqa: E402
from handoff.ledger.store import Actor  # noqa: E402


def _append(path: str, doc: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc) + "\n")
        f.flush()


def _touch(path: str, text: str = "") -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _err(exc: LedgerError) -> dict[str, Any]:
    return {"type": exc.type, "exit_code": exc.exit_code, "message": exc.message,
            "field": getattr(exc, "field", None)}


# --- matrix row 1: heartbeats continue, progress does not ------------------------------


def looper(db: str, run: str, lease: str, worker: str, stopfile: str, out: str) -> int:
    """Heartbeat and log a non-advancing 'tool_retry' every few ms until told to stop.

    This is the busy-but-stuck agent: alive to every health check, never progressing.
    """
    lease_i = lease
    beats = retries = 0
    stopped_by = "stopfile"
    with Ledger(db, busy_timeout_s=10) as lg:
        while not os.path.exists(stopfile):
            try:
                lg.heartbeat(run, lease_i, worker=worker)
                beats += 1
                lg.progress(run, lease_i, "tool_retry", f"retry {retries}", worker=worker)
                retries += 1
            except (StaleLease, TerminalRun) as exc:
                stopped_by = exc.type
                break
            time.sleep(0.02)
    _touch(out, json.dumps({"beats": beats, "retries": retries, "stopped_by": stopped_by}))
    return 0


# --- matrix rows 2 and 3: paused after starting a side effect, resumed after replacement


LATE_KINDS = ("heartbeat", "progress", "note", "transition", "artifact", "evidence", "block",
              "effect_confirm", "effect_start", "submit", "release", "claim")


def effect_worker(db: str, run: str, lease: str, worker: str, marker: str, gofile: str, out: str,
                  late: str, artifact_path: str) -> int:
    """Start a side effect, then hang 'performing' it until ``gofile`` appears.

    A heartbeat thread beats every 20 ms meanwhile, so only a SIGSTOP silences it. Once
    resumed (the test creates ``gofile`` and sends SIGCONT), it behaves like a worker
    that never learnt it was replaced: confirms the effect and makes ``late`` more
    writes of every kind under its old lease, counting what the ledger accepted.
    """
    lease_i, n_late = lease, int(late)
    lg = Ledger(db, busy_timeout_s=10)
    resumed = threading.Event()
    tally: dict[str, Any] = {"accepted": 0, "refused": {}, "accepted_what": [], "beats_before": 0,
                             "late_beats_refused": 0, "late_beats_accepted": 0}
    lock = threading.Lock()

    def note(kind: str, exc: LedgerError | None) -> None:
        with lock:
            if exc is None:
                tally["accepted"] += 1
                tally["accepted_what"].append(kind)
            else:
                tally["refused"][exc.type] = tally["refused"].get(exc.type, 0) + 1

    stop_beats = threading.Event()

    def beat() -> None:
        while not stop_beats.is_set():
            late_beat = os.path.exists(gofile)
            try:
                lg.heartbeat(run, lease_i, worker=worker)
                if late_beat:
                    tally["late_beats_accepted"] += 1
                    note("heartbeat(thread)", None)
                else:
                    tally["beats_before"] += 1
            except LedgerError as exc:
                if late_beat:
                    tally["late_beats_refused"] += 1
                    note("heartbeat(thread)", exc)
                if isinstance(exc, (StaleLease, TerminalRun)):
                    return
            time.sleep(0.02)

    lg.effect_start(run, lease_i, "deploy-42", "POST /deploy v42", worker=worker)
    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    _touch(marker, "effect started")
    while not os.path.exists(gofile):  # "performing the side effect"
        time.sleep(0.005)
    resumed.set()
    # The effect returned: the worker goes on as if nothing happened.
    for i in range(n_late):
        kind = LATE_KINDS[i % len(LATE_KINDS)]
        try:
            if kind == "heartbeat":
                lg.heartbeat(run, lease_i, worker=worker)
            elif kind == "progress":
                lg.progress(run, lease_i, "tool_outcome", f"late {i}", key=f"late-{i}", worker=worker)
            elif kind == "note":
                lg.progress(run, lease_i, "note", f"late note {i}", worker=worker)
            elif kind == "transition":
                lg.transition(run, lease_i, "verifying", reason=f"late {i}", worker=worker)
            elif kind == "artifact":
                lg.artifact(run, lease_i, artifact_path, worker=worker)
            elif kind == "evidence":
                lg.evidence(run, "tests", "pass", f"late {i}", lease=lease_i, actor=Actor("worker", worker))
            elif kind == "block":
                lg.block(run, "late blocker", "none", lease=lease_i, actor=Actor("worker", worker))
            elif kind == "effect_confirm":
                lg.effect_confirm(run, "deploy-42", "done", lease=lease_i, actor=Actor("worker", worker))
            elif kind == "effect_start":
                lg.effect_start(run, lease_i, "deploy-42", "POST /deploy v42", worker=worker)
            elif kind == "submit":
                lg.submit(run, lease_i, "late result", worker=worker)
            elif kind == "release":
                lg.release(run, lease_i, "late release", worker=worker)
            elif kind == "claim":
                lg.claim(run, worker)
            note(kind, None)
        except LedgerError as exc:
            note(kind, exc)
    time.sleep(0.1)  # let the heartbeat thread make its late attempt too
    stop_beats.set()
    beater.join(timeout=5)
    lg.close()
    _touch(out, json.dumps(tally))
    return 0


# --- matrix row 4: the same progress delivered by racing processes --------------------


def duplicator(db: str, run: str, lease: str, worker: str, gofile: str, out: str, times: str) -> int:
    """Deliver the same keyed progress report ``times`` times, as fast as possible."""
    outcomes: dict[str, int] = {}
    with Ledger(db, busy_timeout_s=30) as lg:
        while not os.path.exists(gofile):
            time.sleep(0.001)
        for _ in range(int(times)):
            o = lg.progress(run, lease, "tool_outcome", "uploaded report.pdf", key="upload-report",
                            worker=worker)
            outcomes[o.result.outcome] = outcomes.get(o.result.outcome, 0) + 1
    _touch(out, json.dumps(outcomes))
    return 0


# --- matrix row 5: the store becomes unavailable ------------------------------------------


def progress_until_error(db: str, run: str, lease: str, worker: str, ack: str, out: str,
                         mode: str = "plain", pad: str = "0", limit: str = "100000",
                         busy: str = "5") -> int:
    """Report progress steps (keyed p<k>, acked after return) until the ledger refuses.

    ``mode``: ``readonly`` opens the ledger read-only; ``pages:N`` caps the file at the
    current size plus N pages (PRAGMA max_page_count, a quota); ``gate:FILE`` waits for
    FILE before each step (so the test can change the world between steps).
    Stops at the first LedgerError, records it, and exits with its exit code.
    """
    lease_i, pad_n = lease, int(pad)
    try:
        lg = Ledger(db, busy_timeout_s=float(busy), readonly=(mode == "readonly"), create=False)
    except LedgerError as exc:
        _touch(out, json.dumps({"error": _err(exc), "acked": 0, "stage": "open"}))
        return exc.exit_code
    if mode.startswith("pages:"):
        conn = lg.store.conn
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={count + int(mode.split(':', 1)[1])}")
    k = 0
    try:
        while k < int(limit):
            if mode.startswith("gate:"):
                gate = mode.split(":", 1)[1] + f".{k}"
                while not os.path.exists(gate):
                    time.sleep(0.005)
            lg.progress(run, lease_i, "tool_outcome", f"step {k} " + "x" * pad_n, key=f"p{k}", worker=worker)
            _append(ack, {"k": k})
            k += 1
    except LedgerError as exc:
        _touch(out, json.dumps({"error": _err(exc), "acked": k, "stage": "write", "failed_key": f"p{k}"}))
        lg.close()
        return exc.exit_code
    lg.close()
    _touch(out, json.dumps({"error": None, "acked": k}))
    return 0


def locker(db: str, marker: str, mode: str = "EXCLUSIVE") -> int:
    """Hold the database's write lock (a long transaction in another program) until killed."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"BEGIN {mode}")
    # A half-done write the holder never commits: it must never show up.
    conn.execute("INSERT INTO handoff_meta(key, value) VALUES ('locker', 'uncommitted')")
    _touch(marker, str(os.getpid()))
    while True:
        time.sleep(1)


# --- matrix row 6: the watchdog, killed and restarted ------------------------------------


def watchdog(db: str, name: str, schedule: str, out: str, pause: str = "0") -> int:
    """One watch_once pass per instant in ``schedule`` (comma-separated µs), in order.

    Every action is appended to ``out`` as it is decided; a killed watchdog simply
    starts over from the first instant, as a restarted daemon would re-derive its work.
    """
    from handoff.watchdog import watch_once

    with Ledger(db, busy_timeout_s=30) as lg:
        _append(out, {"started": True, "pid": os.getpid()})  # up and about to pass: time its kill from here
        for now in (int(x) for x in schedule.split(",")):
            acts = watch_once(lg, name=name, now_us=now, interval_s=1.0)
            for a in acts:
                _append(out, {"now": now, "run": a.run_id, "action": a.action, "outcome": a.outcome,
                              "key": a.key, "pid": os.getpid()})
            time.sleep(float(pause))
    _append(out, {"done": True, "pid": os.getpid()})
    return 0


# --- crash consistency: writers killed at random and restarted -------------------------


def crash_writer(db: str, wid: str, run: str, lease: str, shared: str, n: str, ack: str,
                 gate: str = "", replay: str = "2", stop: str = "") -> int:
    """Append steps k = start..n-1 (n = -1: until the file ``stop`` appears) and ack each
    after the call returns.

    Even k: progress on the writer's own run (its lease, key w<wid>-k<k>); odd k:
    evidence on a run shared by all writers (operator, key w<wid>-k<k>). A restarted
    incarnation starts ``replay`` steps before its last ack, so it re-sends acknowledged
    keys (they must come back as duplicates) and the one that was in flight. With
    ``gate`` (a file), a StoreUnavailable makes it wait for the gate and retry the same
    key instead of dying (disk full until space returns).
    """
    wid_i, lease_i, n_i = int(wid), lease, int(n)
    acks = []
    if os.path.exists(ack):
        with open(ack, encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):
                    acks.append(json.loads(line)["k"])
    start = max(0, (max(acks) + 1 - int(replay)) if acks else 0)
    errors: dict[str, int] = {}
    with Ledger(db, busy_timeout_s=30) as lg:
        me = Actor("operator", f"op{wid_i}")
        k = start - 1
        while True:
            k += 1
            if (n_i >= 0 and k >= n_i) or (n_i < 0 and stop and os.path.exists(stop)):
                break
            key = f"w{wid_i}-k{k}"
            while True:
                try:
                    if k % 2 == 0:
                        o = lg.progress(run, lease_i, "tool_outcome", f"{wid_i}:{k}", key=key, worker=f"w{wid_i}")
                    else:
                        o = lg.evidence(shared, "check", "pass", f"{wid_i}:{k}", actor=me, key=key)
                    break
                except LedgerError as exc:
                    errors[exc.type] = errors.get(exc.type, 0) + 1
                    if not gate or exc.exit_code != 3:
                        raise
                    _append(ack + ".errors", {"k": k, "error": _err(exc)})
                    while not os.path.exists(gate):
                        time.sleep(0.01)
            _append(ack, {"k": k, "run": o.result.run_id, "outcome": o.result.outcome,
                          "first_seq": o.result.first_seq, "last_seq": o.result.last_seq})
    return 0


def fiu_writer(db: str, run: str, lease: str, n: str, ready: str, go: str, done: str, off: str, out: str) -> int:
    """Append under libfiu (started by ``fiu-run -x``): faults are switched on from outside
    with ``fiu-ctrl`` after start-up, and off again before results are written, so only
    the ledger's own writes and syncs meet them. Acks are kept in memory until then."""
    acked: list[int] = []
    errors: dict[str, int] = {}
    samples: dict[str, str] = {}
    lg = Ledger(db, busy_timeout_s=5)
    os.close(os.open(ready, os.O_CREAT | os.O_WRONLY))
    while not os.path.exists(go):
        time.sleep(0.005)
    for k in range(int(n)):
        try:
            if lg is None:
                lg = Ledger(db, busy_timeout_s=5)
            lg.progress(run, lease, "tool_outcome", f"0:{k}", key=f"w0-k{k}", worker="w0")
            acked.append(k)
        except LedgerError as exc:
            errors[exc.type] = errors.get(exc.type, 0) + 1
            samples.setdefault(exc.type, exc.message)
        except Exception as exc:  # anything untyped is a finding
            name = f"untyped {type(exc).__name__}"
            errors[name] = errors.get(name, 0) + 1
            samples.setdefault(name, str(exc))
            try:
                if lg is not None:
                    lg.close()
            except Exception:
                pass
            lg = None
    os.close(os.open(done, os.O_CREAT | os.O_WRONLY))
    while not os.path.exists(off):
        time.sleep(0.005)
    # Faults are off: the very same connection must work again.
    after = "ok"
    try:
        if lg is None:
            lg = Ledger(db, busy_timeout_s=5)
        lg.progress(run, lease, "tool_outcome", f"0:{n}", key=f"w0-k{n}", worker="w0")
        acked.append(int(n))
    except Exception as exc:
        after = f"{type(exc).__name__}: {exc}"
    _touch(out, json.dumps({"acked": acked, "errors": errors, "samples": samples, "after": after}))
    return 0


ROLES = {
    "looper": looper, "effect_worker": effect_worker, "duplicator": duplicator,
    "progress_until_error": progress_until_error, "locker": locker, "watchdog": watchdog,
    "crash_writer": crash_writer, "fiu_writer": fiu_writer,
}


if __name__ == "__main__":
    role, *argv = sys.argv[1:]
    sys.exit(ROLES[role](*argv))
