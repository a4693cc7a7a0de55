"""Each projection's rows after ordinary commands, through the real Ledger on a real file."""

from __future__ import annotations

import sqlite3

import pytest

from handoff import Ledger
from handoff.ledger.errors import CapacityExceeded, LedgerError
from handoff.projections import engine, queries, view_rows
from handoff.reducers import delivery as dl
from handoff.reducers import liveness
from handoff.reducers.checkpoint import AGGREGATE

from tests.support import S

from projection_support import dump


@pytest.fixture
def result_file(tmp_path):
    p = tmp_path / "result.md"
    p.write_text("the report\n")
    return str(p)


def row(clocked_lg: Ledger, table: str, run_id: str, **extra: str) -> dict | None:
    conn = sqlite3.connect(clocked_lg.store.path)
    conn.row_factory = sqlite3.Row
    try:
        where = " AND ".join(["run_id=?", *(f"{k}=?" for k in extra)])
        r = conn.execute(f"SELECT * FROM {table} WHERE {where}", (run_id, *extra.values())).fetchone()
        return None if r is None else dict(r)
    finally:
        conn.close()


def rows(clocked_lg: Ledger, table: str, run_id: str) -> list[dict]:
    conn = sqlite3.connect(clocked_lg.store.path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} WHERE run_id=?", (run_id,))]
    finally:
        conn.close()


def assert_checkpoint_row(clocked_lg: Ledger, run_id: str) -> dict:
    """The row's columns and packet say exactly what a fresh fold of the log says."""
    cp = clocked_lg.store.fold(run_id, AGGREGATE)
    head = clocked_lg.store.head(run_id)
    r = row(clocked_lg, "checkpoints", run_id)
    assert r is not None
    assert view_rows.decode_checkpoint(r["packet"]) == cp
    assert r["packet"] == view_rows.encode_checkpoint(cp)
    assert (r["state"], r["owner"], r["target"], r["worker"], r["lease"]) == (
        cp.state, cp.owner, cp.target, cp.worker, cp.lease)
    assert r["terminal"] == int(cp.terminal)
    assert r["progress_seq"] == cp.progress_seq
    assert r["last_seq"] == cp.last_seq == head.last_seq
    assert "last_position" not in r  # the run's position lives in the heads table alone
    assert head.last_position <= clocked_lg.store.last_position()
    assert r["updated_us"] == cp.last_event_us
    assert r["fork_parent"] == cp.fork_parent
    # The API's read path is the view joined with the beat kept beside the log, and it
    # must agree with the log's fold joined the same way.
    now = liveness.overlay(cp, clocked_lg.store.liveness([run_id]).get(run_id))
    assert clocked_lg.checkpoint(run_id) == now
    assert queries.checkpoint(clocked_lg.store, run_id) == now
    return r


def drive_to_verifying(clocked_lg: Ledger, run_id: str, lease: int, result_file: str) -> None:
    clocked_lg.transition(run_id, lease, "planning")
    clocked_lg.progress(run_id, lease, "plan_committed")
    clocked_lg.transition(run_id, lease, "executing")
    clocked_lg.progress(run_id, lease, "tool_outcome", "ran it")
    clocked_lg.artifact(run_id, lease, result_file)
    clocked_lg.transition(run_id, lease, "verifying")


def drive_to_succeeded(clocked_lg: Ledger, run_id: str, lease: int, result_file: str) -> None:
    drive_to_verifying(clocked_lg, run_id, lease, result_file)
    clocked_lg.evidence(run_id, "tests", "pass", lease=lease)
    clocked_lg.submit(run_id, lease, "done")


# --- checkpoints ---------------------------------------------------------------------


