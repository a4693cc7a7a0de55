"""Tamper evidence: an attacker with write access to the SQLite file, and what verify sees.

The attacker drops the append-only triggers (anyone who can write the file can), then
edits, deletes, reorders, inserts or re-chains rows with plain sqlite3, and puts the
triggers back to cover its tracks (a trigger left missing is reported by itself:
tests/faults/test_copies.py). For every case
``Ledger.verify()`` and ``handoff verify`` (exit 4) must report it, naming the first bad
position. Two cases cannot be seen from inside the file, and the tests say so:

- a truncated tail whose ``heads`` row was fixed to match, and
- a run re-chained from an edit onwards with its ``heads`` row fixed

since every hash is a plain sha256 anyone can recompute. The remedy is a head digest the
user keeps outside the file (``export_head_digest`` below, or the last line of ``handoff
export RUN``): comparing it later catches both. What stays undetectable even then is an
attacker *appending* well-formed events after the digest was taken: the chain is
integrity, not authentication.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from handoff.facade import Ledger
from handoff.ledger.sqlite import APPEND_ONLY_TRIGGERS
from handoff.ledger.store import GENESIS_HASH, chain_hash

from tests.support import invoke

from .conftest import handoff

RUNS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    """A closed ledger (WAL folded into the file) with three runs whose events interleave."""
    d = tmp_path_factory.mktemp("tamper")
    db = str(d / "base.db")
    art = d / "result.md"
    art.write_text("the result\n")
    with Ledger(db) as lg:
        leases = {}
        for r in RUNS:
            lg.open(run_id=r, goal=f"goal {r}", target="chat:#ops", owner="alice")
        for r in RUNS:
            leases[r] = lg.claim(r, f"w-{r}")
        for step in ("planning", "executing"):
            for r in RUNS:
                lg.transition(r, leases[r], step, worker=f"w-{r}")
        for i in range(3):
            for r in RUNS:
                lg.progress(r, leases[r], "tool_outcome", f"{r} step {i}", key=f"{r}-{i}", worker=f"w-{r}")
        lg.artifact("alpha", leases["alpha"], str(art), worker="w-alpha")
        # A beat with attrs of its own is logged (a bare one would be kept beside the log),
        # so beta's log ends with a heartbeat event at seq 8, as the cases below expect.
        beat = lg.heartbeat("beta", leases["beta"], worker="w-beta", attrs={"phase": "waiting"})
        assert beat.result.outcome == "committed" and beat.result.last_seq == 8, beat.result
        assert lg.verify() == [] and lg.check() == []
        pos = {(r.run_id, r.seq): r.position for r in lg.store.read_all()}
        last = {h.run_id: h.last_seq for h in lg.store.list_runs()}
    return {"db": db, "dir": d, "pos": pos, "last": last, "max_pos": max(pos.values()), "leases": leases}


def attack(base: dict[str, Any], name: str, *sql: str | tuple[str, tuple], rechain_global: bool = False) -> str:
    """A copy of the ledger, tampered with raw sqlite3 after dropping the triggers.

    ``rechain_global``: the attacker also recomputes the ledger-wide chain (it is keyless,
    so anyone with the file can), leaving only an outside digest to notice.
    """
    path = str(base["dir"] / f"{name}.db")
    shutil.copy(base["db"], path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for trig in ("events_no_update", "events_no_overwrite", "events_no_delete"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trig}")
    for stmt in sql:
        if isinstance(stmt, tuple):
            conn.execute(*stmt)
        else:
            conn.execute(stmt)
    if rechain_global:
        from handoff.ledger.sqlite import global_link
        from handoff.ledger.store import GENESIS_HASH

        prev = GENESIS_HASH
        for position, h in conn.execute("SELECT position, hash FROM events ORDER BY position").fetchall():
            prev = global_link(prev, position, h)
            conn.execute("UPDATE events SET global_hash=? WHERE position=?", (prev, position))
    for trig in APPEND_ONLY_TRIGGERS.values():
        conn.execute(trig)
    conn.execute("COMMIT")
    conn.close()
    return path


def row(path: str, run: str, seq: int) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return dict(conn.execute("SELECT * FROM events WHERE run_id=? AND seq=?", (run, seq)).fetchone())
    finally:
        conn.close()


def rehash(r: dict[str, Any], prev: bytes) -> bytes:
    return chain_hash(prev, r["run_id"], r["seq"], r["type"], r["actor"], r["lease"], r["idem_key"],
                      r["recorded_us"], r["schema_version"], r["payload"])


def rechain_sql(path: str, run: str, from_seq: int, *, fix_heads: bool) -> list[tuple[str, tuple]]:
    """The UPDATEs that re-chain ``run`` from ``from_seq`` (whose row is already edited)."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM events WHERE run_id=? ORDER BY seq", (run,))]
    conn.close()
    stmts: list[tuple[str, tuple]] = []
    prev = GENESIS_HASH
    for r in rows:
        if r["seq"] >= from_seq:
            h = rehash(r, prev)
            stmts.append(("UPDATE events SET prev_hash=?, hash=? WHERE position=?", (prev, h, r["position"])))
            r["hash"] = h
        prev = r["hash"]
    if fix_heads:
        stmts.append(("UPDATE heads SET last_hash=? WHERE run_id=?", (prev, run)))
    return stmts


