"""'handoff export --sqlite' (Ledger.export_sqlite, handoff/sqlite_export.py): a readable copy.

An analyst's questions are asked of the copy in plain SQL and checked against the
ledger's own answers: stalled runs by owner, deliveries per target, the events of one
lease, a full-text search. A second export adds only what is new; a redacted copy shows
nothing the redacted JSON Lines export hides; every refusal leaves both files as they were.
"""

from __future__ import annotations

import collections
import sqlite3
from datetime import datetime

import pytest

from handoff import Ledger
from handoff.ledger.errors import InvalidInput
from tests.ledger.conformance import refused
from tests.support import Clock

SECRET_OWNER = "carol.secret-owner"


def _story(db: str, tmp_path, clock: Clock) -> Ledger:
    """Runs of three owners: stalled ones, delivered ones (two targets), a revoked lease."""
    lg = Ledger(db, create=True, clock=clock)
    for i in range(9):
        owner = ("alice", "bob", SECRET_OWNER)[i % 3]
        target = ("chat:#ops", "mail:team")[i % 2]
        rid = f"r{i}"
        lg.open(run_id=rid, goal=f"fix the flaky test {i}" if i % 4 == 0 else f"write report {i}", target=target,
                owner=owner, heartbeat_timeout_s=600, progress_timeout_s=60)
        lease = lg.claim(rid, f"w{i % 2}")
        lg.transition(rid, lease, "planning", worker=f"w{i % 2}")
        if i % 3 == 1:  # delivered
            lg.transition(rid, lease, "executing", worker=f"w{i % 2}")
            lg.transition(rid, lease, "verifying", worker=f"w{i % 2}")
            f = tmp_path / f"{rid}.md"
            f.write_text(f"result {i}")
            lg.artifact(rid, lease, str(f), worker=f"w{i % 2}")
            lg.evidence(rid, "tests", "pass", lease=lease, detail="all green")
            lg.submit(rid, lease, "done", worker=f"w{i % 2}")
            lg.deliver(rid, f"k{i}", by=owner)
            lg.delivered(rid, f"k{i}", f"receipt {i}")
        elif i == 2:
            lg.revoke(rid, "worker lost")
            lease = lg.claim(rid, "w9")
            lg.transition(rid, lease, "executing", worker="w9")
        TOKENS[rid] = lease
    clock.advance(120)  # past the progress timeout: the live runs that only beat are stalled
    for i in (0, 3, 5):
        lg.heartbeat(f"r{i}", TOKENS[f"r{i}"], worker="w")
    return lg


#: Each run's current lease token, as its claim returned it.
TOKENS: dict[str, str] = {}


@pytest.fixture
def story(tmp_path):
    clock = Clock(step_us=1000)
    lg = _story(str(tmp_path / "l.db"), tmp_path, clock)
    yield lg, clock
    lg.close()


def _q(path, sql, *args):
    with sqlite3.connect(path) as c:
        return c.execute(sql, args).fetchall()


def test_analyst_queries_agree_with_the_ledger(story, tmp_path):
    lg, clock = story
    out = str(tmp_path / "readable.db")
    doc = lg.export_sqlite(out)
    judged = _q(out, "SELECT DISTINCT health_judged_at FROM runs")
    assert len(judged) == 1  # one moment for every run
    when = datetime.fromisoformat(judged[0][0].replace("Z", "+00:00"))
    now = int(when.timestamp()) * 1_000_000 + when.microsecond
    # Stalled runs by owner.
    got = dict(_q(out, "SELECT owner, count(*) FROM runs WHERE health_classification = 'stalled' GROUP BY owner"))
    want = collections.Counter(cp.owner for cp in lg.iter_runs(include_terminal=True, health=("stalled",),
                                                                 now=now))
    assert got == dict(want) and sum(got.values()) >= 2
    # Deliveries per target.
    got = dict(_q(out, "SELECT target, count(*) FROM deliveries WHERE status = 'confirmed' GROUP BY target"))
    want = collections.Counter(d["target"] for d in lg.deliveries(status="confirmed"))
    assert got == dict(want) and len(got) == 2
    receipts = dict(_q(out, "SELECT run_id, receipt FROM deliveries"))
    assert receipts == {d["run_id"]: d["receipt"] for d in lg.deliveries() if d["key"]}  # attempted at least once
    # The events of one lease: the revoked one of r2, and its successor.
    for lease in (1, 2):
        got = [r[0] for r in _q(out, "SELECT seq FROM events WHERE run_id = 'r2' AND lease = ? ORDER BY seq", lease)]
        assert got == [r.seq for r in lg.log("r2") if r.lease == lease] and got
    assert _q(out, "SELECT worker, ended_by, end_reason FROM leases WHERE run_id = 'r2' ORDER BY lease") == [
        ("w0", "revoked", "worker lost"), ("w9", None, None)]
    # Full-text search over summaries and details, and the runs' goals.
    hits = {r[0] for r in _q(out, "SELECT run_id FROM runs WHERE rowid IN "
                                  "(SELECT rowid FROM runs_fts WHERE runs_fts MATCH 'flaky')")}
    assert hits == {cp.run_id for cp in lg.iter_runs(include_terminal=True) if "flaky" in cp.goal}
    green = _q(out, "SELECT run_id, seq FROM events WHERE rowid IN "
                    "(SELECT rowid FROM events_fts WHERE events_fts MATCH 'green')")
    assert sorted(green) == sorted((r.run_id, r.seq) for r in lg.events(types=("evidence_recorded",)))
    # Every event, its payload readable JSON, its hashes the ledger's; keys hold.
    assert _q(out, "SELECT count(*) FROM events")[0][0] == lg.store.last_position() == doc["events"]
    first = lg.store.read_all().__next__()
    assert _q(out, "SELECT hash, json_extract(payload, '$.goal') FROM events WHERE position = 1") == [
        (first.hash.hex(), first.event.goal)]
    assert _q(out, "PRAGMA foreign_key_check") == []
    assert doc["runs"] == 9 and doc["last_position"] == lg.store.last_position()


