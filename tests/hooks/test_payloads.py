"""Each harness's payloads, read and recorded: Claude Code's as captured from the real CLI,
Codex's checked against the JSON schemas Codex publishes, OpenHands' and Goose's from their
documentation (tests/hooks/fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from handoff import Ledger
from handoff.hooks import payloads
from handoff.hooks.replay import flush
from tests.hooks.feed import FIXTURES, run_hook, session

SCHEMAS = FIXTURES / "codex" / "schema"
SCHEMA_OF = {"SessionStart": "session-start", "UserPromptSubmit": "user-prompt-submit", "PreToolUse": "pre-tool-use",
             "PostToolUse": "post-tool-use", "PermissionRequest": "permission-request", "Stop": "stop"}


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def test_the_codex_fixtures_are_what_codex_publishes(tmp_path):
    checked = set()
    for doc in session("codex", tmp_path):
        event = doc["hook_event_name"]
        jsonschema.validate(doc, _schema(SCHEMA_OF[event] + ".command.input"))
        checked.add(event)
    assert checked == set(SCHEMA_OF)


def test_the_deny_answer_is_codex_s_and_claude_code_s_pre_tool_use_output():
    answer = json.loads(payloads.deny("codex", "the lease was revoked"))
    jsonschema.validate(answer, _schema("pre-tool-use.command.output"))
    assert answer["hookSpecificOutput"] == {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                            "permissionDecisionReason": "the lease was revoked"}
    assert json.loads(payloads.deny("goose", "why")) == {"decision": "block", "reason": "why"}


def test_a_file_tool_s_content_is_never_kept_and_inputs_are_bounded(tmp_path):
    big = "x" * 100_000
    h = payloads.read("claude-code", {"hook_event_name": "PreToolUse", "session_id": "s", "cwd": str(tmp_path),
                                      "tool_name": "Write", "tool_use_id": "t1",
                                      "tool_input": {"file_path": "notes.md", "content": "sk-live-" + big}})
    assert h.files == [str(tmp_path / "notes.md")] and "sk-live" not in h.input and "content" not in h.input
    h = payloads.read("claude-code", {"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash",
                                      "tool_use_id": "t2", "tool_input": {"command": big}})
    assert len(h.input) == payloads.MAX_INPUT
    h = payloads.read("codex", {"hook_event_name": "PostToolUse", "session_id": "s", "cwd": "/w", "tool_name": "apply_patch",
                                "tool_input": {"command": "*** Begin Patch\n*** Update File: src/a.py\n@@\n-a\n+b\n"
                                                          "*** Add File: b.txt\n+b\n*** End Patch\n"}})
    assert h.files == ["/w/src/a.py", "/w/b.txt"]


@pytest.mark.parametrize("harness", payloads.HARNESSES)
def test_a_fixture_session_of_each_harness_is_one_run(tmp_path, harness):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    (cwd / "a.txt").write_text("alpha\n")  # what the session's tools wrote
    for doc in session(harness, cwd):
        proc = run_hook(harness, db, doc)
        assert (proc.returncode, proc.stdout) == (0, b""), proc.stderr
    done = flush(str(db), wait_s=60)
    assert done["refused"] == 0 and done["left"] == 0
    with Ledger(str(db)) as lg:
        [cp] = list(lg.runs(include_terminal=True))
        assert cp.run_id == f"{harness}-s-0001" and cp.goal == "write the files"
        assert [a.path for a in cp.artifacts] == [str(cwd / "a.txt")]
        assert cp.state == "ready_for_review"  # the turn ended with a file written
        records = list(lg.log(cp.run_id))
        steps = [r.event.detail for r in records if r.type == "progress_recorded" and r.event.kind == "tool_outcome"]
        assert any("a.txt" in s for s in steps)
        effects = [r.event.what for r in records if r.type == "side_effect_started"]
        assert len(effects) == 1 and "printf" in effects[0] or "echo hi" in effects[0]  # the shell call
        assert cp.pending_effects == ()  # ... confirmed done
        assert cp.lease is None if harness != "codex" else cp.lease == 1  # Codex has no SessionEnd
        if harness == "claude-code":  # the permission prompt blocked the run; the tool's end cleared it
            types = [r.type for r in records]
            assert types.index("blocker_raised") < types.index("blocker_cleared")
            [raised] = [r for r in records if r.type == "blocker_raised"]
            assert raised.event.reason == "waiting on you: permission for Bash"


@pytest.mark.parametrize("stdin", [b"", b"not json", b"[1, 2]", b'{"hook_event_name": "PreToolUse"}',
                                   b'{"hook_event_name": "SomethingNew", "session_id": "s"}'])
def test_what_is_not_a_payload_is_ignored_quietly(tmp_path, stdin):
    proc = run_hook("claude-code", tmp_path / "ledger.db", stdin)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
    assert not Path(str(tmp_path / "ledger.db") + ".hooks").exists()


def test_a_call_with_no_outcome_by_the_end_of_the_turn_never_ran(tmp_path):
    """Claude Code refuses a call it was denied permission for without a PostToolUse: by
    the Stop, every call that ran has had its PostToolUse, so the open one is ``absent``."""
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    (cwd / "a.txt").write_text("alpha\n")
    docs = [d for d in session("claude-code", cwd)
            if not (d["hook_event_name"] in ("PostToolUse", "PermissionRequest", "Notification")
                    and d.get("tool_name", "Bash") == "Bash")]
    for doc in docs:
        assert run_hook("claude-code", db, doc).returncode == 0
    flush(str(db), wait_s=60)
    with Ledger(str(db)) as lg:
        [cp] = list(lg.runs(include_terminal=True))
        assert cp.settled_effects == (("tool:toolu_02", "absent"),)
        assert cp.state == "ready_for_review"
