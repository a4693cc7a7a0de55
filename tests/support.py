"""Small helpers the test packages share (tests/cli and tests/faults run real processes)."""

from __future__ import annotations

import os
import shutil
import sys


def executable() -> list[str]:
    """The installed ``handoff`` next to this interpreter, else ``python -m handoff.cli``."""
    here = os.path.join(os.path.dirname(sys.executable), "handoff")
    if os.path.exists(here):
        return [here]
    found = shutil.which("handoff")
    return [found] if found else [sys.executable, "-m", "handoff.cli"]
