"""Concurrency: 8 writer processes on 8 runs at once against one ledger file.

Each writer is its own process with its own Ledger (one connection), appending durable
``progress`` commands to its own run, all started together. The reference is one writer
process doing the same total (the same 8 runs, round-robin). Aggregate throughput is all
events over the window from the first writer's start to the last one's end, on the
shared monotonic clock; start-up and imports happen before the start signal and are not
timed. A lock error that reaches a caller (``StoreUnavailable`` past the 5 s busy
timeout) is counted, and the writer retries the same command with the same key.
"""

from __future__ import annotations

from typing import Any

from .common import path_in, raw_connect, reap, spawn
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "concurrency"
WRITERS = 8


def _ledger_with_runs(db: str, count: int) -> list[list[Any]]:
    from .bench_commands import open_ledger, working_run

    runs = []
    with open_ledger(db) as lg:
        for w in range(count):
            run_id = f"run-w{w}"
            runs.append([run_id, str(working_run(lg, run_id))])  # the token, through JSON
    return runs


def _start(groups: list[dict[str, Any]]) -> list[Any]:
    procs = [spawn("writer", g, stdin=True) for g in groups]
    for p in procs:
        line = p.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"a writer did not start: {line!r}")
    return procs


def _go(procs: list[Any], total: int) -> Measured:
    for p in procs:
        p.stdin.write(b"go\n")
    for p in procs:
        p.stdin.flush()
        p.stdin.close()
    reports = [reap(p) for p in procs]
    done = sum(r["done"] for r in reports)
    if done != total:
        raise RuntimeError(f"the writers did {done} commands, expected {total}")
    window = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    return Measured(seconds=window, metrics={"lock_errors": float(sum(r["errors"] for r in reports))})


def _kill(procs: list[Any]) -> None:
    for p in procs:
        if p.poll() is None and p.returncode is None:
            p.kill()
            p.wait()


def _writers(kind: str, processes: int):
    def prepare(ctx: Ctx) -> Trial:
        per = ctx.params["per_writer"]
        if kind == "handoff":
            db = path_in(ctx.dir, "ledger.db")
            runs = _ledger_with_runs(db, WRITERS)
        else:
            db = path_in(ctx.dir, "raw.db")
            raw_connect(db).close()
            runs = [[f"run-w{w}", 0] for w in range(WRITERS)]
        if processes == 1:
            groups = [{"db": db, "kind": kind, "runs": runs, "n_each": per, "tag": "single"}]
        else:
            groups = [{"db": db, "kind": kind, "runs": [r], "n_each": per, "tag": f"w{i}"}
                      for i, r in enumerate(runs)]
        procs = _start(groups)
        total = per * WRITERS
        return Trial(lambda: _go(procs, total), close=lambda: _kill(procs))

    return prepare


register(
    Scenario(
        name="writers-8",
        area=AREA,
        title="8 writer processes on 8 runs at once vs one writer doing the same total",
        measures=(
            "8 processes, each its own Ledger on the same file, each appending durable "
            "Ledger.progress commands (with keys) to its own run, started together; "
            "aggregate events/s over the whole window, and the count of lock errors that "
            "reached a caller (busy timeout 5 s; each is retried). Reference: one process "
            "doing the same 8 x N commands round-robin over the 8 runs. Peer: 8 raw sqlite3 "
            "processes doing one INSERT + COMMIT per event (busy timeout 5 s), for scale."
        ),
        full={"n": WRITERS * 250, "per_writer": 250},
        quick={"n": WRITERS * 15, "per_writer": 15},
        subject=Side("handoff-ledger, 8 writers", _writers("handoff", WRITERS),
                     note="8 processes x Ledger.progress, one durable commit each"),
        reference=Side("handoff-ledger, 1 writer", _writers("handoff", 1),
                       note="1 process, the same total, round-robin over the 8 runs"),
        peers=(
            Side("raw sqlite3, 8 writers", _writers("raw", WRITERS),
                 note="8 processes x (BEGIN IMMEDIATE; INSERT; COMMIT), busy timeout 5 s"),
        ),
        goal=0.8,
        goals=(Goal("no lock error reaches a caller", metric="lock_errors", max_value=0.0),),
        unit="events",
    )
)



# --- group commit: 8 threads sharing one Ledger -------------------------------------------

THREADS = 8


def _threads(threads: int, group_commit: bool):
    """``threads`` threads of one process, one Ledger between them, each issuing durable
    ``progress`` commands (with keys) to its own run; released together by a barrier."""

    def prepare(ctx: Ctx) -> Trial:
        import threading

        from handoff.facade import Ledger

        from .bench_commands import working_run
        from .common import SYNCHRONOUS, _check, expect

        total = ctx.params["n"]
        lg = Ledger(path_in(ctx.dir, "ledger.db"), synchronous=SYNCHRONOUS, group_commit=group_commit)
        _check(lg.store.conn, "handoff-ledger")
        runs = [(f"run-t{i}", working_run(lg, f"run-t{i}")) for i in range(THREADS)]
        base = {run_id: lg.checkpoint(run_id).last_seq for run_id, _ in runs}
        # One thread does the whole total round-robin over the same runs; more split it.
        shares = [runs] if threads == 1 else [[r] for r in runs]
        per = total // len(shares)
        start = threading.Barrier(len(shares) + 1)
        failures: list[BaseException] = []

        def work(mine: list[tuple[str, Any]]) -> None:
            progress = lg.progress
            start.wait()
            try:
                for k in range(per):
                    run_id, lease = mine[k % len(mine)]
                    progress(run_id, lease, "tool_outcome", f"step {k}", key=f"k{k}", worker="w1")
            except BaseException as exc:  # reported by check, never swallowed
                failures.append(exc)

        pool = [threading.Thread(target=work, args=(share,)) for share in shares]
        for t in pool:
            t.start()

        def run() -> None:
            start.wait()
            for t in pool:
                t.join()

        def check() -> None:
            if failures:
                raise RuntimeError(f"a command failed: {failures[0]!r}")
            expect("events written", sum(lg.checkpoint(r).last_seq - base[r] for r, _ in runs), total)

        return Trial(run, check, lg.close)

    return prepare


register(
    Scenario(
        name="group-commit-8",
        area=AREA,
        title="8 threads on one Ledger(group_commit=True) vs one thread doing the same total",
        measures=(
            "8 threads of one process share one Ledger opened with group_commit=True, each "
            "issuing durable Ledger.progress commands (with keys) to its own run, released "
            "together: concurrent commands share a write transaction and its one fsync, each "
            "in a savepoint of its own (fenced, deduplicated and decided alone). Reference: "
            "one thread on a plain Ledger doing the same total round-robin over the 8 runs. "
            "Peer: the same 8 threads on a plain Ledger (one transaction per command)."
        ),
        full={"n": THREADS * 500},
        quick={"n": THREADS * 20},
        subject=Side("handoff-ledger, 8 threads, group commit", _threads(THREADS, True),
                     note="Ledger(group_commit=True): one commit per group of waiting commands"),
        reference=Side("handoff-ledger, 1 thread", _threads(1, False),
                       note="a plain Ledger, one commit per command"),
        peers=(
            Side("handoff-ledger, 8 threads, no group commit", _threads(THREADS, False),
                 note="a plain Ledger shared by 8 threads: the store's lock serialises them"),
        ),
        goal=3.0,
        unit="events",
    )
)
