"""The layers import downward only: ledger <- reducers <- projections <- handoff <- cli.

They are installed under one name (``handoff.ledger``, ``handoff.reducers``,
``handoff.projections``, ``handoff`` itself, ``handoff.cli``); a module is judged by the
name it is installed under. Every module of the library is parsed and every import it makes is read, wherever it
sits (module level, inside a function, under ``TYPE_CHECKING``, or as a literal
``importlib.import_module("...")`` / ``__import__("...")``), relative ones resolved. An
import from a lower layer into a higher one fails the test, naming the file and line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Lower first: a module may import its own layer and those before it, never one after.
LAYERS = ("ledger", "reducers", "projections", "handoff", "cli")
RANK = {name: i for i, name in enumerate(LAYERS)}

#: Where each layer of the repository is installed (pyproject.toml's package-dir).
INSTALLED = {"ledger": "handoff.ledger", "reducers": "handoff.reducers",
             "projections": "handoff.projections", "cli": "handoff.cli"}


def module_name(path: Path) -> str:
    """The name ``path`` is imported by once installed (ledger/store.py: handoff.ledger.store)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in INSTALLED:
        parts = [*INSTALLED[parts[0]].split("."), *parts[1:]]
    return ".".join(parts)


def library_modules() -> list[Path]:
    out = [ROOT / "cli.py"]
    for layer in LAYERS[:-1]:
        out += sorted(p for p in (ROOT / layer).rglob("*.py") if not p.is_symlink())  # handoff/cli.py is cli.py
    return out


def _import_statements(tree: ast.AST, package: str, skip: set[ast.AST] | None = None
                       ) -> Iterator[tuple[int, str, list[str] | None]]:
    """(line, module named, the names taken from it or None) for every import in ``tree``
    outside ``skip``: ``import``, ``from ... import`` (relative ones resolved against
    ``package``) and ``import_module`` / ``__import__`` of a literal name."""
    for node in ast.walk(tree):
        if skip and node in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target, [alias.name for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _is_dynamic_import(node.func)):
            yield node.lineno, node.args[0].value, None


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source``, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for line, target, names in _import_statements(ast.parse(source), package):
        out.append((line, target))
        # ``from . import x`` / ``from pkg import sub`` may name submodules: count them too.
        out += [(line, f"{target}.{name}" if target else name) for name in names or () if name != "*"]
    return out


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def layer_of(module: str) -> str | None:
    for layer, name in INSTALLED.items():
        if module == name or module.startswith(name + "."):
            return layer
    if module == "handoff" or module.startswith("handoff."):
        return "handoff"
    return None


def upward(path: Path) -> list[tuple[str, int, str]]:
    """(imported layer, line, imported module) for each import ``path`` makes upward."""
    module = module_name(path)
    mine = layer_of(module)
    assert mine is not None, path
    found = []
    for line, target in imports_of(path.read_text(), module, path.name == "__init__.py"):
        theirs = layer_of(target)
        if theirs is not None and RANK[theirs] > RANK[mine]:
            found.append((theirs, line, target))
    return found


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_go_downward(path):
    """Every upward import fails here: there are no exceptions."""
    rel = path.relative_to(ROOT).as_posix()
    bad = [f"{rel}:{line} imports {target} ({layer} is above {layer_of(module_name(path))})"
           for layer, line, target in upward(path)]
    assert bad == []


def test_the_parser_sees_every_form_of_import():
    src = (
        "import handoff.facade\n"
        "from handoff.projections import engine\n"
        "from .. import cli\n"
        "def later():\n"
        "    from handoff.demo import run\n"
        "    import importlib\n"
        "    importlib.import_module('handoff.projections.queries')\n"
        "    __import__('handoff.cli')\n"
        "if TYPE_CHECKING:\n"
        "    from handoff.reducers.checkpoint import Checkpoint\n"
    )
    got = {target for _, target in imports_of(src, "handoff.ledger.x")}
    assert {"handoff.facade", "handoff.projections", "handoff.projections.engine", "handoff.demo",
            "handoff.projections.queries", "handoff.cli", "handoff.reducers.checkpoint"} <= got
    assert {layer_of(t) for t in got} - {None} == {"handoff", "projections", "cli", "reducers"}
    # ``from .. import x`` climbs one package per extra dot.
    assert {t for _, t in imports_of("from .. import cli\n", "handoff.ledger.x")} == {"handoff", "handoff.cli"}
    # Relative imports resolve inside their package: ledger's own modules are not upward.
    assert {t for _, t in imports_of("from .store import Actor\n", "handoff.ledger.sqlite")} == {
        "handoff.ledger.store", "handoff.ledger.store.Actor"}
    assert {t for _, t in imports_of("from . import events\n", "handoff.ledger", is_package=True)} == {
        "handoff.ledger", "handoff.ledger.events"}
    assert module_name(ROOT / "cli.py") == "handoff.cli"
    assert module_name(ROOT / "ledger" / "__init__.py") == "handoff.ledger"


