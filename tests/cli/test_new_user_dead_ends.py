"""Two dead ends a new user met, from the command line.

Leaving ``unknown``: the health hint said "claim" while a worker held the lease (a claim
is then refused). A public delivery refused by the sanitization gate after submit: no
command moved the run on. And the ledger's own answers after the watchdog acts:
``status`` keeps the work's last progress.
"""

from __future__ import annotations

import json
import os

from handoff import Actor
from handoff.reducers import transitions as T

SECRET = "AKIAIOSFODNN7EXAMPLE"


def _lost_effect(h, run: str = "r1") -> None:
    """A run left in unknown: its worker started a side effect and lost the lease."""
    with h.ledger() as lg:
        lg.open(goal="g", target="chat:#ops", owner="alice", run_id=run)
        tok = lg.claim(run, "w1")
        lg.transition(run, tok, T.PLANNING, worker="w1")
        lg.transition(run, tok, T.EXECUTING, worker="w1")
        lg.effect_start(run, tok, "mail-1", "mail the report", worker="w1")
        lg.revoke(run, "no heartbeat", actor=Actor("watchdog", "dog"))


def _health(h, run: str = "r1") -> dict:
    return h.json("status", run)["health"]


def test_leaving_unknown_the_hint_names_the_next_step_for_who_holds_the_run(h):
    _lost_effect(h)
    health = _health(h)
    assert (health["classification"], health["action"]) == ("needs_reconciliation", "reconcile")
    assert "effect-confirm" in health["reason"] and "claim" in health["reason"]

    # A worker claims before anyone reconciles: the next step is still the reconciliation,
    # and after it the holder moves on, it does not claim.
    h("claim", "r1", "--worker", "w2")
    health = _health(h)
    assert health["action"] == "reconcile" and "w2" in health["reason"]
    assert "handoff claim" not in health["reason"]

    h("effect-confirm", "r1", "--effect-key", "mail-1", "--outcome", "absent", "--by", "op", "--note", "no mail sent")
    health = _health(h)
    assert (health["classification"], health["action"]) == ("needs_worker", "transition")
    assert "w2" in health["reason"] and "claim" not in health["reason"]
    # ... and what the hint says is what works: a claim is refused, the transition is not.
    refused = h("claim", "r1", "--worker", "w3", code=1)
    assert "held by w2" in refused.stderr


def test_leaving_unknown_with_no_lease_the_hint_says_claim_first(h):
    _lost_effect(h)
    h("effect-confirm", "r1", "--effect-key", "mail-1", "--outcome", "done", "--by", "op", "--note", "mail arrived")
    health = _health(h)
    assert (health["classification"], health["action"]) == ("needs_worker", "claim")
    assert "transition" in health["reason"]


def test_status_keeps_the_works_last_progress_after_the_watchdog_revokes(h):
    _lost_effect(h)
    doc = h.json("status", "r1")
    assert doc["state"] == T.UNKNOWN
    assert doc["last_progress"]["kind"] == "state:executing"
    log = h.json("log", "r1")["events"]
    [moved] = [e for e in log if e["type"] == "state_changed" and "-> unknown" in e["summary"]]
    assert moved["actor"] == "watchdog:dog" and doc["last_progress"]["seq"] < moved["seq"]


def _leaky(h, tmp_path) -> str:
    work = tmp_path / "work"
    work.mkdir()
    report = work / "report.md"
    report.write_text(f"# Report\n\nUsed key {SECRET} to fetch the dump.\n")
    out = tmp_path / "outbox"
    out.mkdir()
    with h.ledger() as lg:
        lg.open(goal="g", target=f"file://{out}", owner="alice", run_id="r1", public=True)
        tok = lg.claim("r1", "w1")
        for to in (T.PLANNING, T.EXECUTING, T.VERIFYING):
            lg.transition("r1", tok, to, worker="w1")
        lg.artifact("r1", tok, str(report), worker="w1")
        lg.evidence("r1", "tests", "pass", lease=tok)
        lg.submit("r1", tok, "done", worker="w1")
    return tok


def test_reopen_from_the_command_line(h, tmp_path):
    tok = _leaky(h, tmp_path)
    h("sanitize", "r1", "--by", "alice", code=None)
    line = [e for e in h.json("log", "r1")["events"] if e["type"] == "sanitization_checked"][0]["summary"]
    assert line.startswith("FAILED") and "AKIA" not in line
    before = h.json("log", "r1")["events"]
    # Refusals exit with the documented code and change nothing.
    err = h("reopen", "r1", "--by", "mallory", "--reason", "x", code=1)
    assert "not the owner" in err.stderr and "Traceback" not in err.stderr
    err = h("reopen", "r1", "--by", "alice", "--reason", "", code=2)
    assert "reason" in err.stderr
    assert h.json("log", "r1")["events"] == before
    doc = h.json("reopen", "r1", "--by", "alice", "--reason", "the report quotes a key")
    assert doc["state"] == T.VERIFYING
    err = h("reopen", "r1", "--by", "alice", "--reason", "again", code=1)
    assert "verifying" in err.stderr
    report = str(tmp_path / "work" / "report.md")
    h("artifact-withdraw", "r1", report, "--reason", "quoted a key", "--lease", tok)
    with open(report, "w") as f:
        f.write("# Report\n\nFetched with the read-only role.\n")
    h("artifact", "r1", report, "--lease", tok)
    h("submit", "r1", "--lease", tok, "--summary", "key removed")
    h("sanitize", "r1", "--by", "alice")
    h("deliver", "r1", "--by", "alice", "--delivery-key", "v1", "--send")
    assert h.json("status", "r1")["state"] == T.DELIVERED
    sent = os.listdir(tmp_path / "outbox")
    assert sent and all(SECRET not in (tmp_path / "outbox" / f).read_text() for f in sent)


def test_reopen_json_shape(h, tmp_path):
    _leaky(h, tmp_path)
    h("sanitize", "r1", "--by", "alice", code=None)
    out = h("reopen", "r1", "--by", "alice", "--reason", "quotes a key", "--json")
    doc = json.loads(out.stdout)
    assert doc["run_id"] == "r1" and doc["state"] == T.VERIFYING and doc["outcome"] == "committed"
