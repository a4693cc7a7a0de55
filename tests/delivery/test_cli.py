"""The delivery verbs through the CLI: open --public, sanitize, deliver --send, export --redact."""

from __future__ import annotations

import json

from handoff.delivery.adapters import file_name
from tests.support import Handoff

from .conftest import outbox


def _ready(h: Handoff, tmp_path, target: str, content: str, *extra: str) -> str:
    art = tmp_path / "report.md"
    art.write_text(content)
    run = h("open", "--goal", "g", "--target", target, "--owner", "alice", *extra).stdout.strip()
    lease = h("claim", run, "--worker", "w1").stdout.strip()
    for s in ("planning", "executing"):
        h("transition", run, "--lease", lease, "--to", s)
    h("artifact", run, "--lease", lease, str(art))
    h("transition", run, "--lease", lease, "--to", "verifying")
    h("evidence", run, "--kind", "tests", "--outcome", "pass", "--lease", lease)
    h("submit", run, "--lease", lease, "--summary", "done")
    return run


def test_public_delivery_through_the_cli(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    box = outbox(tmp_path)
    run = _ready(h, tmp_path, f"file://{box}", "Key: ghp_" + "a" * 36 + "\n", "--public")
    refused = h("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send", "--json", code=1)
    assert json.loads(refused.stderr or refused.stdout)["error"]["type"] == "SanitizationRequired"
    doc = h.json("sanitize", run, "--by", "alice", code=1)
    assert doc["passed"] is False and doc["findings"][0]["detector"] == "secret"
    assert "ghp_" not in json.dumps(doc)
    text = h("sanitize", run, "--by", "alice", code=1).stdout
    assert "sanitization FAILED: secret in artifact report.md line 1" in text
    assert list(box.iterdir()) == []
    (tmp_path / "report.md").write_text("Key rotated.\n")
    # The recorded artifact no longer matches: refused, exit 1, nothing sent.
    h("sanitize", run, "--by", "alice", code=1)


def test_deliver_send_json_shape(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    box = outbox(tmp_path)
    run = _ready(h, tmp_path, f"file://{box}", "all clean\n", "--public", "--send-timeout", "5")
    assert h.json("sanitize", run, "--by", "alice")["passed"] is True
    doc = h.json("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send")
    assert set(doc) == {"run_id", "status", "sent", "receipt", "error", "tries", "target", "delivery"}
    assert doc["status"] == "confirmed" and doc["sent"] is True and doc["delivery"]["status"] == "confirmed"
    assert (box / file_name(run, "v1")).exists()
    again = h.json("deliver", run, "--by", "alice", "--delivery-key", "v1", "--send")
    assert again["sent"] is False and again["status"] == "confirmed"
    h("deliver", run, "--by", "alice", "--delivery-key", "v1", "--timeout", "3", code=2)  # --timeout needs --send


def test_open_public_with_a_contract_file_is_a_usage_error(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"goal": "g", "target": "t", "owner": "a", "public": True}))
    assert "drop --public" in h("open", "--contract", str(c), "--public", code=2).stderr
    run = h("open", "--contract", str(c)).stdout.strip()
    assert h.ledger().checkpoint(run).delivery.public is True


def test_export_redact_through_the_cli(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    run = _ready(h, tmp_path, "chat:#ops", "hello\n")
    out = tmp_path / "shared.jsonl"
    env = {"SHARE_SALT": "a-long-enough-salt-value"}
    doc = h.json("export", run, "--redact", "--salt-env", "SHARE_SALT", "-o", str(out), env=env)
    assert doc["redacted"] is True and doc["runs"] == 1
    first = out.read_bytes()
    h("export", run, "--redact", "--salt-env", "SHARE_SALT", "-o", str(out), env=env)
    assert out.read_bytes() == first  # the same salt, the same file: how it is verified
    assert "alice" not in first.decode() and str(tmp_path) not in first.decode()
    r = h("import", str(out), code=2)
    assert "redacted export" in (r.stderr + r.stdout)
    assert "not set" in h("export", run, "--redact", "--salt-env", "NOPE", code=2).stderr
    h("export", run, "--salt-env", "SHARE_SALT", code=2, env=env)
