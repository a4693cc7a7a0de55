"""Progress bars on long work: drawn on a terminal's stderr, never on stdout, never on a pipe.

Each command runs as a real ``handoff`` process with its stderr on a pseudo-terminal
(pty), as in an operator's shell; HANDOFF_PROGRESS_MIN=1 makes a small ledger count as
long work, so the test needs no 20,000-event ledger.
"""

from __future__ import annotations

import os
import pty
import subprocess
import tempfile

import pytest

from handoff import Ledger
from tests.support import executable, working_run


#: What click's bar draws: the label, then "[####...]  done/total".
BAR = "#"


def _ledger(tmp_path, events: int = 1500) -> str:
    db = str(tmp_path / "l.db")
    with Ledger(db, create=True) as lg:
        lease = working_run(lg, "r1")
        for i in range(events):  # attrs of its own, so each beat is an event in the log
            lg.heartbeat("r1", lease, worker="w1", attrs={"n": i})
    return db


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env.update({"HANDOFF_PROGRESS_MIN": "1", "COLUMNS": "100", **extra})
    return env


def _run_on_pty(args: list[str], *, cwd: str, timeout: float = 120) -> tuple[int, bytes, bytes]:
    """Run ``handoff ARGS`` with stderr on a pty; return the exit code, what stdout carried
    (a file) and what the terminal showed."""
    master, slave = pty.openpty()
    sink = tempfile.TemporaryFile()  # a file, not a pipe: a pipe nobody drains would block the child
    proc = subprocess.Popen([*executable(), *args], cwd=cwd, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=sink, stderr=slave)
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child and every copy of the slave end are gone
            break
        if not chunk:
            break
        shown += chunk
    code = proc.wait(timeout=timeout)
    os.close(master)
    sink.seek(0)
    out = sink.read()
    sink.close()
    return code, out, bytes(shown)


def _assert_bar(shown: bytes, label: str) -> None:
    text = shown.decode("utf-8", "replace")
    assert label in text and BAR in text, text[-500:]


@pytest.mark.parametrize("args, label", [
    (["export", "--all", "-o", "out.jsonl"], "exporting"),
    (["verify"], "verifying"),
    (["report", "r1", "-o", "r.html"], "reading the run"),
])
def test_a_bar_on_a_terminal_and_none_on_a_pipe(tmp_path, args, label):
    db = _ledger(tmp_path)
    code, _, shown = _run_on_pty(["--db", db, *args], cwd=str(tmp_path))
    assert code == 0, shown
    _assert_bar(shown, label)
    # The same command with stderr on a pipe (a log, a CI job): not one byte of bar.
    piped = subprocess.run([*executable(), "--db", db, *args], cwd=tmp_path, env=_env(), capture_output=True)
    assert piped.returncode == 0 and label not in piped.stderr.decode() and BAR not in piped.stderr.decode()
    # --quiet: none on the terminal either.
    code, _, shown = _run_on_pty(["--db", db, *args, "--quiet"], cwd=str(tmp_path))
    assert code == 0 and label.encode() not in shown and BAR.encode() not in shown


def test_import_and_copy_show_their_bars(tmp_path):
    db = _ledger(tmp_path)
    subprocess.run([*executable(), "--db", db, "export", "--all", "-o", "all.jsonl"], cwd=tmp_path, env=_env(),
                   check=True, capture_output=True)
    code, _, shown = _run_on_pty(["--db", str(tmp_path / "new.db"), "import", "all.jsonl"], cwd=str(tmp_path))
    assert code == 0, shown
    _assert_bar(shown, "importing")
    code, _, shown = _run_on_pty(["copy", db, str(tmp_path / "copy.db")], cwd=str(tmp_path))
    assert code == 0, shown
    _assert_bar(shown, "copying")
    with Ledger(str(tmp_path / "copy.db")) as a, Ledger(str(tmp_path / "new.db")) as b:
        assert a.ledger_head() == b.ledger_head()


def test_an_export_to_stdout_keeps_stdout_the_data(tmp_path):
    """The bar goes to the terminal's stderr; stdout (a pipe here) holds the export alone."""
    db = _ledger(tmp_path)
    code, out, shown = _run_on_pty(["--db", db, "export", "--all"], cwd=str(tmp_path))
    assert code == 0
    _assert_bar(shown, "exporting")
    plain = subprocess.run([*executable(), "--db", db, "export", "--all"], env=_env(), capture_output=True,
                           check=True).stdout
    assert out == plain and out.count(b"\n") == 1500 + 4


def test_json_prints_no_bar(tmp_path):
    db = _ledger(tmp_path)
    code, out, shown = _run_on_pty(["--db", db, "verify", "--json"], cwd=str(tmp_path))
    assert code == 0 and b'"ok": true' in out
    assert b"verifying" not in shown and BAR.encode() not in shown


def test_a_small_job_shows_no_bar_by_default(tmp_path):
    db = _ledger(tmp_path, events=10)
    master, slave = pty.openpty()
    env = _env()
    del env["HANDOFF_PROGRESS_MIN"]
    proc = subprocess.run([*executable(), "--db", db, "export", "--all", "-o", "o.jsonl"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    os.set_blocking(master, False)
    try:
        shown = os.read(master, 65536)
    except (BlockingIOError, OSError):
        shown = b""
    os.close(master)
    assert proc.returncode == 0 and b"exporting" not in shown
