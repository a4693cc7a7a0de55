"""Helpers for the CLI tests: a CliRunner bound to a fresh ledger, and the real executable."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from click.testing import CliRunner

from handoff import cli
from handoff import Ledger
from tests.support import executable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_runner() -> CliRunner:
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
        return Ledger(self.db)


def _clean(env: dict[str, str]) -> dict[str, str | None]:
    # CliRunner treats None as "unset"; empty strings from the defaults mean unset too.
    return {k: (v if v else None) for k, v in env.items()}


@pytest.fixture
def h(tmp_path) -> Handoff:
    return Handoff(str(tmp_path / "ledger.db"))


def run_exe(*args: str, db: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["HANDOFF_DB"] = db
    return subprocess.run([*executable(), *args], env=env, capture_output=True, text=True, timeout=timeout, **kw)
