"""The processes of the PostgreSQL fault tests (``python -m tests.faults.pg.agents ROLE ...``).

    writer URL HISTORY NAME RUNS N [RETRIES [STOP]]
        N keyed evidence records spread over RUNS (comma-separated), every attempt recorded
        (tests/faults/pg/history.py); a failed or unknown attempt is retried with the same
        key up to RETRIES times, 0.2 s apart. With STOP, it goes on past N until the file
        STOP exists: a client still at work whenever the test injects a fault
    one URL HISTORY RUN KEY [REPLY_TIMEOUT]
        one keyed evidence record, recorded (the blackhole-during-COMMIT row)
    actor FILE [SECONDS]
        the child under ``handoff run``: appends "<time.time()> <n>" to FILE every 20 ms
        (each line is one action on the world) until stopped
    watch URL NAME OUT [GO]
        one watchdog pass as watcher NAME (after the file GO exists); its actions in OUT
    watchloop URL NAME OUT SECONDS INTERVAL
        a watchdog pass every INTERVAL for SECONDS, or until the file OUT.stop exists
    skewed SECONDS ROLE ARGS...
        ROLE with this process's wall clock SECONDS off (time.time and time.time_ns
        moved; the monotonic clock untouched): a host whose clock is wrong
    beat URL RUN TOKEN SECONDS INTERVAL OUT [store|host]
        a worker that heartbeats RUN under TOKEN (``claim:NAME``: claims it first) for
        SECONDS; one line per beat in OUT;
        ``host`` stamps them with this host's clock instead of the store's
"""

from __future__ import annotations

import json
import os
import sys
import time

from handoff.ledger.store import Actor

OWNER = Actor("owner", "alice")


def _ledger(url: str, reply_timeout: float | None = None, busy: float = 5.0):
    from handoff import Ledger
    from handoff.ledger.postgres import PostgresStore

    if reply_timeout is None:
        return Ledger(url, busy_timeout_s=busy)
    return Ledger(store=PostgresStore(url, busy_timeout_s=busy, reply_timeout_s=reply_timeout))


def writer(url: str, history: str, name: str, runs: str, n: str, retries: str = "40", stop: str = "") -> None:
    from handoff.ledger.errors import LedgerError

    from .history import Recorder

    rec = Recorder(history, name)
    names = runs.split(",")
    lg = None
    i = -1
    while (i := i + 1) < int(n) or (stop and not os.path.exists(stop)):
        run, key = names[i % len(names)], f"{name}-{i}"
        for _ in range(int(retries) + 1):
            if lg is None:
                try:
                    lg = _ledger(url, reply_timeout=3.0, busy=2.0)
                except LedgerError:
                    time.sleep(0.2)
                    continue
            status = rec.call(run, key, lambda: lg.evidence(run, "check", "pass", f"{name} {i}", actor=OWNER, key=key))
            if status == "ok":
                break
            time.sleep(0.2)
    rec.close()


def one(url: str, history: str, run: str, key: str, reply_timeout: str = "2") -> None:
    from .history import Recorder

    rec = Recorder(history, "one")
    lg = _ledger(url, reply_timeout=float(reply_timeout), busy=1.0)
    status = rec.call(run, key, lambda: lg.evidence(run, "check", "pass", "once", actor=OWNER, key=key))
    print(status, flush=True)


def actor(path: str, seconds: str = "60") -> None:
    end = time.monotonic() + float(seconds)
    n = 0
    if os.environ.get("HANDOFF_LEASE"):  # what a cut-off worker would go on writing with
        with open(path + ".token", "w", encoding="utf-8") as f:
            f.write(os.environ["HANDOFF_LEASE"])
    with open(path, "a", encoding="utf-8") as f:
        while time.monotonic() < end:
            f.write(f"{time.time():.6f} {n}\n")
            f.flush()
            n += 1
            time.sleep(0.02)


def watch(url: str, name: str, out: str, go: str = "") -> None:
    from handoff.watchdog import watch_once

    with _ledger(url) as lg:
        while go and not os.path.exists(go):
            time.sleep(0.001)
        acts = watch_once(lg, name=name)
    with open(out, "a", encoding="utf-8") as f:
        for a in acts:
            f.write(json.dumps({"run": a.run_id, "action": a.action, "outcome": a.outcome, "key": a.key}) + "\n")


def watchloop(url: str, name: str, out: str, seconds: str, interval: str) -> None:
    """watch_once every INTERVAL for SECONDS (a watchdog on its own host)."""
    from handoff.watchdog import watch_once

    end = time.monotonic() + float(seconds)
    with _ledger(url) as lg, open(out, "a", encoding="utf-8") as f:
        while time.monotonic() < end and not os.path.exists(out + ".stop"):
            for a in watch_once(lg, name=name):
                f.write(json.dumps({"run": a.run_id, "action": a.action, "outcome": a.outcome}) + "\n")
                f.flush()
            time.sleep(float(interval))


def beat(url: str, run: str, token: str, seconds: str, interval: str, out: str, clock: str = "store") -> None:
    """Heartbeats; ``clock=host`` stamps them with this host's wall clock (the old way)."""
    from handoff import Ledger
    from handoff.ledger.store import now_us
    from handoff.ledger.errors import LedgerError

    lg = Ledger(url, clock=now_us) if clock == "host" else _ledger(url)
    if token.startswith("claim:"):  # claim here, so the first beat follows the claim at once
        token = str(lg.claim(run, token[len("claim:"):]))
    end = time.monotonic() + float(seconds)
    with lg, open(out, "a", encoding="utf-8") as f:
        while time.monotonic() < end:
            try:
                r = lg.heartbeat(run, token).result
                f.write(json.dumps({"status": "ok", "seq": r.first_seq, "wall": time.time()}) + "\n")
            except LedgerError as exc:
                f.write(json.dumps({"status": "failed", "error": exc.type}) + "\n")
                f.flush()
                return
            f.flush()
            time.sleep(float(interval))


def skewed(seconds: str, role: str, *args: str) -> None:
    shift = float(seconds)
    real_time, real_ns = time.time, time.time_ns
    time.time = lambda: real_time() + shift  # type: ignore[assignment]
    time.time_ns = lambda: real_ns() + int(shift * 1e9)  # type: ignore[assignment]
    ROLES[role](*args)


ROLES = {"writer": writer, "one": one, "actor": actor, "watch": watch, "watchloop": watchloop, "beat": beat,
         "skewed": skewed}

if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    ROLES[sys.argv[1]](*sys.argv[2:])
