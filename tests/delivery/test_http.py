"""deliver --send to a webhook: a real HTTP server on 127.0.0.1 answers each way it can."""

from __future__ import annotations

import hashlib
import json

import pytest

from handoff.ledger.errors import DeliveryRefused, InvalidInput
from handoff.ledger.events import SendPolicy

from .conftest import log_types, ready_run
from .server import Deaf, Receiver

FAST = SendPolicy(timeout_s=1.0, retries=2, backoff_s=0.0)


def no_sleep(_s: float) -> None:
    pass


def test_a_send_posts_the_bundle_with_the_key_and_records_the_receipt(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, send=FAST)
    sent = lg.deliver(run, "report-v1", send=True, by="alice")
    assert sent.status == "confirmed" and sent.sent and sent.tries == 1
    [req] = receiver.requests
    assert req["key"] == "report-v1"
    body = json.loads(req["body"])
    assert body["format"] == "handoff-delivery/1" and body["run_id"] == run
    assert body["summary"] == "the report is done"
    [art] = body["artifacts"]
    assert art["name"] == "report.md" and art["content"].startswith("# Report")
    assert str(tmp_path) not in req["body"].decode()  # the local path is not sent, only the name
    assert req["headers"]["X-Handoff-Bundle-Sha256"] == hashlib.sha256(req["body"]).hexdigest()
    assert "id msg-1" in sent.receipt
    assert log_types(lg, run)[-4:] == ["delivery_attempted", "delivery_confirmed", "state_changed", "lease_released"]
    cp = lg.checkpoint(run)
    assert cp.state == "delivered" and cp.delivery.receipt == sent.receipt
    # Again: already confirmed, nothing is sent.
    again = lg.deliver(run, "report-v1", send=True, by="alice")
    assert again.status == "confirmed" and not again.sent and len(receiver.requests) == 1


def test_a_reference_send_carries_no_content(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(inline=False))
    lg.deliver(run, "k", send=True, by="alice")
    [art] = json.loads(receiver.requests[0]["body"])["artifacts"]
    assert "content" not in art and len(art["sha256"]) == 64


def test_5xx_is_retried_under_the_same_key_then_left_unknown(lg, tmp_path, receiver):
    receiver.mode = "5xx"
    run = ready_run(lg, tmp_path, receiver.url, send=FAST)
    sent = lg.send_delivery(run, "k1", sleep=no_sleep, by="alice")
    assert sent.status == "unknown" and sent.tries == 3
    assert [r["key"] for r in receiver.requests] == ["k1", "k1", "k1"]
    assert log_types(lg, run)[-2:] == ["delivery_attempted", "delivery_unanswered"]
    st = lg.status(run)["delivery"]
    assert st["status"] == "attempted" and "send again" in st["detail"]
    assert lg.deliveries(status="ambiguous") == [] and lg.check() == []  # not before the timeout
    # The receiver recovers: the same key is sent again and confirmed once.
    receiver.mode = "ok"
    sent = lg.send_delivery(run, "k1", sleep=no_sleep, by="alice")
    assert sent.status == "confirmed" and len(receiver.effects) == 1
    assert log_types(lg, run).count("delivery_confirmed") == 1


def test_a_hang_past_the_timeout_is_unknown_and_a_resend_acts_once(lg, tmp_path, receiver):
    receiver.mode = "act_then_hang"
    run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(timeout_s=0.5, retries=0))
    sent = lg.deliver(run, "k1", send=True, by="alice")
    assert sent.status == "unknown" and "no answer within 0.5s" in sent.error
    assert len(receiver.effects) == 1  # it did arrive; the ledger cannot know that
    receiver.mode = "ok"
    sent = lg.deliver(run, "k1", send=True, by="alice")
    assert sent.status == "confirmed"
    assert len(receiver.effects) == 1 and len(receiver.requests) == 2


