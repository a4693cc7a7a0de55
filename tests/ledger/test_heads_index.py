"""Runs listed a page at a time on the ``heads_first`` index, and ledgers made before the
index existed: given it on a writable open, still listed whole on a read-only one."""

from __future__ import annotations

import os
import sqlite3

from handoff.ledger.sqlite import sqlite_store
from handoff.ledger.sqlite import SqliteStore
from tests.ledger.conformance import W1, step


def _order(path) -> list[str]:
    conn = sqlite3.connect(os.fspath(path))
    try:
        return [r[0] for r in conn.execute("SELECT run_id FROM heads ORDER BY first_position")]
    finally:
        conn.close()


def _indexes(path) -> set[str]:
    conn = sqlite3.connect(os.fspath(path))
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    finally:
        conn.close()


def _ledger_then_edit(path, names: list[str], *sql: str) -> None:
    """A ledger with one event in each named run, then edited behind the store."""
    s = SqliteStore(path)
    for name in names:
        s.append(name, [step(1)], actor=W1)
    s.close()
    conn = sqlite3.connect(os.fspath(path))
    for stmt in sql:
        conn.execute(stmt)
    conn.commit()
    conn.close()


def test_list_runs_pages_in_first_appearance_order(db_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "PAGE", 3)
    s = SqliteStore(db_path)
    # Ids out of alphabetical order, runs interleaved, later appends to early runs.
    names = ["m", "c", "x", "a", "q", "b", "z", "k"]
    for i, name in enumerate(names):
        s.append(name, [step(1)], actor=W1)
        s.append(names[i // 2], [step(2 + i)], actor=W1)
    assert [h.run_id for h in s.list_runs()] == names == _order(db_path)
    assert s.count_runs() == len(names)
    s.close()


def test_a_run_added_between_pages_is_listed_once(db_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "PAGE", 2)
    s = SqliteStore(db_path)
    for name in ["a", "b", "c"]:
        s.append(name, [step(1)], actor=W1)
    seen = []
    for head in s.list_runs():
        seen.append(head.run_id)
        if head.run_id == "a":
            s.append("d", [step(1)], actor=W1)  # a write between pages, as a rebuild does
            s.append("b", [step(2)], actor=W1)
    assert seen == ["a", "b", "c", "d"]
    s.close()


def test_an_older_ledger_gets_the_index_on_a_writable_open_only(db_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "PAGE", 2)
    # As a ledger written before the index existed:
    _ledger_then_edit(db_path, ["p", "e", "g", "a", "r"], "DROP INDEX heads_first")
    before = open(db_path, "rb").read()

    with SqliteStore(db_path, readonly=True) as ro:
        assert [h.run_id for h in ro.list_runs()] == ["p", "e", "g", "a", "r"]
    assert "heads_first" not in _indexes(db_path)
    assert open(db_path, "rb").read() == before, "a read-only open changed the file"

    with SqliteStore(db_path) as rw:
        assert "heads_first" in _indexes(db_path)
        assert [h.run_id for h in rw.list_runs()] == ["p", "e", "g", "a", "r"]
        assert rw.verify() == [] and rw.integrity_check() == "ok"


def test_the_head_a_write_hands_its_hooks_is_the_stored_head(db_path, tmp_path):
    """Hooks and the fold cache get the head the write left, built from what it wrote
    instead of read back: it must equal the stored one, hash included."""
    from handoff.ledger import events as ev
    from handoff.ledger.store import Decision
    from handoff.reducers.checkpoint import AGGREGATE
    from tests.ledger.conformance import OWNER

    seen = []
    s = SqliteStore(db_path)
    s.attach(AGGREGATE, lambda conn, run_id, state, last_position: seen.append((run_id, last_position)))

    def cached(run_id):
        (_, seq, h, _), = [v for (_, r), v in s._cache.items() if r == run_id and v[0] is AGGREGATE]
        return seq, h

    s.append("a", [ev.HandoffOpened(goal="g", target="t", owner="alice")], actor=OWNER)
    s.append("a", [ev.LeaseGranted(worker="w1", lease=1), step(1)], actor=OWNER)
    s.execute("a", AGGREGATE, lambda st, head: Decision((ev.LeaseReleased(lease=1),)), actor=OWNER)
    s.append("b", [ev.RunForked(parent="a", parent_seq=2), step(9)], actor=OWNER)
    for run_id in ("a", "b"):
        head = s.head(run_id)
        assert seen[-1 if run_id == "b" else -2][1] == head.last_position
        assert cached(run_id) == (head.last_seq, head.last_hash)
    assert s.head("a").lease is None and s.head("a").lease_holder is None

    other = SqliteStore(str(tmp_path / "other.db"))
    got = []
    other.attach(AGGREGATE, lambda conn, run_id, state, last_position: got.append((run_id, last_position)))
    other.import_records(list(s.read_for_export()))
    assert sorted(got) == sorted((h.run_id, h.last_position) for h in other.list_runs())
    other.close()
    s.close()


def test_a_damaged_heads_table_is_still_listed_whole(db_path, monkeypatch):
    """Ties and odd first positions (only a damaged file has them) must not hide a run
    from list_runs: check and rebuild walk it, and verify names the damage."""
    monkeypatch.setattr(sqlite_store, "PAGE", 2)
    _ledger_then_edit(
        db_path, ["a", "b", "c", "d", "e"],
        "UPDATE heads SET first_position = 2 WHERE run_id IN ('b', 'c', 'd')",  # ties over a page edge
        "UPDATE heads SET first_position = 0 WHERE run_id = 'e'",
    )
    with SqliteStore(db_path) as s:
        assert [h.run_id for h in s.list_runs()] == ["e", "a", "b", "c", "d"]
        assert s.count_runs() == 5
        assert sorted((p.kind, p.run_id) for p in s.verify()) == [
            ("head_mismatch", r) for r in ("c", "d", "e")
        ]  # 'a' and 'b' still start where their heads rows say (positions 1 and 2)
