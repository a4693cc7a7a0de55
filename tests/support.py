"""Small helpers the test packages share (a clock moved by hand, a working run, the CLI in
this process and as a real one, real processes, ledger files of earlier versions).

One home for each: a helper that two test files need lives here, not in both.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from handoff import Ledger

#: The repository root: children run from it, with it on their import path, so a
#: ``python -c`` child imports the code under test as the tests do.
ROOT = str(Path(__file__).resolve().parent.parent)

#: A second in the ledger's unit of time, the microsecond.
S = 1_000_000
#: The tests' fixed epoch (µs): a history written twice from it is the same history.
T0 = 1_800_000_000 * S


class Clock:
    """The ledger's clock moved by hand, in µs: ``Ledger(path, clock=clock)``.

    Every reading is ``step_us`` later than the one before (a microsecond: readings are
    distinct, as a real clock's are); ``step_us=0`` holds time still until :meth:`advance`,
    for a test that asserts on the very timestamps it set.
    """

    def __init__(self, start: int = T0, step_us: int = 1) -> None:
        self.now, self.step_us = start, step_us

    def __call__(self) -> int:
        self.now += self.step_us
        return self.now

    def advance(self, seconds: float = 0, *, us: int = 0) -> int:
        """Move ``seconds`` (and ``us`` microseconds) ahead; return the new reading."""
        self.now += int(seconds * S) + us
        return self.now


def executable() -> list[str]:
    """The installed ``handoff`` next to this interpreter, else ``python -m handoff.cli``."""
    here = os.path.join(os.path.dirname(sys.executable), "handoff")
    if os.path.exists(here):
        return [here]
    found = shutil.which("handoff")
    return [found] if found else [sys.executable, "-m", "handoff.cli"]


def spawn(code: str, *args: object) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` from the repository root, its output captured."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """Wait for a :func:`spawn` child and return its stdout; a child that failed fails the
    test with both its streams, so the reason is in the report."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{out}\n{err}"
    return out


def file_from_dump(dump: str, path: str | os.PathLike[str]) -> str:
    """A ledger file at ``path`` restored from ``dump``, the SQL text of a file an earlier
    version wrote (tests/ledger/fixtures/), in WAL mode as that version left its files.
    Kept as SQL, not as a binary file, so the fixture can be read and diffed."""
    path = str(path)
    conn = sqlite3.connect(path)
    try:
        with open(dump, encoding="utf-8") as f:
            conn.executescript(f.read())
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
    return path


def make_runner() -> Any:
    """A CliRunner that keeps stderr apart from stdout, on every click version."""
    from click.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


class Handoff:
    """``h("status", run)`` invokes the CLI in-process against this test's ledger."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.runner = make_runner()

    def __call__(self, *args: Any, code: int | None = 0, env: dict[str, str] | None = None) -> Any:
        from handoff import cli

        # The test's own HANDOFF_* variables never leak in; ``env`` sets the ones a test wants.
        full_env = {"HANDOFF_DB": "", "HANDOFF_RUN": "", "HANDOFF_LEASE": "", "HANDOFF_WORKER": "",
                    **(env or {})}
        result = self.runner.invoke(cli.main, ["--db", self.db, *map(str, args)], env=_clean(full_env),
                                    catch_exceptions=False)
        if code is not None:
            assert result.exit_code == code, (
                f"exit {result.exit_code} != {code}\nstdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def json(self, *args: Any, code: int | None = 0, **kw: Any) -> Any:
        result = self(*args, "--json", code=code, **kw)
        return json.loads(result.stdout)

    def ledger(self) -> Ledger:
        from handoff import Ledger

        return Ledger(self.db)


def _clean(env: dict[str, str]) -> dict[str, str | None]:
    # CliRunner treats None as "unset"; empty strings from the defaults mean unset too.
    return {k: (v if v else None) for k, v in env.items()}


def run_exe(*args: str, db: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """The installed ``handoff ARGS`` on ``db``, with none of this test run's HANDOFF_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["HANDOFF_DB"] = db
    return subprocess.run([*executable(), *args], env=env, capture_output=True, text=True, timeout=timeout, **kw)


def invoke(*args: str, **kw: Any) -> Any:
    """``handoff ARGS`` in this process with click's defaults: stdout and stderr together in
    ``.output``, an exception turned into an exit code, the environment as it is; ``kw`` are
    ``CliRunner.invoke``'s (``input=``, ``env=``). (:class:`Handoff` is the strict runner bound
    to one ledger.)"""
    from click.testing import CliRunner

    from handoff import cli

    return CliRunner().invoke(cli.main, list(args), **kw)


def working_run(lg: Ledger, run_id: str = "r1", *, owner: str = "alice", state: str = "executing",
                goal: str = "Write the report", target: str = "chat:#ops", worker: str = "w1",
                **policy: Any) -> str:
    """A working run: open ``run_id``, claim it as ``worker`` and move it to ``state``
    (planning, executing or verifying); return the lease token."""
    lg.open(run_id=run_id, goal=goal, target=target, owner=owner, **policy)
    lease = lg.claim(run_id, worker)
    path = ["planning", "executing", "verifying"]
    for s in path[: path.index(state) + 1] if state in path else []:
        lg.transition(run_id, lease, s, worker=worker)
    return lease
