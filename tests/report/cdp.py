"""A small Chrome DevTools Protocol client over a pipe, for opening reports in a real browser.

Chromium's ``--remote-debugging-pipe`` speaks CDP on file descriptors 3 (commands in)
and 4 (replies and events out), one JSON message per NUL-terminated frame. That needs no
package (no websocket library, no Playwright and its browser downloads) and opens no
debugging port that any other local user could connect to. The tests use Debian's
``chromium``; tests/report/conftest.py decides whether its absence skips or fails.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


class CDPError(Exception):
    """The browser answered a command with an error, or went away."""


class Browser:
    """One headless Chromium, driven over its debugging pipe."""

    def __init__(self, executable: str, *, width: int = 1400, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="handoff-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire() -> None:  # in the child: the pipe ends at fds 3 and 4, inheritable
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--disable-dev-shm-usage", "about:blank"],
            preexec_fn=wire, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.width, self.height = width, height

    # --- the wire ----------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("the browser did not answer in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise CDPError("the browser closed its debugging pipe")
            self._buf += chunk
        frame, _, self._buf = self._buf.partition(b"\0")
        return json.loads(frame)

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, *, timeout: float = 30.0) -> dict[str, Any]:
        for i, e in enumerate(self.events):
            if e["method"] == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_message(deadline)
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    # --- a page ------------------------------------------------------------------------

    def open(self, path: str) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        self.events.clear()
        url = "file://" + os.path.abspath(path)
        page.url = url
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired")
        page.evaluate("new Promise(r => requestAnimationFrame(() => r(1)))")
        return page


class Page:
    def __init__(self, browser: Browser, target: str, session: str) -> None:
        self.browser, self.target, self.session, self.url = browser, target, session, ""

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        res = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in res:
            raise CDPError(f"{expression[:80]}: {res['exceptionDetails'].get('exception', {}).get('description')}")
        return res["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the first match."""
        box = self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) return null;"
            " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if box is None:
            raise CDPError(f"nothing matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.browser.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                           "clickCount": 1}, session=self.session)

    def screenshot(self, path: str, *, full_page: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def problems(self) -> dict[str, list[str]]:
        """What the page did that a self-contained report must not: console errors, uncaught
        exceptions, and requests for anything but the report file itself."""
        self.evaluate("1")  # drain: events that arrived before this reply are now recorded
        errors, requests = [], []
        for e in self.browser.events:
            if e.get("sessionId") != self.session:
                continue
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                errors.append(str(p.get("exceptionDetails", {}).get("exception", {}).get("description")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(p["entry"].get("text", ""))
            elif m == "Network.requestWillBeSent" and p.get("request", {}).get("url") != self.url:
                requests.append(p["request"]["url"])
        return {"errors": errors, "requests": requests}

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})
