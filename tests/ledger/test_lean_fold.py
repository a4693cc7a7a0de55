"""The lean fold path: an aggregate that reads only the fold envelope is folded over
``Step``s (three columns, a page of payloads decoded in one call). It must give exactly
what folding the full ``Recorded`` envelopes one at a time gives, forks and bounds
included, and a damaged payload must still fail naming its position."""

from __future__ import annotations

import os
import sqlite3
import tempfile

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff.ledger import events as ev
from handoff.ledger.sqlite import sqlite_store
from handoff.ledger.errors import CorruptLedger
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Aggregate, EventStore, Recorded, Step
from handoff.reducers import checkpoint
from handoff.reducers.checkpoint import AGGREGATE
from handoff.testing import events
from tests.ledger.conformance import W1, hb, step


class Collect(Aggregate[tuple]):
    """Not lean: it keeps whole envelopes, so the store must hand it Recorded rows."""

    def initial(self, run_id):
        return ()

    def evolve(self, state, recorded):
        return state + (recorded,)


def _fenced(events_: list[ev.Event], start: int = 0) -> list[ev.Event]:
    """The store refuses a lease token that does not grow: number the grants 1, 2, 3..."""
    out, n = [], start
    for e in events_:
        if isinstance(e, ev.LeaseGranted):
            n += 1
            e = msgspec.structs.replace(e, lease=n)
        out.append(e)
    return out


def _one_by_one(store: SqliteStore, run_id: str, until_seq: int | None = None) -> checkpoint.Checkpoint:
    """The reference: every full envelope of the lineage, one ``evolve`` each."""
    cp = checkpoint.initial(run_id)
    for rec in store.history(run_id, until_seq=until_seq):
        cp = checkpoint.evolve(cp, rec)
    return cp


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parent=st.lists(events(), min_size=1, max_size=25),
    child=st.lists(events(), max_size=12),
    data=st.data(),
)
def test_lean_fold_equals_the_full_envelope_fold(monkeypatch, parent, child, data):
    # A page of 3 rows makes every history cross page boundaries, forks included.
    monkeypatch.setattr(sqlite_store, "PAGE", 3)
    parent, child = _fenced(parent), _fenced(child)
    with tempfile.TemporaryDirectory() as d:
        s = SqliteStore(os.path.join(d, "l.db"), synchronous="NORMAL")
        for i in range(0, len(parent), 4):
            s.append("p", parent[i : i + 4], actor=W1)
        at = data.draw(st.integers(1, len(parent)), label="fork at")
        s.append("c", [ev.RunForked(parent="p", parent_seq=at), *child], actor=W1)
        for run_id, length in (("p", len(parent)), ("c", len(child) + 1)):
            for until in (None, *sorted({1, length, data.draw(st.integers(1, length), label="until")})):
                lean = s.fold(run_id, AGGREGATE, until_seq=until)
                full = EventStore.fold(s, run_id, AGGREGATE, until_seq=until)  # Recorded rows
                assert lean == full == _one_by_one(s, run_id, until)
                assert msgspec.json.encode(lean) == msgspec.json.encode(full)
        s.close()


def test_steps_carry_the_envelope_a_fold_reads(db_path):
    s = SqliteStore(db_path)
    s.append("a", [step(1), hb(), ev.StateChanged(from_state="queued", to_state="claimed")], actor=W1)
    with s.lock:
        steps = s._steps_page("a", 0, None)
    recs = list(s.read_run("a"))
    assert all(isinstance(x, Step) for x in steps)
    assert [(x.run_id, x.seq, x.type, x.recorded_us, x.event) for x in steps] == [
        (r.run_id, r.seq, r.type, r.recorded_us, r.event) for r in recs
    ]
    s.close()


