"""Writers taking turns on PostgreSQL: a write is decided from the head it read without a
lock and written only onto that head (handoff_append refuses it otherwise, and it is
decided again). The shared stateful machine (handoff.testing) runs here on a PostgreSQL
ledger, its commands alternating between two stores and a third racing (``other``), with
rebuilds at any step: after every step the views equal a fresh fold of the log, the model
agrees, and the chains verify."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from handoff.facade import Ledger
from handoff.projections import engine
from handoff.testing import LedgerMachine
from tests.pg import fresh_url

FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"


class PostgresLedgerMachine(LedgerMachine):
    """Two stores on one ledger take turns: every command goes through the other one than
    the command before, so each store's fold cache is behind the run all the time. A
    third store races (``other``)."""

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


def test_a_write_whose_run_moved_after_its_read_is_decided_again_from_the_new_head():
    """Between a write's read and its write another store commits to the run: the server
    writes nothing and answers with the run as it now is, the command is decided again
    from that, and lands after the other's event. ``decide`` runs between the two round
    trips, which lets the test put the other write exactly there."""
    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor, Decision

    from handoff.projections import engine

    w = Actor("worker", "w1")
    with Ledger(fresh_url()) as a, Ledger(a.store.url) as b:
        run = b.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")  # a reads the run first
        seen: list[int] = []

        def decide(state, head):
            seen.append(head.last_seq)
            if len(seen) == 1:
                b.store.append(run, [ev.HeartbeatRecorded()], actor=w)
            return Decision([ev.HeartbeatRecorded()])

        result, _ = a.store.execute(run, engine.AGGREGATE, decide, actor=w)
        assert seen == [1, 2]  # decided twice: from seq 1, then from b's seq 2
        assert (result.first_seq, result.last_seq) == (3, 3)
        assert a.store.diagnostics()["writes_decided_again"] == 1
        assert [r.seq for r in a.store.read_run(run)] == [1, 2, 3]
        assert a.check() == [] and a.verify() == []


def test_a_run_that_keeps_moving_ends_the_write_after_the_lock_timeout_with_nothing_written():
    """Decided again and again, never landing: after busy_timeout_s the write gives up with
    StoreUnavailable, and nothing of it is in the log."""
    import pytest

    from handoff.ledger import events as ev
    from handoff.ledger.errors import StoreUnavailable
    from handoff.ledger.store import Actor, Decision
    from handoff.projections import engine

    w = Actor("worker", "w1")
    with Ledger(fresh_url(), busy_timeout_s=0.5) as a, Ledger(a.store.url) as b:
        run = a.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")

        def decide(state, head):
            b.store.append(run, [ev.HeartbeatRecorded()], actor=w)  # always one step ahead
            return Decision([ev.EvidenceRecorded(kind="never-lands", outcome="pass")])

        before = len(list(a.store.read_run(run)))
        with pytest.raises(StoreUnavailable, match="kept changing under this write"):
            a.store.execute(run, engine.AGGREGATE, decide, actor=w)
        types = [r.type for r in a.store.read_run(run)]
        assert "evidence_recorded" not in types and len(types) > before  # b's beats only
        assert a.verify() == []


def test_a_batch_of_several_id_blocks_reports_its_own_positions(monkeypatch):
    """A batch of more than one block of ids (1,024) takes its blocks one after another,
    and another writer's block can fall between them; sealed in write-id order, that
    writer's events land among the batch's positions. The batch must report the
    positions of its own events (read, not counted on), and every one of them."""
    import psycopg

    from handoff.ledger import events as ev
    from handoff.ledger.postgres.postgres_schema import SEAL_LOCK
    from handoff.ledger.postgres.postgres_store import PostgresStore
    from handoff.ledger.store import Actor

    w = Actor("worker", "w")
    url = fresh_url()
    with PostgresStore(url) as a, PostgresStore(url, busy_timeout_s=0.2) as b:
        real_x = PostgresStore.x

        def x(self, sql, args=None, **kw):  # a takes its second block: b writes in between
            if self is a and "generate_series" in sql and not done:
                done.append(1)
                with psycopg.connect(url) as sealer:  # sealing: b's events wait in the queue
                    sealer.execute(SEAL_LOCK)
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


def test_a_hook_that_reads_positions_gets_whole_numbers():
    """A hook is given the write's last write id, a whole number, on every write (and a beat
    kept beside the log is no write of the log: no hook runs for it)."""
    from handoff.projections import engine

    seen = []
    with Ledger(fresh_url()) as lg:
        lg.store.attach(engine.AGGREGATE, lambda txn, run_id, state, last_position: seen.append(last_position))
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        # beats whose attrs change are logged, each a write of its own
        assert lg.heartbeat(run, lease, attrs={"step": 1}).result.outcome == "committed"
        assert lg.heartbeat(run, lease, attrs={"step": 2}).result.outcome == "committed"
        assert lg.heartbeat(run, lease, attrs={"step": 2}).result.outcome == "unchanged"
    assert len(seen) == 4 and all(type(p) is int for p in seen)


def test_a_decision_reads_views_only_by_counting_equal_values():
    """On PostgreSQL a decision that reads a view is checked again by handoff_append under
    the views lock, which it can do only for a count by equal values. Reading rows, or
    counting in order, after a key or by a value that is not text or a whole number, is
    refused with InvalidInput naming the view, and nothing is written."""
    import pytest

    from handoff.ledger import events as ev
    from handoff.ledger.errors import InvalidInput
    from handoff.ledger.store import Actor, Decision

    w = Actor("worker", "w1")
    with Ledger(fresh_url()) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        views = lg.store.views
        reads = {
            "rows": lambda: views.select("checkpoints", ["run_id"], where={"run_id": run}),
            "in order": lambda: views.count("checkpoints", where={"owner": "alice"}, order=["run_id"]),
            "after a key": lambda: views.count("checkpoints", where={"owner": "alice"}, after=("r0",)),
            "a flag": lambda: views.count("checkpoints", where={"terminal": True}),
            "a fraction": lambda: views.count("checkpoints", where={"owner": 1.5}),
        }
        before = [(r.seq, r.payload) for r in lg.log(run)]
        for what, read in reads.items():
            def decide(state, head, read=read):
                read()
                return Decision([ev.HeartbeatRecorded()])

            with pytest.raises(InvalidInput) as err:
                lg.store.execute(run, engine.AGGREGATE, decide, actor=w)
            assert err.value.field == "view", what
            assert [(r.seq, r.payload) for r in lg.log(run)] == before, what
        # A count by equal values is what a decision may read: it lands.
        def counted(state, head):
            assert views.count("checkpoints", where={"owner": "alice"}) == 1
            return Decision([ev.HeartbeatRecorded()])

        result, _ = lg.store.execute(run, engine.AGGREGATE, counted, actor=w)
        assert result.outcome == "committed" and lg.verify() == []
