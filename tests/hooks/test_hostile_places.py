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


def test_two_sessions_whose_ids_differ_only_in_unsafe_characters_are_two_runs(tmp_path):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    with Ledger(str(db)):
        pass
    for sid in ("a/b", "a-b", "x" * 150 + "1", "x" * 150 + "2"):
        for doc in session("claude-code", cwd, session_id=sid)[:2]:
            proc = run_hook("claude-code", db, doc)
            assert proc.returncode == 0, proc.stderr
    from handoff.hooks.replay import flush

    flush(str(db), wait_s=60)
    with Ledger(str(db)) as lg:
        runs = list(lg.runs(include_terminal=True))
    assert len(runs) == 4 and len({cp.run_id for cp in runs}) == 4
    assert "claude-code-a-b" in {cp.run_id for cp in runs}  # a safe id is kept as it is


def test_a_settings_table_of_the_wrong_shape_is_refused_and_left_alone(tmp_path):
    from tests.hooks.agents import handoff

    project = tmp_path / "proj"
    path = project / ".claude" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"hooks": {"Stop": "oops"}}')
    proc = handoff("--db", str(tmp_path / "l.db"), "hooks", "install", "claude-code", "--project", str(project),
                   check=False)
    assert proc.returncode == 2 and "hooks.Stop is not a list" in proc.stderr and "Traceback" not in proc.stderr
    assert path.read_text() == '{"hooks": {"Stop": "oops"}}'


def test_a_linked_settings_file_stays_a_link_and_its_file_gets_the_hook(tmp_path):
    from tests.hooks.agents import handoff

    project, dotfiles = tmp_path / "proj", tmp_path / "dotfiles"
    (project / ".claude").mkdir(parents=True)
    dotfiles.mkdir()
    real = dotfiles / "claude-settings.json"
    real.write_text('{"theme": "dark"}')
    link = project / ".claude" / "settings.json"
    link.symlink_to(real)
    handoff("--db", str(tmp_path / "l.db"), "hooks", "install", "claude-code", "--project", str(project))
    assert link.is_symlink() and os.readlink(link) == str(real)
    doc = json.loads(real.read_text())
    assert doc["theme"] == "dark" and "Stop" in doc["hooks"]