def test_checkpoints_row_follows_every_command(clocked_lg, clock, result_file):
    run = clocked_lg.open(goal="Draft the report", target="chat:#ops", owner="alice", run_id="r1")
    r = assert_checkpoint_row(clocked_lg, run)
    assert clocked_lg.store.head(run).last_position == clocked_lg.store.last_position()
    assert (r["state"], r["owner"], r["lease"], r["worker"], r["terminal"]) == ("queued", "alice", None, None, 0)
    assert r["updated_us"] == clock()

    clock.advance(1)
    lease = clocked_lg.claim(run, "w1")
    r = assert_checkpoint_row(clocked_lg, run)
    assert (r["lease"], r["worker"], r["state"]) == (lease.lease, "w1", "queued")

    clock.advance(1)
    clocked_lg.transition(run, lease, "planning")
    clocked_lg.progress(run, lease, "plan_committed")
    r = assert_checkpoint_row(clocked_lg, run)
    assert r["state"] == "planning"
    assert r["progress_seq"] == 2  # the state change and the plan both advance
    clock.advance(1)
    out = clocked_lg.heartbeat(run, lease)  # the lease's first beat: kept beside the log
    assert out.result.outcome == "unchanged"
    assert assert_checkpoint_row(clocked_lg, run) == r  # no event, so the row is as it was
    assert clocked_lg.checkpoint(run).watch.last_heartbeat_us == clock()
    clock.advance(31)  # a silence longer than half the 60 s timeout: the next beat is logged
    out = clocked_lg.heartbeat(run, lease)
    assert out.result.outcome == "committed"
    r2 = assert_checkpoint_row(clocked_lg, run)
    assert r2["progress_seq"] == 2 and r2["updated_us"] == clock()
    assert clocked_lg.checkpoint(run).watch.last_heartbeat_us == clock()

    clocked_lg.transition(run, lease, "executing")
    clocked_lg.artifact(run, lease, result_file)
    clocked_lg.block(run, "needs a token", "ask ops", lease=lease)
    assert assert_checkpoint_row(clocked_lg, run)["state"] == "blocked"
    clocked_lg.unblock(run, "got it", lease=lease)
    assert assert_checkpoint_row(clocked_lg, run)["state"] == "executing"

    clocked_lg.release(run, lease)
    r = assert_checkpoint_row(clocked_lg, run)
    assert (r["lease"], r["worker"], r["state"]) == (None, None, "executing")

    lease2 = clocked_lg.claim(run, "w2")
    assert lease2.lease == lease.lease + 1
    assert assert_checkpoint_row(clocked_lg, run)["lease"] == lease2.lease

    clocked_lg.close_run(run, "cancelled", "not needed", by="alice")
    r = assert_checkpoint_row(clocked_lg, run)
    assert (r["state"], r["terminal"], r["lease"]) == ("cancelled", 1, None)
    assert clocked_lg.check() == []


def test_refused_command_leaves_the_views_alone(clocked_lg):
    run = clocked_lg.open(goal="g", target="t", owner="alice", run_id="r1")
    lease = clocked_lg.claim(run, "w1")
    before = dump(clocked_lg.store.path)
    with pytest.raises(LedgerError):
        clocked_lg.transition(run, lease, "succeeded")  # not a legal move
    with pytest.raises(LedgerError):
        clocked_lg.heartbeat(run, f"{lease.lease + 7}.{lease.secret}")  # a lease never issued
    with pytest.raises(LedgerError):
        clocked_lg.heartbeat(run, lease.lease)  # a bare number
    assert dump(clocked_lg.store.path) == before


def test_fork_row_names_its_parent(clocked_lg, clock):
    run = clocked_lg.open(goal="g", target="t", owner="alice", run_id="parent")
    lease = clocked_lg.claim(run, "w1")
    clocked_lg.transition(run, lease, "planning")
    child = clocked_lg.fork(run, 3, new_run_id="child", by="op")
    r = assert_checkpoint_row(clocked_lg, child)
    assert (r["fork_parent"], r["state"], r["lease"], r["owner"]) == ("parent", "planning", None, "alice")
    # The parent moving on does not change the child's row, and both stay consistent.
    clocked_lg.transition(run, lease, "executing")
    assert assert_checkpoint_row(clocked_lg, child)["state"] == "planning"
    assert_checkpoint_row(clocked_lg, run)
    assert clocked_lg.check() == []


# --- stall_watch -----------------------------------------------------------------------


def stall_row(clocked_lg: Ledger, run_id: str) -> dict:
    r = row(clocked_lg, "stall_watch", run_id)
    assert r is not None
    cp = clocked_lg.store.fold(run_id, AGGREGATE)
    assert r == view_rows.stall_row(cp)
    return r


