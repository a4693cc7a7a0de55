"""A write's statements are prepared once per connection, inside the write's own messages
(ledger/postgres/store.py, _multi), and a lost or half-made set of prepared statements never
costs more than the one write that finds it, refused with a typed error and nothing written."""

from __future__ import annotations

import math

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from handoff.api import Ledger
from handoff.ledger import events as ev
from handoff.ledger.errors import StoreUnavailable
from handoff.ledger.postgres.store import _LEDGER_NS, _VIEWS, PostgresStore, _literal
from handoff.ledger.store import Actor
from tests.pg import fresh_url

W = Actor("worker", "w1")


def _prepared(store: PostgresStore) -> set[str]:
    return {r[0] for r in store._conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'handoff%'")}


def _log(store: PostgresStore) -> list[tuple]:
    return [(r.run_id, r.seq, r.hash) for r in store.read_all()]


def test_a_write_prepares_its_statements_once_per_connection():
    with Ledger(fresh_url()) as lg:
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.transition(run, lease, "planning")
        lg.transition(run, lease, "executing")
        lg.progress(run, lease, "tool_outcome", "step", key="k0")
        first = _prepared(lg.store)
        assert len(first) >= 8, first  # the write's own and the views' statements
        for i in range(5):
            lg.progress(run, lease, "tool_outcome", f"step {i}", key=f"k{i + 1}")
        assert _prepared(lg.store) == first
        assert lg.status(run)["progress_seq"] == lg.checkpoint(run).progress_seq == 8


def test_statements_gone_from_the_session_are_prepared_again_and_the_write_sent_once_more():
    """As after a pooler's DEALLOCATE ALL: the write that finds them gone is refused by
    the server before its COMMIT, so the store sends it once more, preparing again in the
    same message: written once, in order, and the chain verifies."""
    with PostgresStore(fresh_url()) as store:
        store.append("r1", [ev.ProgressRecorded(kind="a")], actor=W)
        store._conn.execute("DEALLOCATE ALL")
        result = store.append("r1", [ev.ProgressRecorded(kind="b")], actor=W, idempotency_key="k-b")
        assert (result.outcome, result.first_seq) == ("committed", 2)
        assert [seq for _, seq, _ in _log(store)] == [1, 2]
        store._conn.execute("DEALLOCATE ALL")
        again = store.append("r1", [ev.ProgressRecorded(kind="b")], actor=W, idempotency_key="k-b")
        assert (again.outcome, again.first_seq) == ("duplicate", 2)
        assert [seq for _, seq, _ in _log(store)] == [1, 2]
        assert store.verify() == []


def test_a_session_that_already_holds_the_statements_takes_the_write_sent_once_more():
    """What a pooler does the other way round: it hands this connection a session where
    the statements exist while the connection believes it prepared nothing. The write's
    PREPARE fails before anything ran; the store asks the session what it has and sends
    the write once more: written once."""
    with PostgresStore(fresh_url()) as store:
        store.append("r1", [ev.ProgressRecorded(kind="a")], actor=W)
        assert _prepared(store)
        store._conn.handoff_prepared = set()
        result = store.append("r1", [ev.ProgressRecorded(kind="b")], actor=W, idempotency_key="k-b")
        assert (result.outcome, result.first_seq) == ("committed", 2)
        assert [seq for _, seq, _ in _log(store)] == [1, 2]
        assert store.verify() == []


def test_statements_lost_twice_in_a_row_are_refused_with_nothing_written():
    """The store sends a write once more, not for ever: a session that loses its
    statements again before the second message (a pooler switching sessions under every
    transaction) gets a typed refusal, and the log is unchanged."""
    with PostgresStore(fresh_url()) as store:
        store.append("r1", [ev.ProgressRecorded(kind="a")], actor=W)
        before = _log(store)
        real = store._write
        names = set(_prepared(store))
        calls = []

        def write_after_deallocate(*args):
            # What a pooler does: the statements the connection believes it has are gone.
            calls.append(1)
            store._conn.execute("DEALLOCATE ALL")
            store._conn.handoff_prepared = set(names)
            return real(*args)

        store._write = write_after_deallocate
        with pytest.raises(StoreUnavailable, match="does not exist"):
            store.append("r1", [ev.ProgressRecorded(kind="b")], actor=W)
        assert len(calls) == 2
        assert _log(store) == before
        store._write = real
        store.append("r1", [ev.ProgressRecorded(kind="b")], actor=W)
        assert [seq for _, seq, _ in _log(store)] == [1, 2]
        assert store.verify() == []


def test_a_message_that_failed_after_preparing_leaves_the_connection_working():
    """The first write of a connection prepares at the head of its messages, then waits
    for the views lock, which another session holds past the lock timeout: refused, and
    some statements exist while the write did not happen. The next write works."""
    url = fresh_url()
    with Ledger(url, busy_timeout_s=0.3) as lg, psycopg.connect(url, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LEDGER_NS, _VIEWS))
        with pytest.raises(StoreUnavailable):
            lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        other.execute("ROLLBACK")
        assert list(lg.store.read_all()) == []
        assert _prepared(lg.store)  # the failed message's PREPAREs stayed
        run = lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lease = lg.claim(run, "w1")
        lg.transition(run, lease, "planning")
        assert lg.checkpoint(run).state == "planning"
        assert lg.store.verify() == []


