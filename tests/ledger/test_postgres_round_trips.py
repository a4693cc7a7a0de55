"""A command costs at most two round trips to the server, and one when the session knows
the run's head (its own last write or read of it): counted on the wire, by the proxy the
pg-round-trips benchmark counts with (benchmarks/postgres_proxy.py), so the test and the
benchmark count the same thing."""

from __future__ import annotations

import pytest

from handoff.facade import Ledger
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


def test_a_command_on_a_run_the_session_knows_is_one_round_trip_and_so_is_a_repeated_key(proxied):
    """A command decided from the head this session's last write left is one message,
    COMMIT included. A repeated key is answered 'duplicate' from what handoff_append
    answers instead of writing: one round trip too, nothing written."""
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
        assert [r.seq for r in lg.log(run)][-1] == 6  # the beat was kept beside the log; the repeat wrote nothing
        assert lg.store.diagnostics()["writes_decided_again"] == 0
    assert costs == {"heartbeat": 1, "progress": 1, "transition": 1, "keyed": 1, "keyed repeat": 1}, costs


def test_two_processes_taking_turns_on_a_run_pay_two_round_trips_each(proxied):
    """Each write is decided from the head its session last saw, which the other moved:
    handoff_append writes nothing and answers with the run as it is, and the write is
    decided again from that. Two round trips each, and every write lands once, in order,
    on the chain."""
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
    one round trip, nothing written. A heartbeat tries its own statement first (which
    cannot say why it was refused), then the command path's read names the reason: two."""
    from handoff.ledger.errors import StaleLease

    proxy, url = proxied
    with Ledger(url) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.release(run, lease)
        before, live = lg.store.head(run), lg.store.liveness([run])
        for write, cost in ((lambda: lg.transition(run, lease, "planning"), 1), (lambda: lg.heartbeat(run, lease), 2)):
            proxy.mark()
            with pytest.raises(StaleLease):
                write()
            assert proxy.since_mark()[0] == cost
        assert lg.store.head(run) == before and lg.store.liveness([run]) == live


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
    """The first append to a run this session has not seen reads it first; the next are
    decided from the head the last one left."""
    proxy, url = proxied
    with PostgresStore(url) as store:
        for n, cost in ((1, 2), (1, 1), (3, 1)):
            assert _cost(proxy, lambda: store.append("a", [ev.HeartbeatRecorded()] * n,
                                                     actor=Actor("worker", "w"))) == cost
        assert [r.seq for r in store.read_run("a")] == [1, 2, 3, 4, 5]
        assert store.verify() == []


def test_a_store_append_under_the_ledgers_projections_is_one_round_trip(proxied):
    """The views' rows go with the batch, in the same call: no round trip of their own."""
    proxy, url = proxied
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        store = lg.store
        store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
        assert _cost(proxy, lambda: store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))) == 1
        assert lg.check() == []


def test_a_write_that_finds_another_session_sealing_costs_one_round_trip_more(proxied):
    """handoff_append could not seal (the seal lock was taken), so its events were queued
    and committed: the next round trip waits for the seal and returns their positions.
    Two round trips from what the session knew, positions included (a write that seals
    itself, the common case, sends nothing after its COMMIT)."""
    import threading

    import psycopg

    from handoff.ledger.postgres.postgres_schema import SEAL_LOCK

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


