"""Shared helpers: bring a run to a given state through the real Ledger, check refusals."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from handoff import Actor, Ledger
from handoff.ledger import errors as E
from handoff.reducers import commands as C
from handoff.reducers import transitions as T

OWNER = Actor("owner", "alice")
OPERATOR = Actor("operator", "op")
WATCHDOG = Actor("watchdog", "dog")


@dataclass
class Run:
    id: str
    lease: str | None  # the token claim returned; None once the lease has ended
    worker: str
    result: str | None = None
    token: str | None = None  # the token claim returned, kept after the lease ends

    @property
    def actor(self) -> Actor:
        return Actor("worker", self.worker)


def new_ledger(tmp_path: Any, name: str = "ledger.db") -> Ledger:
    # NORMAL skips an fsync per commit; the file, the WAL and the transactions are real.
    return Ledger(os.path.join(str(tmp_path), name), synchronous="NORMAL")


def log(lg: Ledger) -> list[Any]:
    """Every stored event with its envelope, hashes included: the byte-for-byte log."""
    return list(lg.store.read_all())


def refused(lg: Ledger, error: type[E.LedgerError], call: Any, *words: str) -> E.LedgerError:
    """``call()`` must raise exactly ``error``, name the problem, and write nothing."""
    before = log(lg)
    with pytest.raises(E.LedgerError) as info:
        call()
    exc = info.value
    assert type(exc) is error, f"expected {error.__name__}, got {exc.type}: {exc.message}"
    text = exc.message.lower()
    for w in words:
        assert w.lower() in text, f"{exc.type} message does not mention {w!r}: {exc.message}"
    assert log(lg) == before, f"a refused command ({exc.type}) changed the log"
    return exc


def write(path: str, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def bring(
    lg: Ledger, tmp_path: Any, state: str, *, run_id: str = "r1", owner: str = "alice",
    require_review: bool = False, worker: str = "w1", evidence: bool = True, owner_cap: int = 10,
) -> Run:
    """Open ``run_id`` and move it to ``state`` the ordinary way; return its lease and worker."""
    require_review = require_review or state == T.READY_FOR_REVIEW
    result = write(os.path.join(os.path.realpath(str(tmp_path)), f"{run_id}-result.md"), "# the report\n")
    lg.open(goal="write the report", target="chat:#ops", owner=owner, run_id=run_id,
            result_path=result, require_review=require_review, owner_cap=owner_cap)
    run = Run(run_id, None, worker, result)
    if state == T.QUEUED:
        return run
    run.lease = run.token = lg.claim(run_id, worker)
    path = {
        T.PLANNING: [T.PLANNING],
        T.EXECUTING: [T.PLANNING, T.EXECUTING],
        T.BLOCKED: [T.PLANNING, T.EXECUTING],
        T.UNKNOWN: [T.PLANNING, T.EXECUTING],
    }.get(state, [T.PLANNING, T.EXECUTING, T.VERIFYING])
    for to in path:
        lg.transition(run_id, run.lease, to, worker=worker)
    if state in (T.PLANNING, T.EXECUTING, T.VERIFYING):
        return run
    if state == T.BLOCKED:
        lg.block(run_id, "needs the API token", "alice provides the token", lease=run.lease, actor=run.actor)
        return run
    if state == T.UNKNOWN:
        lg.effect_start(run_id, run.lease, "mail-1", "mail the report", worker=worker)
        lg.revoke(run_id, "no heartbeat for 90s", actor=WATCHDOG)
        run.lease = None
        return run
    lg.artifact(run_id, run.lease, result, worker=worker)
    lg.submit(run_id, run.lease, "report written", worker=worker)
    if state == T.READY_FOR_REVIEW:
        return run
    if require_review:
        lg.review(run_id, True, by=owner)
    if evidence:
        lg.evidence(run_id, "tests", "pass", actor=Actor("owner", owner))
    if state == T.SUCCEEDED:
        return run
    if state == T.DELIVERED:
        lg.deliver(run_id, "send-1", by=owner)
        lg.delivered(run_id, "send-1", "msg-1")
        run.lease = None
        return run
    if state in (T.NO_OP, T.CANCELLED, T.FAILED):
        lg.close_run(run_id, state, "stopped", by=owner)
        run.lease = None
        return run
    raise ValueError(f"cannot bring a run to {state}")


def execute(lg: Ledger, run_id: str, actor: Actor, cmd: C.Command, key: str | None = None) -> Any:
    return lg.execute(run_id, cmd, actor=actor, key=key)


# --- racing writers in separate processes ------------------------------------------


def race_worker(path: str, jobs: list[tuple[str, str, str, bytes]], barrier: Any, results: Any, who: int) -> None:
    """Run in a child process: for each round, wait for the rival, then issue one command.

    ``jobs`` holds (run id, actor kind, actor name, encoded command); the outcome of each
    round (committed/duplicate or the error type) goes to ``results`` as (who, round, outcome).
    """
    import msgspec

    lg = Ledger(path, synchronous="NORMAL", busy_timeout_s=30.0)
    try:
        for i, (run_id, kind, name, raw) in enumerate(jobs):
            cmd = msgspec.json.decode(raw, type=C.AnyCommand)
            barrier.wait(timeout=60)
            try:
                out = lg.execute(run_id, cmd, actor=Actor(kind, name))
                results.put((who, i, out.result.outcome))
            except E.LedgerError as exc:
                results.put((who, i, exc.type))
    finally:
        lg.close()