def test_a_second_export_adds_only_what_is_new(story, tmp_path):
    lg, clock = story
    out = str(tmp_path / "readable.db")
    lg.export_sqlite(out)
    assert lg.export_sqlite(out)["events"] == 0
    before = lg.store.last_position()
    lg.close_run("r0", "cancelled", by="alice")
    lg.heartbeat("r3", TOKENS["r3"], worker="w")
    doc = lg.export_sqlite(out)
    assert doc["events"] == lg.store.last_position() - before > 0
    assert _q(out, "SELECT count(DISTINCT position), count(*) FROM events")[0] == (lg.store.last_position(),) * 2
    assert _q(out, "SELECT state FROM runs WHERE run_id = 'r0'") == [("cancelled",)]
    # The terminal runs nothing touched were left alone; every live run was judged again.
    assert doc["runs"] == 1 + sum(1 for cp in lg.iter_runs())


def test_the_cli_writes_and_extends_a_copy(h, tmp_path):
    with h.ledger() as lg:
        lg.open(run_id="r1", goal="g", target="t", owner="o")
    out = str(tmp_path / "c.db")
    assert h.json("export", "--sqlite", out)["events"] == 1
    with h.ledger() as lg:
        lg.claim("r1", "w1")
    assert h.json("export", "--sqlite", out) ["events"] == 1
    assert _q(out, "SELECT type FROM events ORDER BY position") == [("handoff_opened",), ("lease_granted",)]
    r = h("export", "--sqlite", out, "r1", code=2)
    assert "leave out RUN" in r.stderr


def test_a_redacted_copy_hides_what_the_redacted_export_hides(story, tmp_path, monkeypatch):
    lg, _ = story
    out = tmp_path / "red.db"
    salt = b"s" * 32
    doc = lg.export_sqlite(str(out), redact=True, salt=salt)
    assert doc["redacted"] and doc["events"] == lg.store.last_position()
    with sqlite3.connect(out) as c:
        dump = "\n".join(c.iterdump())
    for secret in (SECRET_OWNER, "flaky", "receipt 1", "worker lost", "alice"):
        assert secret not in dump, secret
    assert _q(str(out), "SELECT count(*) FROM events WHERE hash IS NOT NULL OR summary IS NOT NULL") == [(0,)]
    # Structure stays: states and types can still be counted.
    assert _q(str(out), "SELECT count(*) FROM events WHERE type = 'delivery_confirmed'") == [(3,)]
    # Extending it takes the same salt; anything else is refused, and the file is left as it was.
    size = out.read_bytes()
    with refused(lg.store, InvalidInput, "redacted"):
        lg.export_sqlite(str(out))
    with refused(lg.store, InvalidInput, "another salt"):
        lg.export_sqlite(str(out), redact=True, salt=b"t" * 32)
    assert out.read_bytes() == size
    assert lg.export_sqlite(str(out), redact=True, salt=salt)["events"] == 0


def test_refusals_leave_both_files_as_they_were(story, tmp_path):
    lg, _ = story
    with refused(lg.store, InvalidInput, "the ledger itself"):
        lg.export_sqlite(lg.store.path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE notes (x)")
        c.execute("INSERT INTO notes VALUES ('mine')")
    data = other.read_bytes()
    with refused(lg.store, InvalidInput, "not a readable copy"):
        lg.export_sqlite(str(other))
    assert other.read_bytes() == data
    link = tmp_path / "link.db"
    link.symlink_to(other)
    with refused(lg.store, InvalidInput, "symbolic link"):
        lg.export_sqlite(str(link))
    with refused(lg.store, InvalidInput, "redacted copy only"):
        lg.export_sqlite(str(tmp_path / "x.db"), salt=b"s" * 32)
