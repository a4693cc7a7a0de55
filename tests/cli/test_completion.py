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
from tests.support import executable

from .conftest import working_run

BASH = shutil.which("bash")


def _ledger(tmp_path) -> str:
    db = str(tmp_path / "l.db")
    with Ledger(db, create=True) as lg:
        for rid in ("alpha-1", "alpha-2", "beta-1"):
            working_run(lg, rid)
    return db


def _tab(words: list[str], *, cwd: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash offers for the last of ``words`` (the word being typed)."""
    exe = executable()
    if len(exe) != 1:
        pytest.skip("needs the installed handoff executable")
    script = subprocess.run([*exe, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in ["handoff", *words])
    program = (f'eval "$HANDOFF_SCRIPT"\nCOMP_WORDS=({quoted})\nCOMP_CWORD={len(words)}\n'
               f'_handoff_completion "{exe[0]}"\nprintf "%s\\n" "${{COMPREPLY[@]}}"\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    out = subprocess.run([BASH, "--norc", "--noprofile", "-c", program], cwd=cwd, capture_output=True, text=True,
                         env={**base, "HANDOFF_SCRIPT": script, **(env or {})}, timeout=60)
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
