"""PostgreSQL's whole-log read (read_all): pages of positions up to the tail it has read,
each page's events found by a range of write ids, sorted on the client.

- Any page size, any window (after_position, until_position): every event once, in
  position order, pages splitting runs and writes anywhere.
- An event sealed late, after events whose write ids are larger, is read at its
  position (its page's write-id range spans the others; nothing is lost or doubled).
- Between two pages the store is free: no transaction is open on its session, another
  thread writes through the same store, and a generator dropped half-read leaves
  nothing behind. Events sealed while a reader is between pages are read too.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore
from handoff.ledger.store import Actor
from tests.pg import fresh_url

W = Actor("worker", "w")


def _fill(store: PostgresStore) -> list[tuple[int, str, int]]:
    """Writes of 1 to 4 events over three runs, interleaved: (position, run, seq) of each
    event as the appends reported them."""
    expected = []
    seqs = {"a": 0, "b": 0, "c": 0}
    for i, (run, n) in enumerate([("a", 3), ("b", 1), ("c", 4), ("a", 2), ("b", 4), ("c", 1), ("a", 1),
                                   ("b", 2), ("c", 3)]):
        res = store.append(run, [ev.ProgressRecorded(kind="k", detail=f"{run}{i}.{j}") for j in range(n)],
                           actor=W, expected_seq=seqs[run])
        for j, pos in enumerate(res.positions):
            expected.append((pos, run, seqs[run] + j + 1))
        seqs[run] += n
    return sorted(expected)


def _key(records) -> list[tuple[int, str, int]]:
    return [(r.position, r.run_id, r.seq) for r in records]


def test_every_page_size_and_window_reads_each_event_once_in_order():
    with PostgresStore(fresh_url()) as store:
        expected = _fill(store)
        total = len(expected)
        assert [p for p, _, _ in expected] == list(range(1, total + 1))
        whole = list(store.read_all())
        assert _key(whole) == expected
        assert [r.event.detail for r in whole][:3] == ["a0.0", "a0.1", "a0.2"]
        for page in (1, 2, 3, 5, 7, total - 1, total, total + 1):
            assert list(store.read_all(page=page)) == whole, page
            for after in (0, 1, 4, 9, total - 1, total, total + 3):
                for until in (None, after, after + 1, after + 6, total, total + 2):
                    got = list(store.read_all(after_position=after, until_position=until, page=page))
                    stop = total if until is None else min(until, total)
                    assert got == whole[after:stop], (page, after, until)


def test_an_event_sealed_after_events_with_larger_write_ids_is_read_at_its_position():
    """A write takes its ids, stalls before COMMIT while others commit and are sealed,
    then commits, and a reader seals it: its position comes after theirs, its write id
    before. A page that holds it spans their ids too; every page size reads each event
    once, in position order."""
    url = fresh_url()
    with PostgresStore(url) as store:
        store.append("a", [ev.HeartbeatRecorded()], actor=W)  # position 1
        stalled = psycopg.connect(url)  # a transaction: the row is inserted, not committed
        try:
            # queued by its insert's trigger, as when another session was sealing (QUEUE_FUNCTION)
            stalled.execute(
                "INSERT INTO events (id, run_id, seq, type, actor, batch_size, recorded_us, "
                "schema_version, payload, prev_hash, hash, viewed) SELECT nextval('events_id_seq'), "
                "run_id, 2, type, actor, 1, recorded_us, schema_version, payload, hash, hash, true "
                "FROM events WHERE run_id = 'a' AND seq = 1")
            late_id = stalled.execute("SELECT max(id) FROM events").fetchone()[0]
            for i in range(6):  # positions 2..7, write ids after the stalled one's
                store.append(f"r{i}", [ev.HeartbeatRecorded(), ev.HeartbeatRecorded()][: 1 + i % 2], actor=W)
            stalled.commit()
        finally:
            stalled.close()
        sealed_before = store.last_position()
        assert store.unsealed_count() == 1
        late = [r for r in store.read_all(after_position=sealed_before)]  # this reader seals it
        assert _key(late) == [(sealed_before + 1, "a", 2)]
        store.append("z", [ev.HeartbeatRecorded()], actor=W)  # one more after it
        with psycopg.connect(url, autocommit=True) as conn:
            ids = dict(conn.execute("SELECT position, event_id FROM ledger_order").fetchall())
        assert ids[sealed_before + 1] == late_id
        assert all(ids[p] > late_id for p in range(2, sealed_before + 1))  # sealed before, ids after
        whole = list(store.read_all())
        assert [r.position for r in whole] == list(range(1, sealed_before + 3))
        assert _key(whole)[sealed_before] == (sealed_before + 1, "a", 2)
        for page in (1, 2, 3, 4, sealed_before + 2):
            assert list(store.read_all(page=page)) == whole, page
            assert list(store.read_all(after_position=sealed_before - 1, until_position=sealed_before + 1,
                                       page=page)) == whole[sealed_before - 1:sealed_before + 1]


def _session_state(url: str, pid: int) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]


def test_between_pages_the_store_is_free_and_a_dropped_reader_leaves_nothing_open():
    url = fresh_url()
    with PostgresStore(url) as store:
        for i in range(5):
            store.append("a", [ev.HeartbeatRecorded()], actor=W, expected_seq=i)
        pid = store._conn.info.backend_pid
        reader = store.read_all(page=2)
        assert next(reader).position == 1  # the reader holds the rest of its first page
        assert _session_state(url, pid) == "idle"  # not "idle in transaction"

        # Another thread writes through the same store while the reader is between pages.
        done = []
        t = threading.Thread(target=lambda: done.append(
            store.append("b", [ev.HeartbeatRecorded()], actor=W).positions))
        t.start()
        t.join(10)
        assert done == [(6,)]
        # The reader goes on to the end as it now is: the new event is past the tail it
        # read first, and it reads the tail again when it gets there.
        assert [r.position for r in reader] == [2, 3, 4, 5, 6]

        dropped = store.read_all(page=2)
        assert next(dropped).position == 1
        dropped.close()
        del dropped
        assert _session_state(url, pid) == "idle"
        assert store._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert [r.position for r in store.read_all(after_position=4)] == [5, 6]


def _commit_unsealed(url: str) -> None:
    """What a writer killed between its COMMIT and its seal leaves: run a's seq 2,
    committed and queued, with no position (its insert found another session sealing; a
    plain insert is queued by its trigger, as then)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO events (id, run_id, seq, type, actor, batch_size, recorded_us, "
                     "schema_version, payload, prev_hash, hash, viewed) SELECT nextval('events_id_seq'), "
                     "run_id, 2, type, actor, 1, recorded_us, schema_version, payload, hash, hash, true "
                     "FROM events WHERE run_id = 'a' AND seq = 1")


