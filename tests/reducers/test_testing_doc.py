"""The example in docs/testing.md runs, as a user would run it, and passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"


def test_the_documented_example_passes(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- example:start -->\n```python\n(.*?)```\n<!-- example:end -->", text, re.S)
    assert block, "docs/testing.md lost its example markers"
    (tmp_path / "test_my_workflow.py").write_text(block.group(1), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_workflow.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout


def test_the_strategies_example_is_valid_python():
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for code in blocks:
        compile(code, "docs/testing.md", "exec")
