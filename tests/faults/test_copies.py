"""Copies of the ledger: exports, backups and head anchors, as an attacker and a careless user see them.

- An export is never more readable than the ledger, whatever the umask, and is written
  through a private temporary file that nothing planted in the directory can redirect.
- ``handoff backup`` keeps the commits still in the WAL (copying the .db file loses them)
  and is consistent while a writer process appends.
- A tail cut off behind the store passes ``verify`` alone; a head digest kept outside the
  file (``handoff head``) catches it. ``verify RUN`` runs the ledger-wide checks, and a
  dropped or rewritten append-only trigger is reported by ``verify`` and ``doctor``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from handoff import Ledger
from handoff.ledger.errors import HeadAnchorBroken, InvalidInput
from handoff.ledger.sqlite import APPEND_ONLY_TRIGGERS

from tests.support import invoke

from .conftest import ROOT, handoff

TRIGGERS = tuple(APPEND_ONLY_TRIGGERS)


def _ledger_with_runs(db: str, runs: int = 2) -> None:
    with Ledger(db) as lg:
        for i in range(runs):
            lg.open(run_id=f"r{i}", goal=f"goal {i}", target="chat:#ops", owner="alice")
            lease = lg.claim(f"r{i}", f"w{i}")
            lg.transition(f"r{i}", lease, "planning", worker=f"w{i}")


def _files(d) -> set[str]:
    """The directory's names, less the ledger's own -wal and -shm (there while it is open)."""
    return {n for n in os.listdir(d) if n not in ("l.db-wal", "l.db-shm")}


def _events(db: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT * FROM events ORDER BY position").fetchall()
    finally:
        conn.close()


# --- exports: mode and temporary names ----------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_export_gets_the_ledger_mode_whatever_the_umask(tmp_path, umask):
    db, out = str(tmp_path / "l.db"), str(tmp_path / "all.jsonl")

    def under_umask() -> None:
        os.umask(umask)

    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    for args in (["init"], ["open", "--run-id", "r1", "--goal", "g", "--target", "t", "--owner", "o"],
                 ["export", "--all", "-o", out]):
        from tests.support import executable

        p = subprocess.run([*executable(), "--db", db, *args], env=env, capture_output=True, text=True,
                           preexec_fn=under_umask, timeout=60)
        assert p.returncode == 0, p.stderr
    ledger_mode = stat.S_IMODE(os.stat(db).st_mode)
    mode = stat.S_IMODE(os.stat(out).st_mode)
    assert ledger_mode == 0o600
    assert mode == ledger_mode, f"export is {mode:o}, the ledger {ledger_mode:o}"
    assert _files(tmp_path) - {"l.db", "all.jsonl"} == set()


def test_export_follows_the_ledger_mode_when_it_is_more_open(tmp_path):
    db, out = str(tmp_path / "l.db"), str(tmp_path / "all.jsonl")
    _ledger_with_runs(db, 1)
    os.chmod(db, 0o640)
    with Ledger(db) as lg:
        doc = lg.export_to(out)
    assert doc == {"output": out, "events": 3, "runs": 1}
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640


def test_a_symlink_planted_at_the_old_temporary_name_is_not_followed(tmp_path):
    """The old code wrote to OUTPUT.tmp-PID: a link planted there overwrote its target."""
    db, out = str(tmp_path / "l.db"), str(tmp_path / "all.jsonl")
    _ledger_with_runs(db, 1)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    planted = tmp_path / f"all.jsonl.tmp-{os.getpid()}"
    os.symlink(victim, planted)
    res = invoke("--db", db, "export", "--all", "-o", out)
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "precious\n" and stat.S_IMODE(os.stat(victim).st_mode) == 0o644
    assert os.path.islink(planted) and os.readlink(planted) == str(victim)
    assert len(open(out).read().splitlines()) == 3
    assert _files(tmp_path) == {"l.db", "all.jsonl", "victim.txt", planted.name}


@pytest.mark.parametrize("via", ["cli", "api"])
def test_a_symlink_at_the_output_name_is_refused_and_its_target_untouched(tmp_path, via):
    db, out = str(tmp_path / "l.db"), tmp_path / "all.jsonl"
    _ledger_with_runs(db, 1)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, out)
    before = _events(db)
    if via == "cli":
        res = invoke("--db", db, "export", "--all", "-o", str(out))
        assert res.exit_code == 2, res.output
        assert "symbolic link" in res.output and "Traceback" not in res.output
    else:
        with Ledger(db) as lg, pytest.raises(InvalidInput) as info:
            lg.export_to(str(out))
        assert info.value.field == "output" and "symbolic link" in info.value.message
    assert victim.read_text() == "precious\n"
    assert os.path.islink(out) and os.readlink(out) == str(victim)
    assert _files(tmp_path) == {"l.db", "all.jsonl", "victim.txt"}
    assert _events(db) == before


def test_a_device_or_directory_as_output_is_refused(tmp_path):
    """Renaming over /dev/null would replace the device with a file (as root)."""
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 1)
    for target, words in ((os.devnull, "not a regular file"), (str(tmp_path), "directory"),
                          (str(tmp_path / "missing" / "x.jsonl"), "does not exist")):
        res = invoke("--db", db, "export", "--all", "-o", target)
        assert res.exit_code == 2 and words in res.output, (target, res.output)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_no_copy_is_written_over_the_ledger_or_its_wal(tmp_path):
    """Replacing the ledger with its export, or its WAL with anything, loses the ledger or
    every commit still in the WAL: export, backup and head --write all refuse it."""
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 2)
    holder = Ledger(db)  # keeps the WAL (with the last commits) in place while others write
    try:
        before = _events(db)
        for args in (["export", "--all", "-o", db], ["export", "--all", "-o", db + "-wal"],
                     ["backup", db + "-wal"], ["head", "--write", db + "-shm"],
                     ["export", "--all", "-o", os.path.join(str(tmp_path), ".", "l.db")]):
            res = invoke("--db", db, *args)
            assert res.exit_code == 2 and "the ledger itself or one of its files" in res.output, (args, res.output)
        with pytest.raises(InvalidInput):
            holder.export_to(db + "-journal")
        assert _events(db) == before
    finally:
        holder.close()
    assert _events(db) == before


def test_a_failed_export_leaves_the_old_file_and_no_temporary(tmp_path):
    db, out = str(tmp_path / "l.db"), tmp_path / "all.jsonl"
    _ledger_with_runs(db, 1)
    out.write_text("the previous export\n")
    res = invoke("--db", db, "export", "no-such-run", "-o", str(out))
    assert res.exit_code == 1, res.output
    assert out.read_text() == "the previous export\n"
    assert _files(tmp_path) == {"l.db", "all.jsonl"}


# --- backups ------------------------------------------------------------------------------


def test_commits_still_in_the_wal_are_in_the_backup_but_not_in_a_file_copy(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:  # stays open: nothing is checkpointed, every commit is in the WAL
        for i in range(5):
            lg.open(run_id=f"r{i}", goal="g", target="t", owner="alice")
        assert os.path.getsize(db + "-wal") > 0
        last = lg.store.last_position()
        shutil.copy(db, tmp_path / "copied.db")  # what the old advice amounted to
        res = invoke("--db", db, "backup", str(tmp_path / "b.db"), "--json")
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        head = lg.ledger_head_digest()
    assert doc["positions"] == last and doc["head"] == head and doc["runs"] == 5
    assert doc["path"] == str(tmp_path / "b.db") and doc["bytes"] == os.path.getsize(tmp_path / "b.db")
    assert stat.S_IMODE(os.stat(tmp_path / "b.db").st_mode) == stat.S_IMODE(os.stat(db).st_mode)
    assert not os.path.exists(str(tmp_path / "b.db") + "-wal"), "a backup is one self-contained file"
    conn = sqlite3.connect(tmp_path / "copied.db")
    try:
        copied = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    assert copied == 0 < last, "demonstration: the file copy misses every commit still in the WAL"
    with Ledger(str(tmp_path / "b.db")) as b:
        assert b.store.last_position() == last and b.verify(expect_head=head) == [] and b.check() == []
    assert _files(tmp_path) >= {"b.db"} and not any(n.startswith(".b.db") for n in _files(tmp_path))


WRITER = """
import sys, time
from handoff import Ledger
lg = Ledger(sys.argv[1])
i = 0
while True:
    lg.open(run_id=f"w{i}", goal="g", target="t", owner=f"o{i % 50}")
    i += 1
