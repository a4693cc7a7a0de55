"""Work that a scenario runs in a child process: ``python -m benchmarks.child TASK JSON``.

A child times its own work (so interpreter start-up and imports stay outside the timed
region) and prints one JSON line, with its own peak RSS: ``VmHWM`` from
``/proc/self/status``, the high-water mark of the memory map this program got at exec.
(``ru_maxrss`` from wait4 or ``RUSAGE_CHILDREN`` is not used: on Linux it carries over
the parent's peak across fork/vfork + exec, so a child of a large harness process would
report the harness's size.)

- ``rebuild``: open a Ledger and time ``Ledger.rebuild()`` (every projection).
- ``raw-fold``: time a raw read of a (run_id, seq, payload) table, msgspec decode of every
  payload and a trivial fold (count by event type).
- ``writer``: print ``ready``, wait for a line on stdin, then append progress commands
  (or raw INSERT+COMMITs) and report start and end on the shared monotonic clock and how
  many lock errors reached the caller (each one is retried with the same key).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any


def _rss_mb() -> float:
    """Peak RSS of this program so far, in MB (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rebuild(args: dict[str, Any]) -> dict[str, Any]:
    from handoff.facade import Ledger

    with Ledger(args["db"]) as lg:
        before = _rss_mb()
        t0 = time.perf_counter()
        counts = lg.rebuild()
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "counts": counts, "rss_before_mb": before}


def raw_fold(args: dict[str, Any]) -> dict[str, Any]:
    import sqlite3

    import msgspec

    from handoff.ledger import events as ev

    decode = msgspec.json.Decoder(ev.AnyEvent).decode
    conn = sqlite3.connect(args["db"], isolation_level=None)
    before = _rss_mb()
    t0 = time.perf_counter()
    counts: dict[type, int] = {}
    n = 0
    for (payload,) in conn.execute("SELECT payload FROM events ORDER BY rowid"):
        t = type(decode(payload))
        counts[t] = counts.get(t, 0) + 1
        n += 1
    seconds = time.perf_counter() - t0
    conn.close()
    return {"seconds": seconds, "events": n, "types": len(counts), "rss_before_mb": before}


def writer(args: dict[str, Any]) -> dict[str, Any]:
    runs: list[list[Any]] = args["runs"]  # [[run_id, lease], ...]
    n_each: int = args["n_each"]
    tag: str = args["tag"]
    errors = 0
    if args["kind"] == "handoff":
        from handoff.facade import Ledger
        from handoff.ledger.errors import StoreUnavailable

        lg = Ledger(args["db"], busy_timeout_s=args.get("busy_timeout_s", 5.0))

        def one(run_id: str, lease: str, i: int) -> None:
            lg.progress(run_id, lease, "tool_outcome", f"{tag} step {i}: ran the tool",
                        key=f"{tag}-{run_id}-{i}", worker="w1")

        lock_error: type[BaseException] = StoreUnavailable
        close = lg.close
    else:
        import sqlite3

        import msgspec

        from handoff.ledger import events as ev

        conn = sqlite3.connect(args["db"], isolation_level=None, timeout=args.get("busy_timeout_s", 5.0))
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        encode = msgspec.json.Encoder().encode
        seqs = {r[0]: 0 for r in runs}

        def one(run_id: str, lease: str, i: int) -> None:
            payload = encode(ev.ProgressRecorded(kind="tool_outcome", detail=f"{tag} step {i}: ran the tool"))
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO events (run_id, seq, payload) VALUES (?, ?, ?)",
                             (run_id, seqs[run_id] + 1, payload))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            seqs[run_id] += 1

        lock_error = sqlite3.OperationalError
        close = conn.close

    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    for i in range(n_each):
        for run_id, lease in runs:
            while True:
                try:
                    one(run_id, lease, i)
                    break
                except lock_error as exc:  # type: ignore[misc]
                    if "lock" not in str(exc).lower() and "busy" not in str(exc).lower():
                        raise
                    errors += 1
    end = time.monotonic()
    close()
    return {"start": start, "end": end, "errors": errors, "done": n_each * len(runs)}


TASKS = {"rebuild": rebuild, "raw-fold": raw_fold, "writer": writer}


def main(argv: list[str]) -> int:
    task, args = argv[0], json.loads(argv[1])
    out = TASKS[task](args)
    out["peak_rss_mb"] = _rss_mb()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
