"""The installed ``handoff`` as real processes: the worker wrapper and the watchdog."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from handoff import Ledger

from tests.support import executable, run_exe, working_run


def _spawn(*args: str, db: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["HANDOFF_DB"] = db
    return subprocess.Popen([*executable(), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_run_gives_the_child_its_lease_and_records_how_it_ended(tmp_path):
    db = str(tmp_path / "l.db")
    out = tmp_path / "result.txt"
    child = (
        "set -e; echo \"$HANDOFF_RUN $HANDOFF_LEASE $HANDOFF_WORKER $HANDOFF_DB\"; "
        "handoff transition --to planning; handoff progress --kind plan_committed --detail outline; "
        "handoff transition --to executing; echo done > " + str(out) + "; "
        "handoff artifact --kind result " + str(out) + "; sleep 0.5; exit 7"
    )
    done = run_exe("run", "--goal", "wrapped", "--target", "t", "--owner", "o", "--run-id", "w1run",
                   "--heartbeat-timeout", "0.6", "--worker", "wk", "--", "sh", "-c", child, db=db)
    assert done.returncode == 7, done.stderr
    run_id, token, worker, where = done.stdout.splitlines()[0].split(" ")
    assert (run_id, worker, where) == ("w1run", "wk", db) and token.startswith("1.") and len(token) > 30
    assert token not in done.stderr  # the wrapper's own lines name the lease number only
    assert "wk holds lease 1 on w1run" in done.stderr and "exited with code 7" in done.stderr
    with Ledger(db) as lg:
        recs = list(lg.log("w1run"))
        cp = lg.checkpoint("w1run")
        live = lg.store.liveness(["w1run"]).get("w1run")
    # The wrapper beat while the child slept: its beats are counted beside the log (a beat
    # writes an event only when it ends a silence or marks a window), each later than the grant.
    granted = next(r for r in recs if r.type == "lease_granted")
    assert live is not None and live.lease == 1 and live.beats >= 1 and live.beat_us > granted.recorded_us
    notes = [r.event.detail for r in recs if r.type == "progress_recorded" and r.event.kind == "note"]
    assert notes == ["child exited with code 7"]
    assert recs[-1].type == "lease_released" and cp.lease is None and cp.state == "executing"
    assert cp.artifacts[0].bytes == 5


def test_run_forwards_sigterm_to_the_child(tmp_path):
    db = str(tmp_path / "l.db")
    proc = _spawn("run", "--goal", "g", "--target", "t", "--owner", "o", "--run-id", "t1", "--worker", "wk",
                  "--", sys.executable, "-c", "import time; time.sleep(60)", db=db)
    _wait_until(lambda: os.path.exists(db) and _lease(db, "t1") == 1)
    time.sleep(0.3)  # let the child start
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "ended by signal SIGTERM (after SIGTERM was forwarded to it)" in err
    assert _lease(db, "t1") is None


def test_run_stops_the_child_when_its_lease_is_revoked(tmp_path):
    db = str(tmp_path / "l.db")
    marker = tmp_path / "still-running"
    child = f"import time\nwhile True:\n    open({str(marker)!r}, 'w').close(); time.sleep(0.05)"
    proc = _spawn("run", "--goal", "g", "--target", "t", "--owner", "o", "--run-id", "lost", "--worker", "wk",
                  "--heartbeat-timeout", "0.6", "--grace", "2", "--", sys.executable, "-c", child, db=db)
    _wait_until(marker.exists)
    with Ledger(db) as lg:
        lg.revoke("lost", "operator takes it back")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "lost lease 1 on lost (lease 1 was revoked by operator:" in err and "stopping the child" in err
    marker.unlink()
    time.sleep(0.3)
    assert not marker.exists()  # the child is gone
    with Ledger(db) as lg:
        assert list(lg.log("lost"))[-1].type == "lease_revoked"  # the fenced wrapper wrote nothing after


def test_run_refuses_to_join_a_held_run(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        working_run(lg, "held")
    done = run_exe("run", "--run", "held", "--worker", "w2", "--", "true", db=db)
    assert done.returncode == 1 and "held by w1" in done.stderr


def _lease(db: str, run: str):
    try:
        with Ledger(db) as lg:
            return lg.checkpoint(run).lease
    except Exception:
        return None


def test_watchdog_killed_mid_pass_and_restarted_never_acts_twice(tmp_path):
    db = str(tmp_path / "l.db")
    n = 300
    with Ledger(db, synchronous="NORMAL") as lg:
        for i in range(n):
            working_run(lg, f"r{i:03d}", owner=f"o{i}", heartbeat_timeout_s=3600, progress_timeout_s=1)
        now = lg.clock() + 10_000_000
    from handoff.render import iso as _iso

    args = ("watch", "--once", "--name", "wd", "--now", _iso(now), "--commit")
    first = _spawn(*args, db=db)
    lines = [first.stdout.readline() for _ in range(10)]
    first.send_signal(signal.SIGKILL)
    rest, _ = first.communicate(timeout=30)
    first_lines = [x for x in lines + rest.splitlines() if x.strip()]
    assert all(" stalled -> " in x for x in first_lines)
    assert len(first_lines) < 2 * n, "the pass finished before it was killed"

    second = run_exe(*args, db=db)
    assert second.returncode == 0, second.stderr
    second_lines = second.stdout.splitlines()
    assert not set(second_lines) & set(first_lines)  # nothing done twice...
    assert len(first_lines) + len(second_lines) >= 2 * n - 1  # ...and nothing left undone

    third = run_exe(*args, db=db)
    assert third.stdout == ""
    with Ledger(db) as lg:
        for i in range(n):
            kinds = [(r.type, getattr(r.event, "action", None)) for r in lg.log(f"r{i:03d}")
                     if r.type in ("watchdog_observed", "recovery_decided")]
            assert kinds == [("watchdog_observed", None), ("recovery_decided", "mark_stalled")], (i, kinds)
