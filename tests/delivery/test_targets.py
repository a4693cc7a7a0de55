"""Adapter targets are parsed strictly when the contract is written: one the ledger could
never send to is refused at open (typed, naming the target field, no run written), and
every target open accepts is one the adapter can put on the wire."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handoff.delivery import adapters as da
from handoff.ledger.errors import InvalidInput
from handoff.ledger.events import SendPolicy
from handoff.reducers import targets
from tests.support import Handoff

from .conftest import ready_run

REFUSED = {
    "a space in the path": "http://hooks.example/a b",
    "a space in the host": "http://hooks example/x",
    "an unclosed IPv6 bracket": "http://[::1/x",
    "a bad IPv6 literal": "http://[zz]/x",
    "a non-ASCII path": "https://hooks.example/r\u00e9sum\u00e9",
    "a non-ASCII host": "https://b\u00fccher.example/x",
    "a port that is no number": "http://hooks.example:http/x",
    "a port out of range": "http://hooks.example:70000/x",
    "port 0": "http://hooks.example:0/x",
    "no host": "http:///x",
    "a credential": "https://bob:pw@hooks.example/x",
    "a relative directory": "file://outbox",
    "a remote directory": "file://host/srv/outbox",
    "an unclosed quote": "cmd:post 'to ops",
    "no command": "cmd:   ",
}

ACCEPTED = [
    "https://hooks.example/ops", "http://127.0.0.1:8080/hook?team=ops&x=%20y", "http://[::1]:9000/h",
    "https://xn--bcher-kva.example/x", "file:///srv/outbox", "file://localhost/srv/out%20box",
    "cmd:post --to 'ops channel'", "chat:#ops", "ticket 4711",
]


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_open_refuses_a_target_no_adapter_could_send_to(lg, what):
    target = REFUSED[what]
    with pytest.raises(InvalidInput) as err:
        lg.open(goal="g", target=target, owner="alice", run_id="run-t")
    assert err.value.field == "target"
    assert lg.store.head("run-t") is None and list(lg.runs(include_terminal=True)) == []
    # A contract file meets the same rule.
    with pytest.raises(InvalidInput) as err:
        lg.open_contract(json.dumps({"goal": "g", "target": target, "owner": "alice", "run_id": "run-t"}))
    assert err.value.field == "target" and lg.store.head("run-t") is None


def test_a_refused_credential_is_not_repeated_in_the_message(lg):
    with pytest.raises(InvalidInput) as err:
        lg.open(goal="g", target="https://bob:hunter2@hooks.example/x", owner="alice")
    assert "hunter2" not in err.value.message and "user name or password" in err.value.message


@pytest.mark.parametrize("target", ACCEPTED)
def test_open_accepts_every_target_an_adapter_can_use(lg, target):
    run = lg.open(goal="g", target=target, owner="alice")
    assert lg.checkpoint(run).target == target


def test_the_cli_refuses_a_bad_target_with_exit_2_and_no_traceback(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    for args in ((), ("--json",)):
        done = h("open", "--goal", "g", "--target", "http://[::1/x", "--owner", "alice", "--run-id", "run-t", *args,
                 code=InvalidInput.exit_code)
        shown = done.stdout + done.stderr
        assert "Traceback" not in shown and "target" in shown
        if args:
            assert json.loads(done.stdout or done.stderr)["error"]["type"] == "InvalidInput"
    with h.ledger() as lg:
        assert lg.store.head("run-t") is None


def test_an_adapter_for_an_unparseable_target_is_refused_typed():
    """A ledger written before open checked targets may still hold one: the send is
    refused typed, before anything is recorded (``send_delivery`` builds the adapter first)."""
    for target in ("http://[::1/x", "http://a b/x", "cmd:'open"):
        with pytest.raises(InvalidInput) as err:
            da.adapter_for(target, SendPolicy())
        assert err.value.field == "target"


def test_a_webhook_with_a_query_is_posted_to_its_path_and_query(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url + "?team=ops", send=SendPolicy(timeout_s=2.0, retries=0))
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"


#: The characters URLs are made of and broken by, so most examples come near the edge.
URLISH = "ab09.-_~:/?#[]@!$&'()*+,;=% \t\x00\x7f\u00e9\u20ac"


@settings(max_examples=300, deadline=None)
@given(rest=st.one_of(st.text(max_size=40), st.text(alphabet=URLISH, max_size=40)),
       scheme=st.sampled_from(["http://", "https://"]))
def test_every_webhook_target_that_parses_fits_a_request_line(rest, scheme):
    """The rule open applies and the rule http.client applies agree: a URL that parses
    builds a request line and Host header without an error (nothing is connected)."""
    target = scheme + rest
    try:
        t = targets.parse(target)
    except InvalidInput as exc:
        assert exc.field == "target"
        return
    assert isinstance(t, targets.HttpTarget) and 0 < t.port < 65536
    conn = http.client.HTTPConnection(t.host, t.port)
    conn.putrequest("POST", t.path)  # buffers only; raises if the line could not be sent
    conn.close()
