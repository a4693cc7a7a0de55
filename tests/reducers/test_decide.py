"""Every refusal decide can give, through the real Ledger and a SQLite file.

Each case asserts the exact error type, that the message names the problem, and that the
log is byte-for-byte what it was before (``refused`` in helpers.py). Then idempotent
retries, and racing terminal commands from separate processes. decide alone, as a pure
function of a folded checkpoint, is driven by a table in test_decide_table.py.
"""

from __future__ import annotations

import multiprocessing
import os

import msgspec
import pytest

from handoff import Actor
from handoff.ledger import errors as E
from handoff.reducers import commands as C
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import AGGREGATE

from .helpers import OPERATOR, OWNER, WATCHDOG, bring, execute, log, new_ledger, race_worker, refused, write

W1 = Actor("worker", "w1")


@pytest.fixture
def lg(tmp_path):
    ledger = new_ledger(tmp_path)
    yield ledger
    ledger.close()


# --- IllegalTransition --------------------------------------------------------------


@pytest.mark.parametrize("start, to", [
    (T.QUEUED, T.EXECUTING), (T.QUEUED, T.SUCCEEDED), (T.PLANNING, T.VERIFYING),
    (T.EXECUTING, T.READY_FOR_REVIEW), (T.EXECUTING, T.DELIVERED), (T.VERIFYING, T.SUCCEEDED),
    (T.EXECUTING, T.EXECUTING), (T.BLOCKED, T.EXECUTING),
])
def test_moves_the_table_does_not_allow(lg, tmp_path, start, to):
    run = bring(lg, tmp_path, start)
    if run.lease is None:
        run.lease = lg.claim(run.id, "w1")
    refused(lg, E.IllegalTransition, lambda: lg.transition(run.id, run.lease, to, worker="w1"), start, to)


