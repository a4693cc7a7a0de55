"""The real coding-agent CLIs for the hook tests, found where CI installs them.

``.ci/run`` installs them with ``npm install --prefix ~/.cache/handoff-agent-clis
@anthropic-ai/claude-code @openai/codex``; ``HANDOFF_TEST_CLAUDE`` / ``HANDOFF_TEST_CODEX``
name other binaries. A missing CLI skips its tests on a developer's machine and fails them
under ``CI=true``: a CI run that did not exercise the real thing must not pass.

``handoff(...)`` runs the ``handoff`` command as a child process with the hook commands
registered (the same commands whether or not cli.py lists them yet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CACHE = Path(os.environ.get("HANDOFF_AGENT_CLIS", Path.home() / ".cache" / "handoff-agent-clis"))
ROOT = Path(__file__).resolve().parents[2]

_HANDOFF = ("import sys\nfrom handoff.cli import main\nfrom handoff.hookcli import COMMANDS\n"
            "for c in COMMANDS:\n    main.commands.get(c.name) or main.add_command(c)\nsys.exit(main())\n")


def find_cli(name: str, env_var: str) -> str:
    """The CLI's path, or skip (fail under CI=true) saying how to install it."""
    given = os.environ.get(env_var)
    for candidate in (given, CACHE / "node_modules" / ".bin" / name):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    how = (f"the real {name} CLI is not installed: npm install --prefix {CACHE} "
           f"{'@anthropic-ai/claude-code' if name == 'claude' else '@openai/codex'} (or set {env_var})")
    if os.environ.get("CI") == "true":
        pytest.fail(how)
    pytest.skip(how)
    raise AssertionError  # unreachable


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), out.get("PYTHONPATH")]))
    for k in ("HANDOFF_RUN", "HANDOFF_LEASE", "HANDOFF_WORKER", "HANDOFF_DB"):
        out.pop(k, None)
    out.update(extra)
    return out


def handoff(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-c", _HANDOFF, *args], capture_output=True, text=True,
                          env=kw.pop("env", None) or env(), timeout=kw.pop("timeout", 120), **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"handoff {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def claude_env(home: Path, model_url: str) -> dict[str, str]:
    """Claude Code offline: its home in the test's directory, its API the scripted model."""
    home.mkdir(parents=True, exist_ok=True)
    return env(HOME=str(home), ANTHROPIC_BASE_URL=model_url, ANTHROPIC_API_KEY="sk-ant-test-key",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
               IS_SANDBOX="1", TERM="xterm-256color")


def trust_interactive(home: Path, project: Path) -> None:
    """What a person answers once in Claude Code's first interactive run (onboarding done,
    the test key approved, the project folder trusted), written as Claude Code keeps it."""
    cfg = home / ".claude.json"
    doc = json.loads(cfg.read_text()) if cfg.exists() else {}
    doc["hasCompletedOnboarding"] = True
    doc["customApiKeyResponses"] = {"approved": ["sk-ant-test-key"[-20:]], "rejected": []}
    doc.setdefault("projects", {}).setdefault(str(project), {})["hasTrustDialogAccepted"] = True
    cfg.write_text(json.dumps(doc))
