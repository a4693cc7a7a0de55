"""Fold properties: one by one == all at once, prefix == as-of, a + b composes, determinism.

Two sources of histories: arbitrary events (legal or not: the folds must be total), and
histories the real ledger accepted from random commands (what folds meet in practice).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import Actor, Ledger
from handoff.ledger import errors as E
from handoff.reducers import delivery, stall
from handoff.reducers import commands as C
from handoff.reducers.checkpoint import evolve, fold, initial, packet
from handoff.testing import LedgerMachine, as_records, events, issued

NOW = 1_700_000_000_000_000 + 10**9
histories = st.lists(events(), max_size=40).map(as_records)


def _by_one(records, run_id="r1"):
    return functools.reduce(evolve, records, initial(run_id))


@settings(max_examples=200, deadline=None)
@given(histories)
def test_folding_one_by_one_equals_folding_the_whole(records):
    assert fold(records, "r1") == _by_one(records)


@settings(max_examples=200, deadline=None)
@given(histories, st.data())
def test_a_prefix_fold_is_the_state_as_of_that_seq(records, data):
    k = data.draw(st.integers(0, len(records)))
    assert fold(records, "r1", until_seq=k) == fold(records[:k], "r1")


@settings(max_examples=200, deadline=None)
@given(histories, st.data())
def test_fold_of_a_then_b_is_evolve_from_fold_a_over_b(records, data):
    cut = data.draw(st.integers(0, len(records)))
    a, b = records[:cut], records[cut:]
    assert functools.reduce(evolve, b, fold(a, "r1")) == fold(records, "r1")


@settings(max_examples=200, deadline=None)
@given(histories)
def test_the_three_views_are_deterministic(records):
    one, two = fold(records, "r1"), fold(list(records), "r1")
    assert one == two
    assert stall.fold(records) == stall.fold(records) == one.watch
    assert delivery.fold(records) == delivery.fold(records) == one.delivery
    assert stall.classify(one, now_us=NOW) == stall.classify(two, now_us=NOW)
    assert delivery.status(one.delivery, ready=one.delivery_ready, now_us=NOW, timeout_s=600) == \
        delivery.status(two.delivery, ready=two.delivery_ready, now_us=NOW, timeout_s=600)
    assert packet(one, now_us=NOW) == packet(two, now_us=NOW)


@settings(max_examples=100, deadline=None)
@given(histories)
def test_decoding_is_not_needed_twice(records):
    """evolve with the event passed in (already decoded) equals evolve that decodes."""
    cp1 = cp2 = initial("r1")
    for rec in records:
        cp1 = evolve(cp1, rec)
        cp2 = evolve(cp2, rec, rec.event)
    assert cp1 == cp2


# --- histories the ledger really accepted ----------------------------------------------


def _accepted_history(tmp, steps):
    """Run random commands against a fresh ledger; keep what it accepted."""
    lg = Ledger(os.path.join(tmp, "l.db"), synchronous="NORMAL")
    for run_id in ("r1", "r2"):
        lg.open(goal="g", target="chat:#ops", owner="alice", run_id=run_id)
        lg.claim(run_id, "w1")
    for run_id, actor, cmd in steps:
        try:
            lg.execute(run_id, cmd, actor=actor)
        except E.LedgerError:
            pass
    return lg


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(issued(run_ids=("r1", "r2")), min_size=1, max_size=40))
def test_store_histories_fold_the_same_every_way(steps):
    tmp = tempfile.mkdtemp(prefix="handoff-fold-")
    lg = _accepted_history(tmp, steps)
    try:
        _check_every_way(lg)
        assert lg.verify() == []
    finally:
        lg.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _check_every_way(lg):
    for head in lg.store.list_runs():
        run_id = head.run_id
        hist = list(lg.store.history(run_id))
        whole = fold(hist, run_id)
        assert whole == _by_one(hist, run_id) == lg.checkpoint(run_id)
        assert stall.fold(hist) == whole.watch and delivery.fold(hist) == whole.delivery
        for rec in (r for r in hist if r.run_id == run_id):
            as_of = lg.checkpoint(run_id, at_seq=rec.seq)
            prefix = [r for r in hist if r.run_id != run_id or r.seq <= rec.seq]
            assert as_of == fold(prefix, run_id) == fold(hist, run_id, until_seq=rec.seq)
        for cut in range(0, len(hist) + 1, max(1, len(hist) // 5)):
            assert functools.reduce(evolve, hist[cut:], fold(hist[:cut], run_id)) == whole


MOVES = ["drive", "drive", "lose_lease_mid_effect", "stale_worker_returns", "fork", "close", "block"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(MOVES), st.integers(0, 30)), min_size=1, max_size=10))
def test_machine_histories_fold_the_same_every_way(plan):
    """The state machine as a generator of long, mostly-accepted histories (forks included)."""
    m = LedgerMachine()
    try:
        runs = [m.first_run(), m.reviewed_run()]
        for move, n in plan:
            run = runs[n % len(runs)]
            if move == "drive":
                m.drive(run, steps=n, choice=n)
            elif move == "fork":
                child = m.fork(parent=run, pick=n, beyond=False, whom="operator")
                if isinstance(child, str):
                    runs.append(child)
            elif move == "close":
                m.close(run, disposition="no_op", whom="owner", keep=True)
            elif move == "block":
                m.block(run, whom="owner")
            else:
                getattr(m, move)(run, *(["done", bool(n % 2)] if move == "lose_lease_mid_effect" else ["w2"]))
        _check_every_way(m.ledger)
        assert m.ledger.verify() == []
    finally:
        m.teardown()


def test_a_forked_run_folds_its_parents_prefix_then_its_own_events(tmp_path):
    lg = Ledger(str(tmp_path / "l.db"), synchronous="NORMAL")
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id="p")
    lease = lg.claim("p", "w1")
    lg.transition("p", lease, "planning", worker="w1")
    lg.progress("p", lease, "plan_committed", worker="w1")
    lg.transition("p", lease, "executing", worker="w1")
    child = lg.fork("p", 4, new_run_id="c")
    cp = lg.checkpoint(child)
    parent_then = lg.checkpoint("p", at_seq=4)
    assert cp.state == parent_then.state == "planning"
    assert cp.progress_seq == parent_then.progress_seq
    assert cp.lease is None and cp.worker is None, "a fork inherits no lease"
    assert cp.watch.last_heartbeat_us is None and cp.watch.watcher is None, "nor timers or watchers"
    assert (cp.fork_parent, cp.fork_seq, cp.last_seq) == ("p", 4, 1)
    hist = list(lg.store.history(child))
    assert [r.run_id for r in hist] == ["p"] * 4 + ["c"]
    assert fold(hist, child) == cp
    lg.execute(child, C.Observe(classification="healthy", progress_seq=cp.progress_seq), actor=Actor("watchdog", "dog"))
    assert lg.checkpoint(child, at_seq=1) == cp
    lg.close()


def test_the_checkpoint_keeps_the_latest_evidence_of_each_kind_and_the_log_keeps_all():
    from handoff.ledger import events as ev

    runs = [("tests", "pass"), ("lint", "fail"), ("tests", "fail"), ("types", "pass"), ("tests", "pass")]
    records = as_records([ev.EvidenceRecorded(kind=k, outcome=o, detail=f"run {i}") for i, (k, o) in enumerate(runs)])
    cp = fold(records, "r1")
    # A later record of a kind replaces the earlier one and moves to the end, as artifacts do.
    assert [(e.kind, e.outcome, e.detail, e.seq) for e in cp.evidence] == [
        ("lint", "fail", "run 1", 2), ("types", "pass", "run 3", 4), ("tests", "pass", "run 4", 5),
    ]
    assert not cp.evidence_ok  # lint's latest outcome is a failure
    more = as_records([*(ev.EvidenceRecorded(kind=k, outcome=o, detail=f"run {i}") for i, (k, o) in enumerate(runs)),
                       ev.EvidenceRecorded(kind="lint", outcome="pass", detail="run 5")])
    assert fold(more, "r1").evidence_ok
    assert [e.kind for e in fold(more, "r1").evidence] == ["types", "tests", "lint"]
    # However long the history, the packet holds one record per kind.
    long = as_records([ev.EvidenceRecorded(kind=("tests", "lint")[i % 2], outcome="pass") for i in range(2_000)])
    assert len(fold(long, "r1").evidence) == 2
    assert packet(fold(long, "r1"), now_us=NOW)["evidence"][-1]["seq"] == 2_000
