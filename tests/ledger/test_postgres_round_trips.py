"""A command costs at most two round trips to the server (issue 12): counted on the wire,
by the proxy the pg-round-trips benchmark counts with (benchmarks/postgres_proxy.py), so
the test and the benchmark count the same thing."""

from __future__ import annotations

import pytest

from handoff.api import Ledger
from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore
from handoff.ledger.store import Actor
from tests.pg import fresh_url

from benchmarks.postgres_proxy import CountingProxy


@pytest.fixture
def proxied():
    url = fresh_url()
    proxy = CountingProxy(url)
    PostgresStore(url).close()
    yield proxy, proxy.url(url)
    proxy.close()


def _cost(proxy: CountingProxy, fn) -> int:
    """Round trips ``fn`` costs: client bursts that each wait for the server's answer."""
    proxy.mark()
    fn()
    return proxy.since_mark()[0]


def test_a_command_is_two_round_trips_and_a_repeated_key_one(proxied):
    """A command reads the run (one message, no lock), then writes (one message, COMMIT
    included). A repeated key is answered 'duplicate' from the read alone."""
    proxy, url = proxied
    with Ledger(url) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.transition(run, lease, "planning")
        costs = {
            "heartbeat": _cost(proxy, lambda: lg.heartbeat(run, lease)),
            "progress": _cost(proxy, lambda: lg.progress(run, lease, "plan_committed", "3 steps")),
            "transition": _cost(proxy, lambda: lg.transition(run, lease, "executing")),
            "keyed": _cost(proxy, lambda: lg.progress(run, lease, "tool_outcome", "ran", key="k1")),
            "keyed repeat": _cost(proxy, lambda: lg.progress(run, lease, "tool_outcome", "ran", key="k1")),
        }
        assert lg.verify() == [] and lg.check() == []
    assert costs == {"heartbeat": 2, "progress": 2, "transition": 2, "keyed": 2, "keyed repeat": 1}, costs


def test_two_processes_taking_turns_on_a_run_pay_two_round_trips_each(proxied):
    """Each write reads the head the other one left: no write is refused for a stale
    cache, and every write lands once, in order, on the chain."""
    proxy, url = proxied
    with Ledger(url) as a, Ledger(url) as b:
        run = a.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = a.claim(run, "w1")
        a.transition(run, lease, "planning")
        a.transition(run, lease, "executing")
        costs = []
        for i in range(4):
            costs.append(_cost(proxy, lambda: b.progress(run, lease, "tool_outcome", f"b{i}", key=f"b{i}",
                                                         worker="w1")))
            costs.append(_cost(proxy, lambda: a.progress(run, lease, "tool_outcome", f"a{i}", key=f"a{i}",
                                                         worker="w1")))
        # b's key again, sent by a (same worker, same request): 'duplicate', from the read
        costs.append(_cost(proxy, lambda: a.progress(run, lease, "tool_outcome", "b0", key="b0", worker="w1")))
        details = [e.event.detail for e in a.store.read_run(run) if e.type == "progress_recorded"]
        assert details == [d for i in range(4) for d in (f"b{i}", f"a{i}")]
        assert a.checkpoint(run) == b.checkpoint(run) and a.checkpoint(run).last_seq == 12
        assert a.verify() == [] and a.check() == []
        assert a.store.diagnostics()["writes_decided_again"] == 0
    assert costs == [2] * 8 + [1], costs


def test_a_write_chains_on_the_head_the_server_has(proxied):
    """A head changed behind the store (a restored or altered database): the write is
    decided from the head the server has, seq and hash, never from what this process
    wrote last."""
    import psycopg

    proxy, url = proxied
    w = Actor("worker", "w")
    with PostgresStore(url) as store:
        store.append("a", [ev.HeartbeatRecorded()], actor=w)
        store.append("a", [ev.HeartbeatRecorded()], actor=w)
        with psycopg.connect(url.replace(f"127.0.0.1:{proxy.port}", "127.0.0.1:5432"), autocommit=True) as conn:
            conn.execute("UPDATE heads SET last_hash = %s WHERE run_id = 'a'", (b"\x01" * 32,))
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()], actor=w)) == 2
        third = list(store.read_run("a"))[-1]
        assert third.seq == 3 and third.prev_hash == b"\x01" * 32  # chained on what the server said


def test_a_refusal_costs_the_read_alone_and_writes_nothing(proxied):
    """A write under a lease that was given up is refused from the head the read brought:
    one round trip, nothing written."""
    from handoff.ledger.errors import StaleLease

    proxy, url = proxied
    with Ledger(url) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.release(run, lease)
        before = lg.store.head(run)
        proxy.mark()
        with pytest.raises(StaleLease):
            lg.heartbeat(run, lease)
        assert proxy.since_mark()[0] == 1
        assert lg.store.head(run) == before


def test_a_new_process_first_command_is_two_round_trips_when_it_names_its_worker(proxied):
    proxy, url = proxied
    with Ledger(url) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        for _ in range(30):
            lg.heartbeat(run, lease)
    with Ledger(url) as fresh:  # as a new CLI process: nothing cached
        assert _cost(proxy, lambda: fresh.heartbeat(run, lease, worker="w1")) == 2


def test_a_store_append_is_two_round_trips(proxied):
    proxy, url = proxied
    with PostgresStore(url) as store:
        for n in (1, 1, 3):
            assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()] * n,
                                                     actor=Actor("worker", "w"))) == 2
        assert [r.seq for r in store.read_run("a")] == [1, 2, 3, 4, 5]
        assert store.verify() == []


def test_a_store_append_under_the_ledgers_projections_is_two_round_trips(proxied):
    """The views' rows go with the batch, in the same call: no round trip of their own."""
    proxy, url = proxied
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        store = lg.store
        store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert _cost(proxy, lambda: store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 2
        assert lg.check() == []


def test_a_write_that_finds_another_session_sealing_costs_no_extra_round_trip(proxied):
    """handoff_append could not seal (the seal lock was taken), so its events were queued: the
    statement after its COMMIT, in the same message, waits for the seal and returns its
    positions. Two round trips, positions included."""
    import threading

    import psycopg

    from handoff.ledger.postgres.schema import SEAL_LOCK

    proxy, url = proxied
    w = Actor("worker", "w")
    direct = url.replace(f"127.0.0.1:{proxy.port}", "127.0.0.1:5432")
    with PostgresStore(url) as store, psycopg.connect(direct, autocommit=True) as sealer:
        store.append("a", [ev.HeartbeatRecorded()], actor=w)
        sealer.execute("BEGIN")
        sealer.execute(SEAL_LOCK)
        threading.Timer(0.3, sealer.execute, ("ROLLBACK",)).start()
        got = []
        assert _cost(proxy, lambda: got.append(store.append("a", [ev.HeartbeatRecorded()], actor=w))) == 2
        assert got[0].positions == (got[0].last_seq,) and store.unsealed_count() == 0
        assert store.verify() == []
