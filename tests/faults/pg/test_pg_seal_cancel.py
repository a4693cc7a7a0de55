"""A waiting seal cancelled at any moment leaves no lock behind.

A writer whose events were queued waits for the sealer in a session-level shared lock
that it takes and drops at once (handoff_seal, schema 5). Cancelled between the two (a
client's cancel, ``statement_timeout``), the lock would outlive the call: the idle
session would keep it, and then no insert could seal and every waiting seal would give
up, for every ledger in the database. The function's handler drops it. A cancel lands
between the two only now and then (a few in 400 tries without the handler, found by a
review), so this sends many, at moments spread over the wait, and counts."""

from __future__ import annotations

import threading
import time

import psycopg

from handoff.ledger import events as ev
from handoff.ledger.postgres.store import _LEDGER_NS, _SEAL, PostgresStore
from handoff.ledger.store import Actor

from tests.faults.conftest import scale


def _queue_one(url: str) -> None:
    """Leave one committed event in the queue: written while another session seals."""
    holder = psycopg.connect(url)
    holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LEDGER_NS, _SEAL))
    with PostgresStore(url, busy_timeout_s=0.1) as store:
        store.append("q", [ev.HeartbeatRecorded()], actor=Actor("worker", "w"))
    holder.rollback()
    holder.close()


def test_a_cancelled_wait_for_the_seal_leaves_no_lock_held(pg_url, evidence):
    PostgresStore(pg_url).close()
    tries = scale(60, 400)
    admin = psycopg.connect(pg_url, autocommit=True)
    waiter = psycopg.connect(pg_url, autocommit=True)
    _queue_one(pg_url)
    cancelled = leaks = 0
    try:
        for i in range(tries):
            sealer = psycopg.connect(pg_url)
            sealer.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LEDGER_NS, _SEAL))
            outcome: list[str] = []

            def wait(conn=waiter, outcome=outcome) -> None:
                try:
                    conn.execute("SELECT count(*) FROM handoff_seal(true, '{}')")
                    outcome.append("sealed")
                except psycopg.errors.QueryCanceled:
                    outcome.append("cancelled")

            t = threading.Thread(target=wait)
            t.start()
            time.sleep(0.01)  # the waiter is in the shared lock's queue now
            sealer.rollback()  # the sealer is done: the waiters are let go ...
            time.sleep((i % 40) * 0.000025)  # ... and the cancel lands somewhere in that
            admin.execute("SELECT pg_cancel_backend(%s)", (waiter.info.backend_pid,))
            t.join(10)
            sealer.close()
            cancelled += outcome == ["cancelled"]
            held = admin.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND objid = %s",
                (waiter.info.backend_pid, _SEAL)).fetchone()[0]
            if held:
                leaks += 1
                waiter.close()
                waiter = psycopg.connect(pg_url, autocommit=True)
            if admin.execute("SELECT count(*) FROM unsealed").fetchone()[0] == 0:
                _queue_one(pg_url)
    finally:
        waiter.close()
        admin.close()
    assert leaks == 0, f"{leaks} of {tries} cancelled waits left the seal lock held"
    assert cancelled > 0  # the cancels did land inside the wait, some of them
    evidence.add("pg_seal_wait_cancelled", tries=tries, cancelled=cancelled, leaks=leaks)