def test_inside_a_read_transaction_a_reader_reads_what_is_sealed_and_seals_nothing():
    """A seal inside the read-only snapshot would fail and end the transaction: the
    reader reads what is sealed there, twice the same, and the next reader seals."""
    url = fresh_url()
    with PostgresStore(url) as store:
        store.append("a", [ev.HeartbeatRecorded()], actor=W)
        _commit_unsealed(url)
        with store.read_transaction():
            assert _key(store.read_all()) == [(1, "a", 1)]
            assert _key(store.read_all(page=1)) == [(1, "a", 1)]
            assert store.unsealed_count() == 1
        assert _key(store.read_all()) == [(1, "a", 1), (2, "a", 2)]  # outside: sealed, and read
        assert store.unsealed_count() == 0


@pytest.mark.parametrize("page", [1, 1000])
def test_an_empty_ledger_and_a_window_past_the_tail_read_nothing(page):
    with PostgresStore(fresh_url()) as store:
        assert list(store.read_all(page=page)) == []
        store.append("a", [ev.HeartbeatRecorded()], actor=W)
        assert list(store.read_all(after_position=1, page=page)) == []
        assert list(store.read_all(after_position=7, page=page)) == []
        assert _key(store.read_all(until_position=1, page=page)) == [(1, "a", 1)]


def test_a_page_finds_its_write_ids_through_the_position_key_only():
    """min() and max() of the bare event_id would be planned, once the tables have
    statistics, as a walk of the event_id index from either end, filtering on the
    position: through every event before the page, for each page. The page statement's
    plan must read ledger_order by position alone."""
    from handoff.ledger.postgres.rows import PAGE_SQL as _PAGE

    with PostgresStore(fresh_url()) as store:
        for i in range(40):
            store.append(f"r{i}", [ev.HeartbeatRecorded()] * 200, actor=W)
        with store.lock:
            store.x("ANALYZE ledger_order")
            store.x("ANALYZE events")
            plan = "\n".join(r[0] for r in store.x("EXPLAIN " + _PAGE, {"after": 7000, "stop": 7800}))
        assert "ledger_order_event_id_key" not in plan, plan
        assert "ledger_order_pkey" in plan, plan
        assert _key(store.read_all(after_position=7000, until_position=7002)) == [
            (7001, "r35", 1), (7002, "r35", 2)]


@pytest.mark.parametrize("damage", ["DELETE FROM ledger_tail", "UPDATE ledger_tail SET position = 2"])
def test_a_reader_reads_the_whole_order_whatever_the_tail_row_says(damage):
    """The tail row lost or set back behind the store (found by a review): a reader still
    reads every sealed position (it stops at the order's own end, not the row's), and
    verify reports the row, typed, never a raw error."""
    url = fresh_url()
    with PostgresStore(url) as store:
        store.append("a", [ev.ProgressRecorded(kind="k", detail=str(i)) for i in range(5)], actor=W,
                     expected_seq=0)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(damage)
    with PostgresStore(url) as store:
        assert [r.position for r in store.read_all()] == [1, 2, 3, 4, 5]
        assert [r.position for r in store.read_all(page=2)] == [1, 2, 3, 4, 5]
        assert any(p.kind == "tail_mismatch" for p in store.verify())
