"""A stateful Hypothesis machine that drives the real Ledger (real SQLite file, controllable
clock) through random commands, many of them refused, and a "happy path" rule so that runs
also reach review, delivery and the terminal states. Subclasses add the invariants.

It complements handoff.testing.LedgerMachine (see test_projection_ledger_machine.py):
this one moves a controllable clock across the policy timeouts, which the deadline
agreement needs, and interleaves commands with a rebuild's batches.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from handoff import Actor, Ledger
from handoff.ledger.errors import LedgerError
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint

from tests.support import Clock

MAX_RUNS = 6

# Timeouts: ordinary ones, tiny ones (so ticks cross them), and awkward binary floats
# (5 * 1e-6 is 4.9999999999999996e-06) where "strictly more than x seconds" and
# "x * 1e6 µs" round differently.
SECONDS = st.one_of(
    st.sampled_from([60.0, 300.0, 600.0, 1.0, 0.001, 4.35, 1e-06, 5 * 1e-06, 3 * 0.1, 0.1 + 0.2, 2.5e-05]),
    st.floats(min_value=1e-6, max_value=1e4, allow_nan=False, allow_infinity=False),
)
TICKS = st.one_of(
    st.sampled_from([0, 1, 5, 999, 10**6, 59 * 10**6, 61 * 10**6, 301 * 10**6, 601 * 10**6]),
    st.integers(min_value=-(10**6), max_value=10**10),  # the clock may step back a little
)
ACTIONS = (
    "claim", "heartbeat", "transition", "progress", "artifact", "evidence", "block", "unblock",
    "effect_start", "effect_confirm", "submit", "review", "deliver", "delivered",
    "delivery_failed", "release", "revoke", "close", "observe", "recover", "transfer", "fork",
)
PROGRESS_KINDS = sorted(T.ALL_PROGRESS_KINDS | T.NOT_PROGRESS)


class LedgerCommands(RuleBasedStateMachine):
    synchronous = "NORMAL"

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="proj-machine-")
        self.path = os.path.join(self.dir, "ledger.db")
        self.clock = Clock(step_us=0)
        self.lg = Ledger(self.path, clock=self.clock, synchronous=self.synchronous)
        self.runs: list[str] = []
        self.result = os.path.join(self.dir, "result.md")
        with open(self.result, "w") as f:
            f.write("the result\n")
        self.keys = 0

    def teardown(self) -> None:
        try:
            self.lg.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------

    def fold(self, run_id: str) -> Checkpoint:
        return self.lg.store.fold(run_id, AGGREGATE)

    def try_(self, fn, *args, **kw) -> None:
        try:
            fn(*args, **kw)
        except LedgerError:
            pass  # a refusal writes nothing; the invariants check that too

    def run_at(self, i: int) -> str:
        return self.runs[i % len(self.runs)]

    # --- rules -----------------------------------------------------------------------

    @initialize(hb=SECONDS, pt=SECONDS, dt=SECONDS)
    def first_run(self, hb: float, pt: float, dt: float) -> None:
        self.open_run("alice", "chat:#a", False, hb, pt, dt, 2)

    @precondition(lambda self: len(self.runs) < MAX_RUNS)
    @rule(owner=st.sampled_from(["alice", "bob"]), dest=st.sampled_from(["chat:#a", "mail:b"]),
          review=st.booleans(), hb=SECONDS, pt=SECONDS, dt=SECONDS, cap=st.sampled_from([1, 2, 10]))
    def open_run(self, owner: str, dest: str, review: bool, hb: float, pt: float, dt: float, cap: int) -> None:
        run_id = f"run-{len(self.runs)}"
        self.lg.open(goal="work", target=dest, owner=owner, run_id=run_id, require_review=review,
                     heartbeat_timeout_s=hb, progress_timeout_s=pt, delivery_timeout_s=dt,
                     retry_budget=2, owner_cap=cap)
        self.runs.append(run_id)

    @rule(us=TICKS, beat=st.sampled_from([None, None, None, "wd-1", "wd-2"]))
    def tick(self, us: int, beat: str | None) -> None:
        self.clock.advance(us=us)
        if beat is not None:  # a watcher's own stream: never a view row
            self.lg.watcher_beat(beat, 30.0)

    @rule(i=st.integers(0, MAX_RUNS - 1), action=st.sampled_from(ACTIONS), data=st.data())
    def act(self, i: int, action: str, data: st.DataObject) -> None:
        lg, run = self.lg, self.run_at(i)
        cp = self.fold(run)
        stale = data.draw(st.sampled_from([False, False, False, True]), label="stale lease")
        lease = (cp.lease + 1 if cp.lease else 1) if stale or cp.lease is None else cp.lease
        key = data.draw(st.sampled_from(["k1", "k2", "k3"]), label="key")
        if action == "claim":
            self.try_(lg.claim, run, data.draw(st.sampled_from(["w1", "w2"]), label="worker"))
        elif action == "heartbeat":
            self.try_(lg.heartbeat, run, lease)
        elif action == "transition":
            self.try_(lg.transition, run, lease, data.draw(st.sampled_from(T.STATES), label="to"))
        elif action == "progress":
            self.try_(lg.progress, run, lease, data.draw(st.sampled_from(PROGRESS_KINDS), label="kind"))
        elif action == "artifact":
            path = self.result if data.draw(st.booleans(), label="exists") else os.path.join(self.dir, "nope")
            self.try_(lg.artifact, run, lease, path)
        elif action == "evidence":
            outcome = data.draw(st.sampled_from(["pass", "fail", "skipped"]), label="outcome")
            if data.draw(st.booleans(), label="by worker"):
                self.try_(lg.evidence, run, "tests", outcome, lease=lease)
            else:
                self.try_(lg.evidence, run, "tests", outcome, actor=Actor("operator", "op"))
        elif action == "block":
            self.try_(lg.block, run, "stuck", "ask ops", actor=Actor("operator", "op"))
        elif action == "unblock":
            self.try_(lg.unblock, run, "resolved", actor=Actor("operator", "op"))
        elif action == "effect_start":
            self.try_(lg.effect_start, run, lease, "e-" + key, "send a message")
        elif action == "effect_confirm":
            outcome = data.draw(st.sampled_from(["done", "absent"]), label="effect outcome")
            if data.draw(st.booleans(), label="by worker"):
                self.try_(lg.effect_confirm, run, "e-" + key, outcome, lease=lease)
            else:
                self.try_(lg.effect_confirm, run, "e-" + key, outcome, actor=Actor("operator", "op"))
        elif action == "submit":
            self.try_(lg.submit, run, lease, "done")
        elif action == "review":
            self.try_(lg.review, run, data.draw(st.booleans(), label="approve"), by=cp.owner)
        elif action == "deliver":
            self.try_(lg.deliver, run, key, by=cp.owner)
        elif action == "delivered":
            self.try_(lg.delivered, run, key, "receipt-" + key)
        elif action == "delivery_failed":
            self.try_(lg.delivery_failed, run, key, "bounced")
        elif action == "release":
            self.try_(lg.release, run, lease)
        elif action == "revoke":
            self.try_(lg.revoke, run, "too slow", actor=Actor("watchdog", "wd"))
        elif action == "close":
            disp = data.draw(st.sampled_from(["no_op", "cancelled", "failed"]), label="disposition")
            self.try_(lg.close_run, run, disp, by=cp.owner)
        elif action == "observe":
            cls = data.draw(st.sampled_from(["stalled", "healthy"]), label="classification")
            pseq = cp.progress_seq if data.draw(st.booleans(), label="same seq") else cp.progress_seq + 1
            self.try_(lg.observe, run, cls, pseq, watcher="wd", interval_s=30.0)
        elif action == "recover":
            what = data.draw(st.sampled_from(sorted(T.RECOVERY_ACTIONS)), label="recovery")
            self.try_(lg.recover, run, what, "stalled", cp.progress_seq, watcher="wd")
        elif action == "transfer":
            self.try_(lg.transfer, run, data.draw(st.sampled_from(["deliver", "close"]), label="what"),
                      "carol", by=cp.owner)
        elif action == "fork":
            if len(self.runs) < MAX_RUNS and cp.last_seq >= 1:
                at = data.draw(st.integers(1, cp.last_seq), label="at_seq")
                child = f"run-{len(self.runs)}"
                try:
                    lg.fork(run, at, new_run_id=child, by="op")
                    self.runs.append(child)
                except LedgerError:
                    pass

    @rule(i=st.integers(0, MAX_RUNS - 1), steps=st.integers(1, 8), data=st.data())
    def happy(self, i: int, steps: int, data: st.DataObject) -> None:
        """A few steps along the way to delivery, whatever state the run is in."""
        run = self.run_at(i)
        for _ in range(steps):
            if data.draw(st.sampled_from([False, False, True]), label="tick first"):
                self.clock.advance(data.draw(TICKS, label="tick"))
            self.happy_step(run, data)

    def happy_step(self, run: str, data: st.DataObject) -> None:
        lg = self.lg
        cp = self.fold(run)
        if cp.terminal:
            return
        op = Actor("operator", "op")
        if cp.state == T.BLOCKED:
            return self.try_(lg.unblock, run, "resolved", actor=op)
        if cp.state == T.UNKNOWN and cp.pending_effects:
            return self.try_(lg.effect_confirm, run, cp.pending_effects[0].key, "absent", actor=op)
        lease = cp.lease
        if lease is None and cp.state not in (T.READY_FOR_REVIEW, T.SUCCEEDED):
            return self.try_(lg.claim, run, "w1")
        if lease is not None and data.draw(st.sampled_from([False, False, True]), label="heartbeat"):
            return self.try_(lg.heartbeat, run, lease)
        if cp.state in (T.QUEUED,):
            return self.try_(lg.transition, run, lease, T.PLANNING)
        if cp.state == T.PLANNING:
            if cp.watch.last_progress is None or cp.watch.last_progress.kind != "plan_committed":
                return self.try_(lg.progress, run, lease, "plan_committed")
            return self.try_(lg.transition, run, lease, T.EXECUTING)
        if cp.state == T.UNKNOWN:
            return self.try_(lg.transition, run, lease, T.EXECUTING)
        if cp.state == T.EXECUTING:
            if not any(a.substantive for a in cp.artifacts):
                return self.try_(lg.artifact, run, lease, self.result)
            return self.try_(lg.transition, run, lease, T.VERIFYING)
        if cp.state == T.VERIFYING:
            if not cp.evidence_ok:
                return self.try_(lg.evidence, run, "tests", "pass", lease=lease)
            return self.try_(lg.submit, run, lease, "done")
        if cp.state == T.READY_FOR_REVIEW:
            return self.try_(lg.review, run, True, by=cp.owner)
        if cp.state == T.SUCCEEDED:
            pending = cp.delivery.pending
            if pending is not None:
                how = data.draw(st.sampled_from(["confirm", "fail", "wait"]), label="delivery outcome")
                if how == "confirm":
                    return self.try_(lg.delivered, run, pending.key, "receipt")
                if how == "fail":
                    return self.try_(lg.delivery_failed, run, pending.key, "bounced")
                return None  # leave it pending: ticks may make it ambiguous
            if not cp.evidence_ok:
                return self.try_(lg.evidence, run, "tests", "pass", actor=op)
            self.keys += 1
            return self.try_(lg.deliver, run, f"h{self.keys}", by=cp.owner)
