"""What only SqliteStore.memory() does (the conformance suite runs on it through
tests/backends.py and tests/ledger/test_store_conformance.py)."""

from __future__ import annotations

from handoff.ledger.sqlite import SqliteStore
from tests.ledger.conformance import W1, hb


def test_memory_stores_are_independent():
    a, b = SqliteStore.memory(), SqliteStore.memory()
    try:
        a.append("r", [hb()], actor=W1)
        assert b.head("r") is None
        assert b.last_position() == 0
        assert b.append("r", [hb(), hb()], actor=W1).positions == (1, 2)
        assert a.last_position() == 1
    finally:
        a.close()
        b.close()


def test_memory_store_touches_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with SqliteStore.memory() as s:
        s.append("r", [hb()], actor=W1)
        assert s.verify() == []
        assert s.integrity_check() == "ok"
    assert list(tmp_path.iterdir()) == []
