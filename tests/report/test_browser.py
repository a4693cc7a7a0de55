"""The HTML report opened in a real headless Chromium, driven over the DevTools protocol.

What a reader sees is queried from the rendered DOM: the lanes, the summary's answers and
their proof links, the as-of panel after a real mouse click. Every page is also checked
for what a self-contained report must never do: log a console error, throw, or request
anything but its own file. A control page proves that check can fail.
"""

from __future__ import annotations

import json
import time

import pytest

from handoff import Ledger, report
from handoff.ledger import events as ev
from handoff.ledger.store import Actor, LeaseToken, lease_digest
from handoff.ledger.sqlite import SqliteStore
from tests.support import Clock

from .story import GOAL, incident


@pytest.fixture
def incident_report(tmp_path):
    clock = Clock()
    with Ledger(str(tmp_path / "ledger.db"), clock=clock) as lg:
        run = incident(lg, clock, tmp_path)
        doc = lg.write_report(run, tmp_path / "report.html")
        log = {r.seq: r for r in lg.log(run)}
        packets = {seq: lg.status(run, at_seq=seq) for seq in log}
    return doc["path"], run, log, packets


def _clean(page) -> None:
    found = page.problems()
    assert found == {"errors": [], "requests": []}, found


def test_the_lanes_and_the_summary_are_drawn(browser, incident_report):
    path, run, log, _ = incident_report
    page = browser.open(path)
    try:
        assert page.evaluate("document.body.dataset.ready") == "1"
        lanes = page.evaluate("[...document.querySelectorAll('#timeline .lane')].map(g => g.dataset.lane)")
        assert lanes == ["state", "lease:worker-a", "lease:worker-b", "heartbeats", "progress", "watchdog",
                         "blockers", "effects", "artifacts", "review", "delivery"]
        counts = page.evaluate("Object.fromEntries([...document.querySelectorAll('#timeline .lane')].map("
                               "g => [g.dataset.lane, g.querySelectorAll('[data-seq]').length]))")
        beats = sum(1 for r in log.values() if r.type == "heartbeat_recorded")
        assert counts["heartbeats"] == beats and all(counts[k] for k in lanes), counts
        revoked = page.evaluate("document.querySelector('.lane[data-lane=\"lease:worker-a\"] .lease-revoked')"
                                "?.getAttribute('data-end-seq')")
        assert int(revoked) == next(s for s, r in log.items() if r.type == "lease_revoked")
        # The rendered boxes really are laid out left to right in time order.
        xs = page.evaluate("[...document.querySelectorAll('.lane[data-lane=\"state\"] rect.span')].map("
                           "r => r.getBoundingClientRect().left)")
        assert xs == sorted(xs) and len(xs) == 11
        answers = page.evaluate("Object.fromEntries([...document.querySelectorAll('#summary dd')].map(d => "
                                "[d.dataset.answer, [d.querySelector('.answer').textContent, "
                                "[...d.querySelectorAll('a.proof')].map(a => Number(a.dataset.seq))]]))")
        assert answers["state"][0] == "delivered"
        assert "exactly once" in answers["delivered"][0] and "chat:#ops message 1" in answers["delivered"][0]
        assert [log[s].type for s in answers["delivered"][1]] == ["delivery_attempted", "delivery_confirmed"]
        assert [log[s].event.action for s in answers["watchdog"][1]] == ["revoke_lease", "mark_stalled"]
        # The goal's markup is shown as text, never run.
        assert GOAL in page.evaluate("document.querySelector('header p').textContent")
        assert page.evaluate("document.title") == f"Incident report: {run}"
        _clean(page)
    finally:
        page.close()