def test_stall_watch_deadlines(clocked_lg, clock):
    run = clocked_lg.open(goal="g", target="t", owner="alice", run_id="r1",
                  heartbeat_timeout_s=60, progress_timeout_s=300)
    r = stall_row(clocked_lg, run)
    assert (r["live"], r["state"], r["lease"], r["next_deadline_us"]) == (1, "queued", None, None)
    assert queries.due_run_ids(clocked_lg.store, clock() + 10**12) == []

    t1 = clock.advance(5)
    lease = clocked_lg.claim(run, "w1")
    r = stall_row(clocked_lg, run)
    assert (r["lease"], r["lease_since_us"], r["last_heartbeat_us"]) == (lease.lease, t1, t1)
    # Attention starts strictly after the heartbeat timeout: at +60 s + 1 µs.
    assert r["next_deadline_us"] == t1 + 60 * S + 1
    nd = r["next_deadline_us"]
    assert run not in queries.due_run_ids(clocked_lg.store, nd - 1)
    assert run in queries.due_run_ids(clocked_lg.store, nd)
    assert clocked_lg.stalls(now=nd - 1) == []
    [(cp, health)] = clocked_lg.stalls(now=nd)
    assert (cp.run_id, health.classification) == (run, "unavailable")

    # Heartbeats push the liveness deadline; progress never moves, so the progress
    # deadline (lease start + 300 s) eventually comes first.
    for k in range(1, 6):
        clock.advance(59)
        clocked_lg.heartbeat(run, lease)
    r = stall_row(clocked_lg, run)
    assert r["last_heartbeat_us"] == t1 + 5 * 59 * S
    assert r["next_deadline_us"] == t1 + 300 * S + 1
    [(_, health)] = clocked_lg.stalls(now=t1 + 300 * S + 1)
    assert health.classification == "stalled"

    # Advancing progress resets the progress clock.
    t2 = clock.advance(1)
    clocked_lg.transition(run, lease, "planning")
    r = stall_row(clocked_lg, run)
    assert (r["progress_seq"], r["last_progress_kind"], r["last_progress_us"]) == (1, "state:planning", t2)
    assert r["next_deadline_us"] == min(r["last_heartbeat_us"] + 60 * S + 1, t2 + 300 * S + 1)

    # Watchdog observations of a stall count repeats (the retry count column).
    clocked_lg.observe(run, "stalled", progress_seq=1, watcher="wd")
    clocked_lg.observe(run, "stalled", progress_seq=1, watcher="wd")
    assert stall_row(clocked_lg, run)["retry_count"] == 2

    # Blocked: no deadline at all; unblocked: the clocks are back.
    clocked_lg.block(run, "waiting on ops", "ping ops", lease=lease)
    assert stall_row(clocked_lg, run)["next_deadline_us"] is None
    assert run not in queries.due_run_ids(clocked_lg.store, clock() + 10**12)
    clocked_lg.unblock(run, "ops answered", lease=lease)
    assert stall_row(clocked_lg, run)["next_deadline_us"] is not None

    # A pending side effect whose lease is lost: attention now, whatever the time.
    clocked_lg.effect_start(run, lease, "send-1", "send an email")
    assert stall_row(clocked_lg, run)["pending_effects"] == 1
    clocked_lg.revoke(run, "worker vanished")
    r = stall_row(clocked_lg, run)
    assert (r["state"], r["lease"], r["next_deadline_us"]) == ("unknown", None, 0)
    assert run in queries.due_run_ids(clocked_lg.store, 0)
    [(_, health)] = clocked_lg.stalls(now=clock())
    assert health.classification == "needs_reconciliation"

    clocked_lg.effect_confirm(run, "send-1", "absent", note="checked the outbox")
    assert stall_row(clocked_lg, run)["next_deadline_us"] == 0  # still unknown: needs a worker

    clocked_lg.close_run(run, "failed", "gave up", by="alice")
    r = stall_row(clocked_lg, run)
    assert (r["live"], r["next_deadline_us"]) == (0, None)
    assert queries.due_run_ids(clocked_lg.store, clock() + 10**12) == []
    assert clocked_lg.stalls(now=clock() + 10**12) == []


def test_unclaimed_working_run_is_due_at_once(clocked_lg, clock):
    run = clocked_lg.open(goal="g", target="t", owner="alice", run_id="r1")
    lease = clocked_lg.claim(run, "w1")
    clocked_lg.transition(run, lease, "planning")
    clocked_lg.release(run, lease, "handing off")
    r = stall_row(clocked_lg, run)
    assert (r["lease"], r["lease_since_us"], r["next_deadline_us"]) == (None, None, 0)
    [(_, health)] = clocked_lg.stalls(now=clock())
    assert health.classification == "unclaimed"


