"""A security review's findings on delivery, each refused with the ledger unchanged, on
every backend where a ledger is involved:

1. a contract chooses which of the sender's environment variables goes out as a bearer
   token: only a variable named HANDOFF_TOKEN_... is ever sent, refused at open and, for a
   run opened before the rule, at send time;
3. a TargetNotAllowed message listed the allow-list (an exact webhook address is a secret);
4. messages echoed a password written into a collector's address or an allow-list pattern;
5. a path prefix was escaped by a server's path normalisation (backslash, %5c, ';').
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from handoff import Ledger
from handoff.delivery import allowed as al
from handoff.integrations import otel as ot
from handoff.ledger.errors import InvalidInput, TargetNotAllowed
from handoff.ledger.events import SendPolicy
from handoff.reducers import targets as tg
from tests.support import executable

from .conftest import ready_run

FOREIGN = "AWS_SECRET_ACCESS_KEY"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def _everything(lg: Ledger) -> tuple[bytes, object]:
    """The whole ledger as its export, and its head: equal before and after means nothing
    was written."""
    return b"".join(lg.export()), lg.ledger_head()


def _cli(db: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HANDOFF_", "AWS_"))}
    full.update(HANDOFF_DB=db, **(env or {}))
    return subprocess.run([*executable(), *args], env=full, capture_output=True, text=True, timeout=120)


# --- 1. the sender, not the contract, chooses which variable is sent ------------------------------


@pytest.mark.parametrize("name", [FOREIGN, "GITHUB_TOKEN", "HANDOFF_TOKEN_", "handoff_token_hook", "HOOK"])
def test_open_refuses_a_token_variable_not_named_handoff_token(backend, receiver, name):
    with Ledger(backend.address()) as lg:
        before = _everything(lg)
        with pytest.raises(InvalidInput) as err:
            lg.open(goal="g", target=receiver.url, owner="alice", send=SendPolicy(token_env=name))
        assert err.value.field == "send.token_env"
        assert "HANDOFF_TOKEN_" in err.value.message and f"${name}" in err.value.message
        with pytest.raises(InvalidInput) as err:
            lg.open_contract(json.dumps({"goal": "g", "target": receiver.url, "owner": "alice",
                                         "send": {"token_env": name}}))
        assert err.value.field == "send.token_env"
        assert _everything(lg) == before and list(lg.runs(include_terminal=True)) == []


def test_a_run_opened_before_the_rule_sends_no_foreign_variable(backend, tmp_path, receiver, monkeypatch):
    """A ledger written by an earlier version may hold such a run: --send refuses it before
    the attempt is recorded, and nothing reaches the receiver."""
    with Ledger(backend.address()) as lg:
        lg.allow_targets("http://*")
        with monkeypatch.context() as m:  # the earlier version: no rule at open
            m.setattr(tg, "token_env_refusal", lambda name: None, raising=False)
            run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(token_env=FOREIGN))
        assert lg.checkpoint(run).delivery.send.token_env == FOREIGN
        before = _everything(lg)
        with pytest.raises(InvalidInput) as err:
            lg.deliver(run, "v1", send=True, env={FOREIGN: SECRET}, by="alice")
        assert err.value.field == "send.token_env" and "HANDOFF_TOKEN_" in err.value.message
        assert "deliver it by hand" in err.value.message and SECRET not in err.value.message
        assert _everything(lg) == before and receiver.requests == []
        # By hand it still goes: recording an attempt sends nothing.
        assert lg.deliver(run, "v1", by="alice").result.outcome == "committed"
        assert receiver.requests == []


def test_a_handoff_token_variable_is_sent(backend, tmp_path, receiver):
    with Ledger(backend.address()) as lg:
        run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(token_env="HANDOFF_TOKEN_HOOK"))
        sent = lg.deliver(run, "v1", send=True, env={"HANDOFF_TOKEN_HOOK": "tok-1", FOREIGN: SECRET}, by="alice")
        assert sent.status == "confirmed"
        assert receiver.requests[0]["headers"]["Authorization"] == "Bearer tok-1"


def test_the_reviewers_reproduction_through_the_command_line(shared_backend, tmp_path, receiver):
    """handoff targets --allow 'http://*'; a contract naming AWS_SECRET_ACCESS_KEY; open is
    refused (exit 2, nothing written) and the receiver never sees the variable."""
    db = shared_backend.address()
    assert _cli(db, "init").returncode == 0
    assert _cli(db, "targets", "--allow", "http://*").returncode == 0
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps({"goal": "g", "target": receiver.url, "owner": "alice",
                                    "send": {"token_env": FOREIGN}}))
    with Ledger(db) as lg:
        before = _everything(lg)
    done = _cli(db, "open", "--contract", str(contract), env={FOREIGN: SECRET})
    assert done.returncode == 2, done
    assert "send.token_env" in done.stderr and "HANDOFF_TOKEN_" in done.stderr and SECRET not in done.stderr
    with Ledger(db) as lg:
        assert _everything(lg) == before and list(lg.runs(include_terminal=True)) == []
    assert receiver.requests == []


@pytest.fixture(params=["sqlite-file", "postgres"])
def shared_backend(request, tmp_path):
    from tests.backends import BACKENDS, OnBackend

    on = OnBackend(BACKENDS[request.param], tmp_path)
    yield on
    on.close()


# --- 3. a refusal does not list the allow-list ---------------------------------------------------

HOOK = "https://hooks.example.com/services/T0AAA/B0BBB/XyZsEcReTpAtH"


def test_a_refused_send_says_how_many_patterns_not_which(backend, tmp_path, receiver):
    with Ledger(backend.address()) as lg:
        lg.allow_targets(HOOK, "file:///srv/outbox/*")
        run = ready_run(lg, tmp_path, receiver.url)
        before = _everything(lg)
        with pytest.raises(TargetNotAllowed) as err:
            lg.deliver(run, "v1", send=True, by="alice")
        message = err.value.message
        assert "XyZsEcReTpAtH" not in message and "T0AAA" not in message and "/srv/outbox" not in message
        assert "it holds 2 patterns, not shown here" in message and "'handoff targets' shows it" in message
        assert _everything(lg) == before and receiver.requests == []


def test_any_list_checked_shows_no_pattern():
    with pytest.raises(TargetNotAllowed) as err:
        al.check("cmd:true", [HOOK], run_id=None, whose="this MCP server's --allow-target list", how="Ask.")
    assert "XyZsEcReTpAtH" not in err.value.message and "it holds 1 pattern, not shown here" in err.value.message


# --- 4. no message repeats a password ------------------------------------------------------------


@pytest.mark.parametrize("endpoint", [
    "https://123456:glc_xS3cret@otlp.example.com:99999",
    "https://123456:glc_xS3cret@otlp.example.com",
    "http://u:glc_xS3cret/x@otlp.example.com",  # a '/' in the password: urlsplit sees no user
    "HTTPS://123456:glc_xS3cret@[::1",
])
def test_a_collector_address_with_a_password_is_refused_unshown(endpoint):
    with pytest.raises(InvalidInput) as err:
        ot.traces_url(endpoint)
    assert err.value.field == "endpoint" and "glc_x" not in err.value.message and "123456" not in err.value.message
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS" in err.value.message


def test_otel_on_the_command_line_prints_no_password(tmp_path):
    db = str(tmp_path / "ledger.db")
    assert _cli(db, "init").returncode == 0
    done = _cli(db, "otel", "r1", "--endpoint", "https://123456:glc_xS3cret@otlp.example.com:99999")
    assert done.returncode == 2, done
    assert "glc_x" not in done.stdout + done.stderr and "OTEL_EXPORTER_OTLP_TRACES_HEADERS" in done.stderr


@pytest.mark.parametrize("pattern", [
    "https://bot:S3cret@hooks.example.com/*/x",
    "https://bot:S3cret@hooks.example.com/services/*",
    "HTTPS://bot:S3cret@hooks.example.com/x",
    "ftp://bot:S3cret@hooks.example.com/x",
    "file://bot:S3cret@/srv/outbox/*",
    "https:/bot:S3cret@hooks.example.com/x",
])
def test_a_pattern_with_a_password_is_refused_unshown(backend, pattern):
    with pytest.raises(InvalidInput) as err:
        al.check_pattern(pattern)
    assert "S3cret" not in err.value.message and "user name or password" in err.value.message
    with Ledger(backend.address()) as lg:
        lg.allow_targets("file:///srv/outbox/*")
        with pytest.raises(InvalidInput) as err:
            lg.allow_targets(pattern)
        assert "S3cret" not in err.value.message
        assert lg.allowed_targets() == ("file:///srv/outbox/*",)


def test_a_command_prefix_may_hold_an_at_sign():
    assert al.check_pattern("cmd:/usr/bin/mail ops@example.com *") == "cmd:/usr/bin/mail ops@example.com *"


# --- 5. a path prefix is not escaped by a server's normalisation ----------------------------------

PREFIX = "https://hooks.example.com/services/*"


@pytest.mark.parametrize("target", [
    "https://hooks.example.com/services/..\\admin",
    "https://hooks.example.com/services/..%5cadmin",
    "https://hooks.example.com/services/..%5Cadmin",
    "https://hooks.example.com/services/..;/admin",
    "https://hooks.example.com/services/x;jsessionid=1/../../admin",
    "https://hooks.example.com/services/..%3b/admin",
    "https://hooks.example.com/services/%2e%2e%5cadmin",
])
def test_a_path_a_server_may_read_otherwise_never_matches_a_prefix(target):
    assert not al.matches(target, al.check_pattern(PREFIX))
    assert al.matches(target, al.check_pattern(target))  # listed in full, it is allowed


@pytest.mark.parametrize("target", [
    "https://hooks.example.com/services/T1/B2",
    "https://hooks.example.com/services/T1/B2?a=1;b=2",  # a query is not the path
    "https://hooks.example.com/services/a%2Fb",
])
def test_a_plain_path_under_the_prefix_still_matches(target):
    assert al.matches(target, al.check_pattern(PREFIX))


@pytest.mark.parametrize("pattern", ["https://hooks.example.com/services;x/*",
                                     "https://hooks.example.com/a%5cb/*"])
def test_a_prefix_holding_them_is_refused(pattern):
    with pytest.raises(InvalidInput, match="without them"):
        al.check_pattern(pattern)


def test_a_send_to_an_escaping_path_is_refused(backend, tmp_path, receiver):
    base = receiver.url.rsplit("/", 1)[0]
    with Ledger(backend.address()) as lg:
        lg.allow_targets(f"{base}/services/*")
        run = ready_run(lg, tmp_path, f"{base}/services/..;/hook")
        before = _everything(lg)
        with pytest.raises(TargetNotAllowed):
            lg.deliver(run, "v1", send=True, by="alice")
        assert _everything(lg) == before and receiver.requests == []
        ok = ready_run(lg, tmp_path, f"{base}/services/hook")
        assert lg.deliver(ok, "v1", send=True, by="alice").status == "confirmed"
        assert len(receiver.requests) == 1
