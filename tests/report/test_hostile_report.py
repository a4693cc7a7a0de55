"""A report of a run whose every text is an attack, opened in a real headless Chromium.

Each field a person or a program can write (goal, owner, target, worker names, progress
detail, artifact paths, evidence, blockers, reasons, keys, receipts) holds markup that
would fetch from, or navigate to, a local HTTP server if it were ever parsed as markup:
a ``<meta http-equiv=refresh>`` after a closed attribute, an ``<img>``, an ``<a href>``,
a closed ``<script>``. Classifications are refused on input now, so those come the way
an older log would still hold them: written to the store beneath the rules. The server
must receive no request at all while the page loads and is clicked through. A control
page with the same payloads left unescaped proves that this browser, from a file page,
does reach that server; the report is checked only after the control's request arrived.
"""

from __future__ import annotations

import http.server
import re
import threading
import time
from pathlib import Path

import pytest

from handoff import Ledger, report
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.store import Actor
from tests.support import Clock

#: How long the control page may take to reach the server on a loaded machine.
CONTROL_DEADLINE_S = 60.0


class _Server:
    """An HTTP server on 127.0.0.1 that records the path of every request it gets."""

    def __init__(self) -> None:
        seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                seen.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(b"<p>leaked</p>")

            def log_message(self, *args: object) -> None:
                pass

        self.seen = seen
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def attack(port: int, field: str) -> str:
    """Text that, parsed as markup in an attribute or a text node, leaves the file: each
    request names the field it came from."""
    base = f"http://127.0.0.1:{port}/{field}"
    return (f'x"><meta http-equiv="refresh" content="0;url={base}-meta"><x y="'
            f"<img src='{base}-img'><a href=\"{base}-a\">click</a></script><script>fetch('{base}-js')</script>")


def short(port: int, field: str) -> str:
    """The same attack in the 200 characters a name may hold."""
    return f'"><meta http-equiv=refresh content="0;url=//127.0.0.1:{port}/{field}"><a href=//127.0.0.1:{port}/{field}-a>'


def hostile_run(lg: Ledger, clock: Clock, port: int) -> str:
    run = "hostile"
    lg.open(run_id=run, goal=attack(port, "goal"), origin=short(port, "origin"), target="chat:" + short(port, "target"),
            owner=short(port, "owner"), heartbeat_timeout_s=10, progress_timeout_s=30, retry_budget=5)
    a = lg.claim(run, short(port, "worker-a"))
    lg.transition(run, a, "planning", reason=attack(port, "transition-reason"))
    lg.progress(run, a, "plan_committed", attack(port, "progress-detail"))
    lg.transition(run, a, "executing")
    lg.effect_start(run, a, short(port, "effect-key"), attack(port, "effect-what"))
    lg.effect_confirm(run, short(port, "effect-key"), "done", lease=a)
    path = Path("out") / (short(port, "artifact-path").replace("/", "_") + ".md")
    path.parent.mkdir(exist_ok=True)
    path.write_text("the result\n")
    lg.artifact(run, a, str(path), kind="result")
    lg.evidence(run, short(port, "evidence-kind"), "pass", attack(port, "evidence-detail"), lease=a)
    lg.block(run, attack(port, "blocker-reason"), attack(port, "blocker-next"), lease=a)
    lg.unblock(run, attack(port, "blocker-resolution"), lease=a)
    # Classifications as an older log holds them: written beneath the rules.
    head = lg.store.head(run)
    wd = Actor("watchdog", short(port, "watcher"))
    lg.store.append(run, [ev.WatchdogObserved(watcher=wd.name, classification=attack(port, "classification"),
                                              progress_seq=1, reason=attack(port, "observe-reason"))],
                    actor=wd, expected_seq=head.last_seq)
    lg.store.append(run, [ev.RecoveryDecided(watcher=wd.name, action="mark_stalled",
                                             classification=attack(port, "recovery-classification"),
                                             progress_seq=1, reason=attack(port, "recovery-reason"))],
                    actor=wd, expected_seq=head.last_seq + 1)
    b = lg.claim(run, short(port, "worker-b")) if lg.checkpoint(run).lease is None else a
    lg.transition(run, b, "verifying")
    lg.submit(run, b, attack(port, "result-summary"))
    lg.deliver(run, short(port, "delivery-key"), by=lg.checkpoint(run).owner)
    lg.delivered(run, short(port, "delivery-key"), attack(port, "receipt"))
    return run