"""


#: How long the writer process may take to show each append the test waits for (a busy
#: machine starts a Python process slowly); polls of the ledger's head are a small share of it.
WRITER_TIMEOUT_S = 120.0
POLL_S = WRITER_TIMEOUT_S / 2000


def _last_position(db: str) -> int:
    with Ledger(db, readonly=True) as lg:
        return lg.store.last_position()


def _wait_for_appends_past(db: str, position: int, writer: subprocess.Popen, deadline: float) -> None:
    """Until the writer has appended past ``position``: a backup then has something new to
    see, however slowly the writer started (never a guess at how long that takes)."""
    while _last_position(db) <= position:
        assert writer.poll() is None, f"the writer exited ({writer.returncode}) before appending"
        assert time.monotonic() < deadline, f"the writer appended nothing past position {position}"
        time.sleep(POLL_S)


def test_a_backup_taken_while_a_writer_process_appends_is_consistent(tmp_path, evidence):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 1)
    start = _last_position(db)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, db], cwd=ROOT)
    try:
        seen: list[int] = []
        deadline = time.monotonic() + WRITER_TIMEOUT_S
        while len(seen) < 4:
            _wait_for_appends_past(db, seen[-1] if seen else start, writer, deadline)
            dest = str(tmp_path / f"b{len(seen)}.db")
            with Ledger(db) as lg:
                doc = lg.backup(dest)
            with Ledger(dest, readonly=True) as b:
                assert b.verify() == [] and b.check() == []
                assert b.verify(expect_head=doc["head"]) == []
            seen.append(doc["positions"])
        _wait_for_appends_past(db, seen[-1], writer, deadline)
        assert writer.poll() is None, "the writer kept running throughout"
    finally:
        writer.kill()
        writer.wait()
    assert start < seen[0], (start, seen)
    assert len(seen) == 4 and seen == sorted(set(seen)), seen  # each backup saw the writer append more
    with Ledger(db) as lg:  # each backup is a prefix of the ledger as it grew
        for i in range(4):
            with Ledger(str(tmp_path / f"b{i}.db"), readonly=True) as b:
                assert lg.verify(expect_head=b.ledger_head_digest()) == []
    evidence.add("copies.backup_under_writer", positions_backed_up=seen)


def test_backup_refusals_write_nothing(tmp_path):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 1)
    victim = tmp_path / "victim.db"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "link.db")
    (tmp_path / "exists.db").write_text("old\n")
    (tmp_path / "live.db-wal").write_text("")
    before, names = _events(db), _files(tmp_path)
    cases = {
        "link.db": "symbolic link",
        "exists.db": "already exists",
        "l.db": "the ledger itself",
        "l.db-wal": "the ledger itself",
        "live.db": "-wal exists beside",
    }
    for name, words in cases.items():
        res = invoke("--db", db, "backup", str(tmp_path / name))
        assert res.exit_code == 2 and words in res.output, (name, res.output)
    for name in ("l.db", "exists.db"):  # --replace overwrites neither the ledger nor a non-database
        with Ledger(db) as lg, pytest.raises(InvalidInput) as info:
            lg.backup(str(tmp_path / name), replace=True)
        assert info.value.field == "dest"
    assert "not an SQLite database" in info.value.message
    assert victim.read_text() == "precious\n" and (tmp_path / "exists.db").read_text() == "old\n"
    assert _events(db) == before and _files(tmp_path) == names
    assert invoke("--db", db, "backup", str(tmp_path / "first.db")).exit_code == 0
    with Ledger(db) as lg:
        lg.open(run_id="later", goal="g", target="t", owner="alice")
    res = invoke("--db", db, "backup", str(tmp_path / "first.db"), "--replace")
    assert res.exit_code == 0, res.output
    with Ledger(str(tmp_path / "first.db")) as b:
        assert b.verify() == [] and b.store.count_runs() == 2


# --- anchors: what the file alone cannot show ------------------------------------------------


def _cut_tail(db: str, keep: int) -> None:
    """Delete every event after position ``keep`` and fix the heads rows by copying values
    from the log: nothing is recomputed (no hash), and the triggers are put back."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    for name in TRIGGERS:
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DELETE FROM events WHERE position > ?", (keep,))
    conn.execute("DELETE FROM heads WHERE run_id NOT IN (SELECT run_id FROM events)")
    for (run,) in conn.execute("SELECT run_id FROM heads").fetchall():
        seq, h, pos = conn.execute("SELECT seq, hash, position FROM events WHERE run_id=? ORDER BY seq DESC LIMIT 1",
                                   (run,)).fetchone()
        conn.execute("UPDATE heads SET last_seq=?, last_hash=?, last_position=? WHERE run_id=?", (seq, h, pos, run))
    for sql in APPEND_ONLY_TRIGGERS.values():
        conn.execute(sql)
    conn.execute("COMMIT")
    conn.close()


