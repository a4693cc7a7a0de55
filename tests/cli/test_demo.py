"""``handoff demo`` end to end, as a user runs it, and what it leaves in the ledger."""

from __future__ import annotations

import os
import re
import textwrap

from handoff import Ledger
from handoff import demo

from tests.support import run_exe

#: The demo stops itself within ``demo.longest_s()``; this only catches a hang of the test.
HANG_GUARD_S = 2 * demo.longest_s()


def slow_agents(tmp_path, monkeypatch, body: str) -> None:
    """Put a ``sitecustomize`` on the path that runs ``body`` first in every demo agent (the
    ``python -c`` children of ``handoff run``, which alone get ``HANDOFF_RUN``): a busy
    machine's slow start, or an agent that dies, played on a quiet one."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, sys, time\nrun = os.environ.get('HANDOFF_RUN')\n"
                                           + textwrap.dedent(body))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))


def test_demo_plays_the_story_and_leaves_the_ledger(tmp_path, monkeypatch):
    # worker-c's agent takes longer to start than demo-stuck's progress timeout, as Python
    # does on a busy machine. The watchdog must judge the run once its agent is at work
    # (planned, executing, retrying), never the start-up as a stall of progress_seq 0.
    slow_agents(tmp_path, monkeypatch, f"""
        if run == "demo-stuck" and sys.argv[0] == "-c":
            time.sleep({1.5 * demo.PROGRESS_TIMEOUT + demo.WATCH_INTERVAL})
        """)
    db = str(tmp_path / "story.db")
    done = run_exe("--db", db, "demo", db=str(tmp_path / "ignored.db"), cwd=str(tmp_path), timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout + done.stderr
    flags = re.findall(r"demo-stuck stalled -> mark_stalled \(lease 1, progress_seq (\d+)\): .*\(last: ([^)]*)\)",
                       done.stdout)
    assert flags == [("3", "state:executing")], done.stdout
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


def test_a_worker_that_dies_stops_the_demo_at_once_naming_its_log(tmp_path, monkeypatch):
    # No wait outlasts the worker it waits on: the demo says which worker ended and where its
    # output is, well before any bound of its own (the stall flag's is derived from its timeout).
    slow_agents(tmp_path, monkeypatch, """
        if run == "demo-stuck" and sys.argv[0] == "-c":
            print("vendor client crashed on start", flush=True)
            os._exit(3)
        """)
    db = str(tmp_path / "story.db")
    done = run_exe("--db", db, "demo", db=db, cwd=str(tmp_path), timeout=HANG_GUARD_S)
    assert done.returncode == 1, done.stdout + done.stderr
    log = tmp_path / "story-files" / "worker-c.log"
    assert done.stderr.strip() == (f"Error: the demo stopped: worker-a's first section and worker-c's start did not "
                                   f"happen: worker-c ended first; see {log}"), done.stderr
    assert "vendor client crashed on start" in log.read_text()
    # Nothing of the demo's is left running: the other workers' wrappers and their agents
    # (an agent outliving its killed wrapper would poll for ever).
    assert _left_running(str(tmp_path)) == []


def _left_running(where: str) -> list[str]:
    """Processes whose command line names ``where``, once the demo's SIGKILLs have had the
    time the demo itself allows a stop (the kill is delivered asynchronously)."""
    import time

    deadline = time.monotonic() + demo.STOP_GRACE + 1.0
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                continue
            if where in cmd and not zombie and int(pid) != os.getpid():
                found.append(f"{pid}: {cmd[:200]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
