"""docs/architecture.md names only what exists.

Every file it names (``something.py``, with or without a directory) is in the tree, and
every backticked dotted name (``ledger.sqlite._explain``, ``Ledger.execute``,
``tests.backends.BACKENDS``) resolves to a module attribute or a class member. The one
page says where a backend's package goes (ledger/postgres/ is the example).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("ledger", "reducers", "projections", "handoff")
#: Named on the page as files a reader is to create (none today).
TO_BE_WRITTEN: set[str] = set()

PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")
TICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def named_names(text: str) -> set[str]:
    out = set()
    for body in TICKED.findall(text):
        head = body.split("(", 1)[0].split("[", 1)[0]
        if DOTTED.fullmatch(head) and not head.endswith((".py", ".md", ".db")):
            out.add(head)
    return out


def library_modules() -> list[ModuleType]:
    names = ["cli"]
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            names.append(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
    return [importlib.import_module(n) for n in names]


def resolve(name: str, modules: list[ModuleType]) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return _walk(obj, parts[cut:])
    # A class-qualified name (``Ledger.execute``): the class must be defined in the library.
    return any(_walk(m, parts) for m in modules if hasattr(m, parts[0]))


def _walk(obj: object, attrs: list[str]) -> bool:
    for a in attrs:
        if not hasattr(obj, a):
            return False
        obj = getattr(obj, a)
    return True


def test_every_file_the_page_names_exists():
    text = DOC.read_text()
    missing = []
    for p in sorted(named_paths(text) - TO_BE_WRITTEN):
        if "/" in p:
            found = (ROOT / p).is_file()
        else:  # a bare file name, as in the layer diagram: somewhere in the library
            found = (ROOT / p).is_file() or any(any((ROOT / pkg).rglob(p)) for pkg in PACKAGES)
        if not found:
            missing.append(p)
    assert missing == []


def test_every_dotted_name_the_page_names_exists():
    modules = library_modules()
    names = named_names(DOC.read_text())
    assert len(names) > 20  # the page names the code it describes
    assert [n for n in sorted(names) if not resolve(n, modules)] == []


def test_the_page_says_where_a_postgresql_backend_goes():
    text = DOC.read_text()
    assert "ledger/postgres/" in text and "tests/backends.py" in text
    assert "tests.backends.BACKENDS" in named_names(text)


@pytest.mark.parametrize("text, paths, names", [
    ("see `ledger.store.EventStore` in ledger/store.py", {"ledger/store.py"}, {"ledger.store.EventStore"}),
    ("`Ledger.execute(run_id, cmd)` and `details[\"why\"]`", set(), {"Ledger.execute"}),
    ("`cli.py`, `handoff doctor`, `--db`, `sqlite:///x.db`", {"cli.py"}, set()),
])
def test_the_scanner_reads_what_it_should(text, paths, names):
    assert named_paths(text) == paths
    assert named_names(text) == names


def test_the_resolver_refuses_what_is_not_there():
    modules = library_modules()
    assert resolve("ledger.store.EventStore.append", modules)
    assert resolve("Ledger.import_lines", modules)
    assert not resolve("ledger.store.EventStore.frobnicate", modules)
    assert not resolve("Ledger.frobnicate", modules)
    assert not resolve("Nowhere.at_all", modules)
