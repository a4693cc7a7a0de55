"""reducers/ stays pure: no I/O, no clock, no randomness; "now" is always an argument.

Two checks, and no module is exempt from either:

- the source check reads each module with ast, so it sees what the code says: ``import
  x``, ``from x import y``, dotted imports, ``__import__``/``importlib.import_module``
  with a literal name, and calls such as ``datetime.now()`` or ``time.time()``;
- the load check imports each module alone in a fresh interpreter and looks at what
  ended up in ``sys.modules``, so a harmless-looking import that drags in a database
  driver, the network, randomness or a layer above the reducers is caught too.
"""

from __future__ import annotations

import ast
import json
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
    "secrets", "uuid", "subprocess", "socket", "shutil", "tempfile", "hypothesis",
    # the layers' bare names: installed, they are a user's own packages, never ours
    "ledger", "reducers", "projections", "cli",
})
#: The project's own modules (installed under ``handoff``) a reducer may import: the event
#: types, the errors, the envelopes, the input checks, and the reducers themselves. Every other ``handoff.``
#: module (the storage backends, the views, the API facade, the kit, the CLI) is above them.
PROJECT_IMPORTABLE = ("handoff.ledger.events", "handoff.ledger.errors", "handoff.ledger.store", "handoff.ledger.inputs",
                      "handoff.reducers")
#: The namespace packages a ``from X import name`` may name, the names then judged alone.
NAMESPACES = ("handoff", "handoff.ledger")
#: Calls that read the clock, by the last two parts of their dotted name.
FORBIDDEN_CALLS = frozenset({
    "datetime.now", "datetime.utcnow", "datetime.today", "date.today",
    "time.time", "time.time_ns", "time.monotonic", "time.perf_counter",
})


def _forbidden(module: str, *, namespace_ok: bool = False) -> str | None:
    for bad in FORBIDDEN_MODULES:
        if module == bad or module.startswith(bad + "."):
            return bad
    if module == "handoff" or module.startswith("handoff."):
        if namespace_ok and module in NAMESPACES:
            return None
        if not any(module == ok or module.startswith(ok + ".") for ok in PROJECT_IMPORTABLE):
            return module
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
            if bad := _forbidden(node.module, namespace_ok=True):
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
    """Every module under reducers/, with no exception by name."""
    return sorted(REDUCERS.rglob("*.py"))


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
    assert pure_modules() == sorted(REDUCERS.rglob("*.py")), "no module of reducers/ may be left out"
    assert "EXCLUDED" not in globals(), "the purity test exempts nothing by name"


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
        "from handoff.ledger import sqlite",
        "from handoff import Ledger",
        "import handoff",
        "from handoff.projections import queries",
        "import handoff.facade as facade",
        "from ledger import events",
        "from datetime import datetime\nx = datetime.now()",
        "import datetime\nx = datetime.datetime.utcnow()",
        "from datetime import date\nx = date.today()",
        "import handoff.ledger.events as ev\nx = ev.time.time()",
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
        "from handoff.ledger import events as ev",
        "from handoff.ledger.store import Recorded",
        "from handoff.reducers import transitions as T",
        "from . import transitions as T",
        "import msgspec",
        "now = 5\nx = now",
        "import osmosis",
    ],
)
def test_the_checker_allows_pure_code(source: str) -> None:
    assert violations(source) == []


