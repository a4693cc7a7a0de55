# test_my_workflow.py: your agent's habits, checked among the machine's own rules.
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from handoff import Actor
from handoff.testing import WATCHDOG, LedgerMachine
from handoff.reducers import commands as C


class MyWorkflow(LedgerMachine):
    own_rule_weight = 5  # each rule below is drawn five times as often as one built-in rule

    @rule(run=LedgerMachine.runs, retries=st.integers(0, 3))
    def flaky_tool(self, run, retries):
        if not self.bring_to_work(run):  # claim and start the run, if it can be
            return
        m = self.model.runs[run]
        me = Actor("worker", m.worker)
        if m.state != "executing":
            self.issue(run, me, C.Transition(lease=m.lease, to="executing"))
        for _ in range(retries):  # activity, never progress
            self.issue(run, me, C.Progress(lease=m.lease, kind="tool_retry"))
        self.issue(run, me, C.Progress(lease=m.lease, kind="tool_outcome"))

    @rule(run=LedgerMachine.runs)
    def watchdog_pauses(self, run):
        seq = self.model.runs[run].progress_seq
        self.issue(run, WATCHDOG, C.Observe(classification="stalled", progress_seq=seq))
        self.issue(run, WATCHDOG, C.Recover(action="pause", classification="stalled", progress_seq=seq))


TestMyWorkflow = MyWorkflow.TestCase
TestMyWorkflow.settings = settings(max_examples=10, stateful_step_count=30, deadline=None)
