"""A sanitization detector that fails while a delivery to a public target is decided: the
refusal is typed (SanitizationRequired), nothing is written or sent, and the CLI exits
with its documented code and no traceback."""

from __future__ import annotations

import json

import pytest

from handoff.ledger.errors import SanitizationRequired
from handoff.reducers import sanitize as sz
from tests.support import Handoff

from .conftest import ready_run
from .test_gate import CLEAN, payloads


def broken(*a, **k):
    raise RecursionError("a pattern blew the stack")


@pytest.mark.parametrize("send", [True, False], ids=["send", "by hand"])
def test_a_detector_failing_at_the_gate_is_a_typed_refusal_and_nothing_moves(lg, tmp_path, receiver, monkeypatch, send):
    run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
    assert lg.sanitize(run, by="alice")["passed"]
    before = payloads(lg, run)
    monkeypatch.setattr(sz, "scan", broken)  # the gate scans the delivery key with it
    with pytest.raises(SanitizationRequired, match="detector failed") as err:
        lg.deliver(run, "v1", send=send, by="alice")
    assert "RecursionError" in err.value.message
    assert payloads(lg, run) == before and receiver.requests == []
    monkeypatch.undo()
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"


def test_the_cli_exits_1_without_a_traceback(tmp_path, receiver, monkeypatch):
    h = Handoff(str(tmp_path / "ledger.db"))
    with h.ledger() as lg:
        run = ready_run(lg, tmp_path, receiver.url, content=CLEAN, public=True)
        assert lg.sanitize(run, by="alice")["passed"]
        before = payloads(lg, run)
    monkeypatch.setattr(sz, "scan", broken)
    done = h("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send", "--json", code=SanitizationRequired.exit_code)
    assert json.loads(done.stdout or done.stderr)["error"]["type"] == "SanitizationRequired"
    assert "Traceback" not in done.stdout + done.stderr
    with h.ledger() as lg:
        assert payloads(lg, run) == before
    assert receiver.requests == []
