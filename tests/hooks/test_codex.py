"""The hooks with the real Codex CLI from npm (``codex exec``), offline against a scripted
Responses API. Codex runs a hook only once a person has trusted it; ``codex exec
--dangerously-bypass-hook-trust`` is its switch for automation that vets its hooks itself,
which these tests are (the hooks are this package's, installed by the test)."""

from __future__ import annotations

import json
import subprocess

from handoff import Ledger
from handoff.hooks.replay import flush
from tests.hooks.agents import env, find_cli, handoff
from tests.hooks.responses_server import ScriptedResponses, codex_home

FLAGS = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--dangerously-bypass-hook-trust"]


def _codex_env(home, **extra):
    return env(CODEX_HOME=str(home), SCRIPTED_API_KEY="test-key", **extra)


def test_codex_exec_under_handoff_run_writes_under_the_wrapper_s_lease(tmp_path):
    codex = find_cli("codex", "HANDOFF_TEST_CODEX")
    home, project, db = tmp_path / "codex-home", tmp_path / "proj", tmp_path / "ledger.db"
    project.mkdir()
    with ScriptedResponses([["printf 'notes\\n' > NOTES.md"], ["cat NOTES.md"]], final="NOTES.md is written.") as model:
        codex_home(home, model.url)
        handoff("--db", str(db), "hooks", "install", "codex", "--user", env=_codex_env(home))
        proc = handoff("--db", str(db), "run", "--goal", "Write the notes", "--target", "pr:7", "--owner", "alice",
                       "--worker", "codex-1", "--", codex, "exec", *FLAGS, "write the notes",
                       env=_codex_env(home), cwd=project, timeout=180)
    assert (project / "NOTES.md").read_text() == "notes\n"
    flush(str(db), wait_s=60, env={})
    with Ledger(str(db)) as lg:
        [cp] = list(lg.runs(include_terminal=True))
        records = list(lg.log(cp.run_id))
    assert cp.goal == "Write the notes" and cp.lease is None, proc.stderr  # the wrapper released at the end
    types = [r.type for r in records]
    assert types.count("lease_granted") == 1 and types.count("side_effect_started") == 2
    whats = [r.event.what for r in records if r.type == "side_effect_started"]
    assert whats[0].startswith("Bash ") and "NOTES.md" in whats[0]
    assert types.count("side_effect_confirmed") == 2
    steps = [r.event.detail for r in records if r.type == "progress_recorded" and r.event.kind == "tool_outcome"]
    assert len(steps) == 2
    [turn] = [r for r in records if r.type == "evidence_recorded"]
    assert turn.event.kind == "turn_result" and turn.event.detail == "NOTES.md is written."
    assert {r.lease for r in records if r.actor == "worker:codex-1" and r.type != "lease_granted"} == {1}


def test_a_revoked_codex_session_is_denied_its_next_command(tmp_path):
    codex = find_cli("codex", "HANDOFF_TEST_CODEX")
    home, project, db = tmp_path / "codex-home", tmp_path / "proj", tmp_path / "ledger.db"
    project.mkdir()

    def revoke() -> None:
        flush(str(db), wait_s=30, env={})
        with Ledger(str(db)) as lg:
            [cp] = list(lg.runs())
            lg.revoke(cp.run_id, "reassigned", by="ops")

    with ScriptedResponses([["touch first.txt"], ["touch second.txt"]], final="Stopped.", before={1: revoke}) as model:
        codex_home(home, model.url)
        handoff("--db", str(db), "hooks", "install", "codex", "--user", "--deny-revoked", env=_codex_env(home))
        proc = subprocess.run([codex, "exec", *FLAGS, "touch two files"], cwd=project, env=_codex_env(home),
                              capture_output=True, text=True, timeout=180)
        told = model.outputs()
    assert proc.returncode == 0, proc.stderr
    assert (project / "first.txt").exists() and not (project / "second.txt").exists()
    assert "no longer this session's" in json.dumps(told[-1])
