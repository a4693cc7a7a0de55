"""Seed 003's failure-injection matrix, row by row, with real processes and real signals.

Every test prints its evidence (last heartbeat, last progress seq, lease token, state
transitions, recovery decisions, final disposition) and adds it to the session's
evidence file (see conftest.py); docs/reliability.md quotes the figures.

1. heartbeats continue while the loop repeats without progress -> stalled, then paused
2. worker SIGSTOPped after starting a side effect -> lease revoked, reconciliation, no blind retry
3. the paused worker replaced, then SIGCONT -> every late write refused, log unchanged
4. a progress event delivered twice (same key; replayed expected_seq) -> stored once
5. the store becomes unavailable (read-only, disk full, locked) -> typed error, nothing claimed
6. the watchdog SIGKILLed during recovery and restarted -> no action twice, every run recovered
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from handoff.facade import Ledger
from handoff.watchdog import watch_once
from handoff.ledger import events as ev
from handoff.ledger.errors import IdempotencyConflict, IllegalTransition, SeqConflict, StoreUnavailable
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor

from tests.support import working_run

from .conftest import (
    IS_ROOT, agent, handoff, kill, log_digest, read_jsonl, run_evidence, scale, wait_until,
)


def planned_run(lg: Ledger, run: str, worker: str = "w1", **policy) -> str:
    """A working run (tests/support.py) whose plan is committed before it executes."""
    lease = working_run(lg, run, state="planning", goal=f"goal of {run}", worker=worker,
                        **{"owner_cap": 1000, **policy})
    lg.progress(run, lease, "plan_committed", "plan v1", worker=worker)
    lg.transition(run, lease, "executing", worker=worker)
    return lease


def recoveries(lg: Ledger, run: str) -> list[ev.RecoveryDecided]:
    return [r.event for r in lg.log(run) if r.type == "recovery_decided"]


def stop_outside_transaction(proc: subprocess.Popen, db: str) -> int:
    """SIGSTOP ``proc`` at a moment it does not hold the write lock; return the retries.

    A process stopped inside a write transaction keeps SQLite's write lock and every
    other writer waits out its busy timeout (test_stopped_lock_holder_blocks_writers_...
    shows that case on purpose). Here the worker must be stopped *between* writes, as a
    paused agent usually is, so a stop that landed mid-transaction is undone and retried.
    """
    retries = 0
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.01)
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            probe.execute("PRAGMA wal_autocheckpoint=0")
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return retries
        except sqlite3.OperationalError:
            retries += 1
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.003 * random.random())
        finally:
            probe.close()


# --- row 1 ---------------------------------------------------------------------------


def test_row1_heartbeats_without_progress_are_stalled_then_paused(tmp_path, procs, evidence):
    db = str(tmp_path / "l.db")
    run = "stuck"
    budget = 2
    with Ledger(db) as lg:
        lease = planned_run(lg, run, heartbeat_timeout_s=30.0, progress_timeout_s=0.4, retry_budget=budget)
        seq_before = lg.checkpoint(run).progress_seq
    stopfile, out = str(tmp_path / "stop"), str(tmp_path / "looper.json")
    p = agent("looper", db, run, lease, "w1", stopfile, out)
    procs.append(p)
    actions = []
    health_seen = []
    with Ledger(db) as lg:
        def beats() -> int:
            """The lease's beats so far: most are kept beside the log, not logged."""
            live = lg.store.liveness([run]).get(run)
            return 0 if live is None or live.lease != lease.lease else live.beats

        wait_until(lambda: lg.checkpoint(run).watch.last_heartbeat_us is not None and beats() >= 3,
                   what="heartbeats")
        deadline = time.monotonic() + 30
        while lg.checkpoint(run).state != "blocked":
            assert time.monotonic() < deadline, f"never paused; actions so far: {actions}"
            time.sleep(0.45)  # a little over the progress timeout: one window per pass
            stalls = lg.stalls()
            health_seen += [(h.classification, h.action) for cp, h in stalls if cp.run_id == run]
            actions += [(a.action, a.outcome) for a in watch_once(lg, name="wd")]
        # The worker is still alive and beating after the pause: liveness never was the problem.
        beats_at_pause, beat_us_at_pause = beats(), lg.checkpoint(run).watch.last_heartbeat_us
        wait_until(lambda: beats() > beats_at_pause and lg.checkpoint(run).watch.last_heartbeat_us > beat_us_at_pause,
                   what="a heartbeat after the pause")
        open(stopfile, "w").close()
        assert p.wait(timeout=30) == 0, p.stderr.read()
        looped = json.load(open(out))
        cp = lg.checkpoint(run)
        rec = run_evidence(lg, run)
        decided = recoveries(lg, run)
        observed = [r.event for r in lg.log(run) if r.type == "watchdog_observed"]
        from handoff.reducers import transitions as T

        advanced_by = {r.actor for r in lg.log(run) if r.seq > 5 and (
            r.event.advances if r.type == "progress_recorded" else r.type in T.ADVANCING_EVENTS)}

    assert looped["beats"] >= 5 and looped["retries"] >= 5
    # After setup only the pause itself (blocker raised, state changed) wrote events of the
    # types that can advance, and the watchdog's own acts never count: progress_seq stayed
    # where the work left it. The worker's heartbeats and tool_retry reports never counted.
    assert advanced_by == {"watchdog:wd"}, advanced_by
    assert cp.progress_seq == seq_before
    assert ("stalled", "mark_stalled") in health_seen and ("stalled", "pause") in health_seen
    assert [d.action for d in decided] == ["mark_stalled", "pause"]
    assert all(d.progress_seq == seq_before for d in decided)
    assert len(observed) >= budget and all(o.classification == "stalled" for o in observed)
    # The watchdog judged from the beats kept beside the log, and its events say so.
    assert all(o.beats is not ev.UNSET and o.beats >= 1 and o.beat_us is not ev.UNSET for o in observed + decided)
    assert cp.state == "blocked" and "paused by watchdog" in cp.blockers[-1].reason
    assert cp.lease == lease.lease, "pausing keeps the lease: a person decides what happens next"
    evidence.add("matrix.row1_stalled", **rec, looper=looped, watchdog_actions=actions,
                 classifications=sorted(set(health_seen)), observations=len(observed))


