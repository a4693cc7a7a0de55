"""The Python examples of docs/testing.md and docs/python-api.md are files that run.

Each example lives in docs/examples/ and the page shows it under a marker line
``<!-- example: docs/examples/NAME.py -->``; these tests require every Python block of
those pages to be such a copy, byte for byte, and run every example file in a fresh
interpreter in an empty directory (so ``handoff.db`` there is a temporary ledger): a
``test_*.py`` file with pytest, any other with python. Before this, the watchdog and
wrapper examples used a ledger and a run that did not exist.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
PAGES = [ROOT / "docs" / "testing.md", ROOT / "docs" / "python-api.md", ROOT / "docs" / "incident-report.md",
         ROOT / "docs" / "integrations.md", ROOT / "docs" / "langgraph.md"]
BLOCK = re.compile(r"(?:<!-- example: (?P<path>[^ ]+) -->\n)?```python\n(?P<code>.*?)```", re.S)


def shown(page: Path) -> list[tuple[str | None, str]]:
    """(example path or None, code) for every Python block of a page."""
    return [(m.group("path"), m.group("code")) for m in BLOCK.finditer(page.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_is_an_example_file_shown_as_it_is(page: Path) -> None:
    blocks = shown(page)
    assert blocks, f"{page.name} has no Python examples"
    for path, code in blocks:
        assert path is not None, (
            f"{page.name}: a Python block without an example marker; keep the code in docs/examples/ "
            f"and put '<!-- example: docs/examples/NAME.py -->' on the line above it:\n{code[:200]}"
        )
        file = ROOT / path
        assert file.parent == EXAMPLES and file.exists(), f"{page.name} shows {path}, which is not in docs/examples/"
        assert code == file.read_text(encoding="utf-8"), (
            f"{page.name} shows {path} differently from the file; copy the file into the page again"
        )


def test_every_example_file_is_shown_somewhere() -> None:
    used = {path for page in PAGES for path, _ in shown(page)}
    files = {f"docs/examples/{p.name}" for p in EXAMPLES.glob("*.py")}
    assert files == used, f"examples not shown in any page: {sorted(files - used)}"


def test_a_block_that_drifted_from_its_file_is_noticed(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example: docs/examples/quickstart.py -->\n```python\nprint('old')\n```\n")
    [(path, code)] = shown(page)
    assert path == "docs/examples/quickstart.py" and code != (ROOT / path).read_text(encoding="utf-8")


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_the_example_runs(example: Path, tmp_path: Path) -> None:
    shutil.copy(example, tmp_path / example.name)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("HANDOFF_DB", None)
    if example.name.startswith("test_"):
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", example.name]
    else:
        argv = [sys.executable, example.name]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{example.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    if example.name.startswith("test_"):
        assert re.search(r"\b[1-9]\d* passed\b", proc.stdout) and "failed" not in proc.stdout, proc.stdout
