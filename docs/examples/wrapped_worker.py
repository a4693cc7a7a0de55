# wrapped_worker.py: run an agent under the worker wrapper, which claims, heartbeats and releases.
import sys

from handoff.worker import run_wrapped

# The agent: any program. It finds its run, lease and ledger in its environment.
AGENT = """
import os
from handoff import Ledger

with Ledger(os.environ["HANDOFF_DB"]) as lg:
    run, lease = os.environ["HANDOFF_RUN"], os.environ["HANDOFF_LEASE"]
    lg.transition(run, lease, "planning")
    lg.progress(run, lease, "plan_committed", "outline ready")
"""

result = run_wrapped(
    "handoff.db", [sys.executable, "-c", AGENT], worker="agent-1",
    open_kwargs={"goal": "Draft the report", "target": "chat:#ops", "owner": "alice"},
)
print(result.describe(), result.lease_lost, result.returncode)
