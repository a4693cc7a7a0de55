"""The PostgreSQL tests' own set-up: an unreachable server fails a CI run, never skips it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = "tests/ledger/test_store_conformance.py::TestStoreConformance::test_new_store_is_empty[postgres]"


def run_without_a_server(ci: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CI": ci, "HANDOFF_TEST_PG": "postgresql://postgres@127.0.0.1:1/postgres"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TARGET],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci, code, word", [("true", 1, "1 failed"), ("", 0, "1 skipped")])
def test_an_unreachable_server_fails_under_ci_and_skips_with_a_reason_elsewhere(ci, code, word):
    out = run_without_a_server(ci)
    assert out.returncode == code, out.stdout + out.stderr
    assert word in out.stdout
    assert "127.0.0.1:1" in out.stdout and "unreachable" in out.stdout
