"""Group commit: concurrent commands from one process's threads share a transaction and a
fsync, and each is still fenced, deduplicated and decided on its own.

Real threads on a real SQLite file. Which commands share a transaction is forced, not
hoped for: the first command's guard (it runs inside the write transaction) waits until
every other thread has queued its command, so those join its transaction. Commits are
counted with SQLite's statement trace on the store's own connection.
"""

from __future__ import annotations

import threading
import time

import pytest

from handoff.facade import Ledger
from handoff.names import lease_token
from handoff.ledger.errors import IdempotencyConflict, InvalidInput, StaleLease, StoreUnavailable
from handoff.ledger.store import Actor
from handoff.reducers import commands as C
from tests.support import working_run


def _commits(lg: Ledger) -> list[str]:
    seen: list[str] = []
    lg.store.conn.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    return seen


def _queued(lg: Ledger) -> int:
    group = lg.store._group
    with group._cv:
        return len(group._queue)


def _in_groups(lg: Ledger, first: callable, rest: list[callable]) -> tuple[list[object], list[str]]:
    """Run ``first`` (which must reach its guard) and, while its transaction is held open,
    queue every one of ``rest``; return each call's result (or exception) and the COMMITs."""
    results: list[object] = [None] * (1 + len(rest))
    holding = threading.Event()
    release = threading.Event()

    def call(i: int, fn: callable) -> None:
        try:
            results[i] = fn(holding, release)
        except Exception as exc:  # the test inspects it
            results[i] = exc

    commits = _commits(lg)
    lead = threading.Thread(target=call, args=(0, first))
    lead.start()
    assert holding.wait(10), "the first command never reached its guard"
    others = [threading.Thread(target=call, args=(i + 1, fn)) for i, fn in enumerate(rest)]
    for i, t in enumerate(others):
        t.start()  # one at a time, so they queue (and are decided) in the order given
        deadline = time.monotonic() + 10
        while _queued(lg) < i + 1:
            assert time.monotonic() < deadline, "a command never queued"
            time.sleep(0.001)
    release.set()
    for t in [lead, *others]:
        t.join(10)
    lg.store.conn.set_trace_callback(None)
    return results, commits


def _holding_progress(lg: Ledger, run_id: str, token: str, key: str):
    def fn(holding: threading.Event, release: threading.Event):
        def guard(cp) -> bool:
            holding.set()
            assert release.wait(10)
            return True

        t = lease_token(token)
        return lg.execute(run_id, C.Progress(lease=t.lease, kind="tool_outcome", detail="first"),
                          actor=Actor("worker", "w1"), key=key, guard=guard, token=token)
    return fn


def _progress(lg: Ledger, run_id: str, token: str, detail: str, key: str):
    return lambda holding, release: lg.progress(run_id, token, "tool_outcome", detail, key=key, worker="w1")


@pytest.fixture
def lg(db_path):
    ledger = Ledger(db_path, group_commit=True)
    yield ledger
    ledger.close()


