"""The sanitization gate of a public target: fail closed, prove what was checked."""

from __future__ import annotations

import json
import os

import pytest

from handoff.facade import Ledger
from handoff.ledger.errors import DeliveryRefused, IllegalTransition, InvalidInput, SanitizationRequired

from .conftest import ready_run

CLEAN = "# Report\n\nThe service recovered at 10:04 after the cache was flushed.\n"
PLANTED = {
    "private path": "# Report\n\nLogs are in /home/alice/incident/logs.txt\n",
    "key": "# Report\n\nUsed key AKIAIOSFODNN7EXAMPLE to fetch the dump.\n",
    "private address": "# Report\n\nThe cache at 10.2.3.4 was flushed.\n",
}


def payloads(lg: Ledger, run: str) -> list[bytes]:
    return [r.payload for r in lg.log(run)]


@pytest.mark.parametrize("what", sorted(PLANTED))
def test_a_planted_secret_refuses_delivery_and_the_target_receives_nothing(lg, tmp_path, receiver, what):
    run = ready_run(lg, tmp_path, receiver.url, content=PLANTED[what], public=True)
    with pytest.raises(SanitizationRequired, match="no sanitization check"):
        lg.deliver(run, "v1", send=True, by="alice")
    doc = lg.sanitize(run, by="alice")
    assert not doc["passed"] and doc["findings"]
    [ev] = [r.event for r in lg.log(run) if r.type == "sanitization_checked"]
    assert not ev.passed and ev.bundle_sha256 == doc["bundle_sha256"]
    assert {i.name for i in ev.items} == {"summary", str(tmp_path / "work" / "report.md")}
    # The log names where, never what: the planted text is not in it.
    secret = PLANTED[what].split("\n")[2].split()[-1 if what != "key" else 2]
    assert secret.encode() not in b"".join(payloads(lg, run))
    before = payloads(lg, run)
    with pytest.raises(SanitizationRequired, match="failed"):
        lg.deliver(run, "v1", send=True, by="alice")
    with pytest.raises(SanitizationRequired):
        lg.deliver(run, "v1", by="alice")  # recording a send by hand is gated the same way
    assert payloads(lg, run) == before
    assert receiver.requests == []


