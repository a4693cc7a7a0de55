"""Processes for the PostgreSQL ordering and concurrency tests (run with ``python -m``).

    writer URL OUT RUN[,RUN...] N      append N heartbeats spread over the runs, keyed;
                                       one JSON line per acknowledged append in OUT
    reader URL OUT TOTAL SECONDS       tail read_all until TOTAL events were seen (or time
                                       runs out); every position seen, in order, in OUT
    staller URL RUN STALLED GO         append one event to RUN, but stall inside the write
                                       transaction (after the insert, before COMMIT) until
                                       the file GO exists; touch STALLED once there
    one URL RUN OUT                    append one event to RUN; its positions in OUT
"""

from __future__ import annotations

import json
import os
import sys
import time

from handoff.ledger import events as ev
from handoff.ledger.errors import LedgerError, OutcomeUnknown
from handoff.ledger.postgres import PostgresStore
from handoff.ledger.store import Actor, Aggregate

W = Actor("worker", "w")


class _Nothing(Aggregate[int]):
    def initial(self, run_id: str) -> int:
        return 0

    def evolve(self, state: int, recorded) -> int:
        return state + 1


def writer(url: str, out: str, runs: str, n: str) -> None:
    names = runs.split(",")
    me = os.getpid()
    with PostgresStore(url, busy_timeout_s=60) as store, open(out, "w") as f:
        for i in range(int(n)):
            run = names[i % len(names)]
            key = f"{me}-{i}"
            try:
                r = store.append(run, [ev.HeartbeatRecorded()], actor=W, idempotency_key=key)
                status = "ok"
                rec = {"run": run, "key": key, "seq": r.first_seq, "positions": list(r.positions)}
            except OutcomeUnknown:
                status, rec = "unknown", {"run": run, "key": key}
            except LedgerError as exc:
                status, rec = "failed", {"run": run, "key": key, "error": exc.type}
            f.write(json.dumps({"status": status, **rec}) + "\n")
            f.flush()


def reader(url: str, out: str, total: str, seconds: str) -> None:
    deadline = time.monotonic() + float(seconds)
    seen: list[int] = []
    with PostgresStore(url, readonly=True) as store:
        while len(seen) < int(total) and time.monotonic() < deadline:
            after = seen[-1] if seen else 0
            got = [r.position for r in store.read_all(after_position=after, page=50)]
            seen.extend(got)
            if not got:
                time.sleep(0.002)
    with open(out, "w") as f:
        json.dump(seen, f)


def staller(url: str, run: str, stalled: str, go: str) -> None:
    """One event written through handoff_append as a client would, inside a transaction
    that stays open (its insert made, the run's row locked) until GO exists; then COMMIT
    and the seal, as the store's one message does them. Its insert finds another session
    sealing, so it is queued (as any insert that meets a sealer): it holds the run, not
    the seal, and so stands for a write that commits late."""
    import psycopg

    from handoff.ledger.postgres.postgres_schema import SEAL_LOCK
    from tests.pg import append_call

    PostgresStore(url).close()  # the schema
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as sealer:
        sealer.execute(SEAL_LOCK)
        conn.execute("BEGIN")
        sql, args = append_call(conn, run, ev.ProgressRecorded(kind="a"))
        conn.execute(sql, args)
        sealer.rollback()
        open(stalled, "w").write(run)
        while not os.path.exists(go):
            time.sleep(0.01)
        conn.execute("COMMIT")
        conn.execute("SELECT count(*) FROM handoff_seal(true, '{}')")


def one(url: str, run: str, out: str) -> None:
    with PostgresStore(url, busy_timeout_s=60) as store:
        r = store.append(run, [ev.ProgressRecorded(kind="b")], actor=W)
    with open(out, "w") as f:
        json.dump(list(r.positions), f)


if __name__ == "__main__":
    {"writer": writer, "reader": reader, "staller": staller, "one": one}[sys.argv[1]](*sys.argv[2:])
