"""The README's promises: its set-up commands are one line each, its Python example runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support import ROOT

README = os.path.join(ROOT, "README.md")


def _readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def test_the_first_screen_has_the_two_one_line_setup_commands():
    first_screen = "\n".join(_readme().splitlines()[:20])
    assert "\npip install . && handoff demo\n" in first_screen
    assert "\npip install -e '.[test,postgres]' && python -m pytest\n" in first_screen
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert f.read().rstrip().endswith("pip install -e '.[test,postgres]' && python -m pytest")


def test_the_python_example_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    assert blocks, "the README has no Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "delivered"
    assert lines[0].startswith("StaleLease - lease 1 of run ")  # delivery released the lease
