"""Importing into a path that did not exist: never delete or replace what someone else made.

The import builds the new ledger under a private name and links it into place only when
it succeeded. These tests race it with a real second process that creates the target
while the import is still reading its input (a pipe the test feeds line by line).
"""

from __future__ import annotations

import glob
import os
import stat
import subprocess
import sys
import time

import pytest

from handoff import Ledger, import_into
from handoff.ledger.errors import InvalidInput, TargetAppeared

from .conftest import ROOT, child_env
from tests.support import executable

# A second program that keeps the ledger open: it creates the file (opening run "other"),
# says so, then writes one more event when told to, as a long-lived worker would.
HOLDER = r"""
import sys
from handoff import Ledger
lg = Ledger(sys.argv[1])
lg.open(run_id="other", goal="made by someone else", target="t", owner="bob")
print("ready", flush=True)
sys.stdin.readline()
lg.claim("other", "w9")
lg.close()
print("done", flush=True)
"""


def _export(tmp_path) -> list[bytes]:
    src = str(tmp_path / "src.db")
    with Ledger(src) as lg:
        lg.open(run_id="r1", goal="the goal", target="chat:#ops", owner="alice")
        lease = lg.claim("r1", "w1")
        lg.transition("r1", lease, "planning", worker="w1")
        return [line + b"\n" for line in lg.export()]


def _start_import(target: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*executable(), "--db", target, "import", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT)


def _wait_until_started(target: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the import holds a file: the target itself (old behaviour) or its private one."""
    pattern = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.import-*")
    deadline = time.monotonic() + 30
    while not (os.path.exists(target) or glob.glob(pattern)):
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the import never started"
        time.sleep(0.02)


def _leftovers(target: str) -> list[str]:
    return glob.glob(os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.import-*"))


def _runs(path: str) -> dict[str, int]:
    with Ledger(path, readonly=True) as lg:
        return {h.run_id: h.last_seq for h in lg.store.list_runs()}


def test_failed_import_keeps_the_ledger_another_process_created_meanwhile(tmp_path, evidence):
    """Today's bug: the failed import deleted the target, its WAL and SHM, with the other
    process's run in it, and that process went on writing into the deleted file."""
    target = str(tmp_path / "new.db")
    lines = _export(tmp_path)
    imp = _start_import(target)
    imp.stdin.write(lines[0])  # type: ignore[union-attr]
    imp.stdin.flush()  # type: ignore[union-attr]
    _wait_until_started(target, imp)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, target], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=child_env(), cwd=ROOT, text=True)
    assert holder.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
    imp.stdin.write(b"{not json\n")  # type: ignore[union-attr]
    imp.stdin.close()  # type: ignore[union-attr]
    assert imp.wait(60) == 2, imp.stderr.read()  # type: ignore[union-attr]
    holder.stdin.write("go\n")  # type: ignore[union-attr]
    holder.stdin.close()  # type: ignore[union-attr]
    assert holder.stdout.readline().strip() == "done" and holder.wait(30) == 0  # type: ignore[union-attr]
    # The other process's run and its later write are both in the file at the target.
    assert _runs(target) == {"other": 2}
    assert _leftovers(target) == []
    evidence.add("import.target", case="failed import while another process created the target",
                 import_exit=2, target_runs=_runs(target))


def test_successful_import_never_replaces_a_file_that_appeared_meanwhile(tmp_path, evidence):
    target = str(tmp_path / "new.db")
    lines = _export(tmp_path)
    imp = _start_import(target)
    imp.stdin.write(lines[0])  # type: ignore[union-attr]
    imp.stdin.flush()  # type: ignore[union-attr]
    _wait_until_started(target, imp)
    subprocess.run([*executable(), "--db", target, "open", "--run-id", "other", "--goal", "g", "--target", "t",
                    "--owner", "bob"], env=child_env(), cwd=ROOT, check=True, capture_output=True)
    for line in lines[1:]:
        imp.stdin.write(line)  # type: ignore[union-attr]
    imp.stdin.close()  # type: ignore[union-attr]
    code = imp.wait(60)
    err = imp.stderr.read().decode()  # type: ignore[union-attr]
    assert code == 1 and "TargetAppeared" not in err and "appeared at" in err, err
    assert _runs(target) == {"other": 1}  # left alone: nothing imported, nothing replaced
    assert _leftovers(target) == []
    # Importing again goes into the ledger that is there now.
    done = subprocess.run([*executable(), "--db", target, "import", "-"], input=b"".join(lines),
                          env=child_env(), cwd=ROOT, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert _runs(target) == {"other": 1, "r1": 3}
    evidence.add("import.target", case="import finished after another process created the target",
                 import_exit=code, error=err.strip())


def test_the_api_builds_a_new_ledger_privately(tmp_path):
    target = str(tmp_path / "fresh.db")
    lines = _export(tmp_path)
    with pytest.raises(InvalidInput):
        import_into(target, [*lines, b"{not json\n"])
    assert [f for f in os.listdir(tmp_path) if not f.startswith("src.db")] == []  # nothing left behind
    assert import_into(target, lines) == {"imported": 3, "skipped": 0, "runs": 1}
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert _runs(target) == {"r1": 3} and _leftovers(target) == []


def test_the_last_step_never_replaces_a_name_that_exists(tmp_path):
    """Publishing cannot replace: a name that exists by then fails, both ways it may be
    done (a hard link, and renameat2 with RENAME_NOREPLACE where links are refused)."""
    from handoff.ledger import files

    private = tmp_path / "private"
    private.write_bytes(b"x")
    target = tmp_path / "there"
    target.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        files.publish_no_replace(str(private), str(target))
    with pytest.raises(FileExistsError):
        files._rename_noreplace(str(private), str(target))
    assert target.read_bytes() == b"someone else's" and private.read_bytes() == b"x"
    assert files._rename_noreplace(str(private), str(tmp_path / "free"))
    assert (tmp_path / "free").read_bytes() == b"x" and not private.exists()


def test_an_address_is_imported_into_where_it_points(tmp_path):
    """sqlite:///path names the file (built under a private name and published, as a
    plain path is); a PostgreSQL address is imported into in one server transaction."""
    lines = _export(tmp_path)
    target = tmp_path / "by-address.db"
    assert import_into(f"sqlite://{target}?synchronous=NORMAL", lines)["imported"] == len(lines)
    assert _runs(str(target)) == {"r1": 3} and _leftovers(str(target)) == []
    assert not any("sqlite:" in name for name in os.listdir(tmp_path))