def _control_page(tmp: Path, port: int) -> Path:
    """The attack as an unescaping renderer would have written it: it must reach the server."""
    page = tmp / "control.html"
    page.write_text(f'<!DOCTYPE html><html><body><svg><rect class="{attack(port, "control")}"/></svg></body></html>')
    return page


def test_a_report_of_hostile_text_makes_no_request_and_shows_it_as_text(browser, server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the artifact's path is relative to here
    clock = Clock()
    with Ledger(str(tmp_path / "ledger.db"), clock=clock) as lg:
        run = hostile_run(lg, clock, server.port)
        out = lg.write_report(run, tmp_path / "report.html")
        goal = lg.status(run)["goal"]
        observed = next(r.seq for r in lg.log(run) if r.type == "watchdog_observed")
    page = browser.open(out["path"])
    try:
        assert page.evaluate("document.body.dataset.ready") == "1"  # the report's own script ran
        assert page.evaluate("location.href") == page.url  # nothing navigated
        injected = page.evaluate(
            "[...document.querySelectorAll('meta[http-equiv], img, iframe, x, script[src]')].map(e => e.outerHTML)"
            ".filter(h => !h.includes('Content-Security-Policy'))")
        assert injected == []
        links = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))")
        assert links and all(h.startswith("#ev-") for h in links), links
        assert page.evaluate("document.querySelectorAll('script').length") == 2  # the data block and the code
        assert goal in page.evaluate("document.getElementById('run-id').parentElement.parentElement.textContent")
        page.click(f'#timeline [data-seq="{observed}"]')  # the as-of panel shows the record's text
        shown = page.evaluate("document.getElementById('asof-record').textContent")
        assert attack(server.port, "classification") in shown
        assert page.evaluate("location.href") == page.url
        found = page.problems()
    finally:
        page.close()
    # The control navigates away at once, so it is opened as a bare target, not a Page.
    control = browser.send("Target.createTarget", {"url": _control_page(tmp_path, server.port).as_uri()})["targetId"]
    try:
        deadline = time.monotonic() + CONTROL_DEADLINE_S
        while not any(p.startswith("/control") for p in server.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        browser.send("Target.closeTarget", {"targetId": control})
    assert any(p.startswith("/control") for p in server.seen), "the control page never reached the server"
    assert [p for p in server.seen if not p.startswith("/control")] == []
    assert found["requests"] == [], found


def test_the_markdown_report_of_hostile_text_holds_no_live_markup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with Ledger(str(tmp_path / "ledger.db"), clock=Clock()) as lg:
        run = hostile_run(lg, Clock(), 8)
        md = report.render(lg.report(run), "md")
    assert "\\<meta" in md  # shown, escaped
    assert re.search(r"(?<!\\)[<>]", md.replace("\\\\", "")) is None  # every angle bracket escaped


@pytest.mark.parametrize("via", ["observe", "recover"])
def test_an_unknown_classification_is_refused_and_nothing_is_written(tmp_path, via):
    with Ledger(str(tmp_path / "ledger.db")) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", run_id="r1")
        before = [r.hash for r in lg.log(run)]
        for bad in ('x"><meta http-equiv="refresh" content="0;url=http://127.0.0.1:1/">', "alive", "Stalled", ""):
            with pytest.raises(E.InvalidInput) as info:
                if via == "observe":
                    lg.observe(run, bad, 0, watcher="dog")
                else:
                    lg.recover(run, "mark_stalled", bad, 0, watcher="dog")
            assert info.value.field == "classification"
            assert "healthy" in info.value.message  # it says what is accepted
        assert [r.hash for r in lg.log(run)] == before
        lg.observe(run, "healthy", 0, watcher="dog")  # a known one is still recorded


def test_an_import_holding_an_unknown_classification_is_refused(tmp_path):
    src, dst = str(tmp_path / "old.db"), str(tmp_path / "new.db")
    with Ledger(src) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", run_id="r1")
        wd = Actor("watchdog", "dog")
        lg.store.append(run, [ev.WatchdogObserved(watcher="dog", classification='x"><a href=//127.0.0.1:1/>',
                                                  progress_seq=0)], actor=wd, expected_seq=1)
        lines = list(lg.export())
    with Ledger(dst) as lg:
        lg.open(goal="other", target="chat:#ops", owner="bob", run_id="kept")
    before = Path(dst).read_bytes()
    with Ledger(dst) as lg, pytest.raises(E.InvalidInput) as info:
        lg.import_lines(lines)
    assert info.value.field == "classification"
    assert Path(dst).read_bytes() == before