def test_the_clean_version_goes_through_once(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    assert lg.sanitize(run, by="alice")["passed"]
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"
    assert lg.deliver(run, "v1", send=True, by="alice").sent is False
    assert len(receiver.requests) == 1 and len(receiver.effects) == 1
    attempted = [r.event for r in lg.log(run) if r.type == "delivery_attempted"]
    checked = [r.event for r in lg.log(run) if r.type == "sanitization_checked"]
    assert attempted[0].bundle_sha256 == checked[0].bundle_sha256


def test_a_change_on_disk_after_the_check_refuses_delivery(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    assert lg.sanitize(run, by="alice")["passed"]
    (tmp_path / "work" / "report.md").write_text(CLEAN + "Also see /home/alice/notes.\n")
    before = payloads(lg, run)
    with pytest.raises(DeliveryRefused, match="no longer matches what the log recorded"):
        lg.deliver(run, "v1", send=True, by="alice")
    assert payloads(lg, run) == before and receiver.requests == []


def test_a_new_result_after_the_check_needs_a_new_check(lg, tmp_path, receiver):
    art = tmp_path / "report.md"
    art.write_text(CLEAN)
    run = lg.open(goal="g", target=receiver.url, owner="alice", public=True, require_review=True)
    tok = lg.claim(run, "w1")
    for s in ("planning", "executing"):
        lg.transition(run, tok, s)
    lg.artifact(run, tok, str(art))
    lg.transition(run, tok, "verifying")
    lg.evidence(run, "tests", "pass", lease=tok)
    lg.submit(run, tok, "v1")
    assert lg.sanitize(run, by="alice")["passed"]
    lg.review(run, False, "add the timeline", by="alice")  # back to executing
    art.write_text(CLEAN + "Timeline: 09:58 alert, 10:04 recovered.\n")
    lg.artifact(run, tok, str(art))
    lg.transition(run, tok, "verifying")
    lg.submit(run, tok, "v2")
    lg.review(run, True, by="alice")
    before = payloads(lg, run)
    with pytest.raises(SanitizationRequired, match="changed at seq .* after the last sanitization check"):
        lg.deliver(run, "v1", send=True, by="alice")
    assert payloads(lg, run) == before and receiver.requests == []
    assert lg.sanitize(run, by="alice")["passed"]
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"
    assert "Timeline" in json.loads(receiver.requests[0]["body"])["artifacts"][0]["content"]


def test_an_unreadable_artifact_refuses_the_check_and_delivery(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    os.remove(tmp_path / "work" / "report.md")
    before = payloads(lg, run)
    with pytest.raises(DeliveryRefused, match="no longer exists"):
        lg.sanitize(run, by="alice")
    with pytest.raises(DeliveryRefused, match="no longer exists"):
        lg.deliver(run, "v1", send=True, by="alice")
    assert payloads(lg, run) == before and receiver.requests == []


def test_binary_content_is_unscannable(tmp_path, receiver):
    lg = Ledger(str(tmp_path / "b.db"))
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\xff\xfe binary \x00\x01")
    run = lg.open(goal="g", target=receiver.url, owner="alice", public=True)
    tok = lg.claim(run, "w1")
    for s in ("planning", "executing"):
        lg.transition(run, tok, s)
    lg.artifact(run, tok, str(path))
    lg.transition(run, tok, "verifying")
    lg.evidence(run, "tests", "pass", lease=tok)
    lg.submit(run, tok, "a blob")
    doc = lg.sanitize(run, by="alice")
    assert not doc["passed"] and doc["findings"][0]["detector"] == "unscannable"
    with pytest.raises(SanitizationRequired):
        lg.deliver(run, "v1", send=True, by="alice")
    assert receiver.requests == []
    lg.close()


def test_the_owners_own_pattern_is_a_detector(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN + "Project BLUEBIRD is on track.\n", public=True,
                    sanitize_patterns=(r"\bBLUEBIRD\b",))
    doc = lg.sanitize(run, by="alice")
    assert [f["detector"] for f in doc["findings"]] == ["pattern[0]"]


def test_a_bad_pattern_is_refused_at_open(lg):
    with pytest.raises(InvalidInput, match="not a valid regular expression"):
        lg.open(goal="g", target="chat:#x", owner="alice", sanitize_patterns=("(",))
    with pytest.raises(InvalidInput, match="matches empty text"):
        lg.open(goal="g", target="chat:#x", owner="alice", sanitize_patterns=("x*",))
    assert list(lg.store.list_runs()) == []


def test_a_key_that_looks_like_a_secret_is_refused(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    lg.sanitize(run, by="alice")
    with pytest.raises(SanitizationRequired, match="delivery key"):
        lg.deliver(run, "bob@example.com", send=True, by="alice")
    assert receiver.requests == []


def test_a_check_before_submission_is_refused(lg, tmp_path):
    run = lg.open(goal="g", target="chat:#x", owner="alice", public=True)
    before = payloads(lg, run)
    with pytest.raises(DeliveryRefused, match="no submitted result"):
        lg.sanitize(run, by="alice")
    from handoff.reducers import commands as C
    from handoff.ledger.store import Actor

    cmd = C.Sanitize(passed=True, bundle_sha256="0" * 64)
    with pytest.raises(IllegalTransition, match="once the run is ready_for_review or succeeded"):
        lg.execute(run, cmd, actor=Actor("owner", "alice"))
    assert payloads(lg, run) == before


def test_a_forged_check_is_refused(lg, tmp_path, receiver):
    from handoff.ledger.events import Finding
    from handoff.ledger.store import Actor
    from handoff.reducers import commands as C

    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    before = payloads(lg, run)
    owner = Actor("owner", "alice")
    with pytest.raises(InvalidInput, match="rules_sha256"):
        lg.execute(run, C.Sanitize(passed=True, bundle_sha256="0" * 64, rules_sha256="1" * 64), actor=owner)
    with pytest.raises(InvalidInput, match="exactly when it has no findings"):
        lg.execute(run, C.Sanitize(passed=True, bundle_sha256="0" * 64, findings=(Finding("email", "summary", 1),)),
                   actor=owner)
    from handoff.ledger.errors import NotAuthorized

    with pytest.raises(NotAuthorized):
        lg.execute(run, C.Sanitize(passed=False, bundle_sha256="0" * 64), actor=Actor("owner", "mallory"))
    assert payloads(lg, run) == before


def test_not_public_means_no_gate(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=PLANTED["key"])
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"


def test_a_transferee_may_check_and_deliver(lg, tmp_path, receiver):
    from handoff.ledger.errors import NotAuthorized

    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    lg.transfer(run, "deliver", "release-bot", by="alice")
    assert lg.sanitize(run, by="release-bot")["passed"]
    before = payloads(lg, run)
    # It could not record the outcome of its own send: refused before anything is sent.
    with pytest.raises(NotAuthorized, match="transferred 'delivered'"):
        lg.deliver(run, "v1", send=True, by="release-bot")
    assert payloads(lg, run) == before and receiver.requests == []
    lg.transfer(run, "delivered", "release-bot", by="alice")
    lg.transfer(run, "delivery_failed", "release-bot", by="alice")
    assert lg.deliver(run, "v1", send=True, by="release-bot").status == "confirmed"


def test_the_contract_file_marks_a_target_public(lg, tmp_path):
    run = lg.open_contract(json.dumps({"goal": "g", "target": "https://hooks.example/x", "owner": "alice",
                                       "public": True, "sanitize_patterns": ["ACME-\\d+"],
                                       "send": {"timeout_s": 5, "retries": 1, "token_env": "HANDOFF_TOKEN_HOOK"}}))
    d = lg.checkpoint(run).delivery
    assert d.public and d.patterns == ("ACME-\\d+",) and d.send.token_env == "HANDOFF_TOKEN_HOOK" and d.send.retries == 1
    with pytest.raises(InvalidInput, match="send.token_env"):
        lg.open_contract(json.dumps({"goal": "g", "target": "t", "owner": "a", "send": {"token_env": "A B"}}))


def test_a_detector_that_fails_refuses_the_check(lg, tmp_path, receiver, monkeypatch):
    from handoff.reducers import sanitize as sz

    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)

    def broken(*a, **k):
        raise RecursionError("a pattern blew the stack")

    monkeypatch.setattr(sz, "scan", broken)
    before = payloads(lg, run)
    with pytest.raises(SanitizationRequired, match="detector failed"):
        lg.sanitize(run, by="alice")
    assert payloads(lg, run) == before
    with pytest.raises(SanitizationRequired, match="no sanitization check"):
        lg.deliver(run, "v1", send=True, by="alice")
    assert receiver.requests == []


def test_many_findings_are_all_returned_and_the_log_keeps_the_first_ones(lg, tmp_path, receiver):
    from handoff.facade import MAX_RECORDED_FINDINGS

    content = "".join(f"host{i}.internal\n" for i in range(MAX_RECORDED_FINDINGS + 50))
    run = ready_run(lg, tmp_path, receiver.url, content=content, public=True)
    doc = lg.sanitize(run, by="alice")
    assert len(doc["findings"]) == MAX_RECORDED_FINDINGS + 50
    [ev] = [r.event for r in lg.log(run) if r.type == "sanitization_checked"]
    assert len(ev.findings) == MAX_RECORDED_FINDINGS + 1 and not ev.passed
    assert ev.findings[-1].detector == "more" and ev.findings[-1].count == 50
