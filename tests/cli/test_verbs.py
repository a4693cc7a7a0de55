"""Every verb through click's CliRunner, against a real ledger file."""

from __future__ import annotations

import os

from tests.support import working_run


def test_init_creates_then_confirms(h):
    assert "created ledger" in h("init").stdout
    assert "already exists" in h("init").stdout
    doc = h.json("init")
    assert doc["created"] is False and doc["db"] == os.path.abspath(h.db)


def test_the_whole_lifecycle_through_the_verbs(h, tmp_path):
    report = tmp_path / "report.md"
    run = h("open", "--goal", "Draft the report", "--target", "chat:#ops", "--owner", "alice",
            "--origin", "ticket:7", "--result", str(report), "--require-review",
            "--heartbeat-timeout", "30").stdout.strip()
    assert run.startswith("run-")
    lease = h("claim", run, "--worker", "w1").stdout.strip()
    assert lease.startswith("1.") and len(lease) > 30  # the fencing number, then the secret
    # A bare beat just after the claim only moves the liveness kept beside the log; one with
    # new attrs is recorded in the log.
    kept = h("heartbeat", run, "--lease", lease).stdout
    assert "heartbeat kept beside the log" in kept and "no event written; last event seq 2" in kept
    assert "heartbeat recorded" in h("heartbeat", run, "--lease", lease, "--attr", "model=m1").stdout
    assert "moved to planning" in h("transition", run, "--lease", lease, "--to", "planning").stdout
    out = h("progress", run, "--lease", lease, "--kind", "plan_committed", "--detail", "3 parts", "--key", "p1")
    assert "plan_committed recorded" in out.stdout
    assert "already recorded" in h("progress", run, "--lease", lease, "--kind", "plan_committed",
                                   "--detail", "3 parts", "--key", "p1").stdout
    h("transition", run, "--lease", lease, "--to", "executing")
    assert "side effect deploy started" in h(
        "effect-start", run, "--lease", lease, "--effect-key", "deploy", "--what", "deploy v1").stdout
    assert "side effect deploy: done" in h("effect-confirm", run, "--effect-key", "deploy", "--outcome", "done",
                                           "--lease", lease).stdout
    assert "blocker #1 raised" in h("block", run, "--reason", "needs creds", "--next-action", "alice grants").stdout
    assert "unblocked" in h("unblock", run, "--resolution", "granted").stdout
    report.write_text("# Report\n\nAll good.\n")
    doc = h.json("artifact", run, "--lease", lease, "--kind", "result", str(report))
    assert doc["artifact"]["bytes"] == len(report.read_bytes()) and len(doc["artifact"]["sha256"]) == 64
    h("transition", run, "--lease", lease, "--to", "verifying")
    h("progress", run, "--lease", lease, "--kind", "verifier_result", "--detail", "ok")
    assert "evidence tests: pass" in h("evidence", run, "--lease", lease, "--kind", "tests", "--outcome", "pass").stdout
    assert "ready_for_review" in h("submit", run, "--lease", lease, "--summary", "done").stdout
    assert "approved" in h("review", run, "--by", "alice", "--approve", "--notes", "fine").stdout
    doc = h.json("deliver", run, "--by", "alice", "--delivery-key", "d1")
    assert doc["send"] is True and doc["outcome"] == "committed" and doc["delivery"]["status"] == "attempted"
    assert doc["target"] == "chat:#ops"
    doc = h.json("delivered", run, "--delivery-key", "d1", "--receipt", "msg 1")
    assert doc["state"] == "delivered" and doc["delivery"]["status"] == "confirmed"
    again = h("deliver", run, "--by", "alice", "--delivery-key", "d1")
    assert "do not send again" in again.stdout
    doc = h.json("deliver", run, "--by", "alice", "--delivery-key", "d1")
    assert doc["send"] is False and doc["outcome"] == "unchanged"
    assert doc["first_seq"] == doc["last_seq"] == h.json("status", run)["last_seq"]  # where the run stands
    packet = h.json("status", run)
    assert packet["state"] == "delivered" and packet["terminal"] is True
    assert packet["result_path"] == str(report)
    assert packet["delivery"]["receipt"] == "msg 1"


def test_release_revoke_close_fork_transfer(h):
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
    assert "lease 1 released" in h("release", "r1", "--lease", lease, "--reason", "bye").stdout
    assert h("claim", "r1", "--worker", "w2").stdout.strip().startswith("2.")
    assert "lease 2 revoked" in h("revoke", "r1", "--reason", "drain", "--by", "ops").stdout
    child = h("fork", "r1", "--at", "3", "--run-id", "r1-fork").stdout.strip()
    assert child == "r1-fork"
    fork = h.json("status", "r1-fork")
    assert fork["fork_parent"] == "r1" and fork["fork_seq"] == 3 and fork["lease"] is None
    assert "bob may now close" in h("transfer", "r1", "--by", "alice", "--action", "close", "--to", "bob").stdout
    assert "closed as no_op" in h("close", "r1", "--by", "bob", "--disposition", "no-op", "--reason", "done upstream").stdout
    assert h.json("status", "r1")["state"] == "no_op"


def test_delivery_failed_then_a_new_key(h, tmp_path):
    with h.ledger() as lg:
        lease = working_run(lg, "r1", state="verifying")
        f = tmp_path / "out.txt"
        f.write_text("x")
        lg.artifact("r1", lease, str(f), worker="w1")
        lg.evidence("r1", "tests", "pass", lease=lease)
        lg.submit("r1", lease, worker="w1")
    h("deliver", "r1", "--by", "alice", "--delivery-key", "k1")
    assert "marked failed" in h("delivery-failed", "r1", "--delivery-key", "k1", "--error", "channel gone").stdout
    assert h.json("deliver", "r1", "--by", "alice", "--delivery-key", "k2")["send"] is True


