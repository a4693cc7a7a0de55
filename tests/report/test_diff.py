"""'handoff diff' (Ledger.diff, reducers/diff.py): where two runs part, and what differs after.

A fork against its origin, two attempts at the same goal, and a run against itself, on
every backend; the CLI's exit codes follow diff(1), and a missing run exits as on every
verb (UnknownRun, 1, an error on stderr and nothing on stdout), with the log unchanged.
"""

from __future__ import annotations

import json


from handoff import Ledger
from handoff.ledger.errors import UnknownRun
from tests.ledger.conformance import assert_unchanged, refused, snapshot
from tests.support import Clock, Handoff

from .story import incident


def attempt(lg: Ledger, clock: Clock, tmp, run: str, text: str, verdict: str) -> None:
    """One attempt at the shared goal: the same steps, a result file of its own."""
    result = tmp / f"{run}.md"
    lg.open(run_id=run, goal="Summarise INC-4711", target="chat:#ops", owner="alice")
    lease = lg.claim(run, "w1")
    for state in ("planning", "executing"):
        lg.transition(run, lease, state)
        # attrs of its own: the log records the beat (a bare repeat is kept beside the log)
        assert lg.heartbeat(run, lease, attrs={"step": state}).result.outcome == "committed"
    lg.progress(run, lease, "tool_outcome", "summary drafted")
    lg.transition(run, lease, "verifying")
    result.write_text(text)
    lg.artifact(run, lease, str(result), kind="result")
    lg.evidence(run, "spellcheck", verdict, lease=lease)
    clock.advance(1)


def test_a_fork_parts_from_its_origin_at_the_fork(backend, tmp_path):
    clock = Clock()
    lg = backend.ledger(clock)
    run = incident(lg, clock, tmp_path)
    child = lg.fork(run, 20, new_run_id="retry", by="alice")
    doc = lg.diff(run, child)
    shared = sum(1 for r in lg.log(run, after_seq=0) if r.seq <= 20 and r.type != "heartbeat_recorded")
    assert doc["same"] is False and doc["common_steps"] == shared
    first = doc["first_divergence"]
    assert first["b"] == {"run_id": "retry", "seq": 1, "type": "run_forked", "at": first["b"]["at"]}
    assert first["a"]["run_id"] == run and first["a"]["seq"] > 20
    assert doc["after"]["state"] == {"a": "delivered", "b": lg.checkpoint(child).state}
    assert doc["after"]["delivery"]["a"]["status"] == "confirmed" and doc["after"]["delivery"]["b"]["status"] != "confirmed"
    assert doc["after"]["artifacts"]["only_a"] and not doc["after"]["artifacts"]["only_b"]
    assert lg.diff(run, run)["same"] is True and lg.diff(run, run)["first_divergence"] is None


def test_two_attempts_differ_in_what_they_made(backend, tmp_path):
    clock = Clock()
    lg = backend.ledger(clock)
    attempt(lg, clock, tmp_path, "try-1", "the summary\n", "pass")
    attempt(lg, clock, tmp_path, "try-2", "another summary\n", "fail")
    doc = lg.diff("try-1", "try-2")
    first = doc["first_divergence"]
    # The lease grants match (their token digests are secrets' digests, left out); the
    # first real difference is the artifact each attempt measured.
    assert first["a"]["type"] == first["b"]["type"] == "artifact_recorded"
    assert {d["field"] for d in first["differs"]} == {"path", "bytes", "sha256"}
    assert doc["after"]["evidence"] == {"spellcheck": {"a": "pass", "b": "fail"}}
    assert doc["heartbeats"] == {"a": 2, "b": 2}
    assert doc["after"]["events_after"]["a"] == {"artifact_recorded": 1, "evidence_recorded": 1}


def test_the_cli_exits_like_diff_and_trouble_writes_nothing(tmp_path):
    clock = Clock()
    h = Handoff(str(tmp_path / "ledger.db"))
    with Ledger(h.db, clock=clock) as lg:
        attempt(lg, clock, tmp_path, "try-1", "the summary\n", "pass")
        attempt(lg, clock, tmp_path, "try-2", "the summary\n", "pass")
        lg.fork("try-1", 4, new_run_id="try-1.f", by="alice")
        before = snapshot(lg.store)
    same = h("diff", "try-1", "try-1", code=0).stdout
    assert "the same: every step matches" in same
    text = h("diff", "try-1", "try-1.f", code=1).stdout
    assert "first divergence at step" in text and "try-1.f seq 1 run_forked" in text
    doc = json.loads(h("diff", "try-1", "try-2", "--json", code=1).stdout)
    assert set(doc) == {"run_a", "run_b", "same", "compared", "heartbeats", "common_steps", "first_divergence", "after"}
    assert doc["first_divergence"]["differs"] == [{"field": "path", "a": str(tmp_path / "try-1.md"),
                                                   "b": str(tmp_path / "try-2.md")}]
    assert doc["after"]["artifacts"]["changed"] == [] and doc["after"]["evidence"] == {}
    r = h("diff", "try-1", "ghost", code=1)
    assert "no run ghost" in r.stderr and r.stdout == ""  # "different" always prints the comparison
    assert json.loads(h("diff", "ghost", "try-1", "--json", code=1).stderr)["error"]["type"] == "UnknownRun"
    with Ledger(h.db) as lg:
        assert_unchanged(lg.store, before)
        with refused(lg.store, UnknownRun, "no run ghost"):
            lg.diff("ghost", "try-1")
