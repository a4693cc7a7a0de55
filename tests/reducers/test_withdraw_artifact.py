"""Withdrawing an artifact: a mistyped path no longer makes a run impossible to submit.

One ``handoff artifact`` with a wrong path used to be recorded as MISSING for good:
``submit`` refused the run forever and nothing could take the record back. Now
``artifact_withdrawn`` (its own event; the log keeps both) removes the path from the
checkpoint, under the rules of transitions.py (who: the lease holder, the owner, an
operator; where: ``WITHDRAWABLE``), with a typed refusal for each way it can be wrong.
"""

from __future__ import annotations

import json
import os

import pytest

from handoff import Actor
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.reducers import commands as C
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import fold

from .helpers import OPERATOR, OWNER, bring, execute, log, new_ledger, refused

W1 = Actor("worker", "w1")


@pytest.fixture
def lg(tmp_path):
    ledger = new_ledger(tmp_path)
    yield ledger
    ledger.close()


def _mistyped(lg, tmp_path, run):
    """The story of the defect: the right file, and a mistyped path recorded as MISSING."""
    lg.artifact(run.id, run.lease, run.result, worker="w1")
    typo = os.path.join(os.path.realpath(str(tmp_path)), "r1-reslut.md")
    out = lg.artifact(run.id, run.lease, typo, worker="w1")
    assert out.checkpoint.artifacts[-1].exists is False
    return typo


def test_a_mistyped_artifact_blocked_submit_until_withdrawn(lg, tmp_path):
    run = bring(lg, tmp_path, T.VERIFYING)
    typo = _mistyped(lg, tmp_path, run)
    refused(lg, E.EvidenceMissing, lambda: lg.submit(run.id, run.lease, "done", worker="w1"), "missing",
            "artifact-withdraw")
    out = lg.withdraw_artifact(run.id, typo, "typo in the file name", lease=run.lease)
    assert out.result.outcome == "committed" and [a.path for a in out.checkpoint.artifacts] == [run.result]
    assert out.checkpoint.progress_seq == lg.checkpoint(run.id).progress_seq  # a correction, not progress
    assert lg.submit(run.id, run.lease, "done", worker="w1").checkpoint.state == T.SUCCEEDED
    # The log keeps both: what was recorded, and that it was taken back and why.
    types = [(r.type, getattr(r.event, "path", None)) for r in lg.log(run.id)]
    assert ("artifact_recorded", typo) in types and ("artifact_withdrawn", typo) in types
    withdrawn = [r for r in lg.log(run.id) if r.type == "artifact_withdrawn"][0]
    assert withdrawn.event == ev.ArtifactWithdrawn(path=typo, reason="typo in the file name")
    assert withdrawn.actor == "worker:w1" and withdrawn.lease == run.lease.lease  # the number, never the token


def test_owner_and_operator_may_withdraw_a_stranger_may_not(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    typo = _mistyped(lg, tmp_path, run)
    refused(lg, E.NotAuthorized, lambda: lg.withdraw_artifact(run.id, typo, "x", actor=Actor("owner", "mallory")),
            "not the owner")
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, Actor("watchdog", "dog"),
                                                 C.WithdrawArtifact(path=typo, reason="x")), "watchdog")
    refused(lg, E.NotAuthorized, lambda: execute(lg, run.id, W1, C.WithdrawArtifact(path=typo, reason="x")),
            "lease")
    assert lg.withdraw_artifact(run.id, typo, "typo", actor=OWNER).result.outcome == "committed"
    lg.artifact(run.id, run.lease, typo, worker="w1")
    assert lg.withdraw_artifact(run.id, typo, "typo again", actor=OPERATOR).result.outcome == "committed"