def verify_cli(path: str) -> tuple[int, dict[str, Any]]:
    res = invoke("--db", path, "verify", "--json", env={"HANDOFF_DB": None})
    return res.exit_code, (json.loads(res.stdout) if res.stdout.strip() else {"stderr": res.stderr})


# --- the detectable cases ------------------------------------------------------------


def _edit(col: str, value: Any, run: str = "alpha", seq: int = 7) -> Callable[[dict, str], list]:
    def make(base: dict, path: str) -> list:
        return [(f"UPDATE events SET {col}=? WHERE run_id=? AND seq=?", (value, run, seq))]
    return make


def _payload_edit(base: dict, path: str) -> list:
    r = row(base["db"], "alpha", 7)
    return [("UPDATE events SET payload=? WHERE position=?",
             (r["payload"].replace(b"alpha step 2", b"alpha step X"), r["position"]))]


def _rehash_one(base: dict, path: str) -> list:
    r = row(base["db"], "alpha", 7)
    r["payload"] = r["payload"].replace(b"alpha step 2", b"alpha step X")
    return [("UPDATE events SET payload=?, hash=? WHERE position=?", (r["payload"], rehash(r, r["prev_hash"]),
                                                                     r["position"]))]


def _swap_rows_within_run(base: dict, path: str) -> list:
    a, b = row(base["db"], "alpha", 7), row(base["db"], "alpha", 8)
    cols = ("seq", "type", "actor", "lease", "idem_key", "idem_digest", "recorded_us", "payload", "prev_hash", "hash")
    sets = ", ".join(f"{c}=?" for c in cols)
    return [("DROP INDEX events_run_seq", ()), ("DROP INDEX events_idem", ()),
            (f"UPDATE events SET {sets} WHERE position=?", (*[b[c] for c in cols], a["position"])),
            (f"UPDATE events SET {sets} WHERE position=?", (*[a[c] for c in cols], b["position"]))]


def _swap_seqs(base: dict, path: str) -> list:
    pa, pb = base["pos"][("beta", 5)], base["pos"][("beta", 6)]
    return [("DROP INDEX events_run_seq", ()),
            ("UPDATE events SET seq=6 WHERE position=?", (pa,)), ("UPDATE events SET seq=5 WHERE position=?", (pb,))]


def _insert_forged_at_end(valid_hash: bool) -> Callable[[dict, str], list]:
    def make(base: dict, path: str) -> list:
        last = row(base["db"], "gamma", base["last"]["gamma"])
        forged = dict(last, seq=last["seq"] + 1, position=base["max_pos"] + 1, idem_key=None, idem_digest=None,
                      payload=b'{"type":"progress_recorded","kind":"tool_outcome","detail":"forged","advances":true}',
                      type="progress_recorded", prev_hash=last["hash"])
        forged["hash"] = rehash(forged, last["hash"]) if valid_hash else b"\x01" * 32
        cols = ", ".join(forged)
        return [(f"INSERT INTO events ({cols}) VALUES ({', '.join('?' * len(forged))})", tuple(forged.values()))]
    return make


