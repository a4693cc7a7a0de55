"""A lease held in a block, on both faces (tests/workers/faces.py): what it records at
its end, its verbs, and every refusal typed with the log left unchanged."""

from __future__ import annotations

import asyncio
import threading

import pytest

from handoff import InvalidInput, LeaseLost, Ledger, StaleLease
from handoff.lease import MAX_STOP_TEXT
from tests.ledger.conformance import refused, snapshot, assert_unchanged
from tests.workers.faces import FACES, Face

SECRET = "password = hunter2-do-not-log-me"


@pytest.fixture(params=FACES)
def face(request, tmp_path):
    lg = Ledger(str(tmp_path / "ledger.db"))
    f = Face(request.param, lg)
    yield f
    asyncio.run(f.close())
    lg.close()


def new_run(lg: Ledger, timeout_s: float = 1.0) -> str:
    return lg.open(goal="Draft the report", target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout_s)


def events(lg: Ledger, run: str) -> list[tuple[str, str, str]]:
    """(type, actor, text) of every event: text is a progress detail or a lease's reason."""
    return [(r.type, r.actor, getattr(r.event, "detail", None) or getattr(r.event, "reason", "")) for r in lg.log(run)]


def test_a_block_claims_heartbeats_and_releases(face):
    lg = face.lg
    run = new_run(lg, timeout_s=0.6)  # a heartbeat every 0.2 s
    seen: dict[str, int] = {}

    async def agent():
        async with face.lease(run, worker="agent-1") as lease:
            assert lease.number == 1 and lg.checkpoint(run).lease == 1
            await lease.transition("planning")
            await lease.progress("plan_committed", "three sections")
            # Silent for longer than the heartbeat timeout: only the block's beats keep the lease.
            await asyncio.sleep(0.6 * 2)
            # The beats went beside the log (most write no event): the run as it stands shows
            # them, counted under this lease, the last one within the timeout.
            live = lg.store.liveness([run])[run]
            assert live.lease == 1 and live.beats >= 2, live
            beat_us = lg.checkpoint(run).watch.last_heartbeat_us
            assert beat_us >= live.beat_us and lg.clock() - beat_us < 0.6 * 1e6  # (it may beat meanwhile)
            seen["beats"] = live.beats
            await lease.transition("executing")

    asyncio.run(agent())
    got = events(lg, run)
    types = [t for t, _, _ in got]
    assert types[:4] == ["handoff_opened", "lease_granted", "state_changed", "progress_recorded"]
    assert types.count("heartbeat_recorded") < seen["beats"], "every beat was logged"
    assert got[-1][0] == "lease_released" and got[-1][1] == "worker:agent-1"
    assert "finished its lease block" in got[-1][2]
    assert lg.checkpoint(run).lease is None


@pytest.mark.parametrize("raised", [RuntimeError, KeyboardInterrupt])
def test_an_exception_is_recorded_bounded_and_sanitized_then_the_lease_released(face, raised):
    lg = face.lg
    run = new_run(lg)
    message = f"the tool failed with {SECRET} " + "x" * 2000

    async def agent():
        async with face.lease(run, worker="agent-1") as lease:
            await lease.transition("planning")
            raise raised(message)

    with pytest.raises(raised):
        asyncio.run(agent())
    got = events(lg, run)
    note, release = got[-2], got[-1]
    assert note[0] == "progress_recorded" and release[0] == "lease_released"
    for _, actor, text in (note, release):
        assert actor == "worker:agent-1"
        assert text.startswith(f"agent-1 stopped: {raised.__name__}: the tool failed with ")
        assert len(text) <= MAX_STOP_TEXT
    exported = b"".join(lg.export())
    assert b"hunter2" not in exported, "a secret from the exception reached the log"
    assert lg.checkpoint(run).lease is None


