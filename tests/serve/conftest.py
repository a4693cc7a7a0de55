"""A real ``handoff serve`` process for the web view's tests, and the browser they drive.

``served(db, *args)`` starts ``python -m handoff.servecli`` on 127.0.0.1 port 0 and reads
the address it prints; the process is stopped when the test ends. The browser is Debian's
``chromium`` driven by Playwright (its Python package only: ``executable_path``, no browser
download). Under CI=true a missing browser or Playwright fails the tests, never skips them
(.ci/run installs the browser, the test extra Playwright).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import ROOT


class Served:
    """A running server: ``url`` ends with '/'; ``base`` is scheme, host and port."""

    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc, self.url = proc, url
        self.base = url.rstrip("/")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(db: str, *args: str, timeout: float = 30) -> Served:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "handoff.servecli", "--db", db, "--http", "127.0.0.1:0", *args],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"handoff serve: (http://\S+/)", line)
        if m:
            return Served(proc, m.group(1))
    proc.kill()
    out, err = proc.communicate()
    raise AssertionError(f"handoff serve did not start (exit {proc.returncode}):\n{out}\n{err}")


@pytest.fixture
def served() -> Iterator[Any]:
    running: list[Served] = []

    def start(db: str, *args: str) -> Served:
        s = start_server(db, *args)
        running.append(s)
        return s

    yield start
    for s in running:
        s.stop()


def find_chromium() -> str | None:
    import shutil

    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


@pytest.fixture(scope="package")
def chromium() -> Iterator[Any]:
    """A headless Chromium under Playwright, for this directory's tests only: Playwright's
    sync API runs an event loop in the main thread until it is stopped, and a test after
    these that starts its own loop (asyncio.run) must not find one running."""
    exe = find_chromium()
    why = None
    if exe is None:
        why = "chromium is not installed (apt-get install -y chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = why or "Playwright's Python package is not installed (pip install -e '.[test]')"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; under CI=true the web view's browser tests must run")
        pytest.skip(why)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    ctx = chromium.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    yield pg
    ctx.close()
