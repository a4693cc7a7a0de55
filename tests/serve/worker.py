"""A real worker process for the web view's tests: it claims a run, heartbeats every
``HEARTBEAT_S`` from the lease block's thread, records a step, says "ready" and works on
until it is killed (the tests SIGKILL it, so nothing is recorded of its end).

    python tests/serve/worker.py DB RUN WORKER HEARTBEAT_S
"""

import sys
import time

from handoff import Ledger

db, run, worker, every = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with Ledger(db) as lg, lg.lease(run, worker=worker, heartbeat_s=every) as lease:
    lease.transition("planning")
    lease.progress("plan_committed", "two steps")
    lease.transition("executing")
    print("ready", lease.number, flush=True)
    while True:
        time.sleep(0.2)
