"""The JSON documents docs/cli.md promises, key by key."""

from __future__ import annotations

import json

from tests.support import working_run

PACKET_KEYS = {
    "run_id", "state", "goal", "origin", "target", "owner", "worker", "lease", "progress_seq",
    "last_progress", "last_heartbeat_at", "blockers", "artifacts", "evidence", "pending_effects",
    "review", "delivery", "health", "monitored", "last_seq", "terminal",
}
WRITE_KEYS = {"run_id", "outcome", "first_seq", "last_seq", "state", "worker", "lease", "progress_seq"}


def _setup(h):
    with h.ledger() as lg:
        lease = working_run(lg, "r1", heartbeat_timeout_s=1)
        lg.progress("r1", lease, "tool_outcome", "did a thing", worker="w1")
    return lease


def test_status_packet(h):
    _setup(h)
    p = h.json("status", "r1")
    assert PACKET_KEYS <= set(p)
    assert set(p["health"]) >= {"classification", "reason", "action"}
    assert set(p["monitored"]) >= {"covered", "watchers"}
    assert p["last_progress"]["kind"] == "tool_outcome" and p["last_progress"]["at"].endswith("Z")
    assert set(p["delivery"]) >= {"status", "target", "key", "receipt", "attempts"}


def test_status_list_log_stalls(h):
    _setup(h)
    doc = h.json("status")
    assert set(doc) == {"now", "runs", "next", "more", "hidden_terminal"} and doc["next"] is None and doc["more"] == 0
    assert doc["hidden_terminal"] == 0  # no run has ended here
    assert set(doc["runs"][0]) == {"run_id", "state", "owner", "target", "worker", "lease", "progress_seq",
                                   "health", "action", "updated_at", "goal"}
    log = h.json("log", "r1")
    assert set(log) == {"run_id", "events", "next"} and log["next"] is None
    assert set(log["events"][0]) == {"run_id", "seq", "position", "at", "actor", "lease", "type", "key", "summary",
                                     "data", "db_role"}
    stalls = h.json("stalls", "--now", "2100-01-01T00:00:00")  # a naive time is UTC
    assert stalls["now"] == "2100-01-01T00:00:00.000000Z"
    assert set(stalls) == {"now", "stalls", "next", "more"} and stalls["next"] is None
    assert set(stalls["stalls"][0]) == {"run_id", "state", "classification", "action", "reason", "worker", "lease",
                                        "last_heartbeat_at", "progress_seq", "last_progress", "retries",
                                        "retry_budget"}


def test_write_documents(h):
    lease = _setup(h)
    doc = h.json("progress", "r1", "--lease", lease, "--kind", "note", "--key", "k")
    assert set(doc) == WRITE_KEYS and doc["outcome"] == "committed" and doc["first_seq"] == doc["last_seq"]
    assert h.json("progress", "r1", "--lease", lease, "--kind", "note", "--key", "k")["outcome"] == "duplicate"
    opened = h.json("open", "--goal", "g", "--target", "t", "--owner", "o", "--run-id", "r2")
    assert opened["run_id"] == "r2" and opened["state"] == "queued"
    claimed = h.json("claim", "r2", "--worker", "w9")
    assert set(claimed) == WRITE_KEYS | {"token"} and claimed["lease"] == 1 and claimed["worker"] == "w9"
    assert claimed["token"].startswith("1.") and len(claimed["token"]) > 30


def test_watch_and_verify_documents(h):
    _setup(h)
    doc = h.json("watch", "--once", "--name", "wd", "--now", "2100-01-01T00:00:00Z", "--commit")
    assert set(doc) == {"watcher", "at", "interval_s", "actions"}
    (a,) = doc["actions"]
    assert set(a) == {"run_id", "classification", "action", "outcome", "key", "progress_seq", "lease", "reason",
                      "seq"}
    assert a["key"] == "watch:r1:revoke_lease:3:1" and a["outcome"] == "committed"
    v = h.json("verify")
    assert set(v) == {"ok", "run_id", "events", "streams", "problems", "projections", "anchors", "erased",
                      "skipped", "db_roles"} and v["ok"] and v["erased"] == []


def test_errors_are_one_json_document_on_stderr(h):
    _setup(h)
    result = h("progress", "r1", "--lease", "9." + "x" * 43, "--kind", "note", "--json", code=1)
    assert result.stdout == ""
    assert json.loads(result.stderr) == {"error": {"type": "StaleLease", "message": json.loads(result.stderr)[
        "error"]["message"]}}
    assert "lease 9 was never issued" in json.loads(result.stderr)["error"]["message"]
