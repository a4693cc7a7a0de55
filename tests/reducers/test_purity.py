"""reducers/ stays pure: no I/O, no clock, no randomness; "now" is always an argument.

The check reads each module's source with ast, so it sees what the code says rather than
what happens to be imported at test time: ``import x``, ``from x import y``, dotted
imports, ``__import__``/``importlib.import_module`` with a literal name, and calls such
as ``datetime.now()`` or ``time.time()`` however the name was bound.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDUCERS = ROOT / "reducers"

#: Modules whose import alone means I/O, a clock, randomness or the CLI.
FORBIDDEN_MODULES = frozenset({
    "sqlite3", "sqlite_utils", "time", "random", "os", "click",
    # the same in other clothes
    "secrets", "uuid", "subprocess", "socket", "shutil", "tempfile",
    # layers above the reducers: the SQLite store and the API facade do I/O
    "ledger.sqlite", "handoff", "cli",
})
#: Calls that read the clock, by the last two parts of their dotted name.
FORBIDDEN_CALLS = frozenset({
    "datetime.now", "datetime.utcnow", "datetime.today", "date.today",
    "time.time", "time.time_ns", "time.monotonic", "time.perf_counter",
})
#: reducers/testing.py drives a real SQLite file and writes artifact files on purpose:
#: it is the property-testing harness, imported only by tests, never by the library.
EXCLUDED = {"testing.py"}


def _forbidden(module: str) -> str | None:
    for bad in FORBIDDEN_MODULES:
        if module == bad or module.startswith(bad + "."):
            return bad
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):  # e.g. datetime.datetime.now().now(): judge the inner call too
        inner = _dotted(node.func)
        return None if inner is None else inner + "()." + ".".join(reversed(parts))
    return None


def violations(source: str, filename: str = "<source>") -> list[str]:
    """Every impure import or clock call in ``source``, as 'line: what' strings."""
    tree = ast.parse(source, filename)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if bad := _forbidden(alias.name):
                    found.append(f"{node.lineno}: import {alias.name} ({bad})")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if bad := _forbidden(node.module):
                found.append(f"{node.lineno}: from {node.module} import ... ({bad})")
            for alias in node.names:
                if bad := _forbidden(f"{node.module}.{alias.name}"):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name} ({bad})")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func) or ""
            tail = ".".join(name.split(".")[-2:])
            if tail in FORBIDDEN_CALLS:
                found.append(f"{node.lineno}: calls {name}()")
            if name in ("__import__", "importlib.import_module") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _forbidden(arg.value):
                    found.append(f"{node.lineno}: {name}({arg.value!r})")
    return found


def pure_modules() -> list[Path]:
    return sorted(p for p in REDUCERS.glob("*.py") if p.name not in EXCLUDED)


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: p.name)
def test_reducer_module_is_pure(path: Path) -> None:
    found = violations(path.read_text(encoding="utf-8"), str(path))
    assert not found, (
        f"reducers/{path.name} must not do I/O, read the clock or draw randomness; pass "
        "'now' and other outside facts in as arguments instead:\n  " + "\n  ".join(found)
    )


def test_every_reducer_module_is_checked() -> None:
    names = {p.name for p in REDUCERS.glob("*.py")}
    assert {"transitions.py", "decide.py", "checkpoint.py", "stall.py", "delivery.py", "commands.py"} <= names
    assert EXCLUDED <= names, "an exclusion names a module that no longer exists: remove it"
    assert len(pure_modules()) == len(names) - len(EXCLUDED)


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: p.name)
def test_pure_modules_do_not_import_the_testing_harness(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = ("." * node.level) + (node.module or "")
            names = {a.name for a in node.names}
            assert mod not in (".testing", "reducers.testing") and not (mod in (".", "reducers") and "testing" in names), (
                f"reducers/{path.name} imports the testing harness, which does I/O"
            )
        if isinstance(node, ast.Import):
            assert all(a.name != "reducers.testing" for a in node.names)


@pytest.mark.parametrize(
    "source",
    [
        "import os",
        "import os.path",
        "import sqlite3 as db",
        "from time import monotonic",
        "from sqlite_utils.db import Database",
        "import random",
        "from click import echo",
        "from ledger import sqlite",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "from datetime import date\nx = date.today()",
        "import ledger\nx = ledger.time.time()",
        "m = __import__('os')",
        "import importlib\nm = importlib.import_module('sqlite3')",
    ],
)
def test_the_checker_catches_impure_code(source: str) -> None:
    assert violations(source), f"the purity check missed: {source!r}"


@pytest.mark.parametrize(
    "source",
    [
        "from datetime import datetime, timezone\nx = datetime.fromtimestamp(0, tz=timezone.utc)",
        "from ledger import events as ev",
        "from ledger.store import Recorded",
        "from . import transitions as T",
        "import msgspec",
        "now = 5\nx = now",
        "import osmosis",
    ],
)
def test_the_checker_allows_pure_code(source: str) -> None:
    assert violations(source) == []


def test_the_library_does_not_need_hypothesis() -> None:
    """Only tests import reducers/testing.py; the library runs without hypothesis installed."""
    code = (
        "import sys\n"
        "import handoff, reducers.checkpoint, reducers.decide, reducers.stall, reducers.delivery\n"
        "import reducers.transitions, reducers.commands\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('hypothesis', 'pytest'))\n"
        "assert not leaked, leaked\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