def test_a_write_whose_seal_finds_the_server_gone_after_its_commit_is_reported_committed(proxied):
    """A write queued behind another session's seal commits in its first message; the
    server then goes away (the proxy closes: the connection drops and a new one is
    refused) before the second message seals it. The write is stored, so the command
    reports it committed (its positions unknown, ()), never StoreUnavailable's "nothing
    was written": a refusal must leave the log unchanged. Once the server is back, the
    next reader seals it."""
    import psycopg

    from handoff.ledger.postgres.postgres_schema import SEAL_LOCK

    proxy, url = proxied
    direct = url.replace(f"127.0.0.1:{proxy.port}", "127.0.0.1:5432")
    w = Actor("worker", "w")

    class CutAfterCommit(PostgresStore):
        cut = False

        def _message(self, sql, args):
            out = super()._message(sql, args)
            if self.cut and sql.rstrip().endswith("COMMIT"):
                sealer.execute("ROLLBACK")  # (the seal lock goes with the server)
                proxy.close()
            return out

    with CutAfterCommit(url, connect_timeout_s=1) as store, psycopg.connect(direct, autocommit=True) as sealer:
        store.append("a", [ev.HeartbeatRecorded()], actor=w)
        sealer.execute("BEGIN")
        sealer.execute(SEAL_LOCK)  # handoff_append cannot seal: it queues the event
        store.cut = True
        got = store.append("a", [ev.HeartbeatRecorded()], actor=w, idempotency_key="k2")
        assert got.outcome == "committed" and got.last_seq == 2 and got.positions == ()
    with PostgresStore(direct) as back:
        assert [r.seq for r in back.read_run("a")] == [1, 2]
        assert [r.position for r in back.read_all()] == [1, 2] and back.unsealed_count() == 0
        assert back.verify() == []


def test_a_check_that_fails_on_what_the_session_remembers_is_made_again_on_a_read(proxied):
    """The session remembers lease 1; another process released it and granted lease 2,
    whose token this session now shows. Only the server's head may refuse a write: the
    check is made again on a read, and the transition lands (a read and a write)."""
    proxy, url = proxied
    with Ledger(url) as a, Ledger(url) as b:
        run = a.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        first = a.claim(run, "w1")  # a knows the run at lease 1
        b.release(run, first)
        second = b.claim(run, "w2")
        assert _cost(proxy, lambda: a.transition(run, second, "planning", worker="w2")) == 2
        assert a.checkpoint(run).lease == b.checkpoint(run).lease and a.checkpoint(run).last_seq == 5
        assert a.verify() == []


def test_the_values_of_a_write_that_found_its_run_moved_are_not_kept(proxied):
    """A graph checkpoint decided from the head the session remembers, after another
    process revoked the lease: handoff_append writes nothing, so the values in the same
    message are not kept either, and decided again the write is refused. Neither the
    log nor the values change."""
    from handoff.ledger.errors import StaleLease
    from handoff.ledger.store import value_digest

    proxy, url = proxied
    with Ledger(url) as a, Ledger(url) as b:
        run = a.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = a.claim(run, "w1")
        a.heartbeat(run, lease)
        b.revoke(run, "replaced", by="alice")
        before = [r.seq for r in a.log(run)]
        blob = b"a checkpoint's value"
        with pytest.raises(StaleLease):
            a.save_graph_checkpoint(run, thread_id="t", checkpoint_id="c1", checkpoint={}, metadata={},
                                    values={"ch": value_digest(blob)}, new_values=[blob], lease=str(lease))
        assert [r.seq for r in a.log(run)] == before
        assert a.store.value_digests(run) == {}
        assert a.store.diagnostics()["writes_from_memory_moved"] == 1


def test_nothing_to_add_is_said_only_of_the_run_as_the_server_has_it(proxied):
    """Session a remembers side effect 'send' as pending; another process settled it. From
    memory, starting 'send' again would be 'unchanged'; on the server's run it is a
    conflict (the key was used and settled). The store asks the server before it answers:
    IdempotencyConflict, nothing written."""
    from handoff.ledger.errors import IdempotencyConflict

    proxy, url = proxied
    with Ledger(url) as a, Ledger(url) as b:
        run = a.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = a.claim(run, "w1")
        a.transition(run, lease, "planning")
        a.effect_start(run, lease, "send", "email the report")
        b.effect_confirm(run, "send", "done", lease=lease)
        before = [(r.seq, r.payload) for r in a.log(run)]
        with pytest.raises(IdempotencyConflict, match="already used and settled"):
            a.effect_start(run, lease, "send", "email the report")
        assert [(r.seq, r.payload) for r in a.log(run)] == before
        # Unchanged on the run as the server has it: answered after a read, within two.
        assert _cost(proxy, lambda: a.effect_confirm(run, "send", "done", lease=lease)) <= 2
        assert [(r.seq, r.payload) for r in a.log(run)] == before
