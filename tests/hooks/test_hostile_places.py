"""What a hook trusts: never code from the agent's project, never a hooks' directory or
file another user can write, never a settings entry it did not write."""

from __future__ import annotations

import json
import os
import subprocess

from handoff import Ledger
from handoff.hooks import settings, spool
from tests.hooks.agents import env
from tests.hooks.feed import run_hook, session


def test_the_installed_command_never_runs_code_from_the_project(tmp_path):
    db, project = tmp_path / "ledger.db", tmp_path / "project"
    fake = project / "handoff" / "hooks"
    fake.mkdir(parents=True)
    for pkg in (project / "handoff", fake):
        (pkg / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("import os\nprint('PLANTED', os.environ.get('HANDOFF_LEASE'))\n")
    with Ledger(str(db)):
        pass
    line = settings.command("claude-code", str(db))
    doc = session("claude-code", project)[0]
    proc = subprocess.run(line, shell=True, cwd=project, input=json.dumps(doc).encode(), capture_output=True,
                          env=env(HANDOFF_LEASE="1.secretvalue"), timeout=60)
    assert proc.returncode == 0 and b"PLANTED" not in proc.stdout + proc.stderr
    assert os.path.exists(os.path.join(spool.state_dir(str(db)), spool.JOURNAL))  # the real hook ran


def test_a_hooks_directory_others_may_write_is_refused_and_nothing_recorded(tmp_path):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    with Ledger(str(db)):
        pass
    directory = spool.state_dir(str(db))
    os.mkdir(directory)
    os.chmod(directory, 0o777)  # planted open to everyone: another user could forge the journal
    forged = os.path.join(directory, spool.JOURNAL)
    with open(forged, "w") as f:
        f.write('{"forged": true}\n')
    before = open(forged).read()
    proc = run_hook("claude-code", db, session("claude-code", cwd)[0])
    assert (proc.returncode, proc.stdout) == (0, b"")  # the agent is never broken
    assert b"not a private directory" in proc.stderr
    assert open(forged).read() == before
    with Ledger(str(db)) as lg:
        assert list(lg.runs(include_terminal=True)) == []


def test_a_new_hooks_directory_is_private_and_ignored_by_git(tmp_path):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    with Ledger(str(db)):
        pass
    proc = run_hook("claude-code", db, session("claude-code", cwd)[0])
    assert proc.returncode == 0, proc.stderr
    directory = spool.state_dir(str(db))
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert open(os.path.join(directory, ".gitignore")).read().splitlines()[-1] == "*"
    assert os.stat(os.path.join(directory, spool.JOURNAL)).st_mode & 0o777 == 0o600


def test_uninstall_removes_only_commands_that_run_the_hook(tmp_path):
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    mine = {"type": "command", "command": "echo -m handoff.hooks is great"}
    path.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [mine]}]}}))
    assert settings._ours(mine) is False
    ours = {"type": "command", "command": settings.command("claude-code", str(tmp_path / "l.db"))}
    assert settings._ours(ours) is True
    assert settings._ours({"type": "command", "command": "python3 -m handoff.hooks codex --db x"}) is True
