"""Guessed writes on PostgreSQL (ledger/postgres/store.py, _guess): a write made from the head
this store's last write left is sent whole in one round trip, proved on the server, and
leaves out view rows that did not change. The shared stateful machine (handoff.testing)
runs here on a PostgreSQL ledger, with its racing writers on a second store (each one's
guesses refused by the other's writes) and rebuilds at any step: after every step the
views equal a fresh fold of the log, the model agrees, and the chains verify."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from handoff.api import Ledger
from handoff.projections import engine
from handoff.testing import LedgerMachine
from tests.pg import fresh_url

FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"


class PostgresLedgerMachine(LedgerMachine):
    """Two stores on one ledger take turns: every command goes through the other one than
    the command before, so guesses are made (a store wrote the run before) and refused
    (the other store wrote it since) all the time. A third store races (``other``)."""

    def __init__(self) -> None:
        self._stores: list[Ledger] = []
        self._turn = 0
        super().__init__()
        self._stores.append(self.make_ledger(""))

    @property  # type: ignore[override]
    def ledger(self) -> Ledger:
        self._turn += 1
        return self._stores[self._turn % len(self._stores)]

    @ledger.setter
    def ledger(self, lg: Ledger) -> None:
        self._stores[:] = [lg]

    def make_ledger(self, path: str) -> Ledger:
        # every store of one machine opens the same schema
        if not hasattr(self, "_url"):
            self._url = fresh_url()
        return Ledger(self._url, clock=self.clock)

    @invariant()
    def views_equal_a_fresh_fold(self) -> None:
        assert self.ledger.check() == []

    @rule(name=st.sampled_from([None, *(p.name for p in engine.PROJECTIONS)]))
    def rebuild(self, name: str | None) -> None:
        self.ledger.rebuild(name)
        assert self.ledger.check() == []

    def teardown(self) -> None:
        try:
            assert self.ledger.verify() == []
        finally:
            try:
                super().teardown()
            finally:
                for lg in self._stores[1:]:
                    lg.close()


PostgresLedgerMachine.TestCase.settings = settings(
    max_examples=60 if FULL else 10,
    stateful_step_count=40 if FULL else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
TestPostgresLedgerMachine = PostgresLedgerMachine.TestCase


def test_the_machine_makes_guesses_and_has_them_refused():
    """The machine above proves something only if its writes are guessed and some guesses
    are refused: its two stores taking turns on one run, counted."""
    machine = PostgresLedgerMachine()
    try:
        run = machine.ledger.open(goal="g", target="chat:#ops", owner="alice")
        lease = machine.ledger.claim(run, "w1")
        for _ in range(6):
            machine.ledger.heartbeat(run, lease, worker="w1")
        counts = [lg.store.diagnostics()["guessed_writes"] for lg in machine._stores]
        assert sum(c["sent"] for c in counts) >= 5 and sum(c["refused"] for c in counts) >= 4
        assert machine.ledger.check() == [] and machine.ledger.verify() == []
    finally:
        machine.teardown()


def test_a_refused_guess_goes_on_with_statements_its_connection_never_prepared():
    """The write that follows a refused guess may need statements this connection has not
    prepared yet (here the owner's load row of a claimed run, which this store never
    wrote). Their PREPAREs must come after the guess is undone: in the failed transaction
    nothing else runs. Found by the machine above; before the fix the write failed with
    'current transaction is aborted'."""
    from handoff.ledger.events import HeartbeatRecorded
    from handoff.ledger.store import Actor

    with Ledger(fresh_url()) as a, Ledger(a.store.url) as b:
        run = a.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")  # a remembers the head
        lease = b.claim(run, "w1")  # b moves it; only b has written a claimed run's rows
        a.store.append(run, [HeartbeatRecorded()], actor=Actor("worker", "w1"))  # a's guess: refused, then written
        assert a.store.diagnostics()["guessed_writes"] == {"sent": 1, "refused": 1}
        assert a.checkpoint(run).worker == "w1" and a.checkpoint(run).lease == lease.lease
        assert a.check() == [] and a.verify() == []


def test_a_batch_of_several_id_blocks_reports_its_own_positions(monkeypatch):
    """A batch of more than one block of ids (1,024) takes its blocks one after another,
    and another writer's block can fall between them; sealed in write-id order, that
    writer's events land among the batch's positions. The batch must report the
    positions of its own events (read, not counted on), and every one of them."""
    import psycopg

    from handoff.ledger import events as ev
    from handoff.ledger.postgres.store import _LEDGER_NS, _SEAL, PostgresStore
    from handoff.ledger.store import Actor

    w = Actor("worker", "w")
    url = fresh_url()
    with PostgresStore(url) as a, PostgresStore(url, busy_timeout_s=0.2) as b:
        real_x = PostgresStore.x

        def x(self, sql, args=None, **kw):  # a takes its second block: b writes in between
            if self is a and "generate_series" in sql and not done:
                done.append(1)
                with psycopg.connect(url) as sealer:  # sealing: b's events wait in the queue
                    sealer.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LEDGER_NS, _SEAL))
                    b.append("other", [ev.HeartbeatRecorded()] * 3, actor=w)
            return real_x(self, sql, args, **kw)

        done: list[int] = []
        monkeypatch.setattr(PostgresStore, "x", x)
        result = a.append("big", [ev.HeartbeatRecorded()] * 1100, actor=w)
        monkeypatch.undo()
        assert done
        mine = [r.position for r in a.read_run("big")]
        assert list(result.positions) == mine and len(mine) == 1100
        assert a.verify() == []


def test_a_hook_that_reads_positions_gets_whole_numbers_and_no_guess():
    """A guessed write knows its ids only on the server: a hook attached without saying
    it leaves the position alone (the default) turns guessing off, and gets integers."""
    from handoff.projections import engine

    seen = []
    with Ledger(fresh_url()) as lg:
        lg.store.attach(engine.AGGREGATE, lambda txn, run_id, state, last_position: seen.append(last_position))
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.heartbeat(run, lease)
        lg.heartbeat(run, lease)
        assert lg.store.diagnostics()["guessed_writes"] == {"sent": 0, "refused": 0}
    assert len(seen) == 4 and all(type(p) is int for p in seen)