@pytest.mark.parametrize("value, literal", [
    ("it's", "'it''s'"),
    ("back\\slash", "'back\\slash'"),
    ("", "''"),
    (-5, "-5"),
    (b"\x00\xff", "'\\x00ff'"),
    (None, "NULL"),
    (True, "true"),
    ([1, 2], "'{1,2}'"),
    (['a"b', None, "it's"], """'{"a\\"b",NULL,"it''s"}'"""),
    ([b"\x01"], """'{"\\\\x01"}'"""),
    ("nul\x00", None),  # psycopg quotes it (and refuses it: text cannot hold NUL)
    (1.5, "'1.5'"),
    (-0.0, "'-0.0'"),
    (1e-310, "'1e-310'"),
    (float("inf"), None),  # psycopg quotes the ones float8 spells in words
    (float("nan"), None),
])
def test_literals_written_by_the_store(value, literal):
    assert _literal(value) == literal


def test_literals_round_trip_through_the_server():
    """What _literal writes reads back as the value, for awkward strings too."""
    with PostgresStore(fresh_url()) as store:
        awkward = ["it's", "a\\'; DROP TABLE events; --", "ünïcödé ✓", "\\x41", "'"]
        for i, text in enumerate(awkward):
            store.append(f"r{i}", [ev.ProgressRecorded(kind="k", detail=text)], actor=W,
                         idempotency_key=text or "empty")
        got = [r.event.detail for r in store.read_all()]
        assert got == awkward
        assert [r.idempotency_key for r in store.read_all()] == awkward
        assert store.verify() == []


def test_a_batch_is_one_insert_and_reads_back_as_written():
    """More than one event: one INSERT of arrays (awkward strings and bytes included),
    the same rows, chains and positions as one INSERT per event would give."""
    from handoff.ledger.store import chain_hash  # noqa: F401 - the chain is verify's to check

    with PostgresStore(fresh_url()) as store:
        details = ["plain", 'quo"te', "back\\slash", "it's", "{brace}", "NULL", "", "ünï ✓"]
        batch = [ev.ProgressRecorded(kind="k", detail=d) for d in details]
        result = store.append("r1", batch, actor=W, idempotency_key="b1", expected_seq=0)
        assert (result.first_seq, result.last_seq) == (1, len(details))
        again = store.append("r1", batch, actor=W, idempotency_key="b1")
        assert again.outcome == "duplicate" and again.positions == result.positions
        got = list(store.read_run("r1"))
        assert [r.event.detail for r in got] == details
        assert [r.idempotency_key for r in got] == ["b1"] + [None] * (len(details) - 1)
        assert [r.position for r in got] == list(result.positions)
        store.append("r1", batch[:2], actor=W)  # a second batch, no key: all its keys NULL
        assert [r.seq for r in store.read_run("r1")] == list(range(1, len(details) + 3))
        assert store.verify() == []


#: Characters that end or shape a literal (drawn often), and any other one (drawn sometimes).
_SHAPING = st.sampled_from(list("'\"\\{},; \t\nNULxE$"))
_TEXT = st.text(st.one_of(_SHAPING, _SHAPING, st.characters(blacklist_categories=("Cs",),
                                                            blacklist_characters="\x00")), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_TEXT, texts=st.lists(st.one_of(st.none(), _TEXT), max_size=6),
       blob=st.binary(max_size=40), blobs=st.lists(st.binary(max_size=12), max_size=4),
       ints=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
       real=st.floats(allow_nan=False, allow_infinity=False))
def test_any_literal_the_store_writes_reads_back_as_its_value(pg_store, text, texts, blob, blobs, ints, real):
    """The store writes literals itself (no driver quoting), so any value it accepts must
    come back from the server as that value and nothing else: quotes, backslashes,
    braces, commas, the word NULL, any Unicode. A literal that could end early would be an
    injection; this is the proof that none does, on the store's own connection settings."""
    conn = pg_store._conn
    assert conn.handoff_literals  # the settings under which the store writes literals
    for value, cast in ((text, "text"), (texts, "text[]"), (blob, "bytea"), (blobs, "bytea[]"),
                        (ints, "bigint[]"), (real, "double precision")):
        lit = _literal(value)
        assert lit is not None
        got = conn.execute(f"SELECT {lit}::{cast}").fetchone()[0]
        assert got == value, (lit, cast)
    got = conn.execute(f"SELECT {_literal(real)}::double precision").fetchone()[0]
    assert math.copysign(1.0, got) == math.copysign(1.0, real)  # the sign of a zero too


@pytest.fixture(scope="module")
def pg_store():
    with PostgresStore(fresh_url()) as store:
        yield store
