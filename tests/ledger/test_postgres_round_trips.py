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


def test_a_command_is_one_round_trip_where_this_process_left_the_run(proxied):
    """With the run's head and fold as this process's last write left them (a worker's
    loop), the write is guessed and sent whole in one round trip. A repeated key is
    answered 'duplicate' from the server: two."""
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
    assert costs == {"heartbeat": 1, "progress": 1, "transition": 1, "keyed": 1, "keyed repeat": 2}, costs


def test_a_guess_refused_because_another_writer_moved_the_run_is_two_round_trips(proxied):
    """Two processes taking turns on one run: each one's guess is refused by the server
    (the head moved), undone, and the write goes on from the head read in the same first
    round trip. Every write lands once, in order, on the chain."""
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
        # b's key again, sent by a (same worker, same request): the guess is refused by
        # the key's unique index, and the answer is 'duplicate'
        costs.append(_cost(proxy, lambda: a.progress(run, lease, "tool_outcome", "b0", key="b0", worker="w1")))
        details = [e.event.detail for e in a.store.read_run(run) if e.type == "progress_recorded"]
        assert details == [d for i in range(4) for d in (f"b{i}", f"a{i}")]
        assert a.checkpoint(run) == b.checkpoint(run) and a.checkpoint(run).last_seq == 12
        assert a.verify() == [] and a.check() == []
    assert costs[0] == 2 and all(c == 2 for c in costs[1:]), costs


def test_a_guess_is_proved_on_the_server_not_trusted(proxied):
    """The guess is written only where the server's head is the one it was made from
    (seq AND hash): a head that differs only in its hash (a restored or altered database)
    refuses the guess, and the write is decided from the server's head."""
    import psycopg

    proxy, url = proxied
    w = Actor("worker", "w")
    with PostgresStore(url) as store:
        store.append("a", [ev.HeartbeatRecorded()], actor=w)
        store.append("a", [ev.HeartbeatRecorded()], actor=w)  # the head is remembered
        with psycopg.connect(url.replace(f"127.0.0.1:{proxy.port}", "127.0.0.1:5432"), autocommit=True) as conn:
            conn.execute("UPDATE heads SET last_hash = %s WHERE run_id = 'a'", (b"\x01" * 32,))
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()], actor=w)) == 2
        third = list(store.read_run("a"))[-1]
        assert third.seq == 3 and third.prev_hash == b"\x01" * 32  # chained on what the server said


def test_a_refusal_is_decided_from_the_server_not_from_the_guess(proxied):
    """A write the guess would refuse (a lease this process knows was given up) is not
    refused from memory: it goes to the server, which refuses it from the head it reads
    under the lock. Two round trips, nothing written."""
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
        assert proxy.since_mark()[0] == 2
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


def test_a_store_append_is_two_round_trips_then_one(proxied):
    proxy, url = proxied
    with PostgresStore(url) as store:
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 2
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 1
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()] * 3, actor=Actor("worker", "w"))) == 1
        assert [r.seq for r in store.read_run("a")] == [1, 2, 3, 4, 5]
        assert store.verify() == []


def test_a_store_append_under_the_ledgers_projections_is_one_round_trip(proxied):
    proxy, url = proxied
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        store = lg.store
        store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert _cost(proxy, lambda: store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 1
        assert lg.check() == []



def test_a_write_that_finds_another_session_sealing_costs_no_extra_round_trip(proxied):
    """Its insert could not seal (the seal lock was taken), so its events were queued: the
    statement after its COMMIT, in the same message, waits for the seal and returns its
    positions. One round trip for a guessed write, two for another, positions included."""
    import threading

    import psycopg

    from handoff.ledger.postgres import store as P

    proxy, url = proxied
    w = Actor("worker", "w")
    direct = url.replace(f"127.0.0.1:{proxy.port}", "127.0.0.1:5432")
    with PostgresStore(url) as store, psycopg.connect(direct, autocommit=True) as sealer:
        store.append("a", [ev.HeartbeatRecorded()], actor=w)
        store.append("a", [ev.HeartbeatRecorded()], actor=w)  # the head is remembered: a guess next
        for fresh, expected in ((False, 1), (True, 2)):
            if fresh:
                store._heads.clear()  # as a process that never wrote the run: no guess
            sealer.execute("BEGIN")
            sealer.execute("SELECT pg_advisory_xact_lock(%s, %s)", (P._LEDGER_NS, P._SEAL))
            threading.Timer(0.3, sealer.execute, ("ROLLBACK",)).start()
            got = []
            assert _cost(proxy, lambda: got.append(store.append("a", [ev.HeartbeatRecorded()], actor=w))) == expected
            assert got[0].positions == (got[0].last_seq,) and store.unsealed_count() == 0
        assert store.verify() == []