# --- deliveries --------------------------------------------------------------------------


def delivery_row(clocked_lg: Ledger, run_id: str) -> dict:
    [r] = rows(clocked_lg, "deliveries", run_id)
    assert r == view_rows.delivery_row(clocked_lg.store.fold(run_id, AGGREGATE))
    return r


def test_delivery_status_transitions(clocked_lg, clock, result_file):
    run = clocked_lg.open(goal="g", target="chat:#ops", owner="alice", run_id="r1", delivery_timeout_s=600)
    assert delivery_row(clocked_lg, run)["status"] == "not_ready"
    lease = clocked_lg.claim(run, "w1")
    drive_to_verifying(clocked_lg, run, lease, result_file)
    assert delivery_row(clocked_lg, run)["status"] == "not_ready"
    clocked_lg.evidence(run, "tests", "pass", lease=lease)
    clocked_lg.submit(run, lease, "done")
    r = delivery_row(clocked_lg, run)
    assert (r["status"], r["target"], r["attempts"], r["key"]) == ("ready", "chat:#ops", 0, None)
    assert [d["run_id"] for d in clocked_lg.deliveries(status="pending")] == [run]

    t_attempt = clock.advance(2)
    clocked_lg.deliver(run, "k1", by="alice")
    r = delivery_row(clocked_lg, run)
    assert (r["status"], r["key"], r["attempts"], r["attempted_us"]) == ("attempted", "k1", 1, t_attempt)
    assert r["ambiguous_after_us"] == t_attempt + 600 * S

    # "ambiguous" is judged at query time, strictly after the timeout, like reducers.delivery.
    for now, expect in ((t_attempt + 600 * S, "attempted"), (t_attempt + 600 * S + 1, "ambiguous")):
        [d] = queries.deliveries(clocked_lg.store, now_us=now)
        assert d["status"] == expect
        cp = clocked_lg.store.fold(run, AGGREGATE)
        assert dl.status(cp.delivery, ready=cp.delivery_ready, now_us=now,
                         timeout_s=cp.policy.delivery_timeout_s)[0] == expect
    assert queries.deliveries(clocked_lg.store, now_us=t_attempt + 600 * S, status="ambiguous") == []
    assert [d["run_id"] for d in queries.deliveries(clocked_lg.store, now_us=t_attempt + 600 * S + 1,
                                                    status="ambiguous")] == [run]
    assert [d["run_id"] for d in clocked_lg.deliveries(status="pending", now=t_attempt + 1)] == [run]
    # The stall scan reports the ambiguous delivery too.
    [(_, health)] = clocked_lg.stalls(now=t_attempt + 600 * S + 1)
    assert health.classification == "delivery_ambiguous"

    clocked_lg.delivery_failed(run, "k1", "target returned 500")
    r = delivery_row(clocked_lg, run)
    assert (r["status"], r["key"], r["attempts"], r["attempted_us"]) == ("failed", "k1", 1, None)
    assert queries.deliveries(clocked_lg.store, now_us=clock() + 10**12, status="ambiguous") == []
    assert [d["run_id"] for d in clocked_lg.deliveries(status="failed")] == [run]

    clocked_lg.deliver(run, "k2", by="alice")
    assert delivery_row(clocked_lg, run)["status"] == "attempted"
    clocked_lg.delivered(run, "k2", "msg-123")
    r = delivery_row(clocked_lg, run)
    assert (r["status"], r["key"], r["receipt"], r["attempts"]) == ("confirmed", "k2", "msg-123", 2)
    assert [d["run_id"] for d in clocked_lg.deliveries(status="confirmed")] == [run]
    assert clocked_lg.deliveries(status="pending") == []
    assert assert_checkpoint_row(clocked_lg, run)["state"] == "delivered"
    assert clocked_lg.check() == []


def test_delivery_waits_for_review(clocked_lg, result_file):
    run = clocked_lg.open(goal="g", target="t", owner="alice", run_id="r1", require_review=True)
    lease = clocked_lg.claim(run, "w1")
    drive_to_succeeded(clocked_lg, run, lease, result_file)
    assert clocked_lg.checkpoint(run).state == "ready_for_review"
    assert delivery_row(clocked_lg, run)["status"] == "not_ready"
    clocked_lg.review(run, True, "fine", by="alice")
    assert delivery_row(clocked_lg, run)["status"] == "ready"