def test_eight_threads_share_commits_and_lose_nothing(lg):
    runs = {f"run-{i}": working_run(lg, f"run-{i}") for i in range(8)}
    before = {r: lg.checkpoint(r).last_seq for r in runs}
    commits = _commits(lg)
    n = 40

    def worker(run_id: str, token: str) -> None:
        for k in range(n):
            lg.progress(run_id, token, "tool_outcome", f"step {k}", key=f"k{k}", worker="w1")

    threads = [threading.Thread(target=worker, args=item) for item in runs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lg.store.conn.set_trace_callback(None)
    for run_id in runs:
        assert lg.checkpoint(run_id).last_seq == before[run_id] + n
        assert [r.seq for r in lg.store.read_run(run_id)] == list(range(1, before[run_id] + n + 1))
    assert len(commits) <= 8 * n
    assert lg.check() == [] and lg.verify() == []


def test_a_group_shares_one_commit(lg):
    tokens = {f"run-{i}": working_run(lg, f"run-{i}") for i in range(4)}
    first = _holding_progress(lg, "run-0", tokens["run-0"], "a0")
    rest = [_progress(lg, r, t, "queued", "q") for r, t in tokens.items() if r != "run-0"]
    results, commits = _in_groups(lg, first, rest)
    assert all(r.result.outcome == "committed" for r in results), results
    # The three queued while the first held the transaction open joined it: one commit.
    assert len(commits) == 1
    for run_id in tokens:
        assert lg.status(run_id)["progress_seq"] == lg.checkpoint(run_id).progress_seq


def test_a_group_is_bounded_and_every_command_still_answered(lg):
    """Past LIMIT commands the rest wait for the next group; a thread whose command was
    left out of the group it led leads the next one, and is answered by that commit."""
    tokens = {f"run-{i}": working_run(lg, f"run-{i}") for i in range(6)}
    lg.store._group.LIMIT = 2
    first = _holding_progress(lg, "run-0", tokens["run-0"], "a0")
    rest = [_progress(lg, r, t, "queued", "q") for r, t in tokens.items() if r != "run-0"]
    results, commits = _in_groups(lg, first, rest)
    assert [r.result.outcome for r in results] == ["committed"] * 6, results
    assert len(commits) == 3  # 2 + 2 + 2
    assert lg.check() == [] and lg.verify() == []


def test_a_refused_command_rolls_back_alone(lg):
    tokens = {f"run-{i}": working_run(lg, f"run-{i}") for i in range(3)}
    stale = tokens["run-1"]
    lg.revoke("run-1", "handed over", by="alice")
    fresh = str(lg.claim("run-1", "w2"))
    log_before = list(lg.store.read_run("run-1"))
    run2_before = list(lg.store.read_run("run-2"))
    first = _holding_progress(lg, "run-0", tokens["run-0"], "a0")
    rest = [
        _progress(lg, "run-1", stale, "from the replaced worker", "s1"),
        _progress(lg, "run-2", tokens["run-2"], "fine", "f1"),
        _progress(lg, "run-2", tokens["run-2"], "fine", "f1"),  # the same request again
        _progress(lg, "run-2", tokens["run-2"], "another request", "f1"),  # the key reused
    ]
    results, commits = _in_groups(lg, first, rest)
    assert len(commits) == 1
    assert isinstance(results[1], StaleLease)
    assert list(lg.store.read_run("run-1")) == log_before  # nothing of the refused one
    outcomes = [r if isinstance(r, Exception) else r.result.outcome for r in results[2:]]
    # Queued in that order, decided in that order: the first write of key f1 commits; its
    # replay is a duplicate; another request under the same key is refused.
    assert outcomes[0] == "committed" and outcomes[1] == "duplicate"
    assert isinstance(outcomes[2], IdempotencyConflict)
    added = list(lg.store.read_run("run-2"))[len(run2_before):]
    assert [(r.type, r.event.detail) for r in added] == [("progress_recorded", "fine")]
    assert fresh and lg.check() == [] and lg.verify() == []


def test_an_exception_in_one_command_leaves_the_others(lg):
    tokens = {f"run-{i}": working_run(lg, f"run-{i}") for i in range(3)}
    before = list(lg.store.read_run("run-1"))

    def broken(holding, release):
        def guard(cp) -> bool:
            raise RuntimeError("the guard failed")
        t = lease_token(tokens["run-1"])
        return lg.execute("run-1", C.Progress(lease=t.lease, kind="tool_outcome", detail="never"),
                          actor=Actor("worker", "w1"), guard=guard, token=t)

    first = _holding_progress(lg, "run-0", tokens["run-0"], "a0")
    results, commits = _in_groups(lg, first, [broken, _progress(lg, "run-2", tokens["run-2"], "ok", "k")])
    assert isinstance(results[1], RuntimeError)
    assert results[2].result.outcome == "committed"
    assert list(lg.store.read_run("run-1")) == before
    assert len(commits) == 1 and lg.check() == []


def test_a_command_from_inside_a_command_is_refused_not_deadlocked(lg):
    """A guard runs inside the group's transaction on the leading thread; a command it
    issues would wait for that very group. It is refused, typed, and writes nothing."""
    tokens = {f"run-{i}": working_run(lg, f"run-{i}") for i in range(2)}
    before = list(lg.store.read_run("run-1"))
    inner: list[Exception] = []

    def guard(cp) -> bool:
        try:
            lg.progress("run-1", tokens["run-1"], "tool_outcome", "nested", key="n1", worker="w1")
        except StoreUnavailable as exc:
            inner.append(exc)
        return True

    t = lease_token(tokens["run-0"])
    out = lg.execute("run-0", C.Progress(lease=t.lease, kind="tool_outcome", detail="outer"),
                     actor=Actor("worker", "w1"), guard=guard, token=t)
    assert out.result.outcome == "committed"
    assert len(inner) == 1 and "inside another command's transaction" in inner[0].message
    assert list(lg.store.read_run("run-1")) == before
    assert lg.check() == []


def test_group_commit_needs_a_writable_sqlite_ledger(db_path, backend):
    Ledger(db_path).close()
    with pytest.raises(StoreUnavailable, match="read-only"):
        Ledger(db_path, readonly=True, group_commit=True)
    address = backend.address()
    store = backend.open(address)
    if type(store).__name__ == "SqliteStore":
        lg = Ledger(store=store, group_commit=True)
        assert lg.store._group is not None
        lg.close()
        return
    with pytest.raises(InvalidInput, match="group commit is offered by the SQLite backend"):
        Ledger(store=store, group_commit=True)
    # Refused before anything was written: the ledger the store names holds no event.
    again = backend.open(address)
    assert again.last_position() == 0
