"""The browser the report tests open reports in: Debian's headless ``chromium``.

Under CI=true a missing browser fails the tests (.ci/run installs it, as it installs
fiu-utils); elsewhere they skip and say how to install it.
"""

from __future__ import annotations

import os

import pytest

from .cdp import Browser, find_chromium


@pytest.fixture(scope="session")
def browser():
    exe = find_chromium()
    if exe is None:
        why = "chromium is not installed (apt-get install -y chromium); the report's browser tests need it"
        if os.environ.get("CI") == "true":
            pytest.fail(why + ", and under CI=true they must run")
        pytest.skip(why)
    b = Browser(exe)
    yield b
    b.close()
