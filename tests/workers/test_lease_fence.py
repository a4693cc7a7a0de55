"""An async agent under ``async with alg.lease(...)`` fences itself when the store goes
away, on both backends, and a second worker resumes from what the first recorded.

The agent is a realistic one: a plan, three tool calls whose side effects change the
world (each step appends a timestamped line to a file, as ``handoff run``'s fault tests
do), an artifact and a submit. Mid-way through the second tool the store is cut off
(SQLite: another process takes the write lock and is then frozen with SIGSTOP;
PostgreSQL: the agent's proxy blackholes) for twice the heartbeat timeout. Then:

- the block ends with ``LeaseLost`` (why ``fenced``), its task cancelled by the fence;
- no step of any tool happened after the moment the watchdog could have revoked the
  lease (the last heartbeat recorded before the store came back, plus the timeout);
- the agent issued no write after the fence tripped: on SQLite, whose lock wait is
  shorter than the margin here, nothing of the worker's lands after that moment; on
  PostgreSQL at most the one call that was on the ledger's thread when the link went
  dark (one thread per ledger: never more) may arrive when the link heals;
- once the store is back, the watchdog revokes the silent lease, and a second worker
  claims the run, reconciles the tool left open by looking at the world, and finishes
  the work from the recorded progress, calling no tool twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from handoff import LeaseLost, Ledger
from handoff.aio import AsyncLedger
from handoff.watchdog import watch_once
from tests.faults.conftest import agent as fault_agent, wait_until

TIMEOUT_S = 2.0  # the run's heartbeat timeout: the fence trips after 1.5 s of silence
STEPS = 40  # steps of one tool call, 50 ms each: the cut lands inside the second tool
TOOLS = ("tool-1", "tool-2", "tool-3")


def act(path: Path, what: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{time.time():.6f} {what}\n")


def actions(path: Path) -> list[tuple[float, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        at, _, what = line.partition(" ")
        out.append((float(at), what))
    return out


def finished(path: Path, tool: str) -> bool:
    """Looking at the world: did the last step of this tool happen?"""
    return any(what.startswith(f"{tool} step {STEPS - 1} ") for _, what in actions(path))


async def work(alg: AsyncLedger, run: str, worker: str, world: Path, report: Path) -> None:
    """The agent: resumes from whatever the ledger says was done before."""
    async with alg.lease(run, worker=worker) as lease:
        cp = await alg.checkpoint(run)
        # A side effect's key is used once: each worker's call of a tool has its own.
        done = {r.event.key.partition(".")[0] async for r in alg.log(run)
                if r.type in ("side_effect_confirmed", "reconciliation_recorded") and r.event.outcome == "done"}
        for fx in cp.pending_effects:  # left open by a lost lease: look at the world, then say
            tool = fx.key.partition(".")[0]
            outcome = "done" if finished(world, tool) else "absent"
            await lease.confirm(fx.key, outcome, note=f"{worker} looked at the world after taking over")
            if outcome == "done":
                done.add(tool)
        if cp.state == "queued":
            await lease.transition("planning")
            await lease.progress("plan_committed", "three tool calls, then the report")
        if cp.state != "executing":
            await lease.transition("executing")
        for tool in TOOLS:
            if tool in done:
                continue
            async with lease.effect(f"{tool}.{worker}", f"call {tool}"):
                for step in range(STEPS):
                    await asyncio.sleep(0.05)
                    act(world, f"{tool} step {step} by {worker}")
            await lease.progress("tool_outcome", f"{tool} done")
        report.write_text("# Report\n\nThree tools were called; their results are summarised here.\n")
        await lease.artifact(str(report))
        await lease.transition("verifying")
        await lease.submit("three tools called, the report written")


def proof_seen(address: str, run: str) -> int:
    """The last heartbeat a watchdog would judge from, read while the worker is still cut
    off, over a connection of the test's own on the ledger's side of the cut: the run as it
    stands, beats kept beside the log included (most beats write no event). Read before the
    store comes back, so a call that waited through the cut is not counted as proof."""
    with Ledger(address) as lg:
        w = lg.checkpoint(run).watch
        assert w.lease_since_us is not None, "the run was never claimed"
        return max(w.lease_since_us, w.last_heartbeat_us or 0)


def logged_proofs_agree(log: list, proof_us: int, back_at: float) -> None:
    """The log's own proofs of life from before the store came back are never later than
    the run as it stood then: the kept beat only adds to them."""
    logged = [r.recorded_us for r in log if r.type in ("heartbeat_recorded", "lease_granted")
              and r.recorded_us / 1e6 < back_at]
    assert logged and max(logged) <= proof_us, (logged, proof_us)


class SqliteCut:
    """Another process takes the write lock, then is frozen holding it (SIGSTOP)."""

    def __init__(self, tmp: Path, procs: list) -> None:
        self.db, self.tmp, self.procs = str(tmp / "ledger.db"), tmp, procs
        self.address = self.worker_address = self.db
        self.options = {"busy_timeout_s": 0.25}  # a lock wait shorter than the fence margin
        self.locker = None

    def cut(self) -> None:
        marker = str(self.tmp / "locked")
        self.locker = fault_agent("locker", self.db, marker, "IMMEDIATE")
        self.procs.append(self.locker)
        wait_until(lambda: os.path.exists(marker), what="the lock being held")
        self.locker.send_signal(signal.SIGSTOP)

    def heal(self) -> None:
        self.locker.send_signal(signal.SIGKILL)
        self.locker.wait()


class PostgresCut:
    """The agent's own proxy blackholes: a partition, as both ends see it."""

    def __init__(self, proxies) -> None:
        from tests.pg import fresh_url

        self.address = fresh_url()
        self.proxy = proxies(self.address)
        self.worker_address = self.proxy.url(self.address)
        self.options: dict[str, object] = {}

    def cut(self) -> None:
        self.proxy.blackhole()

    def heal(self) -> None:
        self.proxy.heal()


