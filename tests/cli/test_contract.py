"""Contracts handed in as JSON: checked field by field, refused without writing anything."""

import json

import pytest

from handoff import Ledger
from handoff.contract import schema
from handoff.ledger.errors import InvalidInput
from tests.support import invoke

GOOD = {"goal": "Summarise the incident", "target": "chat:#ops", "owner": "alice",
        "result_path": "report.md", "require_review": True, "policy": {"heartbeat_timeout_s": 30}}


def test_a_contract_opens_the_same_run_as_options(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        run = lg.open_contract(json.dumps({**GOOD, "run_id": "r1"}))
        cp = lg.checkpoint(run)
        assert (cp.goal, cp.target, cp.owner, cp.require_review) == ("Summarise the incident", "chat:#ops", "alice", True)
        assert cp.policy.heartbeat_timeout_s == 30 and cp.policy.owner_cap == 10
        assert cp.result_path.endswith("/report.md")


@pytest.mark.parametrize(
    "bad, field",
    [
        (b"{not json", "contract"),
        (b"\xff\xfe", "contract"),
        (b"[1, 2]", "contract"),
        (json.dumps({**GOOD, "goal": ""}), "goal"),
        (json.dumps({**GOOD, "owner": "a\u0000b"}), "owner"),
        (json.dumps({**GOOD, "policy": {"heartbeat_timeout_s": -1}}), "policy.heartbeat_timeout_s"),
        (json.dumps({**GOOD, "policy": {"retry_budget": 10**12}}), "policy.retry_budget"),
        (json.dumps({**GOOD, "run_id": "../etc/passwd"}), "run_id"),
        (json.dumps({**GOOD, "surprise": 1}), "surprise"),
        ('{"goal": "a", "target": "t", "owner": "o", "policy": {"progress_timeout_s": Infinity}}', "contract"),
    ],
)
def test_bad_contracts_name_the_field_and_write_nothing(tmp_path, bad, field):
    with Ledger(str(tmp_path / "l.db")) as lg:
        with pytest.raises(InvalidInput) as info:
            lg.open_contract(bad)
        assert info.value.field == field
        assert list(lg.store.read_all()) == []


def test_cli_reads_a_contract_from_stdin_and_refuses_mixing(tmp_path):
    db = str(tmp_path / "l.db")
    r = invoke("--db", db, "open", "--contract", "-", "--json", input=json.dumps(GOOD))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["owner"] == "alice"
    r = invoke("--db", db, "open", "--contract", "-", "--goal", "x", input=json.dumps(GOOD))
    assert r.exit_code == 2 and "--contract holds the whole contract" in r.output
    r = invoke("--db", db, "open", "--target", "t")
    assert r.exit_code == 2 and "missing option --goal" in r.output


def test_the_schema_describes_every_field():
    s = schema()
    assert set(s["properties"]) == {"goal", "target", "owner", "origin", "run_id", "result_path",
                                    "stop_rules", "require_review", "policy", "public", "sanitize_patterns",
                                    "send", "progress_kinds"}
    assert s["additionalProperties"] is False
