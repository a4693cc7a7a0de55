"""Take docs/incident-report.png: a report opened in headless Chromium, one event selected.

    handoff --db /tmp/story.db demo --quiet
    python -m tests.report.screenshot /tmp/story-files/demo-report.html docs/incident-report.png

The event selected is the first one the watchdog answer of the summary names (the
revocation, in the demo), so the picture shows the as-of panel as a reader would use it.
"""

from __future__ import annotations

import sys

from .cdp import Browser, find_chromium


def take(report: str, png: str) -> None:
    exe = find_chromium()
    if exe is None:
        raise SystemExit("chromium is not installed (apt-get install -y chromium)")
    browser = Browser(exe, width=1440, height=1000)
    try:
        page = browser.open(report)
        page.click('#summary dd[data-answer="watchdog"] a.proof')
        page.evaluate("window.scrollTo(0, 0)")
        found = page.problems()
        if found["errors"] or found["requests"]:
            raise SystemExit(f"the report misbehaved in the browser: {found}")
        page.screenshot(png)
    finally:
        browser.close()


if __name__ == "__main__":
    take(sys.argv[1], sys.argv[2])
