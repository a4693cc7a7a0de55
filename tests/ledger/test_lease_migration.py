"""A ledger written before lease tokens (event schema 2, heads without lease_digest).

The fixture is the SQL dump of a file made by the version before tokens: run ``held``
with lease 1 granted to w1 (no digest) and two writes under it, run ``idle`` open.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.store import Actor
from tests.support import file_from_dump

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "ledger_schema2.sql")


@pytest.fixture
def old_file(tmp_path) -> str:
    return file_from_dump(FIXTURE, tmp_path / "old.db")


def columns(path: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[1] for r in conn.execute("PRAGMA table_info(heads)")]
    finally:
        conn.close()


def test_the_fixture_is_in_the_old_format(old_file):
    assert "lease_digest" not in columns(old_file)
    conn = sqlite3.connect(old_file)
    versions = {r[0] for r in conn.execute("SELECT schema_version FROM events")}
    conn.close()
    assert versions == {2} and ev.SCHEMA_VERSION > 2


def test_a_read_only_open_reads_it_and_changes_nothing(old_file):
    with Ledger(old_file, readonly=True) as lg:
        assert lg.status("held")["lease"] == 1 and lg.verify() == []
        granted = next(r.event for r in lg.log("held") if r.type == "lease_granted")
        assert granted.token_digest == ""
    assert "lease_digest" not in columns(old_file)


def test_a_writable_open_adds_the_column_and_keeps_everything(old_file):
    with Ledger(old_file, readonly=True) as lg:
        before = [(r.position, r.hash) for r in lg.store.read_all()]
    with Ledger(old_file) as lg:
        assert "lease_digest" in columns(old_file)
        assert [(r.position, r.hash) for r in lg.store.read_all()] == before
        assert lg.verify() == [] and lg.check() == []
    with Ledger(old_file) as lg:  # a second open finds it there and leaves it
        assert lg.verify() == []


def test_a_lease_from_before_tokens_takes_no_writes_until_revoked(old_file):
    with Ledger(old_file) as lg:
        before = list(lg.store.read_all())
        for lease in ("1", 1, f"1.{'A' * 43}"):
            with pytest.raises((E.InvalidInput, E.StaleLease)) as info:
                lg.progress("held", lease, "tool_outcome", "old worker goes on", worker="w1")
            if isinstance(info.value, E.StaleLease):
                assert info.value.details["why"] == "no_token"
                assert "handoff revoke held" in info.value.message and "claim" in info.value.message
        assert list(lg.store.read_all()) == before
        # The same worker re-claiming is told it holds the run, and what to do instead.
        with pytest.raises(E.LeaseHeld, match="already held by worker w1"):
            lg.claim("held", "w1")
        assert list(lg.store.read_all()) == before
        # The documented way out: revoke, then claim for a token that works.
        lg.revoke("held", "upgrade to lease tokens", actor=Actor("operator", "op"))
        token = lg.claim("held", "w1")
        assert token.lease == 2
        lg.progress("held", token, "plan_committed", "carries on with a token", worker="w1")
        assert lg.verify() == [] and lg.check() == []
        # An idle run from the old file is claimed the new way straight away.
        idle = lg.claim("idle", "w2")
        lg.heartbeat("idle", idle, worker="w2")