def _duplicate_row(base: dict, path: str) -> list:
    r = row(base["db"], "beta", 5)
    r = dict(r, position=base["max_pos"] + 1, idem_key=None)
    return [("DROP INDEX events_run_seq", ()),
            (f"INSERT INTO events ({', '.join(r)}) VALUES ({', '.join('?' * len(r))})", tuple(r.values()))]


def _insert_middle(base: dict, path: str) -> list:
    """A forged event slipped in as alpha's seq 7: later seqs shifted up, new row at the end."""
    r = row(base["db"], "alpha", 7)
    forged = dict(r, position=base["max_pos"] + 1, idem_key=None, idem_digest=None,
                  payload=r["payload"].replace(b"alpha step 2", b"forged step"))
    return [("DROP INDEX events_run_seq", ()), ("DROP INDEX events_idem", ()),
            ("UPDATE events SET seq=seq+1 WHERE run_id='alpha' AND seq>=7", ()),
            (f"INSERT INTO events ({', '.join(forged)}) VALUES ({', '.join('?' * len(forged))})",
             tuple(forged.values()))]


def _rechain_run(base: dict, path: str) -> list:
    r = row(base["db"], "alpha", 7)
    edit = ("UPDATE events SET payload=? WHERE position=?",
            (r["payload"].replace(b"alpha step 2", b"alpha step X"), r["position"]))
    # Compute the re-chain as if the edit were in place.
    tmp = attack(base, "rechain-scratch", edit)
    return [edit, *rechain_sql(tmp, "alpha", 7, fix_heads=False)]


