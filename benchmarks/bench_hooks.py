"""Coding-agent hooks: what one hook process costs the agent, which pays it twice per tool call.

``hook-claude-code`` times ``python -m handoff.hooks claude-code`` (what ``handoff hooks
install`` puts in the settings) reading a PostToolUse payload of a Bash call, from spawn to
exit, against ``python -c pass`` in the same run. The subject interleaves the two (a hook,
then a bare interpreter, and so on), so a burst of load falls on both, and reports the
ratio of their p95s as ``p95_x_python``. Between two hooks, untimed, the journal is written
to the ledger (``replay.flush``) and the background replay the hook started is waited for,
so no process is timed while another one loads the ledger, as on an agent that thinks
between tool calls. Peers: the same payload
through the whole CLI (``python -m handoff.cli hook claude-code``, which imports click and
the command table first), and a PreToolUse with the deny switch (which writes the journal
and reads the lease before the agent may go on).

Bytecode caching is on, as on a user's machine (the children's cache is in the scratch
directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from .common import REPO, path_in
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "hooks"
_CLI = ("import sys\nfrom handoff.cli import main\nfrom handoff.hookcli import COMMANDS\n"
        "for c in COMMANDS:\n    main.commands.get(c.name) or main.add_command(c)\nsys.exit(main())\n")


def _env(ctx: Ctx) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(ctx.dir.parent / "pycache")
    for k in ("HANDOFF_RUN", "HANDOFF_LEASE", "HANDOFF_DB", "HANDOFF_WORKER"):
        env.pop(k, None)
    return env


def _payload(event: str, i: int, cwd: str) -> bytes:
    doc: dict[str, Any] = {"session_id": "bench-session", "transcript_path": "/dev/null", "cwd": cwd,
                           "permission_mode": "default", "hook_event_name": event, "tool_name": "Bash",
                           "tool_input": {"command": f"pytest -q tests/test_{i}.py", "description": "run a test"},
                           "tool_use_id": f"toolu_bench_{i:05d}"}
    if event == "PostToolUse":
        doc["tool_response"] = {"stdout": "1 passed", "stderr": "", "interrupted": False}
    return json.dumps(doc).encode()


def _prepare(ctx: Ctx, argv_of: Any, event: str, *, interleave: bool) -> Trial:
    from handoff.hooks.replay import flush

    db = path_in(ctx.dir, "ledger.db")
    env, cwd, n = _env(ctx), str(ctx.dir), ctx.params["n"]
    start = {"session_id": "bench-session", "cwd": cwd, "hook_event_name": "UserPromptSubmit", "prompt": "run tests"}
    for warm in (json.dumps(start).encode(), _payload("PreToolUse", 0, cwd), _payload("PostToolUse", 0, cwd)):
        subprocess.run(argv_of(db), input=warm, env=env, cwd=cwd, check=True, capture_output=True)
        flush(db, wait_s=60)

    def run() -> Measured:
        hooks, pythons = [], []
        for i in range(1, n + 1):
            t0 = time.perf_counter()
            proc = subprocess.run(argv_of(db), input=_payload(event, i, cwd), env=env, cwd=cwd, capture_output=True)
            hooks.append(time.perf_counter() - t0)
            if proc.returncode != 0 or proc.stdout:
                raise RuntimeError(f"the hook exited {proc.returncode} with {proc.stdout[:200]!r}: {proc.stderr[-400:]!r}")
            flush(db, wait_s=60)  # untimed: the journal written, and the background
            _wait_replays(db)  # replay the hook started gone, so it does not slow the next process
            if interleave:
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", "pass"], env=env, cwd=cwd, check=True)
                pythons.append(time.perf_counter() - t0)
        metrics = {}
        if pythons:
            metrics["p95_x_python"] = _p95(hooks) / _p95(pythons)
            metrics["python_p95_ms"] = _p95(pythons) * 1e3
        return Measured(seconds=sum(hooks), latencies=hooks, metrics=metrics)

    def check() -> None:
        from handoff.facade import Ledger

        with Ledger(db) as lg:
            [cp] = list(lg.runs(include_terminal=True))
            steps = sum(1 for r in lg.log(cp.run_id) if r.type in ("progress_recorded", "side_effect_started"))
        if steps < n:
            raise RuntimeError(f"{steps} steps recorded for {n} hooks")

    return Trial(run, check)


def _wait_replays(db: str, deadline_s: float = 60.0) -> None:
    """Wait until no replay process of ``db`` is left (read from /proc; elsewhere, nothing)."""
    if not os.path.isdir("/proc"):
        return
    mark = [b"--replay", db.encode()]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        alive = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if all(m in argv for m in mark):
                alive = True
                break
        if not alive:
            return
        time.sleep(0.005)


def _lean(ctx: Ctx) -> Trial:
    return _prepare(ctx, lambda db: [sys.executable, "-m", "handoff.hooks", "claude-code", "--db", db],
                    "PostToolUse", interleave=True)


def _whole_cli(ctx: Ctx) -> Trial:
    return _prepare(ctx, lambda db: [sys.executable, "-c", _CLI, "--db", db, "hook", "claude-code"],
                    "PostToolUse", interleave=False)


def _deny(ctx: Ctx) -> Trial:
    return _prepare(ctx, lambda db: [sys.executable, "-m", "handoff.hooks", "claude-code", "--db", db,
                                     "--deny-revoked"], "PreToolUse", interleave=False)


def _python(ctx: Ctx) -> Trial:
    env, cwd, n = _env(ctx), str(ctx.dir), ctx.params["n"]

    def run() -> Measured:
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=env, cwd=cwd, check=True)
            lat.append(time.perf_counter() - t0)
        return Measured(seconds=sum(lat), latencies=lat)

    return Trial(run)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]


_HOW = "one process per hook, timed from spawn to exit (subprocess.run), the payload on stdin"

register(
    Scenario(
        name="hook-claude-code",
        area=AREA,
        title="one Claude Code hook process (PostToolUse of a Bash call) vs python -c pass",
        measures=(
            "python -m handoff.hooks claude-code --db LEDGER with a PostToolUse payload on stdin, as Claude Code "
            "runs it after each tool call: start-up, read the payload, append it to the journal (one fsync), "
            "start the background replay, exit. Interleaved with python -c pass, whose p95 it is judged "
            "against (p95_x_python). Median and p95 of ~40 hooks."
        ),
        full={"n": 40},
        quick={"n": 3},
        subject=Side("handoff-ledger", _lean, note="python -m handoff.hooks claude-code (" + _HOW + ")"),
        reference=Side("python -c pass", _python, note=_HOW),
        peers=(
            Side("python -m handoff.cli hook", _whole_cli,
                 note="the same payload through the whole handoff command (click, the command table)"),
            Side("PreToolUse with --deny-revoked", _deny,
                 note="a PreToolUse that writes the journal to the ledger and reads the lease before answering"),
        ),
        goals=(Goal("p95 at most 2x python -c pass's p95, interleaved", metric="p95_x_python", max_value=2.0),),
        kind="latency",
        unit="hooks",
        repeat=1,
        warmup=1,
    )
)
