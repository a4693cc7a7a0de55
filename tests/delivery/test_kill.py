"""SIGKILL of the delivering process at each point of a send, then restart and settle.

The delivering process is the real CLI (``handoff deliver --send``) against a real SQLite
file. Points are reached without timing guesses: the receiver signals when it has read or
acted on the request, and the test holds the ledger's write lock (a second SQLite
connection's BEGIN IMMEDIATE) so the child blocks exactly where it would record. Whatever
point the kill lands on, afterwards the log holds at most one confirmation and a target
that honours keys has acted at most once.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from handoff.facade import Ledger
from handoff.ledger.events import SendPolicy
from handoff.watchdog import watch_once
from tests.support import executable

from .conftest import log_types, outbox, ready_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def deliver(db: str, run: str, key: str = "v1", env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*executable(), "--db", db, "deliver", run, "--by", "alice", "--delivery-key", key, "--send",
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, **(env or {})})


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL, "the child ended before the kill: the point was not reached"


class WriteLock:
    """Holds the ledger's write lock from another connection, as a busy writer would."""

    def __init__(self, db: str) -> None:
        self.conn = sqlite3.connect(db, isolation_level=None, timeout=10)

    def __enter__(self) -> WriteLock:
        self.conn.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def wait_for(pred, what: str, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def confirmed(lg: Ledger, run: str) -> int:
    return log_types(lg, run).count("delivery_confirmed")


@pytest.fixture
def http_run(tmp_path, receiver):
    db = str(tmp_path / "ledger.db")
    lg = Ledger(db)
    run = ready_run(lg, tmp_path, receiver.url, send=SendPolicy(timeout_s=20.0, retries=0))
    yield db, lg, run
    lg.close()


def _restart_and_check(db, lg, run, receiver) -> None:
    receiver.mode = "ok"
    receiver.release.set()
    again = deliver(db, run)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err.decode()
    assert confirmed(lg, run) == 1 and lg.checkpoint(run).state == "delivered"
    assert len(receiver.effects) == 1
    # And once more: nothing is sent, nothing recorded.
    n = len(receiver.requests)
    third = deliver(db, run)
    third.communicate(timeout=60)
    assert third.returncode == 0 and len(receiver.requests) == n and confirmed(lg, run) == 1


def test_killed_before_the_attempt_is_recorded(http_run, receiver):
    db, lg, run = http_run
    before = log_types(lg, run)
    with WriteLock(db):
        child = deliver(db, run)
        time.sleep(1.0)  # it is blocked on the lock, waiting to record the attempt
        kill(child)
    assert log_types(lg, run) == before and receiver.requests == []
    _restart_and_check(db, lg, run, receiver)


def test_killed_during_the_send_before_the_target_acted(http_run, receiver):
    db, lg, run = http_run
    receiver.mode = "hang"
    child = deliver(db, run)
    assert receiver.received.wait(30)
    kill(child)
    assert log_types(lg, run)[-1] == "delivery_attempted" and receiver.effects == []
    assert lg.status(run)["delivery"]["status"] == "attempted"
    _restart_and_check(db, lg, run, receiver)


def test_killed_during_the_send_after_the_target_acted(http_run, receiver):
    db, lg, run = http_run
    receiver.mode = "act_then_hang"
    child = deliver(db, run)
    assert receiver.acted.wait(30)
    kill(child)
    assert log_types(lg, run)[-1] == "delivery_attempted" and len(receiver.effects) == 1
    _restart_and_check(db, lg, run, receiver)


def test_killed_after_the_answer_before_it_is_recorded(http_run, receiver):
    db, lg, run = http_run
    receiver.mode = "act_then_wait"
    child = deliver(db, run)
    assert receiver.acted.wait(30)
    with WriteLock(db):
        receiver.release.set()  # the 200 goes out; the child blocks recording it
        time.sleep(1.0)
        kill(child)
    assert log_types(lg, run)[-1] == "delivery_attempted" and len(receiver.effects) == 1
    receiver.release.clear()
    _restart_and_check(db, lg, run, receiver)


HOOK = """
import os, time
with open(os.path.join(os.environ["OUT"], "effect-" + str(os.getpid())), "w") as f:
    f.write(os.environ["HANDOFF_DELIVERY_KEY"])
while not os.path.exists(os.environ["GO"]):  # the test lets it finish once it holds the lock
    time.sleep(0.01)
"""


def test_killed_after_a_command_ran_the_watchdog_flags_it_and_a_person_settles_it(tmp_path):
    db = str(tmp_path / "ledger.db")
    lg = Ledger(db)
    box = outbox(tmp_path)
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    run = ready_run(lg, tmp_path, f"cmd:{sys.executable} {script}", delivery_timeout_s=1.0)
    go = tmp_path / "go"
    env = {"OUT": str(box), "GO": str(go)}
    child = deliver(db, run, env=env)
    wait_for(lambda: len(os.listdir(box)) == 1, "the command's effect")
    with WriteLock(db):
        go.write_text("")
        time.sleep(1.0)  # the command has exited; the child waits on the lock to record it
        kill(child)
    assert log_types(lg, run)[-1] == "delivery_attempted"
    # Restarted, it refuses to run the command again: cmd: does not honour keys.
    again = deliver(db, run, env=env)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 1 and b"ResendRefused" in err + out and len(os.listdir(box)) == 1
    # Past the delivery timeout the watchdog asks for reconciliation; a person settles it.
    later = lg.clock() + 5_000_000
    acts = watch_once(lg, name="wd", now_us=later)
    assert [(a.action, a.outcome) for a in acts] == [("reconcile_delivery", "committed")]
    lg.delivered(run, "v1", "the hook's effect file is there", by="alice")
    assert confirmed(lg, run) == 1 and len(os.listdir(box)) == 1
    lg.close()