def test_a_cut_tail_passes_verify_alone_and_is_caught_by_expect_head(tmp_path, evidence):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 3)  # positions: r0 1-3, r1 4-6, r2 7-9
    kept = invoke("--db", db, "head")
    assert kept.exit_code == 0
    digest = kept.stdout.strip()
    assert digest.startswith("9:") and len(digest) == 2 + 64
    early = invoke("--db", db, "head", "--json")
    assert json.loads(early.stdout)["position"] == 9
    _cut_tail(db, 6)  # r2 disappears, with its heads row
    assert invoke("--db", db, "rebuild").exit_code == 0  # the projections are refolded too
    alone = invoke("--db", db, "verify")
    assert alone.exit_code == 0, "demonstration: from inside the file nothing disagrees"
    before = _events(db)
    res = invoke("--db", db, "verify", "--expect-head", digest)
    assert res.exit_code == 4 and "head_anchor" in res.output and "cut from its tail" in res.output
    doc = json.loads(invoke("--db", db, "verify", "--expect-head", digest, "--json").stdout)
    assert doc["ok"] is False and doc["anchors"] == 1
    assert [(p["kind"], p["position"]) for p in doc["problems"]] == [("head_anchor", 9)]
    with Ledger(db) as lg:
        assert [p.kind for p in lg.verify(expect_head=digest)] == ["head_anchor"]
        assert lg.verify(expect_head=lg.ledger_head_digest()) == []
    assert _events(db) == before
    evidence.add("copies.cut_tail", verify_alone_exit=alone.exit_code, with_anchor_exit=res.exit_code)


