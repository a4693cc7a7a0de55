"""The ledger's list of delivery targets it may send to itself (handoff/delivery/allowed.py):
the matcher's rules, the list kept in the ledger on every backend, and deliver --send
refusing what the list does not name, with the log unchanged and nothing run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from handoff import Ledger
from handoff.delivery import allowed as al
from handoff.ledger.errors import InvalidInput
from tests.backends import BACKENDS, OnBackend
from tests.support import Handoff
from tests.ledger.test_postgres_roles import roles  # noqa: F401  (the fixture: PostgreSQL's least-privilege roles)

from .conftest import ready_run


@pytest.fixture(params=sorted(name for name, b in BACKENDS.items() if b.shared))
def shared_backend(request, tmp_path):
    """The backends the command line can reach by address."""
    on = OnBackend(BACKENDS[request.param], tmp_path)
    yield on
    on.close()

# --- the matcher ------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, target", [
    ("cmd:/usr/local/bin/notify --to ops", "cmd:/usr/local/bin/notify --to ops"),
    ("cmd:*", "cmd:sh -c 'anything'"),
    ("https://*", "https://anywhere.example/x"),
    ("https://hooks.example.com/services/*", "https://hooks.example.com/services/T1/B2"),
    ("https://hooks.example.com/services/*", "https://HOOKS.example.com:443/services/x?y=1"),
    ("https://hooks.example.com/*", "https://hooks.example.com/"),
    ("file:///srv/outbox/*", "file:///srv/outbox"),
    ("file:///srv/outbox/*", "file:///srv/outbox/team-a"),
    ("cmd:/usr/local/bin/notify --channel *", "cmd:/usr/local/bin/notify --channel ops"),
    ("cmd:/usr/local/bin/notify *", "cmd:'/usr/local/bin/notify' x"),
])
def test_a_pattern_allows_what_it_names(pattern, target):
    assert al.matches(target, al.check_pattern(pattern))


@pytest.mark.parametrize("pattern, target", [
    # Exact means exact.
    ("cmd:/usr/local/bin/notify --to ops", "cmd:/usr/local/bin/notify --to ops; rm -rf /"),
    # Another scheme, another host, a host that only begins the same, another port.
    ("https://*", "http://anywhere.example/x"),
    ("https://hooks.example.com/services/*", "https://hooks.example.com.evil.net/services/x"),
    ("https://hooks.example.com/services/*", "https://hooks.example.com:8443/services/x"),
    ("https://hooks.example.com/services/*", "https://evil.net/services/x"),
    # A path that leaves the prefix once resolved, or only begins the same.
    ("https://hooks.example.com/services/*", "https://hooks.example.com/services/../admin"),
    ("https://hooks.example.com/services/*", "https://hooks.example.com/services/%2E%2E/admin"),
    ("https://hooks.example.com/services/*", "https://hooks.example.com/services-admin/x"),
    ("file:///srv/outbox/*", "file:///srv/outbox-evil"),
    ("file:///srv/outbox/*", "file:///srv/outbox/../../etc/cron.d"),
    ("file:///srv/outbox/*", "file:///srv/outbox/%2e%2e/etc"),
    # A command whose program only begins with the allowed words, or that differs in a word.
    ("cmd:/usr/local/bin/notify *", "cmd:/usr/local/bin/notify-evil x"),
    ("cmd:/usr/local/bin/notify *", "cmd:/usr/local/bin/notify\\ x"),
    ("cmd:/usr/local/bin/notify --channel *", "cmd:/usr/local/bin/notify --exec x"),
    ("cmd:/usr/local/bin/notify *", "cmd:sh -c /usr/local/bin/notify"),
])
def test_a_pattern_never_allows_what_it_does_not_name(pattern, target):
    assert not al.matches(target, al.check_pattern(pattern))


def test_a_link_below_an_allowed_directory_does_not_lead_out_of_it(tmp_path):
    box, elsewhere = tmp_path / "outbox", tmp_path / "elsewhere"
    box.mkdir()
    (elsewhere / "sub").mkdir(parents=True)
    (box / "door").symlink_to(elsewhere)
    (box / "real").mkdir()
    pattern = al.check_pattern(f"file://{box}/*")
    assert al.matches(f"file://{box}/real", pattern)
    assert not al.matches(f"file://{box}/door/sub", pattern)


@pytest.mark.parametrize("pattern, says", [
    ("chat:#ops", "names no scheme"),
    ("*", "names no scheme"),
    ("https://hooks.example.com*", "must end its prefix with '/'"),
    ("https://hooks.example.com/services*", "must end its prefix with '/'"),
    ("https://*.example.com/", "'*' before its end"),
    ("file:///srv/out*", "file:///ABSOLUTE/DIR/*"),
    ("file:///srv/outbox/../*", "file:///ABSOLUTE/DIR/*"),
    ("cmd:/usr/local/bin/notify*", "must end its command prefix with a space"),
    ("cmd:'unclosed *", "cannot be split"),
    ("https://user:pw@hooks.example.com/", "user name or password"),
    ("", "non-empty"),
])
def test_a_pattern_that_could_match_more_than_it_says_is_refused(pattern, says):
    with pytest.raises(InvalidInput, match=says):
        al.check_pattern(pattern)


def test_targets_a_person_delivers_need_no_listing():
    assert al.allowed("chat:#ops", ())
    assert not al.allowed("cmd:true", ())


# --- the list in the ledger, on every backend ------------------------------------------------


def _runs_marker(tmp_path: Path, name: str = "ran") -> tuple[str, Path]:
    """A cmd: target that leaves a file behind when it runs."""
    marker = tmp_path / name
    script = tmp_path / f"{name}.py"
    script.write_text(f"import pathlib, sys\npathlib.Path({str(marker)!r}).write_text(sys.stdin.read())\n")
    return f"cmd:{sys.executable} {script}", marker


def _log(lg: Ledger, run: str) -> list[tuple[int, str]]:
    return [(r.seq, r.type) for r in lg.log(run)]


def test_the_list_is_kept_in_the_ledger_and_refuses_a_send_it_does_not_name(backend, tmp_path):
    address = backend.address()
    target, marker = _runs_marker(tmp_path)
    with Ledger(address) as lg:
        assert lg.allowed_targets() is None
        run = ready_run(lg, tmp_path, target)
        assert lg.allow_targets("https://hooks.example.com/services/*", "file:///srv/outbox/*") == (
            "https://hooks.example.com/services/*", "file:///srv/outbox/*")
        before = _log(lg, run)
        with pytest.raises(al.TargetNotAllowed, match="is a command the ledger would carry out itself") as info:
            lg.deliver(run, "v1", send=True, by="alice")
        assert info.value.type == "TargetNotAllowed" and info.value.exit_code == 1
        assert "handoff targets --allow" in info.value.message
        assert _log(lg, run) == before and not marker.exists()
        # Recording a send by hand is not a send: it stays possible.
        assert lg.deliver(run, "hand", by="alice").result.outcome == "committed"
        lg.delivery_failed(run, "hand", "not sent after all", by="alice")
        after_hand = _log(lg, run)
        assert not marker.exists()
        # Another open of the same ledger (a process, a host) follows the same list.
        other = Ledger(address) if backend.shared else lg
        try:
            assert other.allowed_targets() == ("https://hooks.example.com/services/*", "file:///srv/outbox/*")
            with pytest.raises(al.TargetNotAllowed):
                other.deliver(run, "v2", send=True, by="alice")
            assert _log(other, run) == after_hand and not marker.exists()
            prefix = target.rsplit(" ", 1)[0] + " *"
            assert prefix in other.allow_targets(prefix)
            sent = other.deliver(run, "v2", send=True, by="alice")
            assert sent.status == "confirmed" and marker.exists()
        finally:
            if other is not lg:
                other.close()


def test_an_empty_list_sends_nothing_and_unsetting_it_lifts_it(backend, tmp_path):
    target, marker = _runs_marker(tmp_path)
    with Ledger(backend.address()) as lg:
        run = ready_run(lg, tmp_path, target)
        lg.allow_targets("cmd:*")
        assert lg.deny_targets("cmd:*") == ()
        assert lg.allowed_targets() == ()
        before = _log(lg, run)
        with pytest.raises(al.TargetNotAllowed, match=r"\(it is empty; 'handoff targets' shows it"):
            lg.deliver(run, "v1", send=True, by="alice")
        assert _log(lg, run) == before and not marker.exists()
        assert lg.set_allowed_targets(None) is None and lg.allowed_targets() is None
        assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed" and marker.exists()


def test_a_bad_pattern_or_an_unknown_removal_changes_nothing(backend):
    with Ledger(backend.address()) as lg:
        lg.allow_targets("file:///srv/outbox/*")
        with pytest.raises(InvalidInput, match="must end its prefix"):
            lg.allow_targets("https://ok.example/*", "https://bad.example*")
        with pytest.raises(InvalidInput, match="is not on the ledger's list"):
            lg.deny_targets("cmd:*")
        with pytest.raises(InvalidInput, match="not one text"):
            lg.set_allowed_targets("cmd:*")  # type: ignore[arg-type]
        assert lg.allowed_targets() == ("file:///srv/outbox/*",)


# --- a contract from elsewhere, through the command line --------------------------------------


def test_a_contract_file_from_elsewhere_cannot_name_a_command_to_run(shared_backend, tmp_path):
    db = shared_backend.address()
    h = Handoff(db)
    h("init")
    assert h.json("targets") == {"restricted": False, "allowed": None}
    box = tmp_path / "outbox"
    box.mkdir()
    assert h.json("targets", "--allow", f"file://{box}/*") == {"restricted": True, "allowed": [f"file://{box}/*"]}
    target, marker = _runs_marker(tmp_path)
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps({"goal": "summarise", "target": target, "owner": "alice"}))
    run = h("open", "--contract", str(contract)).stdout.strip()
    lease = h("claim", run, "--worker", "w1").stdout.strip()
    art = tmp_path / "report.md"
    art.write_text("# Report\n")
    for step in (("transition", run, "--lease", lease, "--to", "planning"),
                 ("transition", run, "--lease", lease, "--to", "executing"),
                 ("artifact", run, "--lease", lease, str(art)),
                 ("transition", run, "--lease", lease, "--to", "verifying"),
                 ("evidence", run, "--kind", "tests", "--outcome", "pass", "--lease", lease),
                 ("submit", run, "--lease", lease)):
        h(*step)
    with Ledger(db) as lg:
        before = _log(lg, run)
    refused = h("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send", "--json", code=1)
    err = json.loads(refused.stderr or refused.stdout)["error"]
    assert err["type"] == "TargetNotAllowed" and "handoff targets --allow" in err["message"]
    with Ledger(db) as lg:
        assert _log(lg, run) == before
    assert not marker.exists()
    text = h("targets").stdout
    assert f"file://{box}/*" in text and "sends only to" in text
    assert h.json("targets", "--deny", f"file://{box}/*") == {"restricted": True, "allowed": []}
    assert h("targets", "--deny", "cmd:*", code=2)
    assert h("targets", "--allow", "cmd:*", "--unset", code=2)
    assert h.json("targets", "--unset") == {"restricted": False, "allowed": None}
    assert not marker.exists()


def test_targets_on_a_mistyped_db_makes_no_ledger(tmp_path):
    h = Handoff(str(tmp_path / "typo.db"))
    h("targets", code=3)
    assert not os.path.exists(tmp_path / "typo.db")


def test_a_list_edited_behind_the_store_into_nonsense_lets_no_send_through(backend, tmp_path):
    target, marker = _runs_marker(tmp_path)
    with Ledger(backend.address()) as lg:
        run = ready_run(lg, tmp_path, target)
        lg.store.put_setting(al.SETTING, "{not json")
        assert lg.allowed_targets() == ()
        before = _log(lg, run)
        with pytest.raises(al.TargetNotAllowed):
            lg.deliver(run, "v1", send=True, by="alice")
        assert _log(lg, run) == before and not marker.exists()


def test_on_postgresql_only_the_role_that_owns_the_ledger_changes_the_list(roles):
    from handoff.ledger.errors import StoreUnavailable

    listed = ("https://hooks.example.com/services/*",)
    with Ledger(roles.owner) as lg:
        assert lg.allow_targets(*listed) == listed
    for group in ("writer", "watchdog", "auditor"):
        with Ledger(roles.url(group)) as lg:
            assert lg.allowed_targets() == listed  # every role reads it (each send does)
            with pytest.raises(StoreUnavailable, match="owns the ledger|permission"):
                lg.allow_targets("cmd:*")
            with pytest.raises(StoreUnavailable, match="owns the ledger|permission"):
                lg.set_allowed_targets(None)
    with Ledger(roles.owner) as lg:
        assert lg.allowed_targets() == listed
