"""'handoff report' and Ledger.write_report: on every backend, the file it writes, and its refusals.

The browser tests (test_browser.py) look at what a reader sees; these look at the file:
what it holds and what it must not (markup from the ledger, anything that fetches), where
and how it is written, and that every refusal names the problem and writes nothing.
"""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from handoff import Ledger, report
from handoff.ledger.errors import InvalidInput, UnknownRun
from handoff.reducers import timeline
from handoff.reducers.checkpoint import iso
from tests.ledger.conformance import assert_unchanged, refused, snapshot
from tests.support import Clock, Handoff

from .story import GOAL, incident


def test_the_report_on_every_backend(backend, tmp_path):
    clock = Clock()
    lg = backend.ledger(clock)
    run = incident(lg, clock, tmp_path)
    tl = lg.report(run)
    for rec, packet in zip(tl.records, timeline.undelta(tl.packets)):
        assert packet == lg.status(run, at_seq=rec["seq"])
    doc = lg.write_report(run, tmp_path / "r.html")
    assert doc["last_seq"] == lg.store.head(run).last_seq and os.path.getsize(doc["path"]) == doc["bytes"]
    if not backend.shared:
        return
    address = backend.address()
    other = backend.ledger(clock, address)
    run2 = incident(other, clock, tmp_path, run="inc-2")
    h = Handoff(address)
    out = tmp_path / "cli.html"
    got = h.json("report", run2, "-o", str(out))
    assert got["path"] == str(out) and got["format"] == "html" and got["as_of"] is None
    assert out.read_text().count('data-lane="') == len(other.report(run2).lanes)
    md = h("report", run2, "--format", "md", "--at", "20", "-o", "-").stdout
    assert md.startswith(f"# Incident report: run `{run2}`") and "as the ledger stood at seq 20" in md.lower()


def _ledger(tmp_path) -> tuple[Handoff, str]:
    clock = Clock()
    h = Handoff(str(tmp_path / "ledger.db"))
    with Ledger(h.db, clock=clock) as lg:
        run = incident(lg, clock, tmp_path)
    return h, run


def test_the_html_is_self_contained_and_shows_ledger_text_as_text(tmp_path):
    h, run = _ledger(tmp_path)
    text = h("report", run, "-o", "-").stdout
    # Nothing that fetches: no external source or link, and a policy that forbids fetching.
    assert not re.search(r'\b(src|href)\s*=\s*"(?!#)', text), "the report references something outside itself"
    assert "@import" not in text and "url(" not in text
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text).group(1)
    assert "default-src 'none'" in csp and "'unsafe-inline'" not in csp
    for kind, body in (("script-src", re.findall(r"<script>(.*?)</script>", text, re.S)[-1]),
                       ("style-src", re.search(r"<style>(.*?)</style>", text, re.S).group(1))):
        assert report._csp_hash(body) in csp.split(kind, 1)[1].split(";", 1)[0]
    # The goal's markup is escaped in the page and cannot close the data block.
    assert GOAL not in text and "&lt;script&gt;document.title" in text
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S).group(1)
    assert "<" not in data and json.loads(data)["run_id"] == run
    assert GOAL in json.dumps(json.loads(data), ensure_ascii=False)


def test_the_file_gets_the_ledgers_permissions_and_a_default_name(tmp_path, monkeypatch):
    h, run = _ledger(tmp_path)
    os.chmod(h.db, 0o640)
    monkeypatch.chdir(tmp_path)
    doc = h.json("report", run)
    assert doc["path"] == str(tmp_path / f"{run}-report.html")
    assert stat.S_IMODE(os.stat(doc["path"]).st_mode) == 0o640
    md = h.json("report", run, "--format", "md")
    assert md["path"].endswith(f"{run}-report.md") and md["bytes"] == os.path.getsize(md["path"])
    text = open(md["path"]).read()
    assert "x heartbeat_recorded" in text and "| 1 |" in text and "\\|" not in text.split("## Timeline")[0]


def test_markdown_summary_lists_each_answer_with_its_proof(tmp_path):
    h, run = _ledger(tmp_path)
    md = h("report", run, "--format", "md", "-o", "-").stdout
    assert "<script>" not in md and "\\<script\\>" in md  # the goal's markup, escaped
    with Ledger(h.db) as lg:
        answers = lg.report(run).answers
    for a in answers:
        line = next(line for line in md.splitlines() if line.startswith(f"- **{a.question}**"))
        assert all(f"seq {s}" in line for s in a.proof), line


