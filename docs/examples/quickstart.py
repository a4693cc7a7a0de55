# quickstart.py: open a run, claim it, record a step, read its health.
from handoff import LeaseHeld, Ledger, LedgerError  # every typed error is importable here

with Ledger("handoff.db") as lg:
    run = lg.open(goal="Draft the report", target="chat:#ops", owner="alice")
    lease = lg.claim(run, "agent-1")  # the lease token: shown once, passed to every worker write
    lg.transition(run, lease, "planning", worker="agent-1")
    lg.progress(run, lease, "plan_committed", "three sections", worker="agent-1")
    print(lg.status(run)["health"])
    try:
        lg.claim(run, "agent-2")  # agent-1 still holds the run
    except LeaseHeld as refused:  # a LedgerError: typed, with a message and an exit code
        assert isinstance(refused, LedgerError) and refused.exit_code == 1
        print(refused.type, refused.message)
