"""Feeding recorded payloads to the real hook process, as a harness does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.hooks.agents import env

FIXTURES = Path(__file__).parent / "fixtures"


def session(harness: str, cwd: Path, session_id: str = "s-0001", home: str = "/home/u") -> list[dict[str, Any]]:
    """The fixture session of ``harness`` with its placeholders filled in."""
    text = (FIXTURES / "sessions" / f"{harness}.json").read_text()
    text = text.replace("{cwd}", str(cwd)).replace("{session}", session_id).replace("{home}", home)
    return json.loads(text)


def run_hook(harness: str, db: Path, payload: Any, *extra: str, **env_extra: str) -> subprocess.CompletedProcess[bytes]:
    """One hook process, as the installed settings start it; its stdin is ``payload``."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return subprocess.run([sys.executable, "-m", "handoff.hooks", harness, "--db", str(db), *extra], input=data,
                          capture_output=True, env=env(**env_extra), timeout=60)