# --- owner_load ----------------------------------------------------------------------------


def load_rows(clocked_lg: Ledger) -> set[tuple[str, str]]:
    conn = sqlite3.connect(clocked_lg.store.path)
    try:
        return set(conn.execute("SELECT owner, run_id FROM owner_load"))
    finally:
        conn.close()


def test_owner_load_counts_and_cap(clocked_lg, result_file):
    a = [clocked_lg.open(goal="g", target="t", owner="alice", run_id=f"a{i}", owner_cap=2) for i in range(4)]
    b = clocked_lg.open(goal="g", target="t", owner="bob", run_id="b0", owner_cap=2)
    assert clocked_lg.owner_load("alice") == 0 and load_rows(clocked_lg) == set()

    l0 = clocked_lg.claim(a[0], "w0")
    l1 = clocked_lg.claim(a[1], "w1")
    assert clocked_lg.owner_load("alice") == 2
    assert load_rows(clocked_lg) == {("alice", "a0"), ("alice", "a1")}

    before_pos = clocked_lg.store.last_position()
    before = dump(clocked_lg.store.path)
    head_before = clocked_lg.store.head(a[2])
    with pytest.raises(CapacityExceeded):
        clocked_lg.claim(a[2], "w2")
    assert clocked_lg.store.last_position() == before_pos
    assert clocked_lg.store.head(a[2]) == head_before
    assert dump(clocked_lg.store.path) == before

    clocked_lg.claim(b, "wb")  # another owner's cap is its own
    assert (clocked_lg.owner_load("alice"), clocked_lg.owner_load("bob")) == (2, 1)

    clocked_lg.release(a[0], l0)  # release removes
    assert clocked_lg.owner_load("alice") == 1
    clocked_lg.claim(a[2], "w2")
    assert clocked_lg.owner_load("alice") == 2
    clocked_lg.revoke(a[1], "too slow")  # revoke removes
    assert load_rows(clocked_lg) == {("alice", "a2"), ("bob", "b0")}
    clocked_lg.close_run(a[2], "no_op", by="alice")  # close releases the lease
    assert clocked_lg.owner_load("alice") == 0

    l3 = clocked_lg.claim(a[3], "w3")
    drive_to_succeeded(clocked_lg, a[3], l3, result_file)
    assert clocked_lg.owner_load("alice") == 1  # a succeeded run still holds its lease
    clocked_lg.deliver(a[3], "k", by="alice")
    clocked_lg.delivered(a[3], "k", "receipt")  # delivery ends the run and releases the lease
    assert clocked_lg.owner_load("alice") == 0
    assert load_rows(clocked_lg) == {("bob", "b0")}
    [lease_row] = rows(clocked_lg, "owner_load", "b0")
    assert lease_row["lease"] == clocked_lg.checkpoint(b).lease
    assert clocked_lg.check() == []


# --- queries.runs ------------------------------------------------------------------------------