def test_a_path_never_recorded_or_already_withdrawn_is_refused(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    typo = _mistyped(lg, tmp_path, run)
    refused(lg, E.UnknownArtifact, lambda: lg.withdraw_artifact(run.id, "/nowhere/else.md", "x", lease=run.lease),
            "no artifact recorded at /nowhere/else.md", run.result)
    lg.withdraw_artifact(run.id, typo, "typo", lease=run.lease)
    exc = refused(lg, E.UnknownArtifact, lambda: lg.withdraw_artifact(run.id, typo, "typo", lease=run.lease),
                  "withdrawn already")
    assert exc.exit_code == 1


def test_a_retry_with_the_same_key_is_a_duplicate(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    typo = _mistyped(lg, tmp_path, run)
    first = lg.withdraw_artifact(run.id, typo, "typo", lease=run.lease, key="w-1")
    before = log(lg)
    again = lg.withdraw_artifact(run.id, typo, "typo", lease=run.lease, key="w-1")
    assert again.result.outcome == "duplicate" and again.result.first_seq == first.result.first_seq
    assert log(lg) == before


def test_under_a_stale_lease_nothing_is_withdrawn(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    typo = _mistyped(lg, tmp_path, run)
    lg.revoke(run.id, "replaced", actor=OPERATOR)
    lg.claim(run.id, "w2")
    refused(lg, E.StaleLease, lambda: lg.withdraw_artifact(run.id, typo, "typo", lease=run.lease))


@pytest.mark.parametrize("state", [T.READY_FOR_REVIEW, T.SUCCEEDED])
def test_not_once_a_result_is_submitted(lg, tmp_path, state):
    run = bring(lg, tmp_path, state)
    refused(lg, E.IllegalTransition, lambda: lg.withdraw_artifact(run.id, run.result, "x", actor=OWNER),
            state, "submitted result")


@pytest.mark.parametrize("state", [T.DELIVERED, T.NO_OP, T.CANCELLED, T.FAILED])
def test_not_after_the_run_ended(lg, tmp_path, state):
    run = bring(lg, tmp_path, state)
    refused(lg, E.TerminalRun, lambda: lg.withdraw_artifact(run.id, run.result, "x", actor=OWNER), "ended")


@pytest.mark.parametrize("state", sorted(T.WITHDRAWABLE))
def test_allowed_in_every_withdrawable_state(lg, tmp_path, state):
    run = bring(lg, tmp_path, state)
    lease = run.lease
    lg.artifact(run.id, lease or lg.claim(run.id, "w9"), run.result, worker="w1")
    assert lg.checkpoint(run.id).state == state
    out = lg.withdraw_artifact(run.id, run.result, "replaced by a better file", actor=OPERATOR)
    assert out.checkpoint.artifacts == () and out.checkpoint.state == state


def test_a_relative_path_is_matched_as_artifact_resolved_it(lg, tmp_path, monkeypatch):
    run = bring(lg, tmp_path, T.EXECUTING)
    monkeypatch.chdir(tmp_path)
    lg.artifact(run.id, run.lease, "notes.md", worker="w1")  # missing, recorded resolved
    out = lg.withdraw_artifact(run.id, "notes.md", "typo", lease=run.lease)
    assert out.result.outcome == "committed" and all(a.path != "notes.md" for a in out.checkpoint.artifacts)


@pytest.mark.parametrize("field, kw", [("reason", {"reason": "  "}), ("path", {"path": ""})])
def test_malformed_input_is_invalid_input(lg, tmp_path, field, kw):
    run = bring(lg, tmp_path, T.EXECUTING)
    args = {"path": run.result, "reason": "x", **kw}
    exc = refused(lg, E.InvalidInput, lambda: execute(lg, run.id, OPERATOR, C.WithdrawArtifact(**args)))
    assert exc.field == field


def test_the_fold_of_an_old_log_is_unchanged_and_a_withdrawal_folds(lg, tmp_path):
    run = bring(lg, tmp_path, T.EXECUTING)
    typo = _mistyped(lg, tmp_path, run)
    before = fold(list(lg.store.history(run.id)), run.id)
    assert [a.path for a in before.artifacts] == [run.result, typo]
    lg.withdraw_artifact(run.id, typo, "typo", lease=run.lease)
    after = fold(list(lg.store.history(run.id)), run.id)
    assert [a.path for a in after.artifacts] == [run.result]
    assert after == lg.checkpoint(run.id)  # the kept view agrees with a fresh fold
    assert lg.verify() == [] and lg.check() == []


def test_the_cli_verb(tmp_path):
    from tests.support import Handoff

    h = Handoff(str(tmp_path / "cli.db"))
    with h.ledger() as lg:
        run = bring(lg, tmp_path, T.VERIFYING)
    typo = str(tmp_path / "reprot.md")
    assert "MISSING" in h("artifact", run.id, "--lease", run.lease, typo).stdout
    assert "artifact-withdraw" in h("submit", run.id, "--lease", run.lease, code=1).stderr
    doc = h.json("artifact-withdraw", run.id, typo, "--lease", run.lease, "--reason", "typo", "--key", "k")
    assert doc["outcome"] == "committed" and doc["path"] == os.path.realpath(typo)
    again = h.json("artifact-withdraw", run.id, typo, "--lease", run.lease, "--reason", "typo", "--key", "k")
    assert again["outcome"] == "duplicate" and again["first_seq"] == doc["first_seq"]
    res = h("artifact-withdraw", run.id, typo, "--lease", run.lease, "--reason", "typo", "--json", code=1)
    assert json.loads(res.stderr)["error"]["type"] == "UnknownArtifact"
    h("artifact", run.id, "--lease", run.lease, run.result)
    h("artifact", run.id, "--lease", run.lease, str(tmp_path / "old-notes.md"))
    out = h("artifact-withdraw", run.id, str(tmp_path / "old-notes.md"), "--reason", "not needed", "--by", "erin")
    assert "withdrawn" in out.stdout
    with h.ledger() as lg:
        assert list(lg.log(run.id))[-1].actor == "operator:erin"
    assert "succeeded" in h("submit", run.id, "--lease", run.lease).stdout