def test_nothing_imports_the_layers_by_their_bare_names():
    """A bare ``import ledger`` would find a user's own package of that name (the reason
    for one installed namespace): the library, its tests and benchmarks never write one."""
    bare = re.compile(r"^\s*(?:from|import)\s+(ledger|reducers|projections|cli)\b", re.M)
    found = []
    for path in [*library_modules(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py")),
                 *sorted((ROOT / "docs").rglob("*.py"))]:
        if path.is_symlink():
            continue
        for m in bare.finditer(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{path.read_text()[:m.start()].count(chr(10)) + 1}: {m.group(0).strip()}")
    assert found == []


def test_no_import_anywhere_names_a_layer_outside_handoff():
    """The same as parsed code sees it: ``import os, ledger``, an import inside a function
    or an ``importlib.import_module("reducers.x")`` would load a second copy of a module
    under its bare name when the repository root is on sys.path."""
    found = []
    library = set(library_modules())
    for path in [*library, *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py")),
                 *sorted((ROOT / "docs").rglob("*.py"))]:
        if path.is_symlink():
            continue
        rel = path.relative_to(ROOT)
        module = module_name(path) if path in library else ".".join(rel.with_suffix("").parts)
        found += [f"{rel}:{line}: {target}" for line, target in imports_of(path.read_text(), module, path.name == "__init__.py")
                  if target.split(".")[0] in ("ledger", "reducers", "projections", "cli")]
    assert found == []


# --- no import cycle, lazy imports included (issue 40) -------------------------------------


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:``: read by a type checker, never run."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out |= {n for stmt in node.body for n in ast.walk(stmt)}
    return out


def module_imports(source: str, module: str, is_package: bool, known: set[str]) -> dict[str, int]:
    """The modules of ``known`` that ``source`` imports when it runs, each with its first
    line: module level and inside functions alike, ``import_module`` / ``__import__`` of a
    literal name, relative imports resolved. ``from pkg import name`` is an import of
    ``pkg.name`` when that is a module, else of ``pkg``; a parent package loaded on the way
    is not counted (Python loads it before the module, whatever the module imports)."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    named: list[tuple[int, str]] = []
    for line, target, names in _import_statements(tree, package, _type_checking_only(tree)):
        if names is None:
            named.append((line, target))
        else:
            named += [(line, f"{target}.{name}" if f"{target}.{name}" in known else target) for name in names]
    out: dict[str, int] = {}
    for line, name in sorted(named):
        while name and name not in known:  # handoff.ledger.store.Actor: the module handoff.ledger.store
            name = name.rpartition(".")[0]
        if name and name != module:
            out.setdefault(name, line)
    return out


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, for ``sources`` (module -> (text, is_package))."""
    known = set(sources)
    return {m: module_imports(text, m, pkg, known) for m, (text, pkg) in sources.items()}


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) for each import that closes one, in a depth-first walk."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, {})):
            if state.get(n) == 1:
                cycles.append([*path[path.index(n):], n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def _library_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in library_modules()}


def test_no_import_cycle_lazy_imports_included():
    """Every import that runs (at module level or inside a function: a lazy import is
    still an edge) is read from the source of every module under handoff/, ledger/,
    reducers/, projections/ and cli.py; the graph they make has no cycle. A failure prints
    each cycle with the file and line of every import in it. Imports under
    ``if TYPE_CHECKING:`` never run and are not edges here (the layer test above reads
    them)."""
    graph = import_graph(_library_sources())
    paths = {module_name(p): p.relative_to(ROOT).as_posix() for p in library_modules()}
    shown = [" -> ".join(f"{a} ({paths[a]}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"
             for cycle in import_cycles(graph)]
    assert shown == [], "\n".join(shown)


def test_the_cycle_check_would_catch_what_it_looks_for():
    sources = {
        "handoff.ledger": ("from . import store\n", True),
        "handoff.ledger.store": ("from .errors import X\nfrom . import file_copies\n", False),
        "handoff.ledger.errors": ("X = 1\n", False),
        "handoff.ledger.file_copies": ("def f():\n    from .backends import open_store\n", False),
        "handoff.ledger.backends": ("def g():\n    import importlib\n"
                                    "    importlib.import_module('handoff.ledger.store')\n", False),
        "handoff.ledger.typed": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from .store import S\n", False),
    }
    graph = import_graph(sources)
    assert graph["handoff.ledger.store"] == {"handoff.ledger.errors": 1, "handoff.ledger.file_copies": 2}
    assert graph["handoff.ledger.typed"] == {}  # never run
    assert graph["handoff.ledger"] == {"handoff.ledger.store": 1}  # a package's own name is no edge
    assert import_cycles(graph) == [["handoff.ledger.store", "handoff.ledger.file_copies", "handoff.ledger.backends",
                                     "handoff.ledger.store"]]
    sources["handoff.ledger.backends"] = ("def g():\n    import importlib\n", False)
    assert import_cycles(import_graph(sources)) == []


# --- the backends are reached through the interface only (issue 26) ------------------------

#: The backend packages: what they hold is theirs; above ledger/ and in the core, a
#: backend is an ``EventStore`` with a ``Capabilities`` record, never a name to test.
BACKEND_PACKAGES = ("handoff.ledger.sqlite", "handoff.ledger.postgres")
ABOVE_LEDGER = [p for p in library_modules() if layer_of(module_name(p)) != "ledger"]
BACKEND_TEST = re.compile(r"""\bbackend\s*[!=]=|[!=]=\s*["'](?:sqlite|postgresql)["']""")
STORE_GETATTR = re.compile(r"getattr\(\s*[\w.]*store\b")


def _in_backend(module: str) -> str | None:
    return next((b for b in BACKEND_PACKAGES if module == b or module.startswith(b + ".")), None)


def private_backend_imports(path: Path) -> list[str]:
    """``from <backend package>... import _name`` (or a module path with a private part)
    made by a module outside that backend's package."""
    module = module_name(path)
    mine = _in_backend(module)
    found = []
    for line, target in imports_of(path.read_text(), module, path.name == "__init__.py"):
        theirs = _in_backend(target)
        if theirs is not None and theirs != mine and any(part.startswith("_") and part != "__init__"
                                                         for part in target.split(".")):
            found.append(f"{path.relative_to(ROOT).as_posix()}:{line} imports {target}")
    return found


@pytest.mark.parametrize("path", library_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_module_imports_a_backends_private_names(path):
    assert private_backend_imports(path) == []


def test_no_backend_name_is_tested_above_ledger():
    """``facade.py`` branched on ``backend != "sqlite"`` and ``cli.py``'s ``roles`` on
    ``!= "postgresql"``: both ask ``Capabilities`` now (``capabilities_of`` for an
    address, ``store.capabilities`` for an open store)."""
    found = [f"{p.relative_to(ROOT).as_posix()}:{n}: {line.strip()}"
             for p in ABOVE_LEDGER for n, line in enumerate(p.read_text().splitlines(), 1)
             if BACKEND_TEST.search(line)]
    assert found == []


def test_no_store_attribute_is_read_with_getattr_above_ledger():
    """``facade.py`` read ``clock`` and ``enable_group_commit`` with ``getattr``: the ABC
    declares both now, and ``capabilities.own_clock`` says whose clock counts."""
    found = [f"{p.relative_to(ROOT).as_posix()}:{n}: {line.strip()}"
             for p in ABOVE_LEDGER for n, line in enumerate(p.read_text().splitlines(), 1)
             if STORE_GETATTR.search(line)]
    assert found == []


def test_no_backend_imports_the_other():
    for path in library_modules():
        module = module_name(path)
        mine = _in_backend(module)
        if mine is None:
            continue
        others = [t for _, t in imports_of(path.read_text(), module, path.name == "__init__.py")
                  if (b := _in_backend(t)) is not None and b != mine]
        assert others == [], f"{path.relative_to(ROOT).as_posix()} imports {others}"


def test_the_leak_checks_would_catch_what_they_look_for():
    assert BACKEND_TEST.search('if address.backend != "sqlite":')
    assert BACKEND_TEST.search("if parse(st.db).backend == 'postgresql':")
    assert not BACKEND_TEST.search("if lg.store.capabilities.is_file:")
    assert STORE_GETATTR.search('enable = getattr(self.store, "enable_group_commit", None)')
    assert STORE_GETATTR.search('getattr(store, "clock", None)')
    src = "from handoff.ledger.postgres import roles_sql\nfrom handoff.ledger.postgres.postgres_store import _send\n"
    got = [t for _, t in imports_of(src, "handoff.cli")]
    assert [t for t in got if _in_backend(t) and any(p.startswith("_") for p in t.split("."))] == [
        "handoff.ledger.postgres.postgres_store._send"]


# --- a backend package's own modules, and the hooks the core attaches (issue 26) -----------

def _backend_helpers() -> list[Path]:
    """The modules of a backend package beside its store (views, verify, group commit...)."""
    return [p for p in library_modules() if _in_backend(module_name(p)) and p.name not in ("sqlite_store.py", "postgres_store.py", "__init__.py")]


def _dialect_protocol() -> set[str]:
    """The underscored names the core declares for a dialect to fill in (``FoldingStore``'s):
    a helper may call those, as the core does."""
    from handoff.ledger.store_core import FoldingStore

    return {n for n in dir(FoldingStore) if n.startswith("_") and not n.startswith("__")}


def private_reads(path: Path) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` and ``_name`` is not the core's
    dialect protocol, and ``from .x import _name``: another module's private parts."""
    protocol = _dialect_protocol()
    tree = ast.parse(path.read_text())
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in protocol
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"{rel}:{node.lineno} reads {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.level:
            found += [f"{rel}:{node.lineno} imports {a.name} from .{node.module}" for a in node.names
                      if a.name.startswith("_")]
    return found


@pytest.mark.parametrize("path", _backend_helpers(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_backends_helper_modules_read_no_private_name_of_another(path):
    """PostgreSQL's views and verify read the store's ``_x``, ``_gather``, ``_fast``,
    ``_lock`` and imported ``_rec``, ``_b``, ``_RUN_COLUMNS``; SQLite's views and group
    commit its ``_conn``, ``_begin``, ``_finish``. What a package's modules share is now
    public within it (tests/test_backends.py keeps it out of every other package)."""
    assert private_reads(path) == []


def test_the_private_read_check_would_catch_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from .store import _rec\n"
                   "def f(store, self):\n"
                   "    store._x('SELECT 1')\n"
                   "    self._store._gather.append(1)\n"
                   "    self._ok = store._head_locked('r')\n")
    got = private_reads(bad)
    assert any("imports _rec" in g for g in got)
    assert any("store._x" in g for g in got) and any("self._store._gather" in g for g in got)
    assert not any("_head_locked" in g or "self._ok" in g for g in got)


def test_attach_takes_no_backend_knobs():
    """``attach(keeps_views=, reads_position=)`` carried PostgreSQL's write machinery into
    the interface the projections call: a hook declares what it does (``ledger.store.Hook``)
    and each backend reads the declaration. Every store's ``attach`` takes the aggregate and
    the hook, and nothing in the library passes more."""
    import inspect

    from handoff.ledger.store_core import FoldingStore
    from handoff.ledger.postgres.postgres_store import PostgresStore
    from handoff.ledger.sqlite.sqlite_store import SqliteStore
    from handoff.ledger.store import EventStore

    for cls in (EventStore, FoldingStore, SqliteStore, PostgresStore):
        assert list(inspect.signature(cls.attach).parameters) == ["self", "aggregate", "hook"], cls
    calls = [f"{p.relative_to(ROOT).as_posix()}:{node.lineno}"
             for p in library_modules() for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "attach"
             and (len(node.args) != 2 or node.keywords)]
    assert calls == []