def test_clicking_an_event_shows_its_record_and_the_packet_right_after_it(browser, incident_report):
    path, run, log, packets = incident_report
    page = browser.open(path)
    try:
        revoke = next(s for s, r in log.items() if r.type == "lease_revoked")
        page.click(f'#timeline .lease-revoked[data-end-seq="{revoke}"]')  # the span starts at the grant
        grant = next(s for s, r in log.items() if r.type == "lease_granted")
        shown = json.loads(page.evaluate("document.querySelector('#asof-packet pre').textContent"))
        assert shown == packets[grant] and shown["worker"] == "worker-a"
        page.click(f'#events tr[data-seq="{revoke}"]')
        assert page.evaluate("document.getElementById('asof-title').textContent") == f"seq {revoke}"
        record = page.evaluate("Object.fromEntries([...document.querySelectorAll('#asof-record table tr')].map("
                               "tr => [tr.cells[0].textContent, tr.cells[1].textContent]))")
        rec = log[revoke]
        assert record["type"] == "lease_revoked" and record["actor"] == "watchdog:ops"
        assert record["hash"] == rec.hash.hex() and record["prev_hash"] == rec.prev_hash.hex()
        shown = json.loads(page.evaluate("document.querySelector('#asof-packet pre').textContent"))
        assert shown == packets[revoke] and shown["lease"] is None and shown["state"] == "executing"
        assert page.evaluate(f"document.querySelector('#events tr[data-seq=\"{revoke}\"]').classList.contains('selected')")
        # A proof link in the summary selects the event it names.
        page.click('#summary dd[data-answer="delivered"] a.proof:last-of-type')
        confirmed = next(s for s, r in log.items() if r.type == "delivery_confirmed")
        shown = json.loads(page.evaluate("document.querySelector('#asof-packet pre').textContent"))
        assert shown == packets[confirmed] and shown["delivery"]["status"] == "confirmed"
        _clean(page)
    finally:
        page.close()


def test_the_problem_check_sees_a_request_and_an_error(browser, tmp_path):
    """The control: a page that fetches and fails is caught, so a clean result means something."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/pixel.png">'
                   "<script>console.error('broken')</script></body></html>")
    page = browser.open(str(bad))
    try:
        time.sleep(0.2)
        found = page.problems()
        assert "http://127.0.0.1:9/pixel.png" in found["requests"] and "broken" in found["errors"]
    finally:
        page.close()


def _heartbeat_run(path: str, beats: int) -> str:
    """A run of ``beats`` heartbeats and a few real steps, written in batches."""
    store = SqliteStore(path, synchronous="NORMAL", clock=Clock(step_us=30_000_000))  # a batch every 30 s
    w = Actor("worker", "w1")
    token = LeaseToken("1." + "s3cret" * 8)
    store.append("long", [ev.HandoffOpened(goal="Watch the vendor export", target="chat:#ops", owner="o"),
                          ev.LeaseGranted(worker="w1", lease=1, token_digest=lease_digest(token.secret))],
                 actor=Actor("owner", "o"))
    store.append("long", [ev.StateChanged(from_state="queued", to_state="executing")], actor=w, lease=token)
    for i in range(beats // 1000):
        store.append("long", [ev.HeartbeatRecorded()] * 999 + [ev.ProgressRecorded(kind="tool_outcome",
                                                                                    detail=f"batch {i}")],
                     actor=w, lease=token)
    store.close()
    return "long"


def test_a_100000_event_run_is_a_small_file_with_binned_heartbeats(browser, tmp_path):
    db = str(tmp_path / "long.db")
    run = _heartbeat_run(db, 100_000)
    with Ledger(db) as lg:
        doc = lg.write_report(run, tmp_path / "long.html")
        md = lg.write_report(run, tmp_path / "long.md", fmt="md")
    assert doc["last_seq"] > 100_000 and doc["bytes"] < 5 * 1024 * 1024, doc
    assert md["bytes"] < 200_000
    page = browser.open(doc["path"])
    try:
        bins = page.evaluate("document.querySelectorAll('.lane[data-lane=\"heartbeats\"] .bin').length")
        assert 0 < bins <= report.BINS
        counted = page.evaluate("[...document.querySelectorAll('.bin')].reduce((n, b) => n + Number(b.dataset.count), 0)")
        assert counted == 99_900
        page.click(".bin")
        first = page.evaluate("Number(document.querySelector('.bin').dataset.first)")
        picks = page.evaluate("document.querySelectorAll('#asof-record button.beat-pick').length")
        assert picks > 0
        page.click("#asof-record button.beat-pick")
        assert page.evaluate("document.getElementById('asof-title').textContent") == f"seq {first}"
        record = page.evaluate("Object.fromEntries([...document.querySelectorAll('#asof-record table tr')].map("
                               "tr => [tr.cells[0].textContent, tr.cells[1].textContent]))")
        assert record["type"] == "heartbeat_recorded" and record["actor"] == "worker:w1"
        assert "replay long --at" in page.evaluate("document.getElementById('asof-note').textContent")
        shown = json.loads(page.evaluate("document.querySelector('#asof-packet pre').textContent"))
        assert shown["run_id"] == run and shown["last_seq"] < first
        _clean(page)
    finally:
        page.close()
