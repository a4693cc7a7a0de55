"""``handoff hooks install`` and ``uninstall``: the user's own hooks are never touched,
installing twice changes nothing, and uninstalling takes out exactly what was added."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.hooks.agents import env, handoff

USERS_OWN = {
    "permissions": {"allow": ["Bash(npm test)"]},
    "hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./check-bash.sh"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
    },
}


@pytest.mark.parametrize("harness,relpath", [("claude-code", ".claude/settings.json"),
                                             ("openhands", ".openhands/hooks.json"),
                                             ("codex", ".codex/hooks.json")])
def test_install_keeps_the_user_s_hooks_and_uninstall_removes_exactly_ours(tmp_path, harness, relpath):
    project, db = tmp_path / "proj", tmp_path / "ledger.db"
    path = project / relpath
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(USERS_OWN))
    handoff("--db", str(db), "hooks", "install", harness, "--project", str(project))
    once = path.read_text()
    doc = json.loads(once)
    assert doc["permissions"] == USERS_OWN["permissions"]
    assert doc["hooks"]["PreToolUse"][0] == USERS_OWN["hooks"]["PreToolUse"][0]
    ours = [h["command"] for groups in doc["hooks"].values() for g in groups for h in g["hooks"]
            if "-m handoff.hooks" in h["command"]]
    assert len(ours) == len(doc["hooks"]) and all(f"handoff.hooks {harness} --db {db}" in c for c in ours)
    assert os.path.exists(db)  # the ledger is created by the install

    handoff("--db", str(db), "hooks", "install", harness, "--project", str(project))
    assert path.read_text() == once  # idempotent
    handoff("--db", str(db), "hooks", "install", harness, "--project", str(project), "--deny-revoked")
    again = json.loads(path.read_text())
    assert sum("--deny-revoked" in h["command"] for gs in again["hooks"].values() for g in gs for h in g["hooks"]) \
        == len(ours)  # replaced, not added to

    out = handoff("--db", str(db), "hooks", "uninstall", harness, "--project", str(project)).stdout
    assert f"{len(ours)} hook(s) removed" in out
    assert json.loads(path.read_text()) == USERS_OWN


def test_a_new_settings_file_is_private_and_uninstall_leaves_no_empty_table(tmp_path):
    project = tmp_path / "proj"
    handoff("--db", str(tmp_path / "l.db"), "hooks", "install", "claude-code", "--project", str(project))
    path = project / ".claude" / "settings.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    handoff("--db", str(tmp_path / "l.db"), "hooks", "uninstall", "claude-code", "--project", str(project))
    assert json.loads(path.read_text()) == {}


def test_goose_gets_a_plugin_of_its_own_which_uninstall_removes(tmp_path):
    project = tmp_path / "proj"
    handoff("--db", str(tmp_path / "l.db"), "hooks", "install", "goose", "--project", str(project))
    plugin = project / ".agents" / "plugins" / "handoff-ledger"
    assert json.loads((plugin / "plugin.json").read_text())["name"] == "handoff-ledger"
    events = json.loads((plugin / "hooks" / "hooks.json").read_text())["hooks"]
    assert set(events) == {"SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure",
                           "Stop", "SessionEnd"}
    assert all("matcher" not in g for gs in events.values() for g in gs)  # goose's matcher is a regex: none is all
    handoff("--db", str(tmp_path / "l.db"), "hooks", "uninstall", "goose", "--project", str(project))
    assert not plugin.exists()


def test_user_scope_follows_codex_home(tmp_path):
    home = tmp_path / "codex-home"
    handoff("--db", str(tmp_path / "l.db"), "hooks", "install", "codex", "--user", env=env(CODEX_HOME=str(home)))
    assert "PreToolUse" in json.loads((home / "hooks.json").read_text())["hooks"]


def test_a_settings_file_that_is_not_json_is_refused_and_left_alone(tmp_path):
    project = tmp_path / "proj"
    path = project / ".claude" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    proc = handoff("--db", str(tmp_path / "l.db"), "hooks", "install", "claude-code", "--project", str(project),
                   check=False)
    assert proc.returncode == 2 and "is not JSON" in proc.stderr
    assert path.read_text() == "{ not json"