#: name -> (tamper, expected first problem kind, run, seq whose position is named or None)
CASES: dict[str, tuple[Callable[[dict, str], list], str, str, int | None]] = {
    "edit payload": (_payload_edit, "bad_hash", "alpha", 7),
    "payload replaced by garbage": (_edit("payload", b"\xff\x00garbage"), "bad_hash", "alpha", 7),
    "edit type column": (_edit("type", "evidence_recorded"), "bad_hash", "alpha", 7),
    "edit actor (impersonate)": (_edit("actor", "operator:root"), "bad_hash", "alpha", 7),
    "edit lease (launder a stale write)": (_edit("lease", 99), "bad_hash", "alpha", 7),
    "backdate recorded_us": (_edit("recorded_us", 1), "bad_hash", "alpha", 7),
    "edit idempotency key": (_edit("idem_key", "other"), "bad_hash", "alpha", 7),
    "edit schema_version": (_edit("schema_version", 1), "bad_hash", "alpha", 7),
    "edit prev_hash": (_edit("prev_hash", b"\x02" * 32), "broken_link", "alpha", 7),
    "hash stored as text": (_edit("hash", "deadbeef"), "bad_type", "alpha", 7),
    "edit payload and rehash the row": (_rehash_one, "broken_link", "alpha", 8),
    "delete a middle event": (lambda b, p: [("DELETE FROM events WHERE run_id='alpha' AND seq=7", ())],
                              "position_gap", "alpha", 7),
    "delete a run's first event": (lambda b, p: [("DELETE FROM events WHERE run_id='beta' AND seq=1", ())],
                                   "position_gap", "beta", 1),
    "swap two events of a run": (_swap_rows_within_run, "seq_gap", "alpha", 7),
    "swap two seq numbers": (_swap_seqs, "seq_gap", "beta", 5),
    "insert a forged event mid-run": (_insert_middle, "seq_gap", "alpha", 7),
    "append a forged event, bad hash": (_insert_forged_at_end(False), "bad_hash", "gamma", None),
    "duplicate an event": (_duplicate_row, "seq_gap", "beta", None),
}
#: Cases verify names by run and seq (no position): the heads table disagrees with the log.
HEAD_CASES: dict[str, tuple[Callable[[dict, str], list], str, int]] = {
    "append a forged event, valid hash, heads untouched": (_insert_forged_at_end(True), "gamma", 8),
    "delete the last event, heads untouched": (
        lambda b, p: [("DELETE FROM events WHERE run_id='beta' AND seq=8", ())], "beta", 7),
    "re-chain a run after an edit, heads untouched": (_rechain_run, "alpha", 8),
    "heads row edited (last_seq)": (lambda b, p: [("UPDATE heads SET last_seq=3 WHERE run_id='beta'", ())],
                                   "beta", 8),
    "heads row deleted": (lambda b, p: [("DELETE FROM heads WHERE run_id='beta'", ())], "beta", 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tampered_row_is_detected_at_its_position(base, name, evidence):
    make, kind, run, seq = CASES[name]
    path = attack(base, name.replace(" ", "_").replace("(", "").replace(")", ""), *make(base, ""))
    with Ledger(path) as lg:
        problems = lg.verify()
    assert problems, f"{name}: verify found nothing"
    first = problems[0]
    want_pos = base["pos"][(run, seq)] if seq is not None else base["max_pos"] + 1
    if kind == "position_gap":
        # The hole itself is named: positions jump over the deleted one.
        deleted = base["pos"][(run, seq)]
        assert first.kind in ("position_gap", "seq_gap"), problems
        holes = [p for p in problems if p.kind == "position_gap"]
        if deleted == 1:  # nothing before it: the run's next event shows the gap
            assert any(p.kind == "seq_gap" and p.run_id == run for p in problems), problems
        else:
            assert holes and holes[0].position == deleted + 1 and f"from {deleted - 1} to {deleted + 1}" in holes[0].message
        shown = holes[0].position if holes else first.position
    else:
        assert (first.kind, first.run_id, first.position) == (kind, run, want_pos), problems
        shown = first.position
    code, doc = verify_cli(path)
    assert code == 4 and doc["ok"] is False, doc
    assert doc["problems"][0]["position"] == problems[0].position
    evidence.add("tamper.detected", case=name, first_problem=first.kind, position=shown, run=first.run_id,
                 seq=first.seq, cli_exit=code, problems=len(problems))


@pytest.mark.parametrize("name", list(HEAD_CASES))
def test_log_and_heads_disagreeing_is_detected(base, name, evidence):
    make, run, seq = HEAD_CASES[name]
    path = attack(base, name.replace(" ", "_").replace(",", ""), *make(base, ""))
    with Ledger(path) as lg:
        problems = lg.verify()
    # A row added or re-chained behind the store breaks the ledger-wide chain at its
    # position (named first); the heads table disagreeing with the log is reported too.
    assert problems and problems[0].kind in ("head_mismatch", "global_chain"), problems
    assert any(p.kind == "head_mismatch" and (p.run_id, p.seq) == (run, seq) for p in problems) or (
        problems[0].kind == "global_chain" and problems[0].run_id == run), problems
    code, doc = verify_cli(path)
    assert code == 4 and doc["problems"][0]["kind"] == problems[0].kind
    evidence.add("tamper.detected", case=name, first_problem=problems[0].kind, position=problems[0].position, run=run,
                 seq=seq, cli_exit=code, problems=len(problems))


def test_undecodable_payload_is_reported_by_the_cli_not_a_traceback(base):
    path = attack(base, "garbage-cli", *_edit("payload", b"\xff\x00garbage")(base, ""))
    codes = {}
    for args in (["verify", "--json"], ["check"], ["log", "alpha"]):
        res = invoke("--db", path, *args)
        assert "Traceback" not in res.output and not (res.exception and not isinstance(res.exception, SystemExit))
        codes[args[0]] = res.exit_code
    assert codes == {"verify": 4, "check": 4, "log": 3}


def test_real_handoff_verify_names_the_position(base):
    path = attack(base, "real-cli", *_payload_edit(base, ""))
    r = handoff("verify", db=path)
    assert r.returncode == 4
    pos = str(base["pos"][("alpha", 7)])
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("bad_hash"))
    assert line.split()[1:4] == ["alpha", "7", pos], r.stdout


def test_tampered_projection_row_is_caught_by_check(base, evidence):
    """Projections are derived, not evidence; check (and whole-ledger verify) still notice."""
    path = attack(base, "projection", "UPDATE checkpoints SET state='delivered' WHERE run_id='beta'")
    with Ledger(path) as lg:
        assert lg.verify() == []
        diffs = lg.check()
    assert diffs and diffs[0]["run_id"] == "beta"
    code, doc = verify_cli(path)
    assert code == 4 and doc["projections"]
    evidence.add("tamper.detected", case="projection row edited", first_problem="projection difference",
                 position=None, run="beta", seq=None, cli_exit=code, problems=len(diffs))


def test_heads_lease_edited_is_detected(base):
    path = attack(base, "heads-lease", "UPDATE heads SET lease=7, lease_holder='mallory' WHERE run_id='beta'")
    with Ledger(path) as lg:
        problems = lg.verify()
    assert problems and problems[0].run_id == "beta"


def test_heads_token_digest_swapped_for_an_attackers_is_detected(base):
    """Mallory puts the digest of a secret she drew into beta's heads row: her token is now
    accepted for beta's live lease (the file is hers to write), and verify names the row."""
    from handoff.ledger.store import lease_digest

    secret = "M" * 43
    path = attack(base, "heads-digest",
                  f"UPDATE heads SET lease_digest='{lease_digest(secret)}' WHERE run_id='beta'")
    with Ledger(path) as lg:
        lease = lg.checkpoint("beta").lease
        assert lg.progress("beta", f"{lease}.{secret}", "tool_outcome", "forged", worker="mallory")
        problems = [p for p in lg.verify() if p.kind == "fence_mismatch"]
    assert [p.run_id for p in problems] == ["beta"] and "token digest" in problems[0].message


def test_events_of_two_runs_swapped_in_global_order_is_detected(base):
    pa, pb = base["pos"][("alpha", 7)], base["pos"][("beta", 7)]
    assert pb == pa + 1
    path = attack(base, "cross-run-swap", ("UPDATE events SET position=-1 WHERE position=?", (pa,)),
                  ("UPDATE events SET position=? WHERE position=?", (pa, pb)),
                  ("UPDATE events SET position=? WHERE position=-1", (pb,)))
    with Ledger(path) as lg:
        assert lg.store.read_all().__next__()  # still readable
        problems = lg.verify()
    assert problems


# --- what the file alone cannot show, and the remedy ------------------------------------


def export_head_digest(lg: Ledger) -> dict[str, dict[str, Any]]:
    """What a user keeps outside the file: each run's last seq and last hash."""
    return {h.run_id: {"last_seq": h.last_seq, "last_hash": h.last_hash.hex()} for h in lg.store.list_runs()}


def compare_head_digest(kept: dict[str, dict[str, Any]], lg: Ledger) -> list[str]:
    """Problems between a kept digest and the ledger now. Growth since is fine; the event at
    each kept seq must still be there with the kept hash (chains make that cover the prefix)."""
    out = []
    for run, d in kept.items():
        head = lg.store.head(run)
        if head is None:
            out.append(f"{run}: gone")
            continue
        if head.last_seq < d["last_seq"]:
            out.append(f"{run}: ends at seq {head.last_seq}, the digest says {d['last_seq']} (truncated)")
            continue
        rec = next(iter(lg.store.read_run(run, after_seq=d["last_seq"] - 1, until_seq=d["last_seq"])), None)
        if rec is None or rec.hash.hex() != d["last_hash"]:
            out.append(f"{run}: seq {d['last_seq']} no longer has the digest's hash (rewritten)")
    return out


def test_truncated_tail_with_fixed_heads_needs_an_outside_digest(base, evidence):
    with Ledger(base["db"], readonly=True) as lg:
        kept = export_head_digest(lg)
        status_seq = lg.status("gamma")["last_seq"]
    assert kept["gamma"]["last_seq"] == status_seq  # the same figure `handoff status --json` prints
    prev = row(base["db"], "gamma", 6)
    gone = base["pos"][("gamma", 7)]
    # Delete gamma's last event, close the hole in the global positions (they are outside
    # every hash), and make the heads table agree.
    path = attack(base, "truncated",
                  "DELETE FROM events WHERE run_id='gamma' AND seq>=7",
                  ("UPDATE events SET position=position-1 WHERE position>?", (gone,)),
                  ("UPDATE heads SET last_position=last_position-1 WHERE last_position>?", (gone,)),
                  ("UPDATE heads SET last_seq=6, last_hash=?, last_position=? WHERE run_id='gamma'",
                   (prev["hash"], prev["position"])),
                  rechain_global=True)
    with Ledger(path) as lg:
        inside = lg.verify()
        stale_projections = len(lg.check())
        lg.rebuild()  # the attacker refolds the projections too (anyone can: 'handoff rebuild')
        found = compare_head_digest(kept, lg)
    code, _ = verify_cli(path)
    assert inside == [], "demonstration: from inside the file the log looks whole"
    assert stale_projections > 0 and code == 0, "...and after a rebuild nothing inside the file disagrees"
    assert found == ["gamma: ends at seq 6, the digest says 7 (truncated)"]
    evidence.add("tamper.undetectable_inside", case="truncated tail, heads fixed", verify_problems=len(inside),
                 projection_differences_before_rebuild=stale_projections, cli_exit_after_rebuild=code,
                 outside_digest=found)


def test_rechained_run_with_fixed_heads_needs_an_outside_digest(base, evidence):
    with Ledger(base["db"], readonly=True) as lg:
        kept = export_head_digest(lg)
    r = row(base["db"], "alpha", 7)
    edit = ("UPDATE events SET payload=? WHERE position=?",
            (r["payload"].replace(b"alpha step 2", b"alpha step X"), r["position"]))
    tmp = attack(base, "rechain-fixed-scratch", edit)
    path = attack(base, "rechain-fixed", edit, *rechain_sql(tmp, "alpha", 7, fix_heads=True), rechain_global=True)
    with Ledger(path) as lg:
        inside = lg.verify()
        found = compare_head_digest(kept, lg)
        diffs = lg.check()
    code, _ = verify_cli(path)
    assert inside == [] and code == 0, "demonstration: a consistent re-chain passes verify"
    assert found == ["alpha: seq 8 no longer has the digest's hash (rewritten)"]
    evidence.add("tamper.undetectable_inside", case="run re-chained after an edit, heads fixed",
                 verify_problems=len(inside), projection_differences=len(diffs), cli_exit=code,
                 outside_digest=found)


def test_head_digest_from_the_cli_export_catches_truncation(base, tmp_path, evidence):
    """The same remedy with the CLI only: the last exported line of each run is its digest."""
    path = str(tmp_path / "l.db")
    shutil.copy(base["db"], path)
    exp = handoff("export", "--all", db=path)
    assert exp.returncode == 0, exp.stderr
    kept = {}
    for line in exp.stdout.splitlines():
        e = json.loads(line)
        kept[e["run_id"]] = {"last_seq": e["seq"], "last_hash": e["hash"]}
    with Ledger(path) as lg:  # legitimate growth after the digest is not a problem
        lg.progress("beta", base["leases"]["beta"], "tool_outcome", "later", worker="w-beta")
        assert compare_head_digest(kept, lg) == []
    prev = row(path, "beta", 7)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.execute("DELETE FROM events WHERE run_id='beta' AND seq>=8")
    conn.execute("UPDATE heads SET last_seq=7, last_hash=?, last_position=? WHERE run_id='beta'",
                 (prev["hash"], prev["position"]))
    conn.execute(APPEND_ONLY_TRIGGERS["events_no_delete"])
    conn.close()
    with Ledger(path) as lg:
        assert lg.verify() == []
        found = compare_head_digest(kept, lg)
    assert found == ["beta: ends at seq 7, the digest says 8 (truncated)"]
    evidence.add("tamper.undetectable_inside", case="truncated tail, digest from 'handoff export'",
                 verify_problems=0, outside_digest=found)
