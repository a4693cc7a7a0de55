# watchdog_pass.py: one watchdog pass over a ledger whose worker has gone quiet.
from handoff import Ledger
from handoff.watchdog import watch_once

with Ledger("handoff.db") as lg:
    run = lg.open(goal="Draft the report", target="chat:#ops", owner="alice", heartbeat_timeout_s=60)
    lease = lg.claim(run, "agent-1")
    lg.transition(run, lease, "planning", worker="agent-1")

    # The worker sends no heartbeat. Judge the ledger as it stands two minutes from now:
    later = lg.clock() + 120 * 1_000_000  # times are UTC microseconds
    for action in watch_once(lg, name="ops-watchdog", interval_s=10, now_us=later):
        print(action.line(), action.outcome)
    print(lg.status(run)["lease"])  # the lease was revoked: None