def test_a_side_effect_is_recorded_before_and_confirmed_after(face):
    lg = face.lg
    run = new_run(lg)
    happened: list[str] = []

    async def agent():
        async with face.lease(run, worker="agent-1") as lease:
            await lease.transition("planning")
            await lease.transition("executing")
            async with lease.effect("post-1", "POST /deploy v1"):
                assert lg.checkpoint(run).pending_effects[0].key == "post-1"  # recorded before
                happened.append("post-1")
            async with lease.effect("post-2", "POST /deploy v2") as fx:
                fx.absent("the service said no before anything changed")
            with pytest.raises(TimeoutError):
                async with lease.effect("post-3", "POST /deploy v3"):
                    raise TimeoutError("no answer: it may or may not have happened")

    asyncio.run(agent())
    confirmed = {r.event.key: r.event.outcome for r in lg.log(run) if r.type == "side_effect_confirmed"}
    assert confirmed == {"post-1": "done", "post-2": "absent"}
    # An exception leaves the outcome unknown: no confirmation is forged for post-3.
    started = [r.event.key for r in lg.log(run) if r.type == "side_effect_started"]
    assert started == ["post-1", "post-2", "post-3"] and happened == ["post-1"]


def test_a_token_claimed_elsewhere_is_adopted_and_one_of_another_run_refused(face):
    lg = face.lg
    run, other = new_run(lg), new_run(lg)
    token = lg.claim(run, "agent-1")  # as 'handoff run' hands it over in HANDOFF_LEASE
    lg.claim(other, "agent-9")

    async def agent(run_id: str, given: str):
        async with face.lease(run_id, worker="agent-1", token=given) as lease:
            await lease.transition("planning")

    asyncio.run(agent(run, token))
    assert events(lg, run)[-1][0] == "lease_released"
    fresh = new_run(lg)
    mine = lg.claim(fresh, "agent-1")
    # The token of another run (lease 1 there too) proves nothing here: typed, nothing written.
    with refused(lg.store, StaleLease):
        asyncio.run(agent(other, mine))
    with refused(lg.store, InvalidInput):
        asyncio.run(agent(fresh, "1"))  # a bare lease number is not a token


def test_a_block_is_entered_once(face):
    lg = face.lg
    run = new_run(lg)
    block = face.lease(run, worker="agent-1")

    async def agent():
        async with block as lease:
            await lease.transition("planning")
            with refused(lg.store, InvalidInput, match="already entered"):
                async with block:
                    pass
        return lease

    lease = asyncio.run(agent())
    # Entered again after it ended: refused, and its verbs no longer write.
    with refused(lg.store, InvalidInput, match="already entered"):
        asyncio.run(block.__aenter__())
    with refused(lg.store, InvalidInput, match="has ended"):
        asyncio.run(lease.progress("note", "after the end"))


def test_verbs_after_the_lease_was_lost_raise_lease_lost_and_write_nothing(face):
    lg = face.lg
    run = new_run(lg)
    told = threading.Event()
    kw = {"on_lost": lambda lease: told.set()} if face.name == "sync" else {}
    outcome: dict[str, object] = {}

    async def agent():
        async with face.lease(run, worker="agent-1", **kw) as lease:
            outcome["lease"] = lease
            await lease.transition("planning")
            lg.revoke(run, "the host is drained", by="ops")
            try:
                # The sync form finds out at its next verb (or its callback); the async
                # form's task is cancelled by its fence task first.
                for _ in range(200):
                    await lease.progress("note", "still working?")
                    await asyncio.sleep(0.02)
            except LeaseLost as exc:
                outcome["first"] = exc
                raise

    with pytest.raises(LeaseLost) as info:
        asyncio.run(agent())
    assert info.value.details["why"] == "lost" and "revoked by operator:ops" in info.value.message
    if face.name == "sync":
        assert told.wait(5), "on_lost was not called"
    assert events(lg, run)[-1][0] == "lease_revoked"  # the block's end recorded nothing
    lease = outcome["lease"]
    with refused(lg.store, LeaseLost):
        asyncio.run(lease.progress("note", "used after LeaseLost"))
    with refused(lg.store, LeaseLost):
        asyncio.run(lease.submit("a result from a worker that lost its lease"))


def test_a_fence_margin_not_below_the_timeout_is_refused_before_anything_is_written(face):
    lg = face.lg
    run = new_run(lg, timeout_s=2)
    before = snapshot(lg.store)

    async def agent():
        async with face.lease(run, worker="agent-1", fence_margin_s=2):
            pass

    with pytest.raises(InvalidInput, match="margin"):
        asyncio.run(agent())
    assert_unchanged(lg.store, before)
