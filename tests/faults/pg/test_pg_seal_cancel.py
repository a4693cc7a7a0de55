"""A waiting seal cancelled at any moment leaves no lock behind.

A writer whose events were queued waits in line for the sealer (handoff_seal waits for
the seal lock, the ledger_tail row). A lock that outlived a cancelled call (a client's
cancel, ``statement_timeout``) would be kept by the idle session, and then no insert
could seal and every waiting seal would give up. The seal lock is a row lock, which ends
with its transaction; this sends many cancels, at moments spread over the wait, and
counts the locks the idle session still holds after each."""

from __future__ import annotations

import threading
import time

import psycopg

from handoff.ledger import events as ev
from handoff.ledger.postgres.postgres_schema import SEAL_LOCK
from handoff.ledger.postgres.postgres_store import PostgresStore
from handoff.ledger.store import Actor

from tests.faults.conftest import scale


def _queue_one(url: str) -> None:
    """Leave one committed event in the queue: written while another session seals."""
    holder = psycopg.connect(url)
    holder.execute(SEAL_LOCK)
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
            sealer.execute(SEAL_LOCK)
            outcome: list[str] = []

            def wait(conn=waiter, outcome=outcome) -> None:
                try:
                    conn.execute("SELECT count(*) FROM handoff_seal(true, '{}')")
                    outcome.append("sealed")
                except psycopg.errors.QueryCanceled:
                    outcome.append("cancelled")

            t = threading.Thread(target=wait)
            t.start()
            time.sleep(0.01)  # the waiter is in the lock's queue now
            sealer.rollback()  # the sealer is done: the waiters are let go ...
            time.sleep((i % 40) * 0.000025)  # ... and the cancel lands somewhere in that
            admin.execute("SELECT pg_cancel_backend(%s)", (waiter.info.backend_pid,))
            t.join(10)
            sealer.close()
            cancelled += outcome == ["cancelled"]
            held = admin.execute(  # an idle session in autocommit holds no lock at all
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND granted", (waiter.info.backend_pid,)).fetchone()[0]
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
