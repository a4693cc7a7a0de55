"""What a webhook's headers carry: a bearer token or a delivery key a header cannot carry
unchanged is refused before the attempt is recorded (typed, the token never shown, the
log unchanged, the key still free), and anything that fails after the attempt was recorded
but before a byte left is recorded as a failure, so a new key can follow."""

from __future__ import annotations

import json
import sys
import tempfile

import pytest

from handoff.delivery import adapters as da
from handoff.delivery import bundle as db
from handoff.ledger.errors import InvalidInput
from handoff.ledger.events import SendPolicy
from tests.support import run_exe

from .conftest import log_types, ready_run
from .test_gate import payloads

FAST = SendPolicy(timeout_s=2.0, retries=0, backoff_s=0.0, token_env="HANDOFF_TOKEN_HOOK")
SECRET = "s3cr3t-b34r3r"

BAD_TOKENS = {
    "trailing newline": SECRET + "\n",
    "inner newline": SECRET + "\nX-Injected: 1",
    "carriage return": SECRET + "\r",
    "non-Latin-1": SECRET + "\u20ac",
    "Latin-1 but not ASCII": SECRET + "\u00e9",
    "inner space": "s3cr3t b34r3r",
    "control character": SECRET + "\x01",
}


@pytest.mark.parametrize("what", sorted(BAD_TOKENS))
def test_a_token_a_header_cannot_carry_is_refused_unseen_before_anything_is_recorded(lg, tmp_path, receiver, what):
    run = ready_run(lg, tmp_path, receiver.url, send=FAST)
    before = payloads(lg, run)
    with pytest.raises(InvalidInput) as err:
        lg.deliver(run, "v1", send=True, env={"HANDOFF_TOKEN_HOOK": BAD_TOKENS[what]}, by="alice")
    assert err.value.field == "token_env" and "$HANDOFF_TOKEN_HOOK" in err.value.message
    assert "s3cr3t" not in str(err.value) and "s3cr3t" not in repr(err.value.details)
    assert payloads(lg, run) == before and receiver.requests == []
    # The key was not used up: with the token fixed, the same key goes through.
    sent = lg.deliver(run, "v1", send=True, env={"HANDOFF_TOKEN_HOOK": SECRET}, by="alice")
    assert sent.status == "confirmed"
    assert receiver.requests[0]["headers"]["Authorization"] == f"Bearer {SECRET}"


def test_the_cli_refuses_a_bad_token_with_exit_2_no_traceback_and_never_prints_it(tmp_path, receiver, monkeypatch):
    from handoff.facade import Ledger

    db_path = str(tmp_path / "ledger.db")
    with Ledger(db_path) as lg:
        run = ready_run(lg, tmp_path, receiver.url, send=FAST)
        before = payloads(lg, run)
    monkeypatch.setenv("HANDOFF_TOKEN_HOOK", SECRET + "\n")  # the real process reads it from its environment
    for as_json in ((), ("--json",)):
        done = run_exe("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send", *as_json, db=db_path)
        assert done.returncode == InvalidInput.exit_code, done.stderr
        shown = done.stdout + done.stderr
        assert "Traceback" not in shown and "s3cr3t" not in shown and "HANDOFF_TOKEN_HOOK" in shown
        if as_json:
            assert json.loads(done.stdout or done.stderr)["error"]["type"] == "InvalidInput"
    with Ledger(db_path) as lg:
        assert payloads(lg, run) == before
    assert receiver.requests == []


@pytest.mark.parametrize("key", ["r\u00e9sum\u00e9-\u20ac", "caf\u00e9", "v1 ", " v1", "v1\u00a0x"])
def test_a_key_a_header_cannot_carry_is_refused_before_it_is_recorded(lg, tmp_path, receiver, key):
    run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(timeout_s=2.0, retries=0))
    before = payloads(lg, run)
    with pytest.raises(InvalidInput, match="Idempotency-Key") as err:
        lg.deliver(run, key, send=True, by="alice")
    assert err.value.field == "delivery_key"
    assert payloads(lg, run) == before and receiver.requests == []
    # Nothing is left open: another key is accepted at once.
    assert lg.deliver(run, "report-v1", send=True, by="alice").status == "confirmed"
    assert [r["key"] for r in receiver.requests] == ["report-v1"]


def test_a_key_with_inner_spaces_is_sent_as_it_is(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(timeout_s=2.0, retries=0))
    assert lg.deliver(run, "report v1 (final)", send=True, by="alice").status == "confirmed"
    assert receiver.requests[0]["key"] == "report v1 (final)"


def test_a_request_that_cannot_be_built_after_the_record_is_a_failure_and_nothing_left(lg, tmp_path, receiver):
    """The last line of defence behind ``prepare``: a header that fails while the request
    is built (before any byte is written) is a known failure, not an exception that
    leaves the attempt open."""
    run = ready_run(lg, tmp_path, receiver.url)
    bundle = db.build(lg.checkpoint(run))
    adapter = da.HttpAdapter(receiver.url, timeout_s=2.0)
    outcome, receipt, error = adapter.send_once(bundle, "caf\u20ac", run)  # prepare would have refused it
    assert (outcome, receipt) == ("failed", "") and "nothing was sent" in error
    assert receiver.requests == []


def test_a_command_whose_files_cannot_be_prepared_is_recorded_failed_and_a_new_key_follows(lg, tmp_path, monkeypatch):
    """After the attempt is recorded, a ``cmd:`` send that fails before the command starts
    (its work directory cannot be made) is recorded as failed: not left open, not
    unknown, so the run is not stuck waiting for a person."""
    run = ready_run(lg, tmp_path, f"cmd:{sys.executable} -c pass")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    sent = lg.deliver(run, "v1", send=True, by="alice")
    assert sent.status == "failed" and "nothing ran" in sent.error
    assert log_types(lg, run)[-2:] == ["delivery_attempted", "delivery_failed"]
    monkeypatch.undo()
    assert lg.deliver(run, "v2", send=True, by="alice").status == "confirmed"
