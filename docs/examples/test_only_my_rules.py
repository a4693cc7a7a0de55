# test_only_my_rules.py: no built-in rule runs; every step is one of yours.
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from handoff import Actor
from handoff.testing import LedgerMachine
from handoff.reducers import commands as C


class DeliverOnce(LedgerMachine):
    builtin_rules = ()  # or ("lease", "sensible"), or {"lease": 1, "faults": 3}

    @rule(run=LedgerMachine.runs, steps=st.integers(1, 15))
    def work_honestly(self, run, steps):
        self.drive(run, steps)  # the steps a well-behaved worker and owner take

    @rule(run=LedgerMachine.runs, key=st.sampled_from(["again", "k1"]))
    def owner_sends_again(self, run, key):
        m = self.model.runs[run]
        if m.state == "delivered":  # a second send must be refused or be a no-op
            self.issue(run, Actor("owner", m.owner), C.Deliver(key=key), key=f"deliver:{key}")

    @invariant()
    def one_receipt_per_delivered_run(self):
        for run_id, m in self.model.runs.items():
            assert m.confirmations == (1 if m.state == "delivered" else 0), run_id


TestDeliverOnce = DeliverOnce.TestCase
TestDeliverOnce.settings = settings(max_examples=10, stateful_step_count=25, deadline=None)