def test_worker_verbs_read_run_and_lease_from_the_environment(h):
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
    env = {"HANDOFF_RUN": "r1", "HANDOFF_LEASE": str(lease), "HANDOFF_WORKER": "w1"}
    out = h("progress", "--kind", "tool_outcome", "--detail", "from env", env=env)
    assert "progress_seq" in out.stdout
    rows = h.json("log", "r1", "--type", "progress_recorded")["events"]
    assert rows[-1]["actor"] == "worker:w1" and rows[-1]["lease"] == lease.lease


def test_status_lists_live_runs_with_filters(h):
    with h.ledger() as lg:
        working_run(lg, "r1", owner="alice")
        working_run(lg, "r2", owner="bob", state="planning")
        lg.open(run_id="r3", goal="g", target="t", owner="alice")
        lg.close_run("r3", "cancelled", by="alice")
    table = h("status").stdout
    assert "r1" in table and "r2" in table and "r3" not in table
    assert table.splitlines()[0].split()[:3] == ["RUN", "STATE", "OWNER"]
    assert [r["run_id"] for r in h.json("status", "--owner", "alice")["runs"]] == ["r1"]
    assert [r["run_id"] for r in h.json("status", "--state", "planning")["runs"]] == ["r2"]
    assert "r3" in [r["run_id"] for r in h.json("status", "--all")["runs"]]
    assert [r["run_id"] for r in h.json("status", "--state", "cancelled")["runs"]] == ["r3"]
    human = h("status", "r1").stdout
    assert "state      executing" in human and "health" in human and "monitored" in human


def test_log_and_replay(h):
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
        lg.heartbeat("r1", lease, worker="w1", attrs={"model": "m1"})  # new attrs: the log records it
        lg.progress("r1", lease, "tool_outcome", "step 1", worker="w1")
    text = h("log", "r1").stdout
    assert text.splitlines()[0].split() == ["SEQ", "TIME", "ACTOR", "LEASE", "TYPE", "SUMMARY"]
    assert "heartbeat_recorded" in text
    assert "heartbeat_recorded" not in h("log", "r1", "--no-heartbeats").stdout
    doc = h.json("log", "r1", "--after", "2")
    assert [e["seq"] for e in doc["events"]] == [3, 4, 5, 6]
    assert doc["events"][-1]["data"] == {"type": "progress_recorded", "kind": "tool_outcome",
                                         "detail": "step 1", "advances": True}
    assert doc["events"][0]["at"].endswith("Z")
    at2 = h.json("replay", "r1", "--at", "2")
    assert at2["state"] == "queued" and at2["lease"] == 1 and at2["last_seq"] == 2
    t = doc["events"][1]["at"]  # seq 4's time: the packet as it stood then
    assert h.json("replay", "r1", "--as-of", t)["last_seq"] == 4
    assert "as it stood at seq 2" in h("replay", "r1", "--at", "2").stdout


def test_stalls_and_watch(h):
    with h.ledger() as lg:
        working_run(lg, "quiet", heartbeat_timeout_s=1.0)
        start = lg.checkpoint("quiet").last_event_us
    later = start + 5_000_000
    from handoff.render import iso as _iso

    doc = h.json("stalls", "--now", _iso(later))
    (row,) = doc["stalls"]
    assert row["classification"] == "unavailable" and row["action"] == "revoke_lease" and row["lease"] == 1
    assert {"last_heartbeat_at", "last_progress", "retries", "retry_budget", "reason"} <= set(row)
    assert "unavailable" in h("stalls", "--now", _iso(later)).stdout
    out = h("watch", "--once", "--name", "t", "--now", _iso(later), "--commit").stdout
    assert out.count("\n") == 1 and "quiet unavailable -> revoke_lease" in out
    doc = h.json("watch", "--once", "--name", "t", "--now", _iso(later), "--commit")
    assert doc["watcher"] == "t" and doc["actions"] == []
    assert h.json("status", "quiet")["lease"] is None


def test_verify_check_rebuild_ok(h):
    with h.ledger() as lg:
        working_run(lg, "r1")
    assert h("verify").stdout.startswith("ok:")
    doc = h.json("verify", "r1")
    assert doc["ok"] is True and doc["events"] == 4 and doc["problems"] == []
    assert h("check").stdout.startswith("ok")
    assert h.json("check")["differences"] == []
    counts = h.json("rebuild")["rebuilt"]
    assert counts["checkpoints"] == 1
    assert "checkpoints" in h("rebuild", "--projection", "checkpoints").stdout


def test_doctor(h):
    h("init")
    facts = h.json("doctor")
    assert facts["journal_mode"] == "wal" and facts["path"] == os.path.abspath(h.db)
    assert "sqlite" in h("doctor").stdout


def test_run_in_process_records_a_clean_exit(h):
    import sys

    result = h("run", "--goal", "g", "--target", "t", "--owner", "o", "--run-id", "r9", "--worker", "w",
               "--json", "--", sys.executable, "-c", "import os; assert os.environ['HANDOFF_RUN'] == 'r9'")
    doc = __import__("json").loads(result.stdout)
    assert doc["exit_code"] == 0 and doc["released"] is True and doc["lease_lost"] is False
    assert "holds lease 1 on r9" in result.stderr
    assert h.json("status", "r9")["lease"] is None
    h("run", "--worker", "w", "--", "true", code=2)  # neither --run nor a contract
