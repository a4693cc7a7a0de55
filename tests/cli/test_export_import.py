"""export and import through the CLI: round trip, idempotent, tampering refused."""

from __future__ import annotations

import json
import os

from handoff import Ledger

from tests.support import Handoff, working_run


def _source(h):
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
        lg.progress("r1", lease, "tool_outcome", "step", worker="w1")
        lg.fork("r1", 3, new_run_id="r1.child")
        lg.open(run_id="r2", goal="other", target="t", owner="bob")


def test_round_trip_and_twice_changes_nothing(h, tmp_path):
    _source(h)
    out = tmp_path / "all.jsonl"
    doc = h.json("export", "--all", "-o", str(out))
    assert doc == {"output": str(out), "events": 7, "runs": 3}
    lines = out.read_text().splitlines()
    first = json.loads(lines[0])
    assert first["run_id"] == "r1" and first["seq"] == 1 and first["payload"]["type"] == "handoff_opened"
    dst = Handoff(str(tmp_path / "dst.db"))
    assert dst.json("import", str(out)) == {"imported": 7, "skipped": 0, "runs": 3}
    assert dst.json("import", str(out)) == {"imported": 0, "skipped": 7, "runs": 3}
    assert "0 events of 3 runs; 7 were already here" in dst("import", str(out)).stdout
    dst("verify")
    assert dst.json("status", "r1.child")["fork_parent"] == "r1"
    with Ledger(h.db) as a, Ledger(dst.db) as b:
        assert [r.hash for r in a.store.read_all()] == [r.hash for r in b.store.read_all()]


def test_export_to_stdout_brings_a_forks_parent(h):
    _source(h)
    text = h("export", "r1.child").stdout
    runs = [json.loads(x)["run_id"] for x in text.splitlines()]
    assert set(runs) == {"r1", "r1.child"}


def test_tampered_input_is_refused_whole(h, tmp_path):
    _source(h)
    out = tmp_path / "all.jsonl"
    h("export", "--all", "-o", str(out))
    lines = out.read_text().splitlines()
    lines[2] = lines[2].replace("planning", "verifying")
    out.write_text("\n".join(lines) + "\n")
    target = tmp_path / "dst.db"
    dst = Handoff(str(target))
    result = dst("import", str(out), code=2)
    assert "line 3" in result.stderr and "hash" in result.stderr
    assert not target.exists()  # nothing was created, nothing imported


def test_export_usage_and_unknown_runs(h, tmp_path):
    _source(h)
    h("export", code=2)
    h("export", "r1", "--all", code=2)
    h("export", "r1", "--json", code=2)
    out = tmp_path / "none.jsonl"
    assert json.loads(h("export", "nope", "--json", "-o", str(out), code=1).stderr)["error"]["type"] == "UnknownRun"
    assert not out.exists()
