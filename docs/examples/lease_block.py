# lease_block.py: a worker in this process holds its lease in a block; the block heartbeats.
from pathlib import Path

from handoff import LeaseLost, Ledger

with Ledger("handoff.db") as lg:
    run = lg.open(goal="Draft the report", target="chat:#ops", owner="alice")
    report = Path("report.md")
    try:
        with lg.lease(run, worker="agent-1") as lease:  # claims; heartbeats from a thread
            lease.transition("planning")
            lease.progress("plan_committed", "one section")
            lease.transition("executing")
            with lease.effect("notify-1", "post the draft link to #ops"):
                pass  # the side effect goes here: recorded as started before, done after
            report.write_text("# Report\n\nThe one section, written.\n")
            lease.artifact(str(report))
            lease.transition("verifying")
            lease.submit("the report is written")
    except LeaseLost as lost:  # revoked, or no heartbeat could be recorded in time
        print("stopped:", lost.message)
    print(lg.status(run)["state"], "- lease held now:", lg.status(run)["lease"])  # released at the end
