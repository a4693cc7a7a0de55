"""Ledger.preview: the answer a real write would get now, with nothing written."""

from __future__ import annotations

import pytest

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger.store import Actor
from handoff.reducers import commands as C
from tests.ledger.conformance import assert_unchanged, snapshot


@pytest.fixture
def lg(lg):
    """tests/conftest.py's ledger, with run r1 open."""
    lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
    return lg


def test_a_preview_decides_as_execute_would_and_writes_nothing(lg):
    before = snapshot(lg.store)
    seen = lg.preview("r1", C.Claim(worker="w1", token_digest="0" * 64), actor=Actor("worker", "w1"))
    assert seen.outcome == "would_commit"
    assert [type(e).__name__ for e in seen.events] == ["LeaseGranted"]
    assert_unchanged(lg.store, before)
    assert lg.checkpoint("r1").lease is None


def test_a_preview_of_a_replayed_key_is_a_duplicate_with_the_earlier_result(lg):
    cmd = C.Observe(classification="healthy", progress_seq=0, reason="fine")
    done = lg.execute("r1", cmd, actor=Actor("watchdog", "ops"), key="watch:r1:x").result
    before = snapshot(lg.store)
    seen = lg.preview("r1", cmd, actor=Actor("watchdog", "ops"), key="watch:r1:x")
    assert seen.outcome == "duplicate" and seen.events == ()
    assert (seen.result.first_seq, seen.result.last_seq, seen.result.positions) == (done.first_seq, done.last_seq, done.positions)
    assert_unchanged(lg.store, before)


def test_a_guard_that_says_no_previews_as_unchanged(lg):
    before = snapshot(lg.store)
    seen = lg.preview("r1", C.Claim(worker="w1", token_digest="0" * 64), actor=Actor("worker", "w1"),
                      guard=lambda cp: False)
    assert seen.outcome == "unchanged" and seen.events == ()
    assert_unchanged(lg.store, before)


def test_a_preview_raises_the_refusal_a_write_would_get_and_writes_nothing(lg):
    before = snapshot(lg.store)
    with pytest.raises(E.UnknownRun):
        lg.preview("nope", C.Claim(worker="w1", token_digest="0" * 64), actor=Actor("worker", "w1"))
    with pytest.raises(E.NotAuthorized):
        lg.preview("r1", C.Close(disposition="cancelled", reason="x"), actor=Actor("worker", "w1"))
    token = lg.claim("r1", "w1")
    before = snapshot(lg.store)
    with pytest.raises(E.StaleLease):  # the token is checked as for a real write
        lg.preview("r1", C.Heartbeat(lease=token.lease), actor=Actor("worker", "w1"),
                   token=f"{token.lease}.{'A' * 43}")
    assert lg.preview("r1", C.Heartbeat(lease=token.lease), actor=Actor("worker", "w1"),
                      token=token).outcome == "would_commit"
    assert_unchanged(lg.store, before)
