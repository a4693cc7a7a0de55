"""The layers import downward only: ledger <- reducers <- projections <- handoff <- cli.

Every module of the library is parsed and every import it makes is read, wherever it
sits (module level, inside a function, under ``TYPE_CHECKING``, or as a literal
``importlib.import_module("...")`` / ``__import__("...")``), relative ones resolved. An
import from a lower layer into a higher one fails the test, naming the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Lower first: a module may import its own layer and those before it, never one after.
LAYERS = ("ledger", "reducers", "projections", "handoff", "cli")
RANK = {name: i for i, name in enumerate(LAYERS)}

#: Upward imports known today, each to be removed by named work. The general test skips
#: exactly these (file, layer) pairs; each has its own xfail(strict=True) test, which
#: fails as XPASS once the import is gone: then delete the entry, and the general test
#: holds that file to the rule like every other.
KNOWN: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules() -> list[Path]:
    out = [ROOT / "cli.py"]
    for layer in LAYERS[:-1]:
        out += sorted((ROOT / layer).rglob("*.py"))
    return out


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in ``source``, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            # ``from . import x`` / ``from pkg import sub`` may name submodules: count them too.
            out += [(node.lineno, f"{target}.{alias.name}" if target else alias.name)
                    for alias in node.names if alias.name != "*"]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _is_dynamic_import(node.func)):
            out.append((node.lineno, node.args[0].value))
    return out


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def layer_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in RANK else None


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
    """Every upward import fails here except the KNOWN ones, which have their own test below."""
    rel = path.relative_to(ROOT).as_posix()
    bad = [f"{rel}:{line} imports {target} ({layer} is above {layer_of(module_name(path))})"
           for layer, line, target in upward(path) if (rel, layer) not in KNOWN]
    assert bad == []


@pytest.mark.parametrize("rel, layer", [
    pytest.param(rel, layer, id=f"{rel}->{layer}", marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason))
    for (rel, layer), reason in KNOWN.items()
])
def test_known_upward_import_is_gone(rel, layer):
    left = [f"{rel}:{line} imports {target}" for theirs, line, target in upward(ROOT / rel) if theirs == layer]
    assert left == []


def test_every_known_exception_names_a_module_that_exists():
    for rel, layer in KNOWN:
        assert (ROOT / rel).is_file(), f"{rel} is gone: remove its entry from KNOWN"
        assert layer in RANK, layer


def test_the_parser_sees_every_form_of_import():
    src = (
        "import handoff.api\n"
        "from projections import engine\n"
        "from .. import cli\n"
        "def later():\n"
        "    from handoff.demo import run\n"
        "    import importlib\n"
        "    importlib.import_module('projections.queries')\n"
        "    __import__('cli')\n"
        "if TYPE_CHECKING:\n"
        "    from reducers.checkpoint import Checkpoint\n"
    )
    got = {target for _, target in imports_of(src, "ledger.x")}
    assert {"handoff.api", "projections", "projections.engine", "handoff.demo", "projections.queries",
            "cli", "reducers.checkpoint"} <= got
    # ``from .. import x`` climbs one package per extra dot.
    assert {t for _, t in imports_of("from .. import cli\n", "ledger.sub.x")} == {"ledger", "ledger.cli"}
    # Relative imports resolve inside their package: ledger's own modules are not upward.
    assert {t for _, t in imports_of("from .store import Actor\n", "ledger.sqlite")} == {
        "ledger.store", "ledger.store.Actor"}
    assert {t for _, t in imports_of("from . import events\n", "ledger", is_package=True)} == {
        "ledger", "ledger.events"}
