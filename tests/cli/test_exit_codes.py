"""Every exit code the CLI documents, and the error shapes on stderr."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.support import working_run

#: Stands for the token working_run's claim got (parameters are fixed before it exists).
TOKEN = "<token>"


def _err(result):
    return json.loads(result.stderr)["error"]


def test_0_ok(h):
    h("init", code=0)


@pytest.mark.parametrize("setup, args, kind", [
    ("lease2", ["progress", "r1", "--lease", TOKEN, "--kind", "tool_outcome"], "StaleLease"),
    ("working", ["transition", "r1", "--lease", TOKEN, "--to", "queued"], "IllegalTransition"),
    ("working", ["claim", "r1", "--worker", "w2"], "LeaseHeld"),
    ("delivered", ["deliver", "r1", "--by", "alice", "--delivery-key", "other"], "DeliveryRefused"),
    # Closing released the lease: its token is refused before the run's end is even looked at.
    ("closed", ["progress", "r1", "--lease", TOKEN, "--kind", "note"], "StaleLease"),
    ("closed", ["evidence", "r1", "--kind", "tests", "--outcome", "pass", "--by", "op"], "TerminalRun"),
    ("working", ["review", "r1", "--by", "mallory", "--approve"], "NotAuthorized"),
    ("working", ["status", "nope"], "UnknownRun"),
    ("working", ["submit", "r1", "--lease", TOKEN], "IllegalTransition"),
    ("working", ["open", "--run-id", "r1", "--goal", "g", "--target", "t", "--owner", "o"], "RunExists"),
])
def test_1_refused_by_the_rules(h, tmp_path, setup, args, kind):
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
        if setup == "lease2":
            lg.revoke("r1", "test")
            lg.claim("r1", "w2")
        elif setup == "delivered":
            lg.transition("r1", lease, "verifying", worker="w1")
            f = tmp_path / "r.txt"
            f.write_text("result")
            lg.artifact("r1", lease, str(f), worker="w1")
            lg.evidence("r1", "tests", "pass", lease=lease)
            lg.submit("r1", lease, worker="w1")
            lg.deliver("r1", "k1", by="alice")
            lg.delivered("r1", "k1", "ok")
        elif setup == "closed":
            lg.close_run("r1", "cancelled", by="alice")
    args = [str(lease) if a == TOKEN else a for a in args]
    before = h.json("verify")["events"] if setup != "none" else 0
    text = h(*args, code=1)
    assert text.stdout == ""
    assert text.stderr.startswith("Error: ") and text.stderr.count("\n") == 1
    assert _err(h(*args, "--json", code=1))["type"] == kind
    assert h.json("verify")["events"] == before  # a refusal writes nothing


@pytest.mark.parametrize("args, kind", [
    (["open", "--goal", "g", "--target", "t"], "UsageError"),
    (["progress", "r1", "--lease", "zero", "--kind", "x"], "BadParameter"),
    (["progress", "r1", "--lease", "1", "--kind", "note"], "BadParameter"),  # a number is not a token
    (["status", "--now", "yesterday"], "BadParameter"),
    (["frobnicate"], ("UsageError", "NoSuchCommand")),
    (["replay", "r1"], "UsageError"),
    (["review", "r1", "--by", "alice"], "UsageError"),
    (["progress", "r1", "--lease", TOKEN, "--kind", "made_up_kind"], "InvalidInput"),
    (["open", "--goal", "", "--target", "t", "--owner", "o"], "InvalidInput"),
    (["status", "bad run id!"], "InvalidInput"),
])
def test_2_usage(h, args, kind):
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
    args = [str(lease) if a == TOKEN else a for a in args]
    result = h(*args, code=2)
    assert "Error" in result.stderr
    error = _err(h(*args, "--json", code=2))
    assert error["type"] in ((kind,) if isinstance(kind, str) else kind) and error["message"]


def test_3_store_problems(h, tmp_path):
    missing = tmp_path / "nowhere.db"
    result = h("--db", str(missing), "status", code=3)
    assert "handoff init" in result.stderr
    assert not missing.exists()  # a mistyped --db never creates a ledger
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    assert _err(h("--db", str(junk), "status", "--json", code=3))["type"] in ("NotALedger", "CorruptLedger")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t (x)")
    assert "not a handoff ledger" in h("--db", str(other), "status", code=3).stderr


def test_3_locked_past_the_busy_timeout(h):
    h("init")
    holder = sqlite3.connect(h.db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        result = h("--busy-timeout", "0.2", "open", "--goal", "g", "--target", "t", "--owner", "o", "--json", code=3)
        assert _err(result)["type"] == "StoreUnavailable"
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_4_verify_finds_a_tampered_event(h):
    with h.ledger() as lg:
        working_run(lg, "r1")
    with sqlite3.connect(h.db) as c:
        c.execute("DROP TRIGGER events_no_update")
        c.execute("UPDATE events SET payload = CAST(replace(payload, 'alice', 'mallo') AS BLOB) "
                  "WHERE seq = 1 AND run_id = 'r1'")
    result = h("verify", code=4)
    assert "bad_hash" in result.stdout
    # Each table ends in a blank line, so the next header (and the summary on stderr, in a
    # terminal) starts a paragraph of its own instead of running on from the last row.
    problems, _, rest = result.stdout.partition("\n\n")
    assert problems.startswith("PROBLEM") and rest.startswith("PROJECTION"), result.stdout
    assert result.stdout.endswith("\n\n") and "problem(s) in the log" in result.stderr
    doc = h.json("verify", code=4)
    assert doc["ok"] is False and doc["problems"][0]["kind"] == "bad_hash"


def test_4_check_finds_a_drifted_projection(h):
    with h.ledger() as lg:
        working_run(lg, "r1")
    with sqlite3.connect(h.db) as c:
        c.execute("UPDATE checkpoints SET state = 'delivered' WHERE run_id = 'r1'")
    assert "state" in h("check", code=4).stdout
    diffs = h.json("check", code=4)["differences"]
    assert any(d["column"] == "state" and d["kept"] == "delivered" for d in diffs)
    h("verify", code=4)
    h("rebuild")
    h("check", code=0)