# --- row 2 ---------------------------------------------------------------------------


def test_row2_sigstop_after_effect_start_is_reconciled_never_retried(tmp_path, procs, evidence):
    db = str(tmp_path / "l.db")
    run = "deploy"
    with Ledger(db) as lg:
        lease = planned_run(lg, run, heartbeat_timeout_s=0.5, progress_timeout_s=600.0)
    marker, gofile, out = (str(tmp_path / n) for n in ("started", "go", "w.json"))
    p = agent("effect_worker", db, run, lease, "w1", marker, gofile, out, 0, str(tmp_path / "none"))
    procs.append(p)
    wait_until(lambda: os.path.exists(marker), what="the side effect to start")
    time.sleep(0.1)  # a few heartbeats while the effect is in flight
    stop_retries = stop_outside_transaction(p, db)
    actions = []
    with Ledger(db) as lg:
        beat_at_stop = lg.checkpoint(run).watch.last_heartbeat_us
        deadline = time.monotonic() + 30
        while not any(d.action == "reconcile" for d in recoveries(lg, run)):
            assert time.monotonic() < deadline, f"no reconciliation asked for; actions: {actions}"
            time.sleep(0.2)
            actions += [(a.action, a.classification, a.outcome) for a in watch_once(lg, name="wd")]
        for _ in range(3):  # later passes must not ask again or do anything else
            actions += [(a.action, a.classification, a.outcome) for a in watch_once(lg, name="wd")]
        cp = lg.checkpoint(run)
        assert cp.state == "unknown" and cp.lease is None
        assert [e.key for e in cp.pending_effects] == ["deploy-42"]
        assert cp.watch.last_heartbeat_us == beat_at_stop, "a stopped process cannot beat"
        # A replacement may claim, but it cannot retry the effect or move on blindly.
        lease2 = lg.claim(run, "w2")
        with pytest.raises(IllegalTransition):
            lg.effect_start(run, lease2, "deploy-42", "POST /deploy v42", worker="w2")
        with pytest.raises(IllegalTransition):
            lg.transition(run, lease2, "executing", worker="w2")
        # Someone looks at the world and records what happened: the reconciliation.
        lg.effect_confirm(run, "deploy-42", "done", note="v42 is live on staging",
                          actor=Actor("operator", "ops"))
        lg.transition(run, lease2, "executing", worker="w2")
        with pytest.raises(IdempotencyConflict):
            lg.effect_start(run, lease2, "deploy-42", "POST /deploy v42", worker="w2")
        lg.heartbeat(run, lease2, worker="w2")  # w2 is alive (the heartbeat timeout is 0.5 s)
        after = [(a.action, a.outcome) for a in watch_once(lg, name="wd")]
        rec = run_evidence(lg, run, old_lease=lease)
        decided = recoveries(lg, run)
        starts = [r for r in lg.log(run) if r.type == "side_effect_started"]
        recon = [r.event for r in lg.log(run) if r.type == "reconciliation_recorded"]
        assert lg.verify() == [] and lg.check() == []
    kill(p)

    assert [(d.action, d.classification) for d in decided] == [
        ("revoke_lease", "unavailable"), ("reconcile", "needs_reconciliation")]
    assert len(starts) == 1, "the side effect was started once and never retried blindly"
    assert [(r.key, r.outcome) for r in recon] == [("deploy-42", "done")]
    assert after == [], "a reconciled run with a live worker needs nothing from the watchdog"
    evidence.add("matrix.row2_sigstop_effect", **rec, watchdog_actions=actions,
                 effect_started=len(starts), reconciliations=len(recon), sigstop_retries=stop_retries)