def test_the_library_does_not_need_hypothesis() -> None:
    """Only tests import the kit (handoff/testing); the library runs without hypothesis installed."""
    code = (
        "import sys\n"
        "import handoff, handoff.reducers.checkpoint, handoff.reducers.decide, handoff.reducers.stall\n"
        "import handoff.reducers.delivery, handoff.reducers.transitions, handoff.reducers.commands\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('hypothesis', 'pytest'))\n"
        "assert not leaked, leaked\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# --- what the reducers load, transitively ------------------------------------------------

#: Standard-library modules that no reducer may load, directly or through anything it
#: imports. ``time``, ``os`` and ``uuid`` cannot be on this list: the interpreter loads
#: ``time`` and ``os`` before any code runs, and msgspec (the event codec) loads ``uuid``
#: for its UUID type; the source check above forbids the reducers to use them. Likewise
#: typing_extensions loads the C module ``_socket`` (for a constant), so the list names
#: ``socket``, the module that opens connections.
LOADED_FORBIDDEN = frozenset({
    "sqlite3", "_sqlite3",                                    # a database driver
    "socket", "ssl", "select", "selectors", "http", "urllib.request",  # the network
    "subprocess", "multiprocessing", "signal",                # other processes
    "asyncio", "threading", "concurrent",                     # waiting, and so a clock
    "random", "_random", "secrets",                           # randomness
    "tempfile", "shutil", "glob",                             # files
})
#: The project's own modules a reducer may load: the namespace packages (whose
#: ``__init__`` loads only the errors), the event types, the errors, the envelopes
#: (``handoff.ledger.store`` holds the interface and the hash chain, not a backend) and the
#: input checks (``handoff.ledger.inputs``: pure functions of their values).
PROJECT_ALLOWED = frozenset({"handoff", "handoff.ledger", "handoff.ledger.errors", "handoff.ledger.events",
                             "handoff.ledger.inputs", "handoff.ledger.store"})
#: Installed (third-party) packages a reducer may load: the event codec and what it needs.
THIRD_PARTY_ALLOWED = frozenset({"msgspec", "typing_extensions"})

_PROBE = r"""
import json, sys, traceback

root, purelib, names = sys.argv[1], sys.argv[2], sys.argv[3:]
first_importer = {}


class Watch:
    # Remember, for every module, which project file was importing when it first loaded.
    def find_spec(self, name, path=None, target=None):
        if name not in first_importer:
            frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(root)]
            first_importer[name] = f"{frames[-1].filename[len(root) + 1:]}:{frames[-1].lineno}" if frames else "?"
        return None


sys.meta_path.insert(0, Watch())
import importlib
for name in names:
    importlib.import_module(name)
out = {}
for mod_name, mod in list(sys.modules.items()):
    where = getattr(mod, "__file__", None) or ""
    kind = "installed" if where.startswith(purelib) else "project" if where.startswith(root) else "stdlib"
    out[mod_name] = [kind, first_importer.get(mod_name, "at start-up")]
print(json.dumps(out))
"""


def loaded_by(modules: list[str], *, extra_path: Path | None = None) -> dict[str, tuple[str, str]]:
    """Import ``modules`` in a fresh interpreter started without site (``-S``), so that no
    ``.pth`` file loads anything first; returns every module then loaded, as name ->
    (project / installed / stdlib, the project file and line that first imported it)."""
    import sysconfig

    purelib = sysconfig.get_paths()["purelib"]  # this venv's: without site, the child cannot tell
    path = [str(ROOT), purelib]
    if extra_path is not None:
        path.insert(0, str(extra_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    root = str(extra_path if extra_path is not None else ROOT)
    proc = subprocess.run([sys.executable, "-S", "-c", _PROBE, root, purelib, *modules],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {k: tuple(v) for k, v in json.loads(proc.stdout).items()}


def load_violations(loaded: dict[str, tuple[str, str]], *,
                    own_prefixes: tuple[str, ...] = ("handoff.reducers",)) -> list[str]:
    """What in ``loaded`` a pure module must not load, each with the line that loaded it."""
    found: list[str] = []
    reported: set[str] = set()
    for name, (kind, by) in sorted(loaded.items()):
        top = name.split(".")[0]
        own = any(name == p or name.startswith(p + ".") for p in own_prefixes)
        if top in reported and not own and kind != "project":
            continue  # one line per package is enough
        before = len(found)
        if kind == "project" and not own and name not in PROJECT_ALLOWED:
            found.append(f"{name} (a project module above the event types), loaded from {by}")
        elif kind == "installed" and top not in THIRD_PARTY_ALLOWED:
            found.append(f"{name} (an installed package the reducers do not need), loaded from {by}")
        elif any(name == bad or name.startswith(bad + ".") for bad in LOADED_FORBIDDEN):
            found.append(f"{name} (I/O, processes, threads or randomness), loaded from {by}")
        if len(found) > before:
            reported.add(top)
    return found


def _module_name(path: Path) -> str:
    """reducers/decide.py -> handoff.reducers.decide, the name it is installed under."""
    return "handoff." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("path", pure_modules(), ids=lambda p: p.name)
def test_reducer_module_loads_nothing_impure(path: Path) -> None:
    found = load_violations(loaded_by([_module_name(path)]))
    assert not found, (
        f"importing {_module_name(path)} alone loads what a pure fold must not; import it lazily "
        "where it is needed, above the reducers, or move the code out of reducers/:\n  " + "\n  ".join(found)
    )


def test_the_load_check_sees_what_the_source_check_cannot(tmp_path: Path) -> None:
    """A module whose own imports look innocent but load a driver and the API facade."""
    pkg = tmp_path / "fakepure"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("import importlib\nstore = importlib.import_module('handoff.ledger.' + 'sqlite')\n")
    (pkg / "fold.py").write_text("from handoff.ledger import events\nfrom . import helper\n")
    assert violations((pkg / "fold.py").read_text()) == []
    found = load_violations(loaded_by(["fakepure.fold"], extra_path=tmp_path), own_prefixes=("fakepure",))
    assert any(f.startswith("sqlite3 ") for f in found), found
    assert any("fakepure/helper.py:2" in f for f in found), found


def test_the_load_check_allows_the_event_types() -> None:
    assert load_violations(loaded_by(["handoff.ledger.events", "handoff.ledger.store", "handoff.ledger.errors"])) == []


def test_the_kit_lives_outside_the_pure_package() -> None:
    """The property-testing kit drives a real ledger: it belongs above the reducers."""
    assert not (REDUCERS / "testing.py").exists() and not (REDUCERS / "testing").exists()
    assert (ROOT / "handoff" / "testing" / "__init__.py").exists()
