"""A result the sanitization gate refused after submit has a way forward: the owner reopens it.

Before ``reopen``, such a run was stuck: the gate refused its delivery, withdrawing an
artifact was refused after submit, a review cannot be rejected once the run succeeded,
and a claim was refused while the lease was held. Every other use of ``reopen`` is refused
with a typed error and writes nothing.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import Actor, Ledger
from handoff.ledger import errors as E
from handoff.reducers import commands as C
from handoff.reducers import decide as D
from handoff.reducers import transitions as T
from handoff.render import summarize

from .helpers import OPERATOR, WATCHDOG, bring, log, new_ledger, refused, write

SECRET = "AKIAIOSFODNN7EXAMPLE"
LEAKY = f"# Report\n\nUsed key {SECRET} to fetch the dump.\n"
CLEAN = "# Report\n\nThe dump was fetched with the team's read-only role.\n"


def leaky_run(lg: Ledger, tmp_path, run_id: str = "r1") -> tuple[str, str, str]:
    """A public run whose submitted report quotes a key: (run, lease token, report path)."""
    work = tmp_path / f"work-{run_id}"
    work.mkdir()
    report = write(str(work / "report.md"), LEAKY)
    out = tmp_path / f"outbox-{run_id}"
    out.mkdir()
    lg.open(goal="write the report", target=f"file://{out}", owner="alice", run_id=run_id, public=True)
    tok = lg.claim(run_id, "w1")
    for to in (T.PLANNING, T.EXECUTING, T.VERIFYING):
        lg.transition(run_id, tok, to, worker="w1")
    lg.artifact(run_id, tok, report, worker="w1")
    lg.evidence(run_id, "tests", "pass", lease=tok)
    lg.submit(run_id, tok, "report written", worker="w1")
    return run_id, tok, report


def test_a_refused_result_goes_back_fixed_and_is_delivered(tmp_path):
    lg = new_ledger(tmp_path)
    run, tok, report = leaky_run(lg, tmp_path)
    check = lg.sanitize(run, by="alice")
    assert not check["passed"]
    # The dead ends, each refused and writing nothing:
    refused(lg, E.SanitizationRequired, lambda: lg.deliver(run, "v1", send=True, by="alice"), "failed")
    refused(lg, E.IllegalTransition, lambda: lg.withdraw_artifact(run, report, "leaks a key", lease=tok))
    refused(lg, E.IllegalTransition, lambda: lg.review(run, False, "leaks a key", by="alice"))
    refused(lg, E.LeaseHeld, lambda: lg.claim(run, "w2"))
    # The way forward:
    out = lg.reopen(run, by="alice", reason="the report quotes an access key; remove it")
    cp = out.checkpoint
    assert cp.state == T.VERIFYING and cp.lease is not None
    reopened = [r for r in lg.log(run) if r.type == "run_reopened"]
    assert len(reopened) == 1 and reopened[0].event.check_seq == cp.delivery.check.seq
    assert reopened[0].actor == "owner:alice"
    lg.withdraw_artifact(run, report, "quoted an access key", lease=tok)
    write(report, CLEAN)
    lg.artifact(run, tok, report, worker="w1")
    lg.submit(run, tok, "report written, key removed", worker="w1")
    assert lg.sanitize(run, by="alice")["passed"]
    sent = lg.deliver(run, "v1", send=True, by="alice")
    assert sent.status == "confirmed" and lg.checkpoint(run).state == T.DELIVERED
    delivered = os.listdir(tmp_path / "outbox-r1")
    assert delivered and SECRET not in "".join(open(tmp_path / "outbox-r1" / f).read() for f in delivered)
    lg.close()


def test_once_the_lease_is_gone_a_worker_claims_the_reopened_run(tmp_path):
    lg = new_ledger(tmp_path)
    run, tok, report = leaky_run(lg, tmp_path)
    lg.sanitize(run, by="alice")
    lg.release(run, tok, "done", worker="w1")
    lg.reopen(run, by="op", reason="leaks a key", as_operator=True)
    tok2 = lg.claim(run, "w2")
    lg.withdraw_artifact(run, report, "leaks a key", lease=tok2)
    assert lg.checkpoint(run).state == T.VERIFYING and not lg.checkpoint(run).artifacts
    lg.close()


def test_the_check_line_in_the_log_names_its_verdict_and_detectors_never_the_text(tmp_path):
    lg = new_ledger(tmp_path)
    run, _, _ = leaky_run(lg, tmp_path)
    lg.sanitize(run, by="alice")
    [rec] = [r for r in lg.log(run) if r.type == "sanitization_checked"]
    line = summarize(rec.event)
    assert line.startswith("FAILED") and rec.event.findings
    for f in rec.event.findings:
        assert f.detector in line
    assert SECRET not in line and "AKIA" not in line
    lg.close()


# --- every other case is refused, and writes nothing ------------------------------------


def test_refused_without_a_failed_check(tmp_path):
    lg = new_ledger(tmp_path)
    run, _, _ = leaky_run(lg, tmp_path)
    refused(lg, E.IllegalTransition, lambda: lg.reopen(run, by="alice", reason="r"), "no sanitization check")
    write(str(tmp_path / "work-r1" / "report.md"), LEAKY)
    run2 = bring(lg, tmp_path, T.SUCCEEDED, run_id="r2")
    lg.sanitize(run2.id, by="alice")  # a clean report: the check passes
    refused(lg, E.IllegalTransition, lambda: lg.reopen(run2.id, by="alice", reason="r"), "passed")
    lg.close()


def test_refused_while_a_delivery_attempt_waits_for_its_outcome(tmp_path):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.SUCCEEDED)
    lg.deliver(run.id, "d1", by="alice")  # not public: no gate; the attempt stays open
    lg.execute(run.id, _failing_check(), actor=Actor("owner", "alice"))
    refused(lg, E.DeliveryRefused, lambda: lg.reopen(run.id, by="alice", reason="r"), "no outcome")
    lg.delivery_failed(run.id, "d1", "target returned 503")
    assert lg.reopen(run.id, by="alice", reason="r").checkpoint.state == T.VERIFYING
    lg.close()


def _failing_check() -> C.Sanitize:
    from handoff.ledger import events as ev
    from handoff.reducers import sanitize as sz

    digest = "cd" * 32
    return C.Sanitize(passed=False, bundle_sha256=digest, items=(ev.ScannedItem("summary", digest, 3),),
                      findings=(ev.Finding("aws_access_key", "summary", 1),), rules_sha256=sz.rules_digest(()))


@pytest.mark.parametrize("state", [T.QUEUED, T.PLANNING, T.EXECUTING, T.VERIFYING, T.BLOCKED, T.UNKNOWN,
                                   T.READY_FOR_REVIEW])
def test_refused_in_every_other_live_state(tmp_path, state):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    exc = refused(lg, E.IllegalTransition, lambda: lg.reopen(run.id, by="alice", reason="r"), state)
    if state == T.READY_FOR_REVIEW:
        assert "reject the review" in exc.message.lower()
    lg.close()


@pytest.mark.parametrize("state", [T.DELIVERED, T.NO_OP, T.CANCELLED, T.FAILED])
def test_refused_after_the_end(tmp_path, state):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, state)
    refused(lg, E.TerminalRun, lambda: lg.reopen(run.id, by="alice", reason="r"), "ended")
    lg.close()


def test_refused_to_anyone_but_the_owner_or_an_operator_and_without_a_reason(tmp_path):
    lg = new_ledger(tmp_path)
    run, tok, _ = leaky_run(lg, tmp_path)
    lg.sanitize(run, by="alice")
    refused(lg, E.NotAuthorized, lambda: lg.reopen(run, by="mallory", reason="r"), "not the owner")
    for actor in (Actor("worker", "w1"), WATCHDOG):
        refused(lg, E.NotAuthorized, lambda a=actor: lg.execute(run, C.Reopen(reason="r"), actor=a))
    refused(lg, E.InvalidInput, lambda: lg.reopen(run, by="alice", reason="  "), "reason")
    assert lg.execute(run, C.Reopen(reason="r"), actor=OPERATOR).checkpoint.state == T.VERIFYING
    lg.close()


def test_a_retry_under_the_same_key_reopens_once(tmp_path):
    lg = new_ledger(tmp_path)
    run, _, _ = leaky_run(lg, tmp_path)
    lg.sanitize(run, by="alice")
    first = lg.reopen(run, by="alice", reason="r", key="reopen-1")
    again = lg.reopen(run, by="alice", reason="r", key="reopen-1")
    assert again.result.outcome == "duplicate" and again.result.first_seq == first.result.first_seq
    assert [r.type for r in log(lg)].count("run_reopened") == 1
    lg.close()


# --- the rule over random checkpoints ----------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=st.sampled_from(T.STATES), passed=st.none() | st.booleans(), pending=st.booleans())
def test_reopen_is_accepted_exactly_when_succeeded_with_a_failed_check_and_nothing_in_flight(state, passed, pending):
    """decide, over every state and check and attempt: the only accepted case is the one
    the lifecycle names, and what it writes moves the run to verifying."""
    from msgspec.structs import replace

    from handoff.reducers import delivery as dl
    from handoff.reducers.checkpoint import initial

    d = dl.Delivery()
    if passed is not None:
        d = replace(d, check=dl.Check(passed, "ab" * 32, (), (), "", 5))
    if pending:
        d = replace(d, attempts=(dl.Attempt("k1", "alice", 0, 6),))
    cp = replace(initial("r1"), opened=True, owner="alice", state=state, delivery=d)
    ctx = D.Context(actor=Actor("owner", "alice"))
    ok = state == T.SUCCEEDED and passed is False and not pending
    try:
        out = D.decide(cp, C.Reopen(reason="leaks a key"), ctx)
    except E.LedgerError as exc:
        assert not ok, exc.message
        assert isinstance(exc, (E.IllegalTransition, E.TerminalRun, E.DeliveryRefused))
    else:
        assert ok
        assert [type(e).__name__ for e in out] == ["RunReopened", "StateChanged"]
        assert out[1].to_state == T.VERIFYING and out[0].check_seq == 5