@pytest.mark.parametrize("args, code, kind, words", [
    (["report", "ghost"], 1, "UnknownRun", "no run ghost"),
    (["report", "RUN", "--at", "3", "--as-of", "2027-01-15T08:00:05Z"], 2, "UsageError", "not both"),
    (["report", "RUN", "--as-of", "2020-01-01T00:00:00Z"], 2, "InvalidInput", "did not exist yet"),
    (["report", "RUN", "-o", "LINK"], 2, "InvalidInput", "symbolic link"),
    (["report", "RUN", "-o", "LEDGER"], 2, "InvalidInput", "the ledger itself"),
    (["report", "RUN", "-o", "MISSING/r.html"], 2, "InvalidInput", "does not exist"),
    (["report", "RUN", "-o", "-", "--json"], 2, "UsageError", "stdout carries the report"),
    (["report", "RUN", "--format", "pdf"], 2, "BadParameter", "pdf"),
])
def test_refusals_name_the_problem_and_write_nothing(tmp_path, args, code, kind, words):
    h, run = _ledger(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "link.html").symlink_to(victim)
    names = {"RUN": run, "LINK": str(tmp_path / "link.html"), "LEDGER": h.db, "MISSING/r.html": str(tmp_path / "no" / "r.html")}
    argv = [names.get(a, a) for a in args]
    with Ledger(h.db) as lg:
        before = snapshot(lg.store)
    files = sorted(os.listdir(tmp_path))
    r = h(*argv, code=code)
    assert words in r.stderr
    err = json.loads(h(*argv, "--json", code=code).stderr)["error"] if "--json" not in argv else None
    assert err is None or err["type"] == kind
    assert victim.read_text() == "keep me" and sorted(os.listdir(tmp_path)) == files
    with Ledger(h.db) as lg:
        assert_unchanged(lg.store, before)


def test_the_library_refuses_the_same_way(tmp_path):
    h, run = _ledger(tmp_path)
    with Ledger(h.db) as lg:
        with refused(lg.store, UnknownRun, "no run ghost"):
            lg.report("ghost")
        with refused(lg.store, InvalidInput, "not both"):
            lg.report(run, at_seq=3, as_of_us=10**15)
        with refused(lg.store, InvalidInput, "format"):
            lg.write_report(run, tmp_path / "x.pdf", fmt="pdf")
        with refused(lg.store, InvalidInput, "at"):
            lg.report(run, at_seq=0)
    assert not (tmp_path / "x.pdf").exists()


def test_markdown_cannot_carry_a_link_an_image_or_html_from_the_ledger(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    with Ledger(h.db) as lg:
        lg.open(run_id="r1", goal="![seen](http://127.0.0.1:9/track.png)", target="chat:#ops", owner="alice")
        lease = lg.claim("r1", "w1")
        lg.transition("r1", lease, "planning", worker="w1")
        lg.progress("r1", lease, "plan_committed", "[click](http://127.0.0.1:9/) <img src=x> a|b", worker="w1")
    md = h("report", "r1", "--format", "md", "-o", "-").stdout
    assert not re.search(r"(?<!\\)[<\[]", md.split("## Timeline")[1].replace("|---|", ""))  # all escaped
    assert "!\\[seen\\](http://127.0.0.1:9/track.png)" in md and "a\\|b" in md
    row = next(line for line in md.splitlines() if "| progress_recorded |" in line)
    assert row.count(" | ") == 4  # the detail's pipe did not add a column


def test_at_and_as_of_draw_the_run_as_it_stood(tmp_path):
    h, run = _ledger(tmp_path)
    with Ledger(h.db) as lg:
        revoked = next(r for r in lg.log(run) if r.type == "lease_revoked")
    at = h.json("report", run, "--at", str(revoked.seq), "-o", str(tmp_path / "at.html"))
    assert at["last_seq"] == revoked.seq and at["as_of"] == f"seq {revoked.seq}"
    when = iso(revoked.recorded_us)
    by_time = h.json("report", run, "--as-of", when, "-o", str(tmp_path / "as-of.html"))
    assert by_time["last_seq"] >= revoked.seq and by_time["end"] == when and by_time["as_of"].startswith(when)
    page = (tmp_path / "at.html").read_text()
    assert f"as the ledger stood at seq {revoked.seq}" in page and 'class="ev span lease-revoked' in page
    assert 'class="ev span delivery-' not in page  # the delivery came later