# --- row 3 ---------------------------------------------------------------------------


@pytest.mark.slow  # scaled: bounded by default, full size with --slow
def test_row3_replaced_worker_resumed_with_sigcont_writes_nothing(tmp_path, procs, evidence):
    db = str(tmp_path / "l.db")
    run = "replace"
    n_late = scale(240, 2400)
    with Ledger(db) as lg:
        lease = planned_run(lg, run, heartbeat_timeout_s=30.0)
    art = tmp_path / "result.txt"
    art.write_text("late result\n")
    marker, gofile, out = (str(tmp_path / n) for n in ("started", "go", "w.json"))
    p = agent("effect_worker", db, run, lease, "w1", marker, gofile, out, n_late, str(art))
    procs.append(p)
    wait_until(lambda: os.path.exists(marker), what="the side effect to start")
    time.sleep(0.1)
    stop_retries = stop_outside_transaction(p, db)
    # Replaced by real CLI processes: an operator revokes, reconciles; w2 claims and goes on.
    steps = [
        ("revoke", run, "--reason", "worker paused for too long", "--by", "ops"),
        ("effect-confirm", run, "--effect-key", "deploy-42", "--outcome", "done", "--by", "ops",
         "--note", "checked: v42 is live"),
        ("claim", run, "--worker", "w2"),
    ]
    for args in steps:
        r = handoff(*args, db=db)
        assert r.returncode == 0, (args, r.stderr)
    lease2 = r.stdout.strip()  # the token the claim printed
    with Ledger(db) as lg:
        lg.transition(run, lease2, "executing", worker="w2")
        before = log_digest(db)
        # Resume the old worker: it finishes "the effect" and goes on writing under lease 1.
        open(gofile, "w").close()
        os.kill(p.pid, signal.SIGCONT)
        assert p.wait(timeout=120) == 0, p.stderr.read()
        tally = json.load(open(out))
        # The same stale worker through the real CLI.
        cli_codes = collections.Counter()
        for args in (("progress", run, "--lease", str(lease), "--kind", "tool_outcome", "--detail", "late"),
                     ("heartbeat", run, "--lease", str(lease)),
                     ("effect-confirm", run, "--effect-key", "deploy-42", "--outcome", "absent", "--lease", str(lease))):
            r = handoff(*args, db=db)
            cli_codes[r.returncode] += 1
            assert "StaleLease" in r.stderr or "has ended" in r.stderr, r.stderr
        after = log_digest(db)
        # The new worker is unaffected.
        lg.progress(run, lease2, "tool_outcome", "w2 carries on", worker="w2")
        rec = run_evidence(lg, run, old_lease=lease)
        assert lg.verify() == [] and lg.check() == []

    late_total = n_late + tally["late_beats_refused"] + tally["late_beats_accepted"]
    assert tally["accepted"] == 0, f"a replaced worker's write was accepted: {tally['accepted_what']}"
    assert sum(tally["refused"].values()) == late_total
    assert set(tally["refused"]) <= {"StaleLease", "LeaseHeld"}, tally["refused"]
    assert cli_codes == {1: 3}
    assert after == before, "the log changed while only the replaced worker was writing"
    evidence.add("matrix.row3_stale_writes", **rec, new_lease=int(lease2.partition(".")[0]), late_writes=late_total,
                 accepted=tally["accepted"], refused=tally["refused"], cli_exit_codes=dict(cli_codes),
                 log_events_before=len(before), log_events_after=len(after), sigstop_retries=stop_retries)


