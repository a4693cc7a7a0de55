"""The hooks with the real Claude Code CLI from npm, driven offline by a scripted model.

Each test installs the hooks with ``handoff hooks install claude-code`` into a project of
its own, runs ``claude`` (headless ``-p``, or interactive in a pseudo-terminal for the
permission prompt) against ``ScriptedModel`` on 127.0.0.1, and reads the ledger it left:
real processes, a real SQLite file, the hooks Claude Code itself ran.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import stat
import subprocess
import time
from pathlib import Path

from handoff import Ledger
from handoff.hooks import spool
from handoff.hooks.replay import flush
from handoff.watchdog import watch_once
from tests.hooks.agents import claude_env, find_cli, handoff, trust_interactive
from tests.hooks.model_server import Call, ScriptedModel

MODEL = "claude-sonnet-4-5"
#: A GitHub token's shape: what the scrub must keep out of the ledger.
SECRET = "ghp_" + "Zq8mW2nR5tY7uI9oP1aS3dF6gH4jK0lX2cV8"


def _install(db: Path, project: Path, *extra: str) -> None:
    handoff("--db", str(db), "hooks", "install", "claude-code", "--project", str(project), "--owner", "alice", *extra)


def _the_run(lg: Ledger):
    runs = list(lg.runs(include_terminal=True))
    assert len(runs) == 1, [r.run_id for r in runs]
    return runs[0]


def _wait_for(what, check, deadline_s: float = 90.0, *, alive=None):
    """Poll ``check()`` until it returns something true, or fail naming ``what``."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        if alive is not None and not alive():
            break
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def _kill_left_behind(home: Path) -> None:
    """Kill what a killed session left running (its shell reads a snapshot under ``home``)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(home).encode() in f.read() and os.getpgid(int(pid)) != os.getpgid(0):
                    os.killpg(os.getpgid(int(pid)), signal.SIGKILL)  # the shell and its command
        except OSError:
            pass


def test_a_session_that_edits_two_files_and_runs_a_command(tmp_path):
    claude = find_cli("claude", "HANDOFF_TEST_CLAUDE")
    project, db, home = tmp_path / "proj", tmp_path / "ledger.db", tmp_path / "home"
    project.mkdir()
    _install(db, project)
    notes, changelog = project / "notes.md", project / "CHANGELOG.md"
    tokens: list[str] = []

    def keep_token() -> None:  # mid-session: the lease token as the state file holds it
        flush(str(db), wait_s=30)
        sessions = spool.load_state(spool.state_dir(str(db)))["sessions"]
        tokens.extend(s["token"] for s in sessions.values() if s.get("token"))

    steps = [[Call("Write", {"file_path": str(notes), "content": "# Notes\n"})],
             [Call("Edit", {"file_path": str(notes), "old_string": "# Notes", "new_string": "# Release notes"})],
             [Call("Write", {"file_path": str(changelog), "content": "- the cache no longer leaks\n"})],
             [Call("Bash", {"command": f"GITHUB_TOKEN={SECRET} echo released", "description": "announce"})]]
    with ScriptedModel(steps, final="Wrote notes.md and CHANGELOG.md, and announced it.",
                       before={3: keep_token}) as model:
        proc = subprocess.run([claude, "-p", f"Write the release notes (token {SECRET})", "--model", MODEL,
                               "--dangerously-skip-permissions"], cwd=project, env=claude_env(home, model.url),
                              capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "announced" in proc.stdout
    handoff("--db", str(db), "hooks", "flush")

    with Ledger(str(db)) as lg:
        cp = _the_run(lg)
        assert cp.run_id.startswith("claude-code-") and cp.owner == "alice"
        assert cp.state == "ready_for_review"
        assert sorted(a.path for a in cp.artifacts) == sorted([str(notes), str(changelog)])
        assert all(a.substantive for a in cp.artifacts)
        assert cp.lease is None  # SessionEnd gave the lease back
        records = list(lg.log(cp.run_id))
        types = [r.type for r in records]
        steps_done = [r.event.detail for r in records if r.type == "progress_recorded" and r.event.kind == "tool_outcome"]
        assert steps_done[:3] == ["Write notes.md", "Edit notes.md", "Write CHANGELOG.md"]
        assert steps_done[3].startswith("Bash ") and "echo released" in steps_done[3]
        assert types.count("side_effect_started") == types.count("side_effect_confirmed") == 1
        assert types[-3:] == ["result_submitted", "state_changed", "lease_released"]
        [turn] = [e for e in lg.status(cp.run_id)["evidence"] if e["kind"] == "turn_result"]
        assert turn["outcome"] == "pass" and turn["detail"].startswith("Wrote notes.md")
        exported = b"".join(lg.export()).decode()
    assert SECRET not in exported and "[secret~" in exported  # the prompt (the goal) and the command, scrubbed
    assert tokens, "the session held a lease mid-session"
    for token in tokens:
        secret = token.partition(".")[2]
        assert secret not in exported and secret not in proc.stdout + proc.stderr
        for transcript in (home / ".claude").rglob("*.jsonl"):  # the agent's context
            assert secret not in transcript.read_text()
    directory = Path(spool.state_dir(str(db)))
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in ("state.json", "journal.jsonl"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    assert (directory / "journal.jsonl").stat().st_size == 0  # all written, nothing raw left behind


def test_a_session_killed_in_a_slow_command_is_unknown_and_flagged(tmp_path):
    claude = find_cli("claude", "HANDOFF_TEST_CLAUDE")
    project, db, home = tmp_path / "proj", tmp_path / "ledger.db", tmp_path / "home"
    project.mkdir()
    _install(db, project, "--heartbeat-timeout", "5")
    steps = [[Call("Bash", {"command": "sleep 120", "description": "run the slow integration suite"})]]
    with ScriptedModel(steps) as model:
        proc = subprocess.Popen([claude, "-p", "run the integration suite", "--model", MODEL,
                                 "--dangerously-skip-permissions"], cwd=project, env=claude_env(home, model.url),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            def started():
                flush(str(db), wait_s=30)
                with Ledger(str(db)) as lg:
                    runs = list(lg.runs())
                    return runs and runs[0].pending_effects
            _wait_for("the Bash call's side effect to be recorded", started, alive=lambda: proc.poll() is None)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the session, mid-command
            proc.wait()
            _kill_left_behind(home)  # Claude Code runs Bash in a process group of its own
    handoff("--db", str(db), "hooks", "flush")

    with Ledger(str(db)) as lg:
        cp = _the_run(lg)
        assert cp.state == "executing" and cp.lease is not None  # nobody said goodbye
        [pending] = cp.pending_effects
        assert pending.what.startswith("Bash ") and "sleep 120" in pending.what
        later = lg.clock() + 10 * 1_000_000  # past the 5 s heartbeat timeout
        actions = watch_once(lg, name="ops", now_us=later)
        assert [(a.classification, a.action, a.outcome) for a in actions] == [
            ("unavailable", "revoke_lease", "committed")]
        cp = lg.checkpoint(cp.run_id)
        assert cp.state == "unknown"  # not "done": the command's outcome is not known
        flagged = {c.run_id: h.classification for c, h in lg.stalls(now=later)}
        assert flagged == {cp.run_id: "needs_reconciliation"}


def test_a_revoked_session_is_denied_its_next_tool_call(tmp_path):
    claude = find_cli("claude", "HANDOFF_TEST_CLAUDE")
    project, db, home = tmp_path / "proj", tmp_path / "ledger.db", tmp_path / "home"
    project.mkdir()
    _install(db, project, "--deny-revoked")
    revoked: list[str] = []

    def revoke() -> None:  # between the two tool calls, an operator takes the run away
        flush(str(db), wait_s=30)
        with Ledger(str(db)) as lg:
            run = _the_run(lg).run_id
            lg.revoke(run, "reassigned to another session", by="ops")
        revoked.append(run)

    steps = [[Call("Bash", {"command": "echo one > first.txt", "description": "first"})],
             [Call("Bash", {"command": "echo two > second.txt", "description": "second"})]]
    with ScriptedModel(steps, final="Stopped.", before={1: revoke}) as model:
        proc = subprocess.run([claude, "-p", "write two files", "--model", MODEL, "--dangerously-skip-permissions"],
                              cwd=project, env=claude_env(home, model.url), capture_output=True, text=True,
                              timeout=180)
        requests = list(model.requests)
    assert proc.returncode == 0, proc.stderr
    assert (project / "first.txt").exists()
    assert not (project / "second.txt").exists()  # denied: the command never ran
    results = [c for r in requests for m in r["body"].get("messages", []) if isinstance(m.get("content"), list)
               for c in m["content"] if c.get("type") == "tool_result"]
    denial = json.dumps(results[-1])
    assert "no longer this session's" in denial and "revoked" in denial  # what the model was told
    handoff("--db", str(db), "hooks", "flush")
    with Ledger(str(db)) as lg:
        records = list(lg.log(revoked[0]))
        after = [r.type for r in records[[r.type for r in records].index("lease_revoked"):]]
        assert after == ["lease_revoked"]  # nothing written under the revoked lease
        assert [r.event.what for r in records if r.type == "side_effect_started"] == [
            next(r.event.what for r in records if r.type == "side_effect_started")]
        assert "first.txt" in next(r.event.what for r in records if r.type == "side_effect_started")


def test_a_permission_prompt_blocks_the_run_on_its_owner(tmp_path):
    claude = find_cli("claude", "HANDOFF_TEST_CLAUDE")
    project, db, home = tmp_path / "proj", tmp_path / "ledger.db", tmp_path / "home"
    project.mkdir()
    _install(db, project)
    env = claude_env(home, "")
    trust_interactive(home, project)
    steps = [[Call("Bash", {"command": "echo hi > answer.txt", "description": "write the answer"})]]
    with ScriptedModel(steps, final="Written.") as model:
        env["ANTHROPIC_BASE_URL"] = model.url
        env.pop("IS_SANDBOX", None)
        pid, fd = pty.fork()
        if pid == 0:  # the child: Claude Code in a terminal, default permission mode
            os.chdir(project)
            os.execve(claude, [claude, "--model", MODEL, "write the answer"], env)
        screen = bytearray()

        def read_screen() -> None:
            while select.select([fd], [], [], 0)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                screen.extend(chunk)

        def state():
            read_screen()
            flush(str(db), wait_s=30)
            with Ledger(str(db)) as lg:
                runs = list(lg.runs())
                return runs[0] if runs else None

        try:
            blocked = _wait_for("the run to be blocked on its owner", lambda: (cp := state()) and
                                cp.state == "blocked" and cp)
            [blocker] = blocked.blockers
            assert blocker.reason == "waiting on you: permission for Bash"
            assert "answer claude-code in its terminal" in blocker.next_action
            assert not (project / "answer.txt").exists()
            os.write(fd, b"\r")  # the owner says yes (the first choice)
            going = _wait_for("the next tool call to clear the blocker", lambda: (cp := state()) and
                              cp.state == "executing" and not cp.blockers and cp)
            assert going.state == "executing"
            _wait_for("the command to run", lambda: read_screen() or (project / "answer.txt").exists())
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
    with Ledger(str(db)) as lg:
        types = [r.type for r in lg.log(_the_run(lg).run_id)]
    assert "blocker_raised" in types and "blocker_cleared" in types


def test_under_handoff_run_claude_code_s_hooks_write_under_the_wrapper_s_lease(tmp_path):
    claude = find_cli("claude", "HANDOFF_TEST_CLAUDE")
    project, db, home = tmp_path / "proj", tmp_path / "ledger.db", tmp_path / "home"
    project.mkdir()
    _install(db, project)
    steps = [[Call("Write", {"file_path": str(project / "fix.py"), "content": "print('fixed')\n"})],
             [Call("Bash", {"command": "python3 fix.py", "description": "run it"})]]
    with ScriptedModel(steps, final="fix.py prints 'fixed'.") as model:
        handoff("--db", str(db), "run", "--goal", "Fix the flaky test", "--target", "pr:512", "--owner", "bob",
                "--worker", "laptop-1", "--", claude, "-p", "fix the flaky test", "--model", MODEL,
                "--dangerously-skip-permissions", env=claude_env(home, model.url), cwd=project, timeout=180)
    with Ledger(str(db)) as lg:
        cp = _the_run(lg)  # the wrapper's run: no second run for the session
        records = list(lg.log(cp.run_id))
    types = [r.type for r in records]
    assert cp.goal == "Fix the flaky test" and cp.owner == "bob" and cp.state == "succeeded"
    assert types.count("lease_granted") == 1 and cp.lease is None
    assert {r.actor for r in records if r.lease is not None} == {"worker:laptop-1"}
    assert [a.path for a in cp.artifacts] == [str(project / "fix.py")]
    assert types.count("side_effect_confirmed") == 1