@pytest.fixture(params=["sqlite", "postgres"])
def store_cut(request, tmp_path, procs, proxies):
    if request.param == "sqlite":
        return SqliteCut(tmp_path, procs)
    return PostgresCut(proxies)


def test_an_async_agent_fences_itself_and_a_second_worker_resumes(store_cut, tmp_path, evidence):
    world, report = tmp_path / "world", tmp_path / "report.md"
    with Ledger(store_cut.address) as lg:
        run = lg.open(goal="Call three tools and report", target="chat:#ops", owner="alice",
                      heartbeat_timeout_s=TIMEOUT_S, result_path=str(report))

    async def first_worker() -> tuple[BaseException | None, float, float, float, int]:
        alg = AsyncLedger(store_cut.worker_address, **store_cut.options)
        task = asyncio.create_task(work(alg, run, "agent-1", world, report))
        while sum(1 for _, w in actions(world) if w.startswith("tool-2")) < 1:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        cut_at = time.time()
        await asyncio.to_thread(store_cut.cut)
        cut_done = time.time()
        await asyncio.sleep(TIMEOUT_S * 2)
        assert task.done(), "the agent went on working with the store cut off"
        proof_us = await asyncio.to_thread(proof_seen, store_cut.address, run)
        back_at = time.time()
        await asyncio.to_thread(store_cut.heal)
        await alg.aclose()  # after the one call in flight (if any) has come back
        return task.exception(), cut_at, cut_done, back_at, proof_us

    error, cut_at, cut_done, back_at, proof_us = asyncio.run(first_worker())
    assert isinstance(error, LeaseLost) and error.details["why"] == "fenced", repr(error)

    with Ledger(store_cut.address) as lg:
        log = list(lg.log(run))
        logged_proofs_agree(log, proof_us, back_at)
        could_revoke = proof_us / 1e6 + TIMEOUT_S
        done = actions(world)
        assert [a for a in done if a[0] >= cut_done], "no tool acted after the cut: the test proves nothing"
        assert max(at for at, _ in done) < could_revoke, (
            f"a tool acted {max(at for at, _ in done) - could_revoke:.3f}s after the watchdog could have revoked")
        late = [r.type for r in log if r.actor == "worker:agent-1" and r.recorded_us / 1e6 >= could_revoke]
        assert len(late) <= (0 if isinstance(store_cut, SqliteCut) else 1), late
        assert lg.checkpoint(run).lease == 1  # the fenced worker wrote nothing at its end

        # The watchdog, judging the ledger once the timeout has passed, revokes the lease.
        acts = watch_once(lg, name="wd", now_us=proof_us + int(TIMEOUT_S * 1e6) + 1_000_000)
        assert ("revoke_lease", "committed") in [(a.action, a.outcome) for a in acts]

    async def second_worker() -> None:
        async with AsyncLedger(store_cut.address) as alg:
            await work(alg, run, "agent-2", world, report)

    asyncio.run(second_worker())
    with Ledger(store_cut.address) as lg:
        cp = lg.checkpoint(run)
        assert cp.state == "succeeded", cp.state  # submitted, no review asked for
        steps = [w for _, w in actions(world)]
        # Every tool ran to its end exactly once in the world; tool-2, cut off mid-way,
        # was reconciled as absent and called again by agent-2.
        for tool in TOOLS:
            assert sum(1 for w in steps if w.startswith(f"{tool} step {STEPS - 1} ")) == 1, tool
        recon = [r.event for r in lg.log(run) if r.type == "reconciliation_recorded"]
        assert [(e.key, e.outcome) for e in recon] == [("tool-2.agent-1", "absent")]
        assert lg.verify() == []
    evidence.add(f"lease_fence_{type(store_cut).__name__}", heartbeat_timeout_s=TIMEOUT_S,
                 cut_s=TIMEOUT_S * 2, cut_took_s=round(cut_done - cut_at, 3),
                 last_action_before_possible_revoke_s=round(could_revoke - max(at for at, _ in done), 3),
                 late_worker_writes=late)


def test_a_sync_block_stops_its_tool_through_on_lost_while_the_file_is_locked(tmp_path, procs):
    """The sync form: the fence thread calls ``on_lost`` in time for the tool to stop
    before the watchdog could revoke, and the block's end raises ``LeaseLost``."""
    import threading

    cut = SqliteCut(tmp_path, procs)
    world = tmp_path / "world"
    stop = threading.Event()
    with Ledger(cut.db, busy_timeout_s=0.25) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=TIMEOUT_S)
        with pytest.raises(LeaseLost) as info:
            with lg.lease(run, worker="agent-1", on_lost=lambda lease: stop.set()) as lease:
                lease.transition("planning")
                started = time.monotonic()
                while not stop.is_set():  # a tool that checks its stop flag between steps
                    act(world, "step")
                    if len(actions(world)) == 10:
                        cut_done = (cut.cut(), time.time())[1]
                    time.sleep(0.05)
                    assert time.monotonic() - started < 60, "the fence never tripped"
        assert info.value.details["why"] == "fenced"
        time.sleep(TIMEOUT_S)
        proof_us = proof_seen(cut.db, run)
        back_at = time.time()
        cut.heal()
        log = list(lg.log(run))
    logged_proofs_agree(log, proof_us, back_at)
    could_revoke = proof_us / 1e6 + TIMEOUT_S
    done = [at for at, _ in actions(world)]
    assert [at for at in done if at >= cut_done], "the tool never acted after the cut"
    assert max(done) < could_revoke
    assert [r.type for r in log if r.recorded_us / 1e6 >= could_revoke] == []