def test_runs_filters_and_order(clocked_lg):
    specs = [("r0", "alice", "chat:#a"), ("r1", "bob", "chat:#a"), ("r2", "alice", "mail:x"),
             ("r3", "carol", "mail:x"), ("r4", "alice", "chat:#a")]
    for rid, owner, target in specs:
        clocked_lg.open(goal="g", target=target, owner=owner, run_id=rid)
    l0 = clocked_lg.claim("r0", "w")
    clocked_lg.transition("r0", l0, "planning")
    l2 = clocked_lg.claim("r2", "w")
    clocked_lg.transition("r2", l2, "planning")
    clocked_lg.transition("r2", l2, "executing")
    clocked_lg.close_run("r3", "cancelled", by="carol")
    # Touch the oldest run last: "oldest first" must not turn into "least recently updated".
    # (A beat kept beside the log touches no row: this one is logged, its attrs changed.)
    assert clocked_lg.heartbeat("r0", l0, attrs={"touch": 1}).result.outcome == "committed"

    def ids(**kw):
        return [cp.run_id for cp in queries.runs(clocked_lg.store, **kw)]

    assert ids() == ["r0", "r1", "r2", "r4"]
    assert ids(include_terminal=True) == ["r0", "r1", "r2", "r3", "r4"]
    assert ids(state="queued") == ["r1", "r4"]
    assert ids(state="planning") == ["r0"]
    assert ids(state="cancelled") == []
    assert ids(state="cancelled", include_terminal=True) == ["r3"]
    assert ids(owner="alice") == ["r0", "r2", "r4"]
    assert ids(target="mail:x") == ["r2"]
    assert ids(target="mail:x", include_terminal=True) == ["r2", "r3"]
    assert ids(owner="alice", target="chat:#a") == ["r0", "r4"]
    assert ids(owner="alice", state="executing") == ["r2"]
    assert ids(owner="nobody") == []
    assert [cp.run_id for cp in clocked_lg.runs(owner="bob")] == ["r1"]
    # Each packet is the full fold.
    for cp in queries.runs(clocked_lg.store, include_terminal=True):
        assert cp == clocked_lg.store.fold(cp.run_id, AGGREGATE)
    # The same answers, in the same order, from rebuilt tables.
    asks: list[dict] = [{}, {"include_terminal": True}, {"owner": "alice"}, {"state": "queued"}]
    before = [ids(**k) for k in asks]
    clocked_lg.rebuild()
    assert [ids(**k) for k in asks] == before


# --- watcher streams ------------------------------------------------------------------------------


def test_watcher_streams_have_no_view_rows(clocked_lg, clock):
    run = clocked_lg.open(goal="g", target="t", owner="alice", run_id="r1")
    before = dump(clocked_lg.store.path)
    clocked_lg.watcher_beat("wd-1", 30)
    clock.advance(30)
    clocked_lg.watcher_beat("wd-1", 30)
    clocked_lg.watcher_beat("wd-2", 10)
    after = dump(clocked_lg.store.path)
    for table in ("checkpoints", "stall_watch", "deliveries", "owner_load"):
        assert after[table] == before[table], table
    # The views are current to the log's end: the beats were applied (as nothing).
    assert {pos for _, pos in after["projection_positions"]} == {clocked_lg.store.last_position()}
    assert [cp.run_id for cp in clocked_lg.runs(include_terminal=True)] == [run]
    assert all(cp.run_id == run for cp, _ in clocked_lg.stalls(now=clock() + 10**12))  # never a watcher
    assert set(clocked_lg.watchers()) == {"wd-1", "wd-2"}
    assert clocked_lg.check() == []
    clocked_lg.rebuild()
    assert dump(clocked_lg.store.path) == after


def test_a_heartbeat_rewrites_only_the_views_it_changes(tmp_path, clock):
    """A beat kept beside the log writes its liveness row and no view row at all. A logged
    beat goes through inline upkeep, which compares a run's delivery and owner-load rows
    with the table and leaves them alone when they are unchanged: it touches the event, the
    head, the checkpoint and stall rows and the liveness row, nothing else."""
    path = str(tmp_path / "l.db")
    with Ledger(path, clock=clock) as clocked_lg:
        clocked_lg.open(goal="G", target="T", owner="o", run_id="r1")
        lease = clocked_lg.claim("r1", "w")
        conn = clocked_lg.store.conn
        views, before = dump(path), conn.total_changes
        beat = clock.advance(1)
        assert clocked_lg.heartbeat("r1", lease).result.outcome == "unchanged"
        assert conn.total_changes - before == 1  # the liveness row alone
        assert dump(path) == views
        assert clocked_lg.checkpoint("r1").watch.last_heartbeat_us == beat

        before = conn.total_changes
        beat = clock.advance(31)  # a silence longer than half the 60 s timeout: logged
        assert clocked_lg.heartbeat("r1", lease).result.outcome == "committed"
        # 1 event + 1 head + 1 checkpoint row + 1 stall row + 1 liveness row; no tracking
        # row since file schema 2 (a write that keeps every projection marks nothing)
        assert conn.total_changes - before == 5
        after = dump(path)
        # (the views' positions are the log's end where nothing is marked: they move with it)
        assert {t for t in after if after[t] != views[t]} == {"checkpoints", "stall_watch", engine.TRACKING}
        assert {pos for _, pos in after[engine.TRACKING]} == {clocked_lg.store.last_position()}
        assert clocked_lg.checkpoint("r1").watch.last_heartbeat_us == beat
        assert clocked_lg.check() == []