def test_a_connection_closed_after_acting_is_unknown_never_failed(lg, tmp_path, receiver):
    receiver.mode = "close_after_act"
    run = ready_run(lg, tmp_path, receiver.url, send=FAST)
    sent = lg.send_delivery(run, "k1", sleep=no_sleep, by="alice")
    assert sent.status == "unknown" and "connection ended" in sent.error
    assert len(receiver.effects) == 1 and len(receiver.requests) == 3  # retried, acted once
    receiver.mode = "ok"
    assert lg.send_delivery(run, "k1", by="alice").status == "confirmed"
    assert len(receiver.effects) == 1


def test_a_target_that_does_not_dedupe_shows_why_keys_matter(lg, tmp_path):
    rx = Receiver(dedupe=False)
    try:
        rx.mode = "close_after_act"
        run = ready_run(lg, tmp_path, rx.url, send=SendPolicy(timeout_s=1.0, retries=1, backoff_s=0.0))
        lg.send_delivery(run, "k1", sleep=no_sleep, by="alice")
        # Every request carried the same key; a receiver that ignores it acts each time.
        assert {r["key"] for r in rx.requests} == {"k1"} and len(rx.effects) == 2
    finally:
        rx.close()


def test_4xx_is_a_known_failure_and_a_new_key_may_follow(lg, tmp_path, receiver):
    receiver.mode = "400"
    run = ready_run(lg, tmp_path, receiver.url, send=FAST)
    sent = lg.send_delivery(run, "k1", sleep=no_sleep, by="alice")
    assert sent.status == "failed" and "HTTP 400" in sent.error and sent.tries == 1
    assert lg.status(run)["delivery"]["status"] == "failed"
    with pytest.raises(DeliveryRefused, match="already failed"):
        lg.send_delivery(run, "k1", by="alice")
    receiver.mode = "ok"
    assert lg.send_delivery(run, "k2", by="alice").status == "confirmed"


def test_nobody_listening_is_a_failure_nothing_sent(lg, tmp_path):
    deaf = Deaf()
    url = deaf.url
    deaf.close()  # the port is now closed: connecting is refused
    run = ready_run(lg, tmp_path, url, send=FAST)
    sent = lg.send_delivery(run, "k1", sleep=no_sleep, by="alice")
    assert sent.status == "failed" and "nothing was sent" in sent.error and sent.tries == 3


def test_the_bearer_token_comes_from_the_environment_and_never_reaches_the_log(lg, tmp_path, receiver):
    secret = "tok-" + "s3cr3t" * 6
    run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(token_env="HANDOFF_TOKEN_HOOK"))
    before = [r.payload for r in lg.log(run)]
    with pytest.raises(InvalidInput, match=r"\$HANDOFF_TOKEN_HOOK, which is not set"):
        lg.send_delivery(run, "k1", env={}, by="alice")
    assert [r.payload for r in lg.log(run)] == before and not receiver.requests
    sent = lg.send_delivery(run, "k1", env={"HANDOFF_TOKEN_HOOK": secret}, by="alice")
    assert sent.status == "confirmed"
    assert receiver.requests[0]["headers"]["Authorization"] == f"Bearer {secret}"
    everything = b"".join(lg.export([run])) + sent.receipt.encode()
    assert secret.encode() not in everything


def test_a_credential_in_the_target_url_is_refused_at_open(lg):
    with pytest.raises(InvalidInput, match="user name or password"):
        lg.open(goal="g", target="https://bob:pw@hooks.example/x", owner="alice")
    assert list(lg.store.list_runs()) == []


def test_a_target_without_an_adapter_is_refused_before_anything_is_recorded(lg, tmp_path):
    run = ready_run(lg, tmp_path, "chat:#ops")
    n = len(log_types(lg, run))
    with pytest.raises(InvalidInput, match="has no adapter"):
        lg.deliver(run, "k1", send=True, by="alice")
    assert len(log_types(lg, run)) == n


def test_https_to_a_server_without_tls_fails_before_anything_is_sent(lg, tmp_path, receiver):
    url = receiver.url.replace("http://", "https://")
    run = ready_run(lg, tmp_path, url, send=SendPolicy(timeout_s=2.0, retries=0))
    sent = lg.send_delivery(run, "k1", by="alice")
    assert sent.status == "failed" and "nothing was sent" in sent.error
    assert receiver.requests == [] and receiver.effects == []
