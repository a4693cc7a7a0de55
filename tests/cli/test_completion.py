"""'handoff completion': the scripts load in a real shell and complete from the ledger.

bash runs the script exactly as a user's ~/.bashrc would (eval of what the command
printed), then its completion function is called the way bash calls it on Tab, with
COMP_WORDS and COMP_CWORD set; the answer is what bash would offer.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from handoff import Ledger
from tests.support import executable, working_run


BASH = shutil.which("bash")


def _ledger(tmp_path) -> str:
    db = str(tmp_path / "l.db")
    with Ledger(db, create=True) as lg:
        for rid in ("alpha-1", "alpha-2", "beta-1"):
            working_run(lg, rid)
    return db


def _tab(words: list[str], *, cwd: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash offers for the last of ``words`` (the word being typed), with COMP_LINE
    and COMP_POINT set as bash sets them (words without ':'; test_a_run_id_with_colons...
    has bash split the line itself)."""
    exe = executable()
    if len(exe) != 1:
        pytest.skip("needs the installed handoff executable")
    script = subprocess.run([*exe, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in ["handoff", *words])
    line = " ".join(["handoff", *words])
    program = (f'eval "$HANDOFF_SCRIPT"\nCOMP_WORDS=({quoted})\nCOMP_CWORD={len(words)}\n'
               f'COMP_LINE="$HANDOFF_LINE"\nCOMP_POINT={len(line)}\n'
               f'_handoff_completion "{exe[0]}"\nprintf "%s\\n" "${{COMPREPLY[@]}}"\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    out = subprocess.run([BASH, "--norc", "--noprofile", "-c", program], cwd=cwd, capture_output=True, text=True,
                         env={**base, "HANDOFF_SCRIPT": script, "HANDOFF_LINE": line, **(env or {})}, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_bash_completes_a_run_id_from_the_ledger_in_db(tmp_path):
    db = _ledger(tmp_path)
    assert _tab(["--db", db, "status", "al"], cwd=str(tmp_path)) == ["alpha-1", "alpha-2"]
    assert _tab(["--db", db, "diff", "alpha-1", "b"], cwd=str(tmp_path)) == ["beta-1"]
    assert _tab(["--db", db, "log", "--run", "alpha-"], cwd=str(tmp_path)) == ["alpha-1", "alpha-2"]
    # HANDOFF_DB names the ledger when --db is not typed.
    assert _tab(["heartbeat", "be"], cwd=str(tmp_path), env={"HANDOFF_DB": db}) == ["beta-1"]


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_bash_completes_commands_options_states_and_kinds(tmp_path):
    assert {"status", "stalls"} <= set(_tab(["st"], cwd=str(tmp_path)))
    assert _tab(["comp"], cwd=str(tmp_path)) == ["completion"]
    assert "--health" in _tab(["runs", "--he"], cwd=str(tmp_path))
    assert _tab(["runs", "--health", "stal"], cwd=str(tmp_path)) == ["stalled"]
    assert _tab(["transition", "r1", "--to", "exec"], cwd=str(tmp_path)) == ["executing"]
    assert "plan_committed" in _tab(["progress", "r1", "--kind", "plan"], cwd=str(tmp_path))


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_a_tab_never_creates_or_changes_a_ledger(tmp_path):
    missing = tmp_path / "nope.db"
    assert _tab(["--db", str(missing), "status", ""], cwd=str(tmp_path)) == []
    assert not missing.exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a ledger at all")
    assert _tab(["--db", str(garbage), "status", ""], cwd=str(tmp_path)) == []
    assert garbage.read_bytes() == b"not a ledger at all"


def test_at_most_fifty_run_ids_per_tab(tmp_path):
    db = str(tmp_path / "many.db")
    with Ledger(db, create=True) as lg:
        for i in range(80):
            lg.open(run_id=f"job-{i:03d}", goal="g", target="t", owner="o")
        assert lg.run_ids("job-", limit=50) == [f"job-{i:03d}" for i in range(50)]
        assert lg.run_ids("job-07") == [f"job-{i:03d}" for i in range(70, 80)]
        assert lg.run_ids("zzz") == []


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_the_command(shell):
    out = subprocess.run([*executable(), "completion", shell], capture_output=True, text=True, check=True).stdout
    assert "_HANDOFF_COMPLETE" in out and "handoff" in out


# --- a real interactive bash: readline splits the line at ':' (COMP_WORDBREAKS) ----------

#: How long one keystroke's answer may take (a Tab starts a Python process).
KEY_TIMEOUT_S = 60.0
#: The interactive shell's prompt: bash prints it when readline takes the keyboard.
PROMPT = "tab-test> "


class Terminal:
    """An interactive bash on a pseudo-terminal with the completion script loaded: keys
    go in as a user types them, and Tab is bash's own completion (readline's word breaks,
    COMP_WORDS, COMP_LINE as bash makes them)."""

    def __init__(self, cwd: str, exe: str, env: dict[str, str]) -> None:
        import pty

        base = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
        path = os.path.dirname(exe) + os.pathsep + base.get("PATH", "")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the shell
            os.chdir(cwd)
            os.execve(BASH, [BASH, "--norc", "--noprofile", "-i"],
                      {**base, "PATH": path, "TERM": "dumb", "PS1": PROMPT, "INPUTRC": "/dev/null", **env})
        self.buf = b""
        # Keys typed before bash shows its prompt would reach a terminal not yet in readline's
        # hands (echoed, not completed): every step waits for the prompt.
        self.read_until(PROMPT)
        self.run(f'eval "$({exe} completion bash)"; bind "set bell-style none"; echo READY-$((6*7))',
                 "READY-42\r\n" + PROMPT)

    def read_until(self, marker: str) -> str:
        import select
        import time

        deadline = time.monotonic() + KEY_TIMEOUT_S
        while marker.encode() not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, f"bash did not print {marker!r}; it printed {self.buf[-2000:]!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                self.buf += os.read(self.fd, 65536)
        text = self.buf.decode(errors="replace")
        self.buf = b""
        return text

    def run(self, line: str, marker: str) -> str:
        os.write(self.fd, line.encode() + b"\n")
        return self.read_until(marker)

    def completed(self, typed: str) -> str:
        """The command line after typing ``typed`` and pressing Tab: bash completes it in
        place; then Ctrl-A, a prefix that makes the line an echo, Ctrl-E and Enter print
        it (readline takes keys in order, so the echo sees the completed line)."""
        os.write(self.fd, typed.encode() + b"\t\x01echo LINE-$((6*7)):\x05\n")
        text = self.read_until("\n" + PROMPT)
        assert "LINE-42:" in text, text
        return text.split("LINE-42:", 1)[1].splitlines()[0].strip()

    def close(self) -> None:
        import signal

        try:
            os.write(self.fd, b"exit\n")
            os.close(self.fd)
        finally:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_a_run_id_with_colons_completes_in_an_interactive_bash(tmp_path):
    exe = executable()
    if len(exe) != 1:
        pytest.skip("needs the installed handoff executable")
    db = str(tmp_path / "l.db")
    with Ledger(db, create=True) as lg:
        for rid in ("job:7:alpha", "job:7:beta", "job:8", "other"):
            lg.open(run_id=rid, goal="g", target="t", owner="o")
    term = Terminal(str(tmp_path), exe[0], {"HANDOFF_DB": db})
    try:
        assert term.completed("handoff status jo") == "handoff status job:"  # the common prefix
        assert term.completed("handoff status job:8") == "handoff status job:8"
        assert term.completed("handoff status job:7:a") == "handoff status job:7:alpha"
        assert term.completed("handoff log --run job:7:b") == "handoff log --run job:7:beta"
        assert term.completed("handoff diff job:7:alpha job:7:b") == "handoff diff job:7:alpha job:7:beta"
        assert term.completed("handoff status oth") == "handoff status other"
        # --opt=VALUE: bash breaks the word at '=' as well.
        assert term.completed("handoff log --run=job:7:b") == "handoff log --run=job:7:beta"
        assert term.completed("handoff log --run=oth") == "handoff log --run=other"
        assert term.completed("handoff progress other --kind=plan_c") == "handoff progress other --kind=plan_committed"
    finally:
        term.close()


def _accepted_kinds(tmp_path) -> set[str]:
    """Every kind 'progress' accepts in some state of a run, found by asking the ledger:
    each candidate (built-in progress of every state, activity that never counts, a
    stranger) is reported in each state a worker can be in, on a fresh run."""
    from handoff.ledger.errors import LedgerError
    from handoff.reducers import transitions as T

    candidates = T.ALL_PROGRESS_KINDS | T.NOT_PROGRESS | {"flying"}
    accepted = set()
    with Ledger(str(tmp_path / "kinds.db"), create=True) as lg:
        for state in ("planning", "executing", "verifying", "blocked", "unknown"):
            lease = working_run(lg, state, state="executing" if state in ("blocked", "unknown") else state)
            if state == "blocked":
                lg.block(state, "waiting for access", "ask ops", lease=lease)
            elif state == "unknown":
                lg.effect_start(state, lease, "fx-1", "deploy")
                lg.release(state, lease, "leaving with the deploy unconfirmed")
                lease = lg.claim(state, "w1")
            for kind in sorted(candidates):
                assert lg.checkpoint(state).state == state  # a progress record never moves the run
                try:
                    lg.progress(state, lease, kind, "step")
                    accepted.add(kind)
                except LedgerError:
                    pass
    return accepted


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_progress_kinds_offered_are_exactly_the_kinds_progress_accepts(tmp_path):
    offered = set(_tab(["progress", "r1", "--kind", ""], cwd=str(tmp_path)))
    assert "blocker_recorded" not in offered and "reconciliation_recorded" not in offered
    assert offered == _accepted_kinds(tmp_path)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_a_runs_declared_kinds_are_offered_for_it(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger(db, create=True) as lg:
        lg.open(run_id="own", goal="g", target="t", owner="o", progress_kinds={"executing": ["page_scraped"]})
        lg.open(run_id="plain", goal="g", target="t", owner="o")
    assert _tab(["--db", db, "progress", "own", "--kind", "page"], cwd=str(tmp_path)) == ["page_scraped"]
    assert _tab(["--db", db, "progress", "plain", "--kind", "page"], cwd=str(tmp_path)) == []