# --- row 4 ---------------------------------------------------------------------------


def test_row4_duplicate_progress_is_stored_once(tmp_path, procs, evidence):
    from click.testing import CliRunner

    from handoff import cli

    db = str(tmp_path / "l.db")
    run = "dup"
    with Ledger(db) as lg:
        lease = planned_run(lg, run)
        seq0 = lg.checkpoint(run).progress_seq
    gofile = str(tmp_path / "go")
    n_proc, times = 3, scale(15, 100)
    outs = [str(tmp_path / f"d{i}.json") for i in range(n_proc)]
    ps = [agent("duplicator", db, run, lease, "w1", gofile, outs[i], times) for i in range(n_proc)]
    procs.extend(ps)
    time.sleep(0.4)
    open(gofile, "w").close()
    for q in ps:
        assert q.wait(timeout=120) == 0, q.stderr.read()
    outcomes = collections.Counter()
    for o in outs:
        outcomes.update(json.load(open(o)))
    # Once more through the CLI: same key, same report -> duplicate, exit 0.
    runner = CliRunner()
    res = runner.invoke(cli.main, ["--db", db, "progress", run, "--lease", str(lease), "--kind", "tool_outcome",
                                   "--detail", "uploaded report.pdf", "--key", "upload-report", "--json"],
                        env={"HANDOFF_WORKER": "w1"})
    assert res.exit_code == 0, res.output
    cli_outcome = json.loads(res.stdout)["outcome"]
    # Same key, different report: refused (exit 1), nothing written.
    before = log_digest(db)
    res2 = runner.invoke(cli.main, ["--db", db, "progress", run, "--lease", str(lease), "--kind", "tool_outcome",
                                    "--detail", "uploaded report-v2.pdf", "--key", "upload-report"],
                         env={"HANDOFF_WORKER": "w1"})
    assert res2.exit_code == 1 and "already used" in res2.stderr, res2.stderr
    assert log_digest(db) == before
    # The raw store: a replayed expected_seq is a conflict, not a second copy.
    store = SqliteStore(db)
    try:
        head = store.head("raw")
        seq = head.last_seq if head else 0
        event = [ev.ProgressRecorded(kind="raw", detail="once")]
        store.append("raw", event, actor=Actor("worker", "w9"), expected_seq=seq)
        with pytest.raises(SeqConflict):
            store.append("raw", event, actor=Actor("worker", "w9"), expected_seq=seq)
        raw_copies = sum(r.event.detail == "once" for r in store.read_run("raw"))
    finally:
        store.close()
    with Ledger(db) as lg:
        stored = [r for r in lg.log(run) if r.type == "progress_recorded" and r.event.detail.startswith("uploaded")]
        cp = lg.checkpoint(run)
        rec = run_evidence(lg, run)
        assert lg.verify() == [] and lg.check() == []
    assert outcomes["committed"] == 1 and outcomes["duplicate"] == n_proc * times - 1
    assert cli_outcome == "duplicate"
    assert len(stored) == 1 and stored[0].idempotency_key == "upload-report"
    assert cp.progress_seq == seq0 + 1
    assert raw_copies == 1
    evidence.add("matrix.row4_duplicates", **rec, deliveries=n_proc * times + 1, outcomes=dict(outcomes),
                 cli_outcome=cli_outcome, stored_copies=len(stored), conflicting_reuse_exit=res2.exit_code,
                 raw_replayed_expected_seq="SeqConflict", raw_copies=raw_copies)