def test_submit_before_verifying(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.artifact(run.id, run.lease, run.result, worker="w1")
    refused(lg, E.IllegalTransition, lambda: lg.submit(run.id, run.lease, worker="w1"), "executing", "submit")


def test_review_when_nothing_waits_for_review(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    refused(lg, E.IllegalTransition, lambda: lg.review(run.id, True, by="alice"), "verifying", "review")


def test_unblock_a_run_that_is_not_blocked(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    refused(lg, E.IllegalTransition, lambda: lg.unblock(run.id, "fixed", actor=OWNER), "not blocked")


def test_leave_unknown_before_reconciling(lg, tmp_path):
    run = bring(lg, tmp_path, T.UNKNOWN)
    lease = lg.claim(run.id, "w2")
    refused(lg, E.IllegalTransition, lambda: lg.transition(run.id, lease, T.EXECUTING, worker="w2"),
            "mail-1", "effect-confirm")
    lg.effect_confirm(run.id, "mail-1", "absent", actor=OPERATOR)
    assert lg.transition(run.id, lease, T.EXECUTING, worker="w2").checkpoint.state == T.EXECUTING


def test_side_effect_outside_working_states(lg, tmp_path):
    run = bring(lg, tmp_path, T.QUEUED)
    lease = lg.claim(run.id, "w1")
    refused(lg, E.IllegalTransition, lambda: lg.effect_start(run.id, lease, "k", "send", worker="w1"), "queued")


def test_confirming_a_delivery_after_the_run_was_blocked(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.deliver(run.id, "send-1", by="alice")
    lg.block(run.id, "target chat archived", "ask alice for a new target", actor=OWNER)
    refused(lg, E.IllegalTransition, lambda: lg.delivered(run.id, "send-1", "msg-1"), "blocked", "delivered")


# --- StaleLease ---------------------------------------------------------------------


@pytest.mark.parametrize("write_", ["heartbeat", "progress", "transition", "artifact", "submit", "effect_start", "release"])
def test_replaced_worker_writes_nothing(lg, tmp_path, write_):
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.revoke(run.id, "no heartbeat", actor=WATCHDOG)
    lg.claim(run.id, "w2")
    old = run.lease
    calls = {
        "heartbeat": lambda: lg.heartbeat(run.id, old, worker="w1"),
        "progress": lambda: lg.progress(run.id, old, "tool_outcome", worker="w1"),
        "transition": lambda: lg.transition(run.id, old, T.VERIFYING, worker="w1"),
        "artifact": lambda: lg.artifact(run.id, old, run.result, worker="w1"),
        "submit": lambda: lg.submit(run.id, old, worker="w1"),
        "effect_start": lambda: lg.effect_start(run.id, old, "k", "send", worker="w1"),
        "release": lambda: lg.release(run.id, old, worker="w1"),
    }
    exc = refused(lg, E.StaleLease, calls[write_], "lease 1 of run", "has ended", "must stop writing")
    # Nothing in the refusal names the lease that replaced it, or anything to retry with.
    assert exc.details["why"] == "ended" and "current_lease" not in exc.details
    assert "lease 2" not in exc.message and "w2" not in exc.message


def test_worker_after_releasing(lg, tmp_path):
    run = bring(lg, tmp_path, T.PLANNING)
    lg.release(run.id, run.lease, worker="w1")
    refused(lg, E.StaleLease, lambda: lg.heartbeat(run.id, run.lease, worker="w1"), "has ended")


def test_revoking_when_no_lease_or_the_wrong_one(lg, tmp_path):
    run = bring(lg, tmp_path, T.QUEUED)
    refused(lg, E.StaleLease, lambda: lg.revoke(run.id, "timeout", actor=WATCHDOG), "no lease to revoke")
    lg.claim(run.id, "w1")
    refused(lg, E.StaleLease, lambda: lg.revoke(run.id, "timeout", lease_number=7, actor=WATCHDOG), "lease 7")
    lg.revoke(run.id, "timeout", lease_number=1, actor=WATCHDOG)
    refused(lg, E.StaleLease, lambda: lg.recover(run.id, "revoke_lease", "unavailable", 0, watcher="dog"), "no lease to revoke")


# --- NotAuthorized ------------------------------------------------------------------


def _owner_action(lg, run, action, actor):
    cmd = {
        "review": C.ReviewResult(approve=True),
        "deliver": C.Deliver(key="send-1"),
        "close": C.Close(disposition="no_op"),
    }[action]
    return lambda: execute(lg, run.id, actor, cmd)


@pytest.mark.parametrize("action", ["review", "deliver", "close"])
def test_worker_may_not_do_the_owners_part(lg, tmp_path, action):
    state = T.READY_FOR_REVIEW if action == "review" else T.SUCCEEDED
    run = bring(lg, tmp_path, state)
    refused(lg, E.NotAuthorized, _owner_action(lg, run, action, W1), "worker", action, "transfer")


@pytest.mark.parametrize("action", ["review", "deliver", "close"])
def test_worker_may_do_it_with_an_explicit_transfer(lg, tmp_path, action):
    state = T.READY_FOR_REVIEW if action == "review" else T.SUCCEEDED
    run = bring(lg, tmp_path, state)
    lg.transfer(run.id, action, "w1", by="alice")
    # Only the actor the transfer names gains the action.
    refused(lg, E.NotAuthorized, _owner_action(lg, run, action, Actor("worker", "w2")), "w2", action)
    out = _owner_action(lg, run, action, W1)()
    assert out.result.outcome == "committed"


def test_a_transfer_covers_one_action_only(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.transfer(run.id, "deliver", "w1", by="alice")
    refused(lg, E.NotAuthorized, _owner_action(lg, run, "close", W1), "close")
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, W1, C.ConfirmDelivery(key="send-1", receipt="m")), "delivered")


def test_someone_who_is_not_the_owner(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    refused(lg, E.NotAuthorized, lambda: lg.deliver(run.id, "send-1", by="mallory"), "mallory", "alice")
    refused(lg, E.NotAuthorized, lambda: lg.close_run(run.id, "no_op", by="mallory"), "not the owner")
    refused(lg, E.NotAuthorized, lambda: lg.transfer(run.id, "deliver", "mallory", by="mallory"), "mallory")


def test_worker_without_its_lease_and_other_kinds_doing_worker_things(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, W1, C.Heartbeat(lease=None)), "must pass its lease")  # type: ignore[arg-type]
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, OWNER, C.Progress(lease=1, kind="tool_outcome")), "progress")
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, WATCHDOG, C.Submit(lease=1)), "watchdog")
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, W1, C.Revoke(reason="mine now")), "revoke")
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, W1, C.Recover(action="pause", classification="x", progress_seq=0)),
            "recover")