def test_expect_head_accepts_growth_and_catches_rewritten_history(tmp_path):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 2)
    with Ledger(db) as lg:
        digest = lg.ledger_head_digest()
        lg.open(run_id="later", goal="g", target="t", owner="alice")
        assert lg.verify(expect_head=digest) == []
        assert lg.verify("r0", expect_head=digest) == []
    # Rewrite the ledger-wide chain from position 1 (keyless: anyone can), keeping every
    # per-run hash: the anchored position's global hash changes.
    from handoff.ledger.sqlite import global_link

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    rows = conn.execute("SELECT position, hash FROM events ORDER BY position").fetchall()
    prev = b"\x01" * 32
    for pos, h in rows:
        prev = global_link(prev, pos, h)
        conn.execute("UPDATE events SET global_hash=? WHERE position=?", (prev, pos))
    conn.execute(APPEND_ONLY_TRIGGERS["events_no_update"])
    conn.close()
    with Ledger(db) as lg:
        problems = lg.verify(expect_head=digest)
    assert [p.kind for p in problems] == ["global_chain", "head_anchor"]
    assert "no longer carries the hash" in problems[1].message


@pytest.mark.parametrize("bad", ["", "9", "x:" + "0" * 64, "9:" + "0" * 63, "9:" + "g" * 64, "-1:" + "0" * 64])
def test_a_malformed_digest_is_refused_with_exit_2(tmp_path, bad):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 1)
    res = invoke("--db", db, "verify", "--expect-head", bad)
    assert res.exit_code == 2 and "head digest" in res.output and "Traceback" not in res.output
    with Ledger(db) as lg, pytest.raises(InvalidInput) as info:
        lg.verify(expect_head=bad)
    assert info.value.field == "expect_head"