def test_an_aggregate_that_is_not_lean_still_gets_whole_envelopes(db_path):
    s = SqliteStore(db_path)
    s.append("a", [step(1), step(2)], actor=W1)
    folded = s.fold("a", Collect())
    assert all(isinstance(r, Recorded) for r in folded)
    assert list(folded) == list(s.read_run("a"))
    s.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"{not json",
        b"",
        b'{"type":"no_such_event"}',
        # Two events in one row: read as JSON lines it would pass for two rows.
        b'{"type":"heartbeat_recorded"}\n{"type":"heartbeat_recorded"}',
    ],
    ids=["garbage", "empty", "unknown-type", "two-lines-in-one-row"],
)
def test_a_damaged_payload_fails_the_lean_fold_naming_its_position(db_path, payload):
    s = SqliteStore(db_path)
    s.append("a", [step(1), step(2), step(3)], actor=W1)
    s.close()
    conn = sqlite3.connect(os.fspath(db_path), isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET payload = ? WHERE position = 2", (payload,))
    before = conn.execute("SELECT * FROM events ORDER BY position").fetchall()
    conn.close()
    with SqliteStore(db_path) as s:
        with pytest.raises(CorruptLedger) as info:
            s.fold("a", AGGREGATE)
        d = info.value.details
        assert (d["run_id"], d["seq"], d["position"]) == ("a", 2, 2)
        assert "handoff verify" in info.value.message
    conn = sqlite3.connect(os.fspath(db_path))
    assert conn.execute("SELECT * FROM events ORDER BY position").fetchall() == before
    conn.close()


def test_a_type_column_that_disagrees_with_its_payload_fails_both_fold_paths(db_path):
    s = SqliteStore(db_path)
    s.append("a", [step(1), hb(), step(3)], actor=W1)
    s.close()
    conn = sqlite3.connect(os.fspath(db_path), isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    # The heartbeat now claims to be a state change: a stall fold reading the column
    # would count it as progress, one reading the payload would not.
    conn.execute("UPDATE events SET type = 'state_changed' WHERE position = 2")
    before = conn.execute("SELECT * FROM events ORDER BY position").fetchall()
    conn.close()
    with SqliteStore(db_path) as s:
        for fold in (s.fold, lambda run, agg: EventStore.fold(s, run, agg)):
            with pytest.raises(CorruptLedger) as info:
                fold("a", AGGREGATE)
            d = info.value.details
            assert (d["run_id"], d["seq"], d["position"]) == ("a", 2, 2)
            assert "state_changed" in info.value.message and "heartbeat_recorded" in info.value.message
        assert [p.kind for p in s.verify()][:1] == ["bad_hash"]
    conn = sqlite3.connect(os.fspath(db_path))
    assert conn.execute("SELECT * FROM events ORDER BY position").fetchall() == before
    conn.close()


# --- decode_many: a page at once, or exactly what decoding one by one says ----------------


def test_decode_many_does_not_let_a_blank_row_absorb_a_doubled_one():
    one = ev.encode(ev.HeartbeatRecorded())
    # As JSON lines this page is three values in three lines; row by row it is damaged.
    page = [one + b" " + one, b"", one]
    with pytest.raises(msgspec.DecodeError):
        ev.decode_many(page)
    for glue in (b"", b"\t", b"\r", b"  "):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            ev.decode_many([one + glue + one, b" \t", one])

_payloads = st.lists(events().map(ev.encode), max_size=20)


def _hostile(payloads: list[bytes], draw) -> list[bytes]:
    """Damage a page the ways that could fool a joined read: blanks, newlines, splits."""
    out = list(payloads)
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["blank", "newline", "split", "merge", "glue", "garbage"]))
        i = draw(st.integers(0, max(len(out) - 1, 0)))
        if how == "blank":
            out.insert(i, b"")
        elif how == "garbage":
            out.insert(i, b"{")
        elif out and how == "newline":
            out[i] = out[i] + b"\n"
        elif out and how == "split" and len(out[i]) > 2:
            cut = draw(st.integers(1, len(out[i]) - 1))
            out[i : i + 1] = [out[i][:cut], out[i][cut:]]
        elif len(out) > 1 and how == "merge" and i + 1 < len(out):
            out[i : i + 2] = [out[i] + b"\n" + out[i + 1], b"\n"]
        elif len(out) > 1 and how == "glue" and i + 1 < len(out):
            # Two values on one line and a blank row to balance the count.
            glue = draw(st.sampled_from([b"", b" ", b"\t", b"\r"]))
            out[i : i + 2] = [out[i] + glue + out[i + 1], draw(st.sampled_from([b"", b" ", b"\t"]))]
    return out


def _each(payloads: list[bytes]):
    try:
        return [ev.decode(p) for p in payloads]
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(payloads=_payloads, data=st.data())
def test_decode_many_is_decode_on_each(payloads, data):
    page = _hostile(payloads, data.draw)
    want = _each(page)
    try:
        got = ev.decode_many(page)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        got = type(exc)
    assert got == want
