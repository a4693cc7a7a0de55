"""A child of ``handoff run`` that crashes: its exit status and the last lines of its
stderr are recorded (bounded, secrets redacted), its stderr still reaches the terminal,
and the report shows why on the lease's span."""

from __future__ import annotations

import re
import subprocess
import sys

from handoff import Ledger, report
from handoff.lease import MAX_STOP_TEXT
from tests.faults.conftest import ROOT, child_env
from tests.support import executable

CHILD = r"""
import sys
for i in range(20):
    print(f"early line {i}", file=sys.stderr)
print("connecting with password = hunter2-do-not-log-me", file=sys.stderr)
print("Traceback (most recent call last):", file=sys.stderr)
print("ValueError: the plan had no steps", file=sys.stderr)
sys.exit(1)
"""


def test_a_crashed_child_leaves_its_exit_and_the_end_of_its_stderr(tmp_path):
    db = str(tmp_path / "ledger.db")
    proc = subprocess.run(
        [*executable(), "run", "--goal", "crash", "--target", "chat:#ops", "--owner", "alice", "--worker", "w1",
         "--", sys.executable, "-c", CHILD],
        cwd=ROOT, env=child_env(HANDOFF_DB=db), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "early line 0" in proc.stderr and "ValueError: the plan had no steps" in proc.stderr  # passed through
    with Ledger(db) as lg:
        (run,) = [h.run_id for h in lg.store.list_runs()]
        released = [r.event for r in lg.log(run) if r.type == "lease_released"][-1]
        why = released.reason
        assert why.startswith("child exited with code 1; its stderr ended with: ")
        assert "ValueError: the plan had no steps" in why and "Traceback" in why
        assert "early line 0" not in why  # only the last lines
        assert len(why) <= MAX_STOP_TEXT
        assert b"hunter2" not in b"".join(lg.export())
        page = report.html_report(lg.report(run))
    span = re.search(r'<rect class="ev span lease-released"[^>]*>(.*?)</rect>', page)
    assert span and "ValueError: the plan had no steps" in span.group(1), "the lease's span does not say why"
