"""Two stores of one SQLite ledger in a process keep SQLite's locks, so a third process's
close cannot reset the WAL under them (sqlite.org/howtocorrupt.html, 2.2: closing any
descriptor of a file drops every POSIX lock the process holds on it)."""

from __future__ import annotations

import subprocess
import sys

from handoff import Ledger

OPEN_AND_CLOSE = "import sys\nfrom handoff import Ledger\nLedger(sys.argv[1]).close()\n"
READ_STATE = ("import sys\nfrom handoff import Ledger\nlg = Ledger(sys.argv[1])\n"
              "cp = lg.checkpoint(sys.argv[2])\nprint(cp.lease, cp.progress_seq, cp.last_seq)\nlg.close()\n")


def test_a_second_handle_and_another_process_lose_none_of_the_first_handles_writes(tmp_path):
    db = str(tmp_path / "h.db")
    a = Ledger(db)
    run = a.open(goal="ship the notes", target="chat:#ops", owner="alice")
    b = Ledger(db)  # opening the same file again in this process must not touch a's locks
    try:
        for _ in range(3):  # other processes come and go, each the last to close as it sees it
            subprocess.run([sys.executable, "-c", OPEN_AND_CLOSE, db], check=True, timeout=60)
        token = a.claim(run, "w1")
        a.transition(run, token, "planning")
        a.transition(run, token, "executing")
        a.progress(run, token, "tool_outcome", "drafted")
        seen = subprocess.run([sys.executable, "-c", READ_STATE, db, run], check=True, timeout=60,
                              capture_output=True, text=True).stdout.split()
        cp = a.checkpoint(run)
        assert cp.last_seq == 5  # opened, granted, two moves, a step
        assert seen == [str(cp.lease), str(cp.progress_seq), "5"], "a write of the first handle was lost"
        assert b.checkpoint(run).last_seq == 5
    finally:
        b.close()
        a.close()
    reopened = Ledger(db)
    try:
        assert reopened.checkpoint(run).last_seq == 5
    finally:
        reopened.close()
