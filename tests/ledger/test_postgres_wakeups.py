"""Wake-ups on PostgreSQL: sealers NOTIFY an empty signal, tailing readers LISTEN, and a
lost notification only delays (the poll behind it)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from handoff.ledger import events as ev
from handoff.ledger.postgres import PostgresStore, notify_channel
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor
from tests.pg import fresh_url

W = Actor("worker", "w")


@pytest.fixture
def url():
    u = fresh_url()
    PostgresStore(u).close()
    return u


def test_a_seal_that_gives_out_positions_notifies_the_ledgers_channel(url):
    with PostgresStore(url) as store:
        schema = store.schema_name()
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute(f"LISTEN {notify_channel(schema)}")
            store.append("a", [ev.HeartbeatRecorded()], actor=W)
            got = list(listener.notifies(timeout=5, stop_after=1))
            assert [(n.channel, n.payload) for n in got] == [(notify_channel(schema), "")]
            # A seal with nothing to seal sends nothing (a reader's seal, a duplicate).
            store.seal()
            assert list(listener.notifies(timeout=0.3)) == []


def test_a_waiting_reader_wakes_when_another_host_writes(url):
    with PostgresStore(url) as reader, PostgresStore(url) as writer:
        writer.append("a", [ev.HeartbeatRecorded()], actor=W)
        assert reader.wait_for_events(0, 0) == 1  # already there: no wait
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(reader.wait_for_events(1, 30)))
        t.start()
        time.sleep(0.3)
        assert done == []  # nothing new yet: it waits
        writer.append("b", [ev.HeartbeatRecorded()], actor=W)
        t.join(30)
        assert done == [2]


def test_a_lost_notification_only_delays(url):
    with PostgresStore(url) as reader, PostgresStore(url) as writer:
        assert reader.wait_for_events(0, 0) == 0
        reader._listener.execute("UNLISTEN *")  # every notification from now on is lost
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(reader.wait_for_events(0, 30)))
        t.start()
        writer.append("a", [ev.HeartbeatRecorded()], actor=W)
        t.join(30)
        assert done == [1]  # found by the poll behind the signal


def test_the_timeout_is_kept_when_nothing_comes(url, tmp_path):
    for store in (PostgresStore(url), SqliteStore(str(tmp_path / "l.db"))):
        with store:
            t0 = time.monotonic()
            assert store.wait_for_events(0, 0.3) == 0
            assert time.monotonic() - t0 >= 0.3
