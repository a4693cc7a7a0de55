"""A command costs at most two round trips to the server (issue 12): counted on the wire,
by a proxy that reads the protocol (tests/ledger/pg_wire.py)."""

from __future__ import annotations

import pytest

from handoff.api import Ledger
from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore
from handoff.ledger.store import Actor
from tests.ledger.pg_wire import CountingProxy
from tests.pg import fresh_url


@pytest.fixture
def proxied():
    proxy = CountingProxy()
    url = fresh_url()
    PostgresStore(url).close()
    yield proxy, proxy.url(url)
    proxy.close()


def _cost(proxy: CountingProxy, fn) -> int:
    before = proxy.requests
    fn()
    return proxy.requests - before


def test_a_command_is_two_round_trips(proxied):
    """With the run's fold cached by this process (a worker's loop). A process's first
    command on a run also reads the run's events (in its first round trip), and one that
    names no worker reads the lease's holder once (a third)."""
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
    assert costs == {k: 2 for k in costs}, costs


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
        store.append("a", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 2
        assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()] * 3, actor=Actor("worker", "w"))) == 2


def test_a_store_append_under_the_ledgers_projections_is_two_round_trips(proxied):
    proxy, url = proxied
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        store = lg.store
        store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert _cost(proxy, lambda: store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 2
        assert lg.check() == []

