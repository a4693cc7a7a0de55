"""The web view in a real browser: Chromium against a real ``handoff serve`` process and
real worker processes.

Every wait is derived from what the test set (a run's heartbeat timeout, the server's
refresh period, the 2 s the run page promises), never a fixed sleep. With
HANDOFF_SERVE_SCREENSHOTS=DIR the fleet, needs-attention and run pages are saved there
(docs/img/ holds the ones docs/serve.md shows).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from handoff import Ledger
from tests.support import ROOT, executable

HEARTBEAT_TIMEOUT_S = 2.0
REFRESH_S = 1.0
HOSTILE = '<img src="http://example.invalid/x.png" onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=1</script>&amp;'


def _shot(page: Any, name: str) -> None:
    where = os.environ.get("HANDOFF_SERVE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / name), full_page=False)


def _worker(db: str, run: str, name: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(Path(ROOT) / "tests/serve/worker.py"), db, run, name,
                             str(HEARTBEAT_TIMEOUT_S / 4)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), proc.stderr.read() if proc.stderr else line
    return proc


def _fleet(db: str) -> None:
    with Ledger(db) as lg:
        for i in range(6):
            lg.open(run_id=f"docs-{i}", goal=f"Summarise incident {4700 + i}", target="chat:#ops",
                    owner="alice" if i % 2 else "bob", heartbeat_timeout_s=600, progress_timeout_s=900)
        lg.open(run_id="hostile", goal=HOSTILE, target="chat:#ops", owner="mallory")
        blocked = lg.open(run_id="needs-creds", goal="Rotate the staging keys", target="chat:#ops", owner="alice")
        lease = lg.claim(blocked, "agent-7")
        lg.transition(blocked, lease, "planning")
        lg.block(blocked, "needs prod read access", "alice grants read access", lease=lease)


@pytest.fixture
def fleet_db(tmp_path: Path) -> str:
    db = str(tmp_path / "serve.db")
    _fleet(db)
    return db


def test_fleet_lists_filters_and_escapes_and_fetches_nothing_else(fleet_db: str, served: Any, page: Any) -> None:
    s = served(fleet_db, "--refresh", str(REFRESH_S))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(s.url)
    rows = page.locator("#fleet tbody tr")
    assert rows.count() == 8
    assert page.locator('#fleet tr[data-run="docs-3"]').is_visible()
    # A filter narrows the list: text in the goal, then an owner.
    page.fill('input[name="q"]', "incident 4703")
    page.click('form.filters button[type="submit"]')
    page.wait_for_url("**q=incident+4703**")
    assert [r.get_attribute("data-run") for r in page.locator("#fleet tbody tr").all()] == ["docs-3"]
    page.goto(s.url + "?owner=alice")
    assert sorted(r.get_attribute("data-run") for r in page.locator("#fleet tbody tr").all()) == [
        "docs-1", "docs-3", "docs-5", "needs-creds"]
    # A heading sorts the whole listing (index-backed): by state, then run id.
    page.goto(s.url)
    page.click('#fleet th a[data-sort="state"]')
    page.wait_for_url("**sort=state**")
    assert [r.get_attribute("data-run") for r in page.locator("#fleet tbody tr").all()] == [
        "needs-creds", *(f"docs-{i}" for i in range(6)), "hostile"]
    # The hostile goal is text: shown as written, nothing of it ran or was fetched.
    page.goto(s.url)
    cell = page.locator('#fleet tr[data-run="hostile"] td.goal')
    assert cell.inner_text() == HOSTILE
    assert page.locator("#fleet img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    page.goto(s.url + "runs/hostile")
    assert page.locator("#goal").inner_text() == HOSTILE
    assert page.evaluate("document.body.dataset.pwned") is None
    page.frame_locator("iframe.report").locator("#run-id").wait_for()
    # Nothing was fetched from anywhere but this server.
    assert requests and all(u.startswith(s.url) for u in requests), [u for u in requests if not u.startswith(s.url)]


def test_sigkilled_worker_appears_under_needs_attention(fleet_db: str, served: Any, page: Any) -> None:
    with Ledger(fleet_db) as lg:
        lg.open(run_id="doomed", goal="Draft the postmortem", target="chat:#ops", owner="alice",
                heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
    worker = _worker(fleet_db, "doomed", "agent-9")
    s = served(fleet_db, "--refresh", str(REFRESH_S))
    try:
        page.goto(s.url + "attention")
        assert page.locator('#attention tr[data-run="doomed"]').count() == 0  # alive and working
        assert page.locator('#attention tr[data-run="needs-creds"]').count() == 1  # blocked on its owner
        os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        worker.wait()
        # Within the heartbeat timeout plus the refresh (and one refresh for the page's own load).
        budget = HEARTBEAT_TIMEOUT_S + 2 * REFRESH_S + 1.0
        page.wait_for_selector('#attention tr[data-run="doomed"][data-why="worker silent or dead"]',
                               timeout=budget * 1000)
        took = time.monotonic() - killed
        assert took <= budget
        _shot(page, "serve-attention.png")
    finally:
        if worker.poll() is None:
            worker.kill()
    page.goto(s.url)
    assert page.locator('#fleet tr[data-run="doomed"] td.h-unavailable').count() == 1
    _shot(page, "serve-fleet.png")


def test_step_from_another_process_appears_within_two_seconds(fleet_db: str, served: Any, page: Any) -> None:
    with Ledger(fleet_db) as lg:
        run = lg.open(run_id="live-1", goal="Follow me", target="chat:#ops", owner="alice")
        token = lg.claim(run, "agent-2")
        lg.transition(run, token, "planning")
        last = lg.checkpoint(run).last_seq
    s = served(fleet_db)
    page.goto(s.url + "runs/live-1")
    page.wait_for_selector("#live.on")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env.update(HANDOFF_DB=fleet_db, HANDOFF_LEASE=str(token))
    done = subprocess.run([*executable(), "progress", "live-1", "--kind", "plan_committed", "--detail",
                           "three sections"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    recorded = time.monotonic()
    page.wait_for_selector(f"#seq-{last + 1}", timeout=2000)
    assert time.monotonic() - recorded <= 2.0
    assert "plan_committed: three sections" in page.locator(f"#seq-{last + 1}").inner_text()
    assert page.locator('[data-fact="progress_seq"]').inner_text() != "0"
    # The embedded report is redrawn too, to the new end of the log.
    page.frame_locator("iframe.report").locator("header p", has_text=f"(seq {last + 1})").wait_for(timeout=5000)
    _shot(page, "serve-run.png")
    # A shareable address for each event: #seq-N selects it in the report too.
    page.goto(s.url + f"runs/live-1#seq-{last + 1}")
    page.frame_locator("iframe.report").locator(f'#ev-{last + 1}.selected').wait_for(timeout=5000)
    assert str(token) not in page.content()


def test_operator_revoke_from_the_page_is_logged_under_the_operator(fleet_db: str, served: Any, page: Any) -> None:
    with Ledger(fleet_db) as lg:
        run = lg.open(run_id="to-revoke", goal="A run to take back", target="chat:#ops", owner="alice")
        lg.claim(run, "agent-3", key="claim-secret-key-42")
    s = served(fleet_db, "--as", "operator", "--name", "olga")
    page.goto(s.url + "runs/to-revoke")
    assert "claim-secret-key-42" not in page.content()
    form = page.locator('form[data-action="revoke"]')
    form.locator('input[name="reason"]').fill("the host is drained")
    form.locator("button").click()
    page.wait_for_selector("#confirm")
    assert "olga" in page.locator("main").inner_text()
    page.click("#confirm button")
    page.wait_for_selector("#flash.ok")
    with Ledger(fleet_db) as lg:
        last = list(lg.log("to-revoke"))[-1]
        assert (last.type, last.actor) == ("lease_revoked", "operator:olga")
        assert lg.checkpoint("to-revoke").lease is None


def test_foreign_origin_is_refused(fleet_db: str, served: Any, page: Any, tmp_path: Path) -> None:
    """A page of another site posts the revoke form to the server: refused, nothing written."""
    with Ledger(fleet_db) as lg:
        run = lg.open(run_id="target-run", goal="Keep me", target="chat:#ops", owner="alice")
        lg.claim(run, "agent-4")
        before = lg.checkpoint(run).last_seq
    s = served(fleet_db, "--as", "operator", "--name", "olga")
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "index.html").write_text(
        f'<form id="f" method="post" action="{s.url}runs/target-run/do/revoke">'
        '<input name="reason" value="pwned"><input name="lease_number" value="1"><input name="csrf" value="x"></form>'
        '<script>document.getElementById("f").submit()</script>')
    other = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(evil)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert other.stdout is not None
        line = other.stdout.readline()
        port = int(line.split("port ")[1].split()[0])
        page.goto(f"http://127.0.0.1:{port}/index.html")
        page.wait_for_url(f"{s.url}runs/target-run/do/revoke")
        assert "another site's page are refused" in page.content()
    finally:
        other.kill()
        other.wait()
    with Ledger(fleet_db) as lg:
        assert lg.checkpoint("target-run").last_seq == before


def test_a_page_the_server_dropped_says_so_and_stops(fleet_db: str, served: Any, page: Any) -> None:
    """The feed's ``dropped`` event (a page that fell too far behind, tests/serve/test_bounds.py
    has the server's side) is shown on the page, and the page stops following."""
    import json

    s = served(fleet_db)
    said = "this page fell more than 64 batches of events behind the run and stopped following it; reload"

    def dropped(route: Any) -> None:
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"},
                      body=f"event: dropped\ndata: {json.dumps(said)}\n\n")

    page.route("**/runs/docs-1/feed*", dropped)
    page.goto(s.url + "runs/docs-1")
    page.wait_for_selector("#dropped", timeout=5000)
    assert page.locator("#dropped").inner_text() == said
    assert page.locator("#live").inner_text() == "stopped"
