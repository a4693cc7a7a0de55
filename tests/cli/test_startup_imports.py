"""What a command process loads: a shell agent pays every import on every event.

``handoff progress`` must not load pydantic (only a contract file needs it), the
integrations' frameworks (OpenTelemetry, pydantic-ai, the OpenAI Agents SDK: only the
command or program that uses one loads it) nor
typing_extensions (msgspec imports it when installed; cli.py loads msgspec without it,
see ``_load_msgspec``), and a command that reads a contract file must still get both,
working, in the same process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from handoff import Ledger

ROOT = Path(__file__).resolve().parent.parent.parent

PROBE = (
    "import atexit, json, sys\n"
    "def report():\n"
    "    import msgspec._utils as u, typing\n"
    "    watched = ('pydantic', 'typing_extensions', 'opentelemetry', 'pydantic_ai', 'agents')\n"
    "    sys.stderr.write('PROBE ' + json.dumps({'loaded': sorted(m for m in watched "
    "if m in sys.modules), 'mcp': sorted(m for m in ('mcp', 'anyio', 'starlette', 'uvicorn') if m in sys.modules), 'hints_from_typing': u._get_type_hints is typing.get_type_hints}) + '\\n')\n"
    "atexit.register(report)\n"
    "sys.argv = ['handoff', *sys.argv[1:]]\n"
    "from handoff.cli import main\n"
    "main()\n"
)


def _run(db: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = dict(os.environ, HANDOFF_DB=db, HANDOFF_WORKER="w1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60)
    line = next(x for x in proc.stderr.splitlines() if x.startswith("PROBE "))
    return proc, json.loads(line[len("PROBE "):])


def test_progress_loads_neither_pydantic_nor_typing_extensions(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#x", owner="o", run_id="r1")
        token = lg.claim(run, "w1")
        lg.transition(run, token, "planning")
    proc, probe = _run(db, "progress", "r1", "--lease", str(token), "--kind", "plan_committed")
    assert proc.returncode == 0, proc.stderr
    assert "plan_committed recorded" in proc.stdout
    assert probe == {"loaded": [], "mcp": [], "hints_from_typing": True}


def test_a_contract_file_still_loads_pydantic_and_typing_extensions(tmp_path):
    db = str(tmp_path / "l.db")
    contract = tmp_path / "contract.json"
    contract.write_text(json.dumps({"goal": "Write it", "target": "chat:#ops", "owner": "alice", "run_id": "c1"}))
    proc, probe = _run(db, "open", "--contract", str(contract))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "c1"
    assert probe["loaded"] == ["pydantic", "typing_extensions"]
    assert probe["mcp"] == []
    with Ledger(db, readonly=True) as lg:
        assert lg.status("c1")["goal"] == "Write it"


def test_the_mcp_command_is_on_the_list_without_loading_the_sdk(tmp_path):
    """``handoff mcp`` imports its server (and the SDK) only when it runs."""
    proc, probe = _run(str(tmp_path / "l.db"), "mcp", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--token-file" in proc.stdout
    assert probe["mcp"] == []


def test_the_otel_command_loads_opentelemetry_only_when_it_runs(tmp_path):
    db = str(tmp_path / "l.db")
    Ledger(db).close()
    proc, probe = _run(db, "otel", "--help")
    assert proc.returncode == 0, proc.stderr
    assert probe["loaded"] == []