def test_claiming_on_behalf_of_another_worker(lg, tmp_path):
    run = bring(lg, tmp_path, T.QUEUED)
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, Actor("worker", "w2"), C.Claim(worker="w1")), "on behalf of w1")


def test_fork_belongs_to_the_parents_owner_or_an_operator(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    refused(lg, E.NotAuthorized, lambda: execute(lg, "child-m", Actor("owner", "mallory"), C.Fork(parent=run.id, at_seq=3)),
            "mallory", "alice")
    out = execute(lg, "child-a", OWNER, C.Fork(parent=run.id, at_seq=3))
    assert out.result.outcome == "committed"
    assert lg.checkpoint("child-a").owner == "alice"


# --- EvidenceMissing ----------------------------------------------------------------


def test_submit_without_any_artifact(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    refused(lg, E.EvidenceMissing, lambda: lg.submit(run.id, run.lease, worker="w1"), "no recorded artifact")


def test_submit_with_a_missing_artifact(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    lg.artifact(run.id, run.lease, run.result, worker="w1")
    gone = str(tmp_path / "chart.png")
    out = lg.artifact(run.id, run.lease, gone, worker="w1")
    assert out.checkpoint.artifacts[-1].exists is False
    refused(lg, E.EvidenceMissing, lambda: lg.submit(run.id, run.lease, worker="w1"), "chart.png", "missing")


def test_submit_with_an_empty_artifact(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    write(run.result, "")
    lg.artifact(run.id, run.lease, run.result, worker="w1")
    refused(lg, E.EvidenceMissing, lambda: lg.submit(run.id, run.lease, worker="w1"), "empty")
    # Writing the content and measuring again is what makes it substantive.
    write(run.result, "# the report\n")
    lg.artifact(run.id, run.lease, run.result, worker="w1")
    assert lg.submit(run.id, run.lease, worker="w1").checkpoint.state == T.SUCCEEDED


def test_submit_without_the_contracts_result_file(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    other = write(str(tmp_path / "notes.md"), "notes\n")
    lg.artifact(run.id, run.lease, other, worker="w1")
    refused(lg, E.EvidenceMissing, lambda: lg.submit(run.id, run.lease, worker="w1"), run.result, "no artifact")


# --- DeliveryRefused ----------------------------------------------------------------


def test_confirming_a_delivery_never_attempted(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    refused(lg, E.DeliveryRefused, lambda: lg.delivered(run.id, "send-9", "msg-9"), "send-9", "attempted")


def test_a_second_delivery_after_one_was_confirmed(lg, tmp_path):
    run = bring(lg, tmp_path, T.DELIVERED)
    refused(lg, E.DeliveryRefused, lambda: lg.deliver(run.id, "send-2", by="alice"), "already delivered", "double send")
    refused(lg, E.DeliveryRefused, lambda: lg.delivered(run.id, "send-1", "msg-OTHER"), "another receipt")


@pytest.mark.parametrize("why", ["no_evidence", "failing_evidence", "not_reviewed", "rejected", "not_succeeded"])
def test_delivering_a_run_that_is_not_ready(lg, tmp_path, why):
    if why == "not_succeeded":
        run = bring(lg, tmp_path, T.VERIFYING)
        words = ("not ready", "verifying")
    elif why in ("not_reviewed", "rejected"):
        run = bring(lg, tmp_path, T.READY_FOR_REVIEW)
        lg.evidence(run.id, "tests", "pass", actor=OWNER)
        if why == "rejected":
            lg.review(run.id, False, "the summary is wrong", by="alice")
        words = ("not ready",)
    else:
        run = bring(lg, tmp_path, T.SUCCEEDED, evidence=False)
        if why == "failing_evidence":
            lg.evidence(run.id, "tests", "pass", actor=OWNER)
            lg.evidence(run.id, "lint", "fail", actor=OWNER)
        words = ("not ready", "evidence")
    refused(lg, E.DeliveryRefused, lambda: lg.deliver(run.id, "send-1", by="alice"), *words)


def test_another_attempt_while_one_has_no_outcome(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.deliver(run.id, "send-1", by="alice")
    refused(lg, E.DeliveryRefused, lambda: lg.deliver(run.id, "send-2", by="alice"), "send-1", "no outcome")
    refused(lg, E.DeliveryRefused, lambda: lg.close_run(run.id, "no_op", by="alice"), "send-1", "no outcome")


def test_a_failed_attempt_needs_a_new_key(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.deliver(run.id, "send-1", by="alice")
    lg.delivery_failed(run.id, "send-1", "target returned 503")
    # Without an idempotency key the rules answer (Ledger.deliver's key would replay the first attempt).
    refused(lg, E.DeliveryRefused, lambda: execute(lg, run.id, OWNER, C.Deliver(key="send-1")), "already failed", "new key")
    refused(lg, E.DeliveryRefused, lambda: lg.delivered(run.id, "send-1", "msg-1"), "marked failed")
    refused(lg, E.DeliveryRefused, lambda: lg.delivery_failed(run.id, "send-1", "again"), "already failed")
    lg.deliver(run.id, "send-2", by="alice")
    assert lg.delivered(run.id, "send-2", "msg-2").checkpoint.state == T.DELIVERED


# --- TerminalRun --------------------------------------------------------------------


def _after_the_end(lg, run):
    lease = run.token if run is not None else None
    return {
        "claim": lambda: lg.claim(run.id, "w2"),
        "heartbeat": lambda: lg.heartbeat(run.id, lease, worker="w1"),
        "transition": lambda: lg.transition(run.id, lease, T.EXECUTING, worker="w1"),
        "progress": lambda: lg.progress(run.id, lease, "tool_outcome", worker="w1"),
        "evidence": lambda: lg.evidence(run.id, "tests", "pass", actor=OWNER),
        "block": lambda: lg.block(run.id, "late", "nothing", actor=OWNER),
        "revoke": lambda: lg.revoke(run.id, "late", actor=WATCHDOG),
        "transfer": lambda: lg.transfer(run.id, "deliver", "w1", by="alice"),
        "close": lambda: lg.close_run(run.id, "cancelled", by="alice"),
        "close_as_operator": lambda: lg.close_run(run.id, "failed", as_operator=True, by="op"),
        "recover": lambda: lg.recover(run.id, "pause", "stalled", 0, watcher="dog"),
        "delivery_failed": lambda: lg.delivery_failed(run.id, "send-1", "late"),
        "review": lambda: lg.review(run.id, True, by="alice"),
    }


TERMINALS = [T.DELIVERED, T.NO_OP, T.CANCELLED, T.FAILED]
LATE = sorted(_after_the_end(None, None))
UNDER_LEASE = ("heartbeat", "transition", "progress")


@pytest.mark.parametrize("end", TERMINALS)
@pytest.mark.parametrize("late", LATE)
def test_nothing_but_observation_after_the_end(lg, tmp_path, end, late):
    run = bring(lg, tmp_path, end)
    if late in UNDER_LEASE:
        # The end released the lease: its token is checked first and proves nothing now.
        refused(lg, E.StaleLease, _after_the_end(lg, run)[late], "lease 1", "has ended")
    else:
        refused(lg, E.TerminalRun, _after_the_end(lg, run)[late], "ended", end)


@pytest.mark.parametrize("end", [T.NO_OP, T.CANCELLED, T.FAILED])
def test_a_closed_run_is_never_delivered(lg, tmp_path, end):
    run = bring(lg, tmp_path, end)
    refused(lg, E.TerminalRun, lambda: lg.deliver(run.id, "send-1", by="alice"), end, "will not be delivered")
    refused(lg, E.TerminalRun, lambda: lg.delivered(run.id, "send-1", "msg-1"), end)


@pytest.mark.parametrize("end", TERMINALS)
def test_observation_is_still_accepted_and_changes_no_state(lg, tmp_path, end):
    run = bring(lg, tmp_path, end)
    before = lg.checkpoint(run.id)
    out = lg.observe(run.id, "silent", before.progress_seq, watcher="dog")
    assert out.result.outcome == "committed"
    assert out.checkpoint.state == end and out.checkpoint.progress_seq == before.progress_seq


def test_forking_at_a_seq_where_the_parent_had_ended(lg, tmp_path):
    run = bring(lg, tmp_path, T.CANCELLED)
    last = lg.checkpoint(run.id).last_seq
    refused(lg, E.TerminalRun, lambda: lg.fork(run.id, last, new_run_id="child"), "earlier seq")
    closed_at = next(r.seq for r in lg.store.read_run(run.id) if r.type == "run_closed")
    child = lg.fork(run.id, closed_at - 1, new_run_id="child")
    assert lg.checkpoint(child).state == T.SUCCEEDED and not lg.checkpoint(child).terminal


# --- CapacityExceeded, LeaseHeld, UnknownEffect, UnknownRun, RunExists ----------------


def test_owner_cap(lg, tmp_path):
    for i in (1, 2, 3):
        lg.open(goal="g", target="chat:#ops", owner="alice", run_id=f"r{i}", owner_cap=2)
    lg.claim("r1", "w1")
    lg.claim("r2", "w2")
    exc = refused(lg, E.CapacityExceeded, lambda: lg.claim("r3", "w3"), "alice", "2 active runs", "cap of 2")
    assert exc.exit_code == 1
    # Another owner is not affected, and a finished run frees its slot.
    lg.open(goal="g", target="chat:#ops", owner="bob", run_id="b1", owner_cap=2)
    lg.claim("b1", "w1")
    lg.close_run("r1", "no_op", by="alice")
    assert lg.claim("r3", "w3").lease >= 1


def test_default_owner_cap_is_ten(lg, tmp_path):
    for i in range(11):
        lg.open(goal="g", target="chat:#ops", owner="alice", run_id=f"r{i}")
    for i in range(10):
        lg.claim(f"r{i}", f"w{i}")
    refused(lg, E.CapacityExceeded, lambda: lg.claim("r10", "w10"), "cap of 10")


def test_claiming_a_held_run(lg, tmp_path):
    run = bring(lg, tmp_path, T.PLANNING)
    refused(lg, E.LeaseHeld, lambda: lg.claim(run.id, "w2"), "held by w1", "revoke")


def test_confirming_an_effect_never_started(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    refused(lg, E.UnknownEffect, lambda: lg.effect_confirm(run.id, "nope", "done", actor=OPERATOR), "nope")


def test_side_effect_keys_are_not_reused(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.effect_start(run.id, run.lease, "k", "send mail", worker="w1")
    refused(lg, E.IdempotencyConflict, lambda: lg.effect_start(run.id, run.lease, "k", "open PR", worker="w1"), "'k'")
    lg.effect_confirm(run.id, "k", "done", lease=run.lease, actor=W1)
    refused(lg, E.IdempotencyConflict, lambda: lg.effect_confirm(run.id, "k", "absent", actor=OPERATOR), "another outcome")
    refused(lg, E.IdempotencyConflict, lambda: lg.effect_start(run.id, run.lease, "k", "send mail", worker="w1"), "new key")


def test_commands_on_a_run_that_does_not_exist(lg, tmp_path):
    refused(lg, E.UnknownRun, lambda: lg.claim("ghost", "w1"), "ghost", "open it first")
    refused(lg, E.UnknownRun, lambda: lg.observe("ghost", "healthy", 0, watcher="dog"), "ghost")
    refused(lg, E.UnknownRun, lambda: lg.fork("ghost", 1, new_run_id="child"), "ghost")


def test_opening_or_forking_onto_an_existing_run(lg, tmp_path):
    run = bring(lg, tmp_path, T.PLANNING)
    refused(lg, E.RunExists, lambda: lg.open(goal="g", target="chat:#ops", owner="alice", run_id=run.id), run.id)
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id="other")
    refused(lg, E.RunExists, lambda: lg.fork(run.id, 2, new_run_id="other"), "other")


# --- InvalidInput -------------------------------------------------------------------


@pytest.mark.parametrize("field, kwargs, words", [
    ("goal", {"goal": "read \x00 this"}, ("goal", "NUL")),
    ("goal", {"goal": "x" * 16_385}, ("goal", "16385", "limit")),
    ("goal", {"goal": "   "}, ("goal", "empty")),
    ("target", {"target": "chat:#ops\nchat:#other"}, ("target", "single line")),
    ("owner", {"owner": "a" * 201}, ("owner", "limit of 200")),
    ("heartbeat_timeout", {"heartbeat_timeout_s": -1}, ("heartbeat_timeout",)),
    ("owner_cap", {"owner_cap": 0}, ("owner_cap",)),
])
def test_malformed_contracts(lg, field, kwargs, words):
    args = {"goal": "g", "target": "chat:#ops", "owner": "alice", "run_id": "r1", **kwargs}
    exc = refused(lg, E.InvalidInput, lambda: lg.open(**args, actor=OPERATOR), *words)
    assert exc.field == field and exc.exit_code == 2


def test_malformed_commands_on_a_run(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    cases = [
        (lambda: lg.evidence(run.id, "tests", "maybe", actor=OWNER), "outcome", ("outcome", "maybe")),
        (lambda: lg.effect_confirm(run.id, "k", "perhaps", actor=OPERATOR), "outcome", ("perhaps",)),
        (lambda: lg.observe(run.id, "healthy", 0, reason="a\x00b", watcher="dog"), "reason", ("NUL",)),
        (lambda: lg.block(run.id, "r" * 16_385, "next", actor=OWNER), "reason", ("limit",)),
        (lambda: lg.transfer(run.id, "publish", "w1", by="alice"), "action", ("publish",)),
        (lambda: lg.transition(run.id, run.lease, "done", worker="w1"), "to", ("done",)),
        (lambda: lg.recover(run.id, "reboot", "stalled", 0, watcher="dog"), "action", ("reboot",)),
        (lambda: lg.fork(run.id, 99, new_run_id="child"), "at_seq", ("only 4 events",)),
    ]
    for call, field, words in cases:
        exc = refused(lg, E.InvalidInput, call, *words)
        assert exc.field == field, (field, exc.message)
    lg.block(run.id, "needs a token", "ask alice", actor=OWNER)
    exc = refused(lg, E.InvalidInput, lambda: lg.unblock(run.id, "x", blocker_id=5, actor=OWNER), "no open blocker 5")
    assert exc.field == "blocker_id"


# --- idempotent retries -------------------------------------------------------------


def test_retried_delivery_attempt_is_not_a_second_send(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    first = lg.deliver(run.id, "send-1", by="alice")
    before = log(lg)
    again = lg.deliver(run.id, "send-1", by="alice")
    # No idempotency key is replayed (deliver takes none): the rules find nothing to add.
    assert first.result.outcome == "committed" and again.result.outcome == "unchanged" and again.duplicate
    assert (again.result.first_seq, again.result.last_seq) == (before[-1].seq, before[-1].seq)
    assert log(lg) == before
    # The rules agree without the store's idempotency key, too.
    raw = execute(lg, run.id, OWNER, C.Deliver(key="send-1"))
    assert raw.result.outcome == "unchanged" and log(lg) == before
    assert len(lg.checkpoint(run.id).delivery.attempts) == 1


def test_retried_confirmation_is_not_a_second_delivery(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.deliver(run.id, "send-1", by="alice")
    lg.delivered(run.id, "send-1", "msg-1")
    before = log(lg)
    assert lg.delivered(run.id, "send-1", "msg-1").result.outcome == "unchanged"
    assert lg.deliver(run.id, "send-1", by="alice").result.outcome == "unchanged"
    assert log(lg) == before
    assert sum(r.type == "delivery_confirmed" for r in before) == 1


def test_retried_side_effect_start_and_confirm(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.effect_start(run.id, run.lease, "k", "send mail", worker="w1")
    n = len(log(lg))
    assert lg.effect_start(run.id, run.lease, "k", "send mail", worker="w1").result.outcome == "unchanged"
    lg.effect_confirm(run.id, "k", "done", lease=run.lease, actor=W1)
    assert lg.effect_confirm(run.id, "k", "done", lease=run.lease, actor=W1).result.outcome == "unchanged"
    assert len(log(lg)) == n + 1


def test_the_same_idempotency_key_for_another_request(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.evidence(run.id, "lint", "pass", "ok", key="ev-1", actor=Actor("owner", "alice"))
    # The same key for a different request is refused, naming the key.
    refused(lg, E.IdempotencyConflict,
            lambda: lg.evidence(run.id, "lint", "fail", "not ok", key="ev-1", actor=Actor("owner", "alice")), "ev-1")


def test_a_delivery_key_that_failed_cannot_be_retried(lg, tmp_path):
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.deliver(run.id, "send-1", by="alice")
    lg.delivery_failed(run.id, "send-1", "timeout")
    refused(lg, E.DeliveryRefused, lambda: lg.deliver(run.id, "send-1", by="alice"), "already failed")
    assert lg.deliver(run.id, "send-2", by="alice").result.outcome == "committed"


# --- racing terminal commands from separate processes --------------------------------


ROUNDS = 6


def _race(path, jobs_a, jobs_b):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=race_worker, args=(path, jobs, barrier, results, who))
             for who, jobs in enumerate((jobs_a, jobs_b))]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range(2 * len(jobs_a))]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    by_round: dict[int, dict[int, str]] = {}
    for who, i, outcome in got:
        by_round.setdefault(i, {})[who] = outcome
    return by_round


def _job(run_id, actor, cmd):
    return (run_id, actor.kind, actor.name, msgspec.json.encode(cmd))


def test_racing_terminal_commands_first_wins(tmp_path):
    """Two processes, two Ledger objects, one file: per run, exactly one terminal event lands."""
    lg = new_ledger(tmp_path)
    a, b = [], []
    for i in range(ROUNDS):
        if i % 2 == 0:
            # close as no_op vs close as cancelled
            run = bring(lg, tmp_path, T.EXECUTING, run_id=f"c{i}")
            a.append(_job(run.id, OWNER, C.Close(disposition="no_op")))
            b.append(_job(run.id, OPERATOR, C.Close(disposition="cancelled")))
        else:
            # confirm the open delivery vs close as failed
            run = bring(lg, tmp_path, T.SUCCEEDED, run_id=f"d{i}")
            lg.deliver(run.id, "send-1", by="alice")
            a.append(_job(run.id, OWNER, C.ConfirmDelivery(key="send-1", receipt="msg-1")))
            b.append(_job(run.id, OPERATOR, C.Close(disposition="failed")))
    path = lg.store.path
    lg.close()

    by_round = _race(path, a, b)

    lg = new_ledger(tmp_path)
    try:
        for i in range(ROUNDS):
            outcomes = sorted(by_round[i].values())
            run_id = f"c{i}" if i % 2 == 0 else f"d{i}"
            winners = [o for o in outcomes if o == "committed"]
            losers = [o for o in outcomes if o != "committed"]
            assert len(winners) == 1, (run_id, outcomes)
            assert losers[0] in ("TerminalRun", "DeliveryRefused"), (run_id, outcomes)
            events = list(lg.store.read_run(run_id))
            ends = [r for r in events if r.type in ("run_closed", "delivery_confirmed")]
            assert len(ends) == 1, [r.type for r in events]
            assert lg.checkpoint(run_id).terminal
        assert lg.verify() == []
    finally:
        lg.close()


# --- forks through the ledger that made them ----------------------------------------


def test_a_fork_is_usable_through_the_ledger_that_made_it(lg, tmp_path):
    """Regression: the store once cached a new fork's state without the parent's prefix."""
    run = bring(lg, tmp_path, T.EXECUTING)
    child = lg.fork(run.id, 3, new_run_id="child")
    assert lg.checkpoint(child) == lg.store.fold(child, AGGREGATE)
    assert lg.checkpoint(child).owner == "alice" and lg.checkpoint(child).lease is None
    assert lg.claim(child, "w2").lease == 2, "the child continues the parent's fencing numbers"
    assert lg.checkpoint(run.id).lease == 1, "the parent's lease is untouched"


# --- side effects cannot be walked away from -----------------------------------------


def test_releasing_with_a_side_effect_in_flight_sends_the_run_to_unknown(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    lg.effect_start(run.id, run.lease, "mail-1", "send the summary mail")
    out = lg.release(run.id, run.lease, "shift over")
    assert out.checkpoint.state == T.UNKNOWN and out.checkpoint.lease is None


def test_submitting_with_a_side_effect_in_flight_is_refused(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    lg.effect_start(run.id, run.lease, "mail-1", "send the summary mail")
    refused(lg, E.IllegalTransition, lambda: lg.submit(run.id, run.lease, "done"), "mail-1")
    lg.effect_confirm(run.id, "mail-1", "done", lease=run.lease)
    report = lg.checkpoint(run.id).result_path
    with open(report, "w") as f:
        f.write("the report")
    lg.artifact(run.id, run.lease, report)
    assert lg.submit(run.id, run.lease, "done").checkpoint.result is not None


def test_a_revocation_aimed_at_an_older_lease_hits_nothing(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    seq = lg.checkpoint(run.id).progress_seq
    refused(lg, E.StaleLease,
            lambda: lg.recover(run.id, "revoke_lease", "unavailable", seq, lease_number=run.lease.lease - 1 or 99, watcher="wd"),
            "nothing revoked")
    assert lg.checkpoint(run.id).lease == run.lease.lease