# --- row 5 ---------------------------------------------------------------------------


def _stored_steps(db: str, run: str) -> list[str]:
    with Ledger(db, readonly=True) as lg:
        return [r.idempotency_key for r in lg.log(run) if r.idempotency_key and r.idempotency_key.startswith("p")]


def _check_stopped_safely(db: str, run: str, ack: str, out: str, proc: subprocess.Popen) -> dict:
    rc = proc.wait(timeout=120)
    result = json.load(open(out))
    acked = [f"p{a['k']}" for a in read_jsonl(ack)]
    stored = _stored_steps(db, run)
    err = result["error"]
    assert err is not None, "the worker should have been stopped by the store"
    assert err["type"] == "StoreUnavailable" and err["exit_code"] == 3 and rc == 3, result
    assert stored == acked, f"acked {acked} but stored {stored}: progress reported that was not stored"
    assert result.get("failed_key") not in stored
    return {"acked": len(acked), "stored": len(stored), "exit_code": rc, "error": err["type"],
            "message": err["message"]}


def _five_setup(db: str, run: str) -> int:
    with Ledger(db) as lg:
        return planned_run(lg, run)


def test_row5_store_readonly_flag(tmp_path, procs, evidence):
    db, run = str(tmp_path / "l.db"), "ro"
    lease = _five_setup(db, run)
    ack, out = str(tmp_path / "ack"), str(tmp_path / "out.json")
    p = agent("progress_until_error", db, run, lease, "w1", ack, out, "readonly")
    procs.append(p)
    got = _check_stopped_safely(db, run, ack, out, p)
    assert "read-only" in got["message"]
    evidence.add("matrix.row5_readonly_flag", **got)


