"""``handoff demo`` end to end, as a user runs it, and what it leaves in the ledger."""

from __future__ import annotations

import time

from handoff import Ledger

from .conftest import run_exe


def test_demo_plays_the_story_and_leaves_the_ledger(tmp_path):
    db = str(tmp_path / "story.db")
    started = time.monotonic()
    done = run_exe("--db", db, "demo", db=str(tmp_path / "ignored.db"), cwd=str(tmp_path), timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 30, f"the demo took {took:.1f}s"
    out = done.stdout
    for text in ("The contracts are written before any worker starts",
                 "demo-report unavailable -> revoke_lease",
                 "worker-b holds lease 2",
                 "refused, and nothing was written: StaleLease: lease 1 of run demo-report has ended",
                 "demo-stuck stalled -> mark_stalled",
                 "matches the file on disk",
                 "already confirmed; nothing sent",
                 "delivered exactly once",
                 "=== final packet: demo-report ===",
                 "=== timeline: demo-report",
                 "handoff --db story.db status demo-report"):
        assert text in out, text
    with Ledger(db) as lg:
        report = list(lg.log("demo-report"))
        stuck = list(lg.log("demo-stuck"))
        assert lg.checkpoint("demo-report").state == "delivered"
        assert lg.verify() == [] and lg.check() == []
    types = [r.type for r in report]
    assert types.count("delivery_attempted") == 1 and types.count("delivery_confirmed") == 1
    assert [r.event.receipt for r in report if r.type == "delivery_confirmed"][0].startswith("file demo-report.")
    assert [r.event.worker for r in report if r.type == "lease_granted"] == ["worker-a", "worker-b"]
    revoked = next(r for r in report if r.type == "lease_revoked")
    late = [r for r in report if r.lease == 1 and r.seq > revoked.seq]
    assert late == []  # worker-a's late write left no trace
    assert any(r.type == "recovery_decided" and r.event.action == "mark_stalled" for r in stuck)
    assert not (tmp_path / "ignored.db").exists()  # HANDOFF_DB is never the demo's target
    # It ends with the incident report of its main run, drawn by 'handoff report''s renderer.
    assert out.rstrip().splitlines()[-1].startswith("The incident report of demo-report is in "
                                                     "story-files/demo-report.html")
    page = (tmp_path / "story-files" / "demo-report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and 'data-lane="lease:worker-b"' in page
    assert "lease-revoked" in page and "window-unavailable" in page


def test_demo_refuses_to_overwrite_a_ledger_it_did_not_make(tmp_path):
    db = str(tmp_path / "real.db")
    with Ledger(db) as lg:
        lg.open(run_id="precious", goal="g", target="t", owner="o")
    done = run_exe("demo", "--db", db, db=db, timeout=60)
    assert done.returncode == 1 and "did not write" in done.stderr
    with Ledger(db) as lg:
        assert lg.checkpoint("precious").opened
