"""PostgreSQL work that runs in a child process: ``python -m benchmarks.postgres_child TASK JSON``.

Each writer is its own process with its own connection, as on many hosts. It imports and
connects first, prints ``ready``, waits for a line on stdin (so every writer starts
together and start-up stays outside the timed window), then works and prints one JSON
line: its start and end on the shared monotonic clock, what it did, and how many lock
errors reached the caller (each retried with the same key).

- ``writer``: ``handoff`` = ``Ledger(url).progress(...)`` with a key per command;
  ``raw`` = one autocommit ``INSERT`` per event (one statement, one durable commit).
- ``notify-writer``: raw psycopg, ``BEGIN; INSERT; [NOTIFY channel;] COMMIT`` sent as one
  pipeline (one round trip either way), with or without the NOTIFY.
- ``listen``: ``LISTEN channel`` and count notifications until stdin closes.
"""

from __future__ import annotations

import json
import select
import sys
import time
from typing import Any

RAW_INSERT = "INSERT INTO events (run_id, seq, payload) VALUES (%s, %s, %s)"


def _payloads(tag: str, n: int) -> list[bytes]:
    import msgspec

    from handoff.ledger import events as ev

    encode = msgspec.json.Encoder().encode
    return [encode(ev.ProgressRecorded(kind="tool_outcome", detail=f"{tag} step {i}: ran the tool"))
            for i in range(n)]


def _wait_for_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def writer(args: dict[str, Any]) -> dict[str, Any]:
    runs: list[list[Any]] = args["runs"]  # [[run_id, lease token], ...]
    n_each: int = args["n_each"]
    tag: str = args["tag"]
    errors = 0
    if args["kind"] == "handoff":
        from handoff.facade import Ledger
        from handoff.ledger.errors import StoreUnavailable

        lg = Ledger(args["url"])

        def one(run_id: str, lease: str, i: int) -> None:
            lg.progress(run_id, lease, "tool_outcome", f"{tag} step {i}: ran the tool",
                        key=f"{tag}-{run_id}-{i}", worker="w1")

        lock_error: type[BaseException] = StoreUnavailable
        close = lg.close
    else:
        import psycopg

        conn = psycopg.connect(args["url"], autocommit=True)
        payloads = _payloads(tag, n_each)
        seqs = {r[0]: 0 for r in runs}

        def one(run_id: str, lease: str, i: int) -> None:
            conn.execute(RAW_INSERT, (run_id, seqs[run_id] + 1, payloads[i]))
            seqs[run_id] += 1

        lock_error = psycopg.errors.LockNotAvailable
        close = conn.close

    _wait_for_go()
    start = time.monotonic()
    for i in range(n_each):
        for run_id, lease in runs:
            while True:
                try:
                    one(run_id, lease, i)
                    break
                except lock_error as exc:  # type: ignore[misc]
                    if "lock" not in str(exc).lower():
                        raise
                    errors += 1
    end = time.monotonic()
    close()
    return {"start": start, "end": end, "errors": errors, "done": n_each * len(runs)}


def notify_writer(args: dict[str, Any]) -> dict[str, Any]:
    import psycopg

    run_id, n, channel = args["run_id"], args["n_each"], args["channel"]
    notify = bool(args["notify"])
    conn = psycopg.connect(args["url"], autocommit=True)
    payloads = _payloads(run_id, n)
    _wait_for_go()
    start = time.monotonic()
    for i in range(n):
        with conn.pipeline():
            conn.execute("BEGIN")
            conn.execute(RAW_INSERT, (run_id, i + 1, payloads[i]))
            if notify:
                conn.execute(f"NOTIFY {channel}")
            conn.execute("COMMIT")
    end = time.monotonic()
    conn.close()
    return {"start": start, "end": end, "errors": 0, "done": n}


def listen(args: dict[str, Any]) -> dict[str, Any]:
    import psycopg

    conn = psycopg.connect(args["url"], autocommit=True)
    conn.execute(f"LISTEN {args['channel']}")
    print("ready", flush=True)
    received = 0
    while True:
        for _ in conn.notifies(timeout=0.05):
            received += 1
        if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.readline():
            break
    # The last writers' notifications may still be on their way: drain briefly.
    for _ in conn.notifies(timeout=0.2):
        received += 1
    conn.close()
    return {"received": received}


TASKS = {"writer": writer, "notify-writer": notify_writer, "listen": listen}


def main(argv: list[str]) -> int:
    task, args = argv[0], json.loads(argv[1])
    out = TASKS[task](args)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