@pytest.mark.skipif(not IS_ROOT, reason="a read-only bind mount needs root")
def test_row5_store_on_a_filesystem_remounted_read_only(tmp_path, evidence):
    """A shell agent calls the real CLI per step; between two steps the volume goes read-only."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir(), mnt.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(mnt)], check=True)
    try:
        db, run = str(mnt / "l.db"), "rofs"
        lease = _five_setup(db, run)
        acked = []
        codes = []
        for k in range(6):
            if k == 3:
                wait_until(lambda: subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)],
                                                  capture_output=True).returncode == 0, what="remount ro")
            r = handoff("progress", run, "--lease", str(lease), "--kind", "tool_outcome", "--detail",
                        f"step {k}", "--key", f"p{k}", db=db)
            codes.append(r.returncode)
            if r.returncode != 0:
                message = r.stderr.strip()
                break
            acked.append(f"p{k}")
        status = handoff("status", run, db=db)
        subprocess.run(["mount", "-o", "remount,rw,bind", str(mnt)], check=True)
        stored = _stored_steps(db, run)
        with Ledger(db) as lg:
            lg.progress(run, lease, "tool_outcome", "step 3", key="p3", worker="w1")  # usable again
            assert lg.verify() == [] and lg.check() == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
    assert codes == [0, 0, 0, 3] and stored == acked == ["p0", "p1", "p2"]
    assert "cannot open" in message or "read-only" in message, message
    assert status.returncode == 3, "even reading needs the -shm file beside a WAL ledger"
    evidence.add("matrix.row5_readonly_mount", acked=len(acked), stored=len(stored), exit_codes=codes,
                 message=message, status_exit_on_ro=status.returncode)


def test_row5_disk_full_by_page_quota(tmp_path, procs, evidence):
    db, run = str(tmp_path / "l.db"), "quota"
    lease = _five_setup(db, run)
    ack, out = str(tmp_path / "ack"), str(tmp_path / "out.json")
    p = agent("progress_until_error", db, run, lease, "w1", ack, out, "pages:40", 3000)
    procs.append(p)
    got = _check_stopped_safely(db, run, ack, out, p)
    assert "full" in got["message"] and got["acked"] >= 1
    with Ledger(db) as lg:  # space returns (no quota on this connection): the ledger goes on
        lg.progress(run, lease, "tool_outcome", "after the quota", key=f"p{got['acked']}", worker="w1")
        assert lg.verify() == [] and lg.check() == [] and lg.store.integrity_check() == "ok"
    evidence.add("matrix.row5_disk_full_quota", **got)


@pytest.mark.skipif(not IS_ROOT, reason="mounting a tmpfs needs root")
def test_row5_disk_full_on_a_small_tmpfs(tmp_path, procs, evidence):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        db, run = str(mnt / "l.db"), "full"
        lease = _five_setup(db, run)
        ack, out = str(tmp_path / "ack"), str(tmp_path / "out.json")
        p = agent("progress_until_error", db, run, lease, "w1", ack, out, "plain", 4000)
        procs.append(p)
        got = _check_stopped_safely(db, run, ack, out, p)
        cli = handoff("progress", run, "--lease", str(lease), "--kind", "tool_outcome", "--detail",
                      "x" * 8000, "--key", "cli-full", db=db)
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        with Ledger(db) as lg:
            lg.progress(run, lease, "tool_outcome", "space is back", key=f"p{got['acked']}", worker="w1")
            assert lg.verify() == [] and lg.check() == [] and lg.store.integrity_check() == "ok"
            assert not any(r.idempotency_key == "cli-full" for r in lg.log(run))
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
    assert "full" in got["message"] and got["acked"] >= 1
    assert cli.returncode == 3 and "full" in cli.stderr, cli.stderr
    evidence.add("matrix.row5_disk_full_tmpfs", **got, cli_exit_code=cli.returncode)


def test_row5_store_locked_by_another_process(tmp_path, procs, evidence):
    db, run = str(tmp_path / "l.db"), "locked"
    lease = _five_setup(db, run)
    ack, out, gate, marker = (str(tmp_path / n) for n in ("ack", "out.json", "gate", "locked"))
    p = agent("progress_until_error", db, run, lease, "w1", ack, out, f"gate:{gate}", 0, 100, 0.3)
    procs.append(p)
    for k in range(3):
        open(f"{gate}.{k}", "w").close()
    wait_until(lambda: len(read_jsonl(ack)) == 3, what="three steps")
    holder = agent("locker", db, marker)
    procs.append(holder)
    wait_until(lambda: os.path.exists(marker), what="the lock")
    started = time.monotonic()
    open(f"{gate}.3", "w").close()
    got = _check_stopped_safely(db, run, ack, out, p)
    waited = time.monotonic() - started
    cli = handoff("--busy-timeout", "0.2", "progress", run, "--lease", str(lease), "--kind", "tool_outcome",
                  "--detail", "cli", "--key", "cli-locked", db=db)
    kill(holder)
    with Ledger(db) as lg:
        lg.progress(run, lease, "tool_outcome", "lock gone", key="p3", worker="w1")
        assert lg.verify() == [] and lg.check() == []
        meta = dict(lg.store.conn.execute("SELECT key, value FROM handoff_meta"))
    assert "locked" in got["message"] and got["acked"] == 3 and waited >= 0.3
    assert cli.returncode == 3 and "locked" in cli.stderr
    assert "locker" not in meta, "the killed lock holder's uncommitted write must vanish"
    evidence.add("matrix.row5_locked", **got, waited_s=round(waited, 2), cli_exit_code=cli.returncode)


def test_row5_stopped_lock_holder_blocks_writers_until_it_dies(tmp_path, procs, evidence):
    """The hazard behind stop_outside_transaction: a process frozen (SIGSTOP, a debugger, a
    hung NFS client...) inside a write transaction keeps the lock. Writers get a typed
    StoreUnavailable after their busy timeout; killing the holder frees the ledger and
    its half-done write never appears."""
    db, run = str(tmp_path / "l.db"), "frozen"
    lease = _five_setup(db, run)
    marker = str(tmp_path / "locked")
    holder = agent("locker", db, marker, "IMMEDIATE")
    procs.append(holder)
    wait_until(lambda: os.path.exists(marker), what="the lock")
    os.kill(holder.pid, signal.SIGSTOP)
    refused = 0
    with Ledger(db, busy_timeout_s=0.2) as lg:
        for _ in range(3):
            with pytest.raises(StoreUnavailable, match="locked"):
                lg.progress(run, lease, "tool_outcome", "blocked", worker="w1")
            refused += 1
        # Nor can the watchdog act: its pass fails the same way (watch_forever logs and retries).
        with pytest.raises(StoreUnavailable, match="locked"):
            watch_once(lg, name="wd")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        lg.progress(run, lease, "tool_outcome", "after the holder died", worker="w1")
        assert lg.verify() == [] and lg.check() == []
    evidence.add("matrix.row5_frozen_lock_holder", refused_while_frozen=refused, watchdog_pass="StoreUnavailable",
                 after_kill="writes accepted")


# --- row 6 ---------------------------------------------------------------------------


def _recovery_world(db: str, tmp_path) -> tuple[dict[str, list[str]], int]:
    """Runs that each need one kind of recovery, and some that need none."""
    kinds: dict[str, list[str]] = collections.defaultdict(list)
    n = scale(2, 4)
    with Ledger(db) as lg:
        for i in range(n):
            run = f"dead-{i}"  # its worker vanished: revoke
            planned_run(lg, run, worker=f"wd{i}", heartbeat_timeout_s=5.0)
            kinds["dead"].append(run)
            run = f"fx-{i}"  # vanished mid side effect: revoke, then reconcile
            lease = planned_run(lg, run, worker=f"wf{i}", heartbeat_timeout_s=5.0)
            lg.effect_start(run, lease, f"send-{i}", "send the invoice", worker=f"wf{i}")
            kinds["effect"].append(run)
            run = f"stuck-{i}"  # beating, never progressing: mark stalled, then pause
            planned_run(lg, run, worker=f"ws{i}", heartbeat_timeout_s=1e6, progress_timeout_s=10.0,
                        retry_budget=2)
            kinds["stuck"].append(run)
            run = f"healthy-{i}"
            planned_run(lg, run, worker=f"wh{i}", heartbeat_timeout_s=1e7, progress_timeout_s=1e7,
                        delivery_timeout_s=1e7)
            kinds["healthy"].append(run)
        for i in range(max(1, n // 2)):
            run = f"sent-{i}"  # a delivery with no outcome past its timeout: reconcile it
            result = tmp_path / f"result-{i}.md"
            result.write_text("the report\n")
            lease = planned_run(lg, run, worker=f"wv{i}", heartbeat_timeout_s=1e6, progress_timeout_s=1e6,
                                delivery_timeout_s=5.0)
            lg.artifact(run, lease, str(result), worker=f"wv{i}")
            lg.transition(run, lease, "verifying", worker=f"wv{i}")
            lg.evidence(run, "tests", "pass", "ok", lease=lease, actor=Actor("worker", f"wv{i}"))
            lg.submit(run, lease, "done", worker=f"wv{i}")
            lg.deliver(run, f"d{i}", by="alice")
            kinds["delivery"].append(run)
        t0 = lg.clock()
    return kinds, t0


@pytest.mark.slow  # scaled: bounded by default, full size with --slow
def test_row6_watchdog_killed_during_recovery_never_acts_twice(tmp_path, procs, evidence):
    db = str(tmp_path / "l.db")
    kinds, t0 = _recovery_world(db, tmp_path)
    # Six passes 11 s apart in ledger time: past every heartbeat timeout at once, and one
    # progress-timeout window of the stuck runs per pass.
    schedule = ",".join(str(t0 + k * 11_000_000) for k in range(1, 7))
    out = str(tmp_path / "actions.jsonl")
    target_kills = scale(15, 60)
    rng = random.Random(6)
    kills = restarts = completed = 0
    killed_pids: list[int] = []
    live: dict[str, subprocess.Popen] = {}
    started: dict[str, float] = {}
    finished: set[str] = set()
    names = ("wd-a", "wd-b")  # two watchdogs at once, on top of the kills

    def start(name: str) -> None:
        # Start-up, then six passes 0.05 s apart: kills land before, during and between
        # passes, and inside their write transactions. The kill is timed from the moment the
        # incarnation says it is up (its "started" line), not from its spawn: on a busy
        # machine the interpreter's start-up alone can outlast any fixed delay.
        live[name] = agent("watchdog", db, name, schedule, out, 0.05, stdout=subprocess.DEVNULL)
        procs.append(live[name])
        started[name] = rng.uniform(-0.1, 0.45)  # when to kill it, after its "started" line

    def kill_due(name: str, up: dict[int, float]) -> bool:
        pid = live[name].pid
        return pid in up and time.monotonic() >= up[pid] + started[name]

    for name in names:
        start(name)
    limit_s = 600
    deadline = time.monotonic() + limit_s
    up: dict[int, float] = {}  # pid -> when its "started" line was first seen
    seen_lines = 0
    while kills < target_kills:
        assert time.monotonic() < deadline, f"only {kills} of {target_kills} kills landed within {limit_s}s"
        time.sleep(0.01)
        lines = read_jsonl(out)
        for line in lines[seen_lines:]:
            if line.get("started"):
                up[line["pid"]] = time.monotonic()
        seen_lines = len(lines)
        for name in names:
            p = live[name]
            if p.poll() is not None:  # finished all passes before its kill: start it over
                assert p.returncode == 0, p.stderr.read()
                restarts += 1
                completed += 1
                start(name)
            elif kill_due(name, up):
                p.kill()
                p.wait()
                killed_pids.append(p.pid)
                kills += 1
                restarts += 1
                start(name)
    for name in names:  # the last incarnations run to the end
        assert live[name].wait(timeout=120) == 0, live[name].stderr.read()
        finished.add(name)

    log_actions = read_jsonl(out)
    # How far each killed incarnation got: passes with at least one action line (0 = killed
    # during start-up or its first pass).
    reached = collections.Counter(
        len({a["now"] for a in log_actions if a.get("pid") == pid and "now" in a}) for pid in killed_pids)
    outcomes = collections.Counter(a["outcome"] for a in log_actions if "outcome" in a)
    with Ledger(db) as lg:
        per_key = collections.Counter()
        observed = collections.Counter()
        summaries = {}
        for run_list in kinds.values():
            for run in run_list:
                for rec in lg.log(run):
                    e = rec.event
                    if isinstance(e, ev.RecoveryDecided):
                        per_key[(run, e.action, e.progress_seq)] += 1
                    elif isinstance(e, ev.WatchdogObserved):
                        observed[(run, e.progress_seq, re.search(r"window \d+", e.reason).group())] += 1
                summaries[run] = run_evidence(lg, run)
        cps = {run: lg.checkpoint(run) for runs in kinds.values() for run in runs}
        problems, diffs = lg.verify(), lg.check()

    twice = {k: v for k, v in per_key.items() if v > 1}
    assert twice == {}, f"recovery actions recorded more than once: {twice}"
    assert all(v == 1 for v in observed.values()), observed
    for run in kinds["dead"]:
        assert cps[run].lease is None and [a for (r, a, _) in per_key if r == run] == ["revoke_lease"]
    for run in kinds["effect"]:
        assert cps[run].state == "unknown" and cps[run].lease is None
        assert sorted(a for (r, a, _) in per_key if r == run) == ["reconcile", "revoke_lease"]
    for run in kinds["stuck"]:
        assert cps[run].state == "blocked", summaries[run]
        assert sorted(a for (r, a, _) in per_key if r == run) == ["mark_stalled", "pause"]
    for run in kinds["delivery"]:
        assert [a for (r, a, _) in per_key if r == run] == ["reconcile_delivery"]
    for run in kinds["healthy"]:
        assert not any(r == run for (r, _, _) in per_key) and cps[run].state == "executing"
    assert problems == [] and diffs == []
    evidence.add("matrix.row6_watchdog_kills", sigkills=kills, incarnations=restarts + len(names),
                 completed_before_their_kill=completed,
                 killed_after_n_passes_with_actions=dict(sorted(reached.items())),
                 passes_per_incarnation=6, recovery_decisions=sum(per_key.values()),
                 recorded_twice=len(twice), observations=sum(observed.values()),
                 action_outcomes=dict(outcomes),
                 runs={k: len(v) for k, v in kinds.items()},
                 examples={k: summaries[v[0]] for k, v in kinds.items()})
