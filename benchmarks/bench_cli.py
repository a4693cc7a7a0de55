"""CLI scenarios: what a shell agent pays per event for ``handoff progress`` as a whole
process, against the start-up of ``python3 -c 'import sqlite3'`` measured in the same run.

(This module is not called ``cli.py``: that would shadow the top-level ``cli`` module,
which is the ``handoff`` command itself.)

Each operation is one process, started with ``subprocess.run`` and timed from spawn to
exit: interpreter start-up, imports, opening the ledger, the durable command (one fsync)
and printing. Both sides use the same interpreter (the one running the harness), so the
``handoff`` console script of this environment is used when it exists, else
``python -c 'from cli import main; main()'``.

Bytecode caching is on, as on a user's machine: the children run without
``PYTHONDONTWRITEBYTECODE`` and with ``PYTHONPYCACHEPREFIX`` in the scratch directory (so
nothing is written into the repository), and the first process of a run fills the cache.
A third row shows the same command with caching off, which is what an environment that
sets ``PYTHONDONTWRITEBYTECODE=1`` pays: every module of the repository compiled from
source in every process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import REPO, path_in
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "cli"


def handoff_argv() -> list[str]:
    script = Path(sys.executable).with_name("handoff")
    if script.exists():
        return [str(script)]
    found = shutil.which("handoff")
    if found and Path(found).resolve().parent == Path(sys.executable).resolve().parent:
        return [found]
    return [sys.executable, "-c", "import sys; from handoff.cli import main; sys.exit(main())"]


def _env(ctx: Ctx, db: str | None = None, *, bytecode: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(ctx.dir.parent / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    if db is not None:
        env["HANDOFF_DB"] = db
        env["HANDOFF_WORKER"] = "w1"
    return env


def _time_processes(n: int, argv_of: Any, env: dict[str, str], cwd: str) -> Measured:
    lat = []
    for i in range(n):
        argv = argv_of(i)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        lat.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-400:]}")
    return Measured(seconds=sum(lat), latencies=lat)


def _python_startup(ctx: Ctx) -> Trial:
    argv = [sys.executable, "-c", "import sqlite3"]
    return Trial(lambda: _time_processes(ctx.params["n"], lambda _i: argv, _env(ctx), str(ctx.dir)))


def _progress_process(ctx: Ctx, bytecode: bool = True) -> Trial:
    from handoff.facade import Ledger

    from .bench_commands import working_run

    db = path_in(ctx.dir, "ledger.db")
    with Ledger(db) as lg:
        lease = working_run(lg, "run-cli")
        base = lg.checkpoint("run-cli").progress_seq
    head = handoff_argv()
    n = ctx.params["n"]

    def argv(i: int) -> list[str]:
        return head + ["progress", "run-cli", "--lease", str(lease), "--kind", "tool_outcome",
                       "--detail", f"step {i}: ran the test suite", "--key", f"step-{i}"]

    def check() -> None:
        with Ledger(db) as lg:
            got = lg.checkpoint("run-cli").progress_seq
        if got != base + n:
            raise RuntimeError(f"progress_seq is {got}, expected {base + n}")

    env = _env(ctx, db, bytecode=bytecode)
    return Trial(lambda: _time_processes(n, argv, env, str(ctx.dir)), check)


def _progress_cold(ctx: Ctx) -> Trial:
    return _progress_process(ctx, bytecode=False)


def _help_process(ctx: Ctx) -> Trial:
    argv = handoff_argv() + ["--help"]
    return Trial(lambda: _time_processes(ctx.params["n"], lambda _i: argv, _env(ctx), str(ctx.dir)))


_HOW = "one process per operation, timed from spawn to exit (subprocess.run)"

register(
    Scenario(
        name="cli-progress",
        area=AREA,
        title="`handoff progress` as a whole process vs python3 -c 'import sqlite3'",
        measures=(
            "handoff progress RUN --lease L --kind tool_outcome --detail ... --key k, run as "
            "its own process (the console script of this environment, HANDOFF_DB and "
            "HANDOFF_WORKER set as inside 'handoff run'): start-up, imports, open the ledger, "
            "one durable command (synchronous=FULL), print one line. Reference: the same "
            "interpreter running python3 -c 'import sqlite3'. Median and p95 of ~20 runs."
        ),
        full={"n": 20},
        quick={"n": 3},
        subject=Side("handoff-ledger", _progress_process, note="handoff progress ... (" + _HOW + ")"),
        reference=Side("python3 -c 'import sqlite3'", _python_startup, note=_HOW),
        peers=(
            Side("handoff progress, no .pyc cache", _progress_cold,
                 note="the same command with PYTHONDONTWRITEBYTECODE=1: every repository module "
                      "compiled from source in every process"),
        ),
        goals=(Goal("at most 4x python3 -c 'import sqlite3' (>= 0.25x)", min_ratio=0.25),),
        kind="latency",
        unit="processes",
        repeat=1,
        warmup=1,
    )
)

register(
    Scenario(
        name="cli-help",
        area=AREA,
        title="`handoff --help` as a whole process vs python3 -c 'import sqlite3'",
        measures=(
            "handoff --help as its own process (click builds the whole command group and "
            "renders the help). Reference: python3 -c 'import sqlite3'. Median and p95 of "
            "~20 runs. No goal of its own; it shows the floor of any handoff command."
        ),
        full={"n": 20},
        quick={"n": 3},
        subject=Side("handoff-ledger", _help_process, note="handoff --help (" + _HOW + ")"),
        reference=Side("python3 -c 'import sqlite3'", _python_startup, note=_HOW),
        kind="latency",
        unit="processes",
        repeat=1,
        warmup=1,
    )
)
