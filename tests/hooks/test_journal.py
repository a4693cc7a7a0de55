"""The journal: a hook never waits for the ledger and never breaks the agent; what it
journals is written in order, once, whenever the ledger answers."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys

from handoff import Ledger
from handoff.hooks import spool
from handoff.hooks.replay import flush
from tests.hooks.agents import env, handoff
from tests.hooks.feed import run_hook, session


def _types(lg: Ledger, run: str) -> list[str]:
    return [r.type for r in lg.log(run)]


def test_a_locked_ledger_is_journaled_then_written_in_order_once(tmp_path):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    (cwd / "a.txt").write_text("alpha\n")
    with Ledger(str(db)):
        pass
    docs = session("claude-code", cwd)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the ledger's write lock
    try:
        for doc in docs:
            proc = run_hook("claude-code", db, doc)
            assert (proc.returncode, proc.stdout) == (0, b""), proc.stderr
        directory = spool.state_dir(str(db))
        lines = [json.loads(line) for line in open(os.path.join(directory, spool.JOURNAL))]
        assert [r["hook"]["event"] for r in lines] == ["session_start", "prompt", "pre_tool", "post_tool", "pre_tool",
                                                        "permission_request", "notification", "post_tool", "stop",
                                                        "session_end"]
        assert flush(str(db), wait_s=60)["left"] > 0  # the ledger did not answer: all of it waits
        assert "did not answer" in open(os.path.join(directory, spool.LOG)).read()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # What a replay that dies before it can say how far it got leaves: this journal and state.
    kept = {name: open(os.path.join(directory, name), "rb").read() for name in (spool.JOURNAL, spool.STATE)}
    out = handoff("--db", str(db), "hooks", "flush").stdout
    assert "refused" in out and "left" not in out
    with Ledger(str(db)) as lg:
        [cp] = list(lg.runs(include_terminal=True))
        first = _types(lg, cp.run_id)
    assert first[:4] == ["handoff_opened", "lease_granted", "state_changed", "progress_recorded"]
    assert first[-1] == "lease_released" and cp.state == "ready_for_review"
    assert os.path.getsize(os.path.join(directory, spool.JOURNAL)) == 0

    # Replayed again from there: every write is keyed, so nothing is written twice.
    for name, data in kept.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    flush(str(db), wait_s=60)
    with Ledger(str(db)) as lg:
        assert _types(lg, cp.run_id) == first


def test_a_hook_that_cannot_write_its_journal_still_exits_0_silently(tmp_path):
    db = tmp_path / "ledger.db"
    os.makedirs(spool.state_dir(str(db)))
    os.chmod(spool.state_dir(str(db)), 0o500)  # no writing here
    try:
        doc = session("claude-code", tmp_path)[1]
        proc = run_hook("claude-code", db, doc)
        if os.geteuid() != 0:  # root writes anyway; the rule is the same
            assert b"nothing recorded" in proc.stderr
        assert (proc.returncode, proc.stdout) == (0, b"")
    finally:
        os.chmod(spool.state_dir(str(db)), 0o700)


def test_under_handoff_run_the_hooks_write_under_the_wrapper_s_lease(tmp_path):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    (cwd / "a.txt").write_text("alpha\n")
    feed = tmp_path / "feed.json"
    feed.write_text(json.dumps(session("claude-code", cwd)))
    agent = tmp_path / "agent.py"  # stands in for 'claude': runs its hooks, as Claude Code does
    agent.write_text(
        "import json, subprocess, sys\n"
        f"for doc in json.load(open({str(feed)!r})):\n"
        "    p = subprocess.run([sys.executable, '-m', 'handoff.hooks', 'claude-code', '--db', 'elsewhere.db'],\n"
        "                       input=json.dumps(doc).encode(), capture_output=True)\n"
        "    assert p.returncode == 0 and p.stdout == b'', p\n"
        "from handoff.hooks.replay import flush\n"
        "import os; flush(os.environ['HANDOFF_DB'], wait_s=60)\n")
    proc = handoff("--db", str(db), "run", "--goal", "Fix the flaky test", "--target", "pr:512", "--owner", "alice",
                   "--worker", "w1", "--", sys.executable, str(agent), env=env(), cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    with Ledger(str(db)) as lg:
        [cp] = list(lg.runs(include_terminal=True))
        records = list(lg.log(cp.run_id))
    assert cp.goal == "Fix the flaky test" and not cp.run_id.startswith("claude-code")
    assert [r.type for r in records].count("lease_granted") == 1  # the wrapper's, and only it
    assert {r.lease for r in records if r.actor.startswith("worker:") and r.type != "lease_granted"} == {1}
    assert any(r.type == "artifact_recorded" for r in records)
    assert cp.state == "succeeded" and cp.lease is None  # its contract asks no review; the wrapper released
    assert not os.path.exists(tmp_path / "elsewhere.db")  # the wrapper's ledger, not --db


def test_the_state_file_is_private_and_the_token_is_never_printed(tmp_path):
    db, cwd = tmp_path / "ledger.db", tmp_path / "work"
    cwd.mkdir()
    outputs = b""
    for doc in session("claude-code", cwd)[:3]:
        proc = run_hook("claude-code", db, doc)
        outputs += proc.stdout + proc.stderr
    flush(str(db), wait_s=60)
    directory = spool.state_dir(str(db))
    state = spool.load_state(directory)
    [s] = state["sessions"].values()
    assert s["token"].startswith("1.")
    assert stat.S_IMODE(os.stat(os.path.join(directory, spool.STATE)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    secret = s["token"].partition(".")[2]
    assert secret.encode() not in outputs
    with Ledger(str(db)) as lg:
        assert secret not in b"".join(lg.export()).decode()
