"""export --redact, and the new events travelling through export and import."""

from __future__ import annotations

import json

import pytest

from handoff.facade import Ledger
from handoff.ledger.errors import RedactedExportRefused

from .conftest import outbox, ready_run

SALT = b"0123456789abcdef-salt"
PLANTED = "# Report\n\nSee /home/alice/incident.log; ask bob@corp.example; db at 10.1.2.3.\n"


def test_a_redacted_export_keeps_structure_and_hides_names_paths_and_secrets(lg, tmp_path, receiver):
    run = ready_run(lg, tmp_path, receiver.url, content=PLANTED, summary="bob@corp.example fixed it on db1.internal")
    lg.deliver(run, "v1", send=True, by="alice")
    lines = [json.loads(x) for x in lg.export_redacted([run], salt=SALT)]
    head, events = lines[0], lines[1:]
    assert head["redacted"] is True and head["format"] == "handoff-redacted-export/2" and "not a ledger" in head["note"]
    original = [json.loads(x) for x in lg.export([run])]
    assert [(e["seq"], e["type"], e["recorded_us"]) for e in events] == \
        [(e["seq"], e["type"], e["recorded_us"]) for e in original]
    states = [e["payload"]["to_state"] for e in events if e["type"] == "state_changed"]
    assert states[-1] == "delivered"
    text = json.dumps(events)
    for hidden in ("alice", "w1", "bob@corp.example", "db1.internal", str(tmp_path), receiver.url):
        assert hidden not in text, hidden
    assert all("hash" not in e and e["redacted"] is True for e in events)
    # Stable with the same salt, different with another.
    assert list(lg.export_redacted([run], salt=SALT)) == list(lg.export_redacted([run], salt=SALT))
    assert list(lg.export_redacted([run], salt=SALT))[1:] != list(lg.export_redacted([run], salt=b"x" * 16))[1:]


def test_a_redacted_export_cannot_be_imported(lg, tmp_path):
    run = ready_run(lg, tmp_path, "chat:#ops")
    out = tmp_path / "shared.jsonl"
    doc = lg.export_to(out, [run], redact=True, salt=SALT)
    assert doc["redacted"] is True and doc["runs"] == 1
    other = Ledger(str(tmp_path / "other.db"))
    with pytest.raises(RedactedExportRefused, match="redacted export"):
        other.import_lines(out.read_bytes().splitlines())
    # A file cut after its header is refused the same way.
    with pytest.raises(RedactedExportRefused):
        other.import_lines(out.read_bytes().splitlines()[3:])
    assert list(other.store.list_runs()) == []
    other.close()


def test_a_short_salt_is_refused(lg):
    from handoff.ledger.errors import InvalidInput

    with pytest.raises(InvalidInput, match="at least 16 bytes"):
        list(lg.export_redacted(None, salt=b"short"))


def test_a_delivered_public_run_imports_with_every_event_admitted_again(lg, tmp_path, receiver):
    box = outbox(tmp_path)
    run = ready_run(lg, tmp_path, f"file://{box}", public=True, content="clean text\n")
    lg.sanitize(run, by="alice")
    receiver.mode = "5xx"
    web = ready_run(lg, tmp_path, receiver.url, public=False)
    lg.send_delivery(web, "w1", retries=0, by="alice")  # unanswered
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"
    other = Ledger(str(tmp_path / "copy.db"))
    counts = other.import_lines(list(lg.export()))
    assert counts["runs"] == 2
    for r in (run, web):
        assert other.checkpoint(r) == lg.checkpoint(r)
    other.close()


def test_an_import_refuses_a_forged_public_delivery(tmp_path):
    """A history in which a public run was delivered without a check is refused on import
    by the same gate, however well its hashes were rebuilt."""
    from handoff.ledger.errors import SanitizationRequired
    from handoff.ledger.store import chain_hash

    plain = Ledger(str(tmp_path / "plain.db"))
    rid = ready_run(plain, tmp_path, "chat:#ops")
    plain.deliver(rid, "v1", by="alice")
    forged, prev = [], bytes(32)
    for line in (json.loads(x) for x in plain.export([rid])):
        if line["type"] == "handoff_opened":
            line["payload"]["public"] = True  # as if the contract had said public
        payload = json.dumps(line["payload"], separators=(",", ":")).encode()
        h = chain_hash(prev, line["run_id"], line["seq"], line["type"], line["actor"], line["lease"],
                       line["idempotency_key"], line["recorded_us"], line["schema_version"], payload)
        line.update(prev_hash=prev.hex(), hash=h.hex(), payload="__P__")
        forged.append(json.dumps(line).replace('"__P__"', payload.decode()))
        prev = h
    plain.close()
    target = Ledger(str(tmp_path / "target.db"))
    with pytest.raises(SanitizationRequired, match="no sanitization check"):
        target.import_lines(forged)
    assert list(target.store.list_runs()) == []
    target.close()


def test_a_named_field_is_digested_too(lg, tmp_path):
    """--redact-field hides a field even where the export would show it (here a state)."""
    run = ready_run(lg, tmp_path, "chat:#ops")
    plain = [json.loads(x) for x in lg.export_redacted([run], salt=SALT)]
    named = [json.loads(x) for x in lg.export_redacted([run], salt=SALT, fields=("to_state", "from_state"))]
    moves = [i for i, e in enumerate(plain) if e.get("type") == "state_changed"]
    assert plain[moves[0]]["payload"]["to_state"] == "planning"
    assert named[moves[0]]["payload"]["to_state"].startswith("[name~") and '"planning"' not in json.dumps(named)