def test_head_write_records_and_refuses_to_launder_a_cut_tail(tmp_path):
    db, anchor = str(tmp_path / "l.db"), tmp_path / "audit" / "handoff.head"
    anchor.parent.mkdir()
    _ledger_with_runs(db, 3)
    doc = json.loads(invoke("--db", db, "head", "--write", str(anchor), "--json").stdout)
    assert doc["previous"] is None and doc["path"] == str(anchor)
    assert anchor.read_text() == doc["digest"] + "\n"
    assert stat.S_IMODE(os.stat(anchor).st_mode) == stat.S_IMODE(os.stat(db).st_mode)
    with Ledger(db) as lg:
        lg.open(run_id="later", goal="g", target="t", owner="alice")
    again = json.loads(invoke("--db", db, "head", "--write", str(anchor), "--json").stdout)
    assert again["previous"] == doc["digest"] and again["position"] == doc["position"] + 1
    _cut_tail(db, 6)
    res = invoke("--db", db, "head", "--write", str(anchor))
    assert res.exit_code == 4 and "no longer contains" in res.output
    assert anchor.read_text() == again["digest"] + "\n", "the anchor is left as it was"
    with Ledger(db) as lg, pytest.raises(HeadAnchorBroken):
        lg.write_head(str(anchor))
    assert os.listdir(anchor.parent) == ["handoff.head"]
    # Something that is not an anchor is not overwritten.
    other = tmp_path / "notes.txt"
    other.write_text("line one\nline two\n")
    res = invoke("--db", db, "head", "--write", str(other))
    assert res.exit_code == 2 and other.read_text() == "line one\nline two\n"


# --- verify RUN sees ledger-wide damage; triggers ------------------------------------------------


def test_verify_run_catches_a_ledger_wide_problem(tmp_path):
    """Before: verify RUN walked only the run, so another run's hole passed unnoticed."""
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 3)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute("DELETE FROM events WHERE position = 5")  # r1 seq 2
    conn.execute(APPEND_ONLY_TRIGGERS["events_no_delete"])
    conn.close()
    res = invoke("--db", db, "verify", "r0", "--json")
    assert res.exit_code == 4, res.output
    doc = json.loads(res.stdout)
    kinds = [p["kind"] for p in doc["problems"]]
    assert kinds == ["position_gap", "global_chain"], doc
    assert doc["problems"][0]["position"] == 6 and "from 4 to 6" in doc["problems"][0]["message"]
    assert doc["skipped"] and any("projections" in s for s in doc["skipped"])
    text = invoke("--db", db, "verify", "r2")
    assert text.exit_code == 4 and "not checked:" in text.output


def test_verify_run_says_what_it_skipped_when_all_is_well(tmp_path):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 2)
    res = invoke("--db", db, "verify", "r0")
    assert res.exit_code == 0 and "not checked: the hash chains, heads and lease fences of the other runs" in res.output
    assert json.loads(invoke("--db", db, "verify", "--json").stdout)["skipped"] == []


@pytest.mark.parametrize("change", ["drop", "alter"])
@pytest.mark.parametrize("name", TRIGGERS)
def test_a_dropped_or_altered_trigger_is_reported_by_verify_and_doctor(tmp_path, name, change):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 1)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"DROP TRIGGER {name}")
    if change == "alter":  # still there by name, refusing nothing
        conn.execute(f"CREATE TRIGGER {name} BEFORE DELETE ON events WHEN 0 BEGIN SELECT 1; END")
    conn.close()
    before = _events(db)
    kind = "trigger_missing" if change == "drop" else "trigger_altered"
    with Ledger(db) as lg:
        assert [(p.kind, p.run_id) for p in lg.verify()] == [(kind, None)]
        assert [p.kind for p in lg.verify("r0")] == [kind]
        assert [p["kind"] for p in lg.doctor()["problems"]] == [kind]
    res = invoke("--db", db, "verify", "--json")
    assert res.exit_code == 4 and name in json.loads(res.stdout)["problems"][0]["message"]
    doc = invoke("--db", db, "doctor", "--json")
    assert doc.exit_code == 4 and json.loads(doc.stdout)["problems"][0]["kind"] == kind
    text = invoke("--db", db, "doctor")
    assert text.exit_code == 4 and "PROBLEM" in text.output and name in text.output
    assert _events(db) == before
    # The real executable agrees.
    assert handoff("doctor", db=db).returncode == 4


def test_doctor_and_verify_are_quiet_about_intact_triggers(tmp_path):
    db = str(tmp_path / "l.db")
    _ledger_with_runs(db, 1)
    doc = invoke("--db", db, "doctor", "--json")
    assert doc.exit_code == 0 and json.loads(doc.stdout)["problems"] == []
    text = invoke("--db", db, "doctor")
    assert text.exit_code == 0 and "ok: the three triggers are in place" in text.output
    assert json.loads(invoke("--db", db, "verify", "--json").stdout)["problems"] == []
