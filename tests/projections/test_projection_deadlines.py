"""The stall index agrees with the watchdog's judgement, at every instant that matters.

``view_rows.next_deadline`` is stored in stall_watch and the stall scan reads only that
index, so for any history and any ``now``:

* ``stall.classify(cp, now).needs_attention``  implies  ``next_deadline <= now``
  (the scan never misses a run that needs attention), and
* ``next_deadline <= now``  implies  the run is in ``queries.due_run_ids(now)``.

The instants tried are the ones where an answer can flip: each recorded time plus each
timeout, one µs either side, and the deadline itself.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from handoff.projections import queries, view_rows
from handoff.reducers import delivery as dl
from handoff.reducers import stall
from handoff.reducers.checkpoint import Checkpoint

from projection_machine import LedgerCommands
from projection_support import FULL


def instants(cp: Checkpoint, now: int) -> set[int]:
    w, pol = cp.watch, cp.policy
    pending = cp.delivery.pending
    bases = {now, cp.last_event_us, w.last_heartbeat_us, w.lease_since_us,
             w.last_progress.at_us if w.last_progress else None,
             pending.at_us if pending else None, view_rows.next_deadline(cp)}
    out = {0, 2**62}
    for b in bases - {None}:
        out.update((b - 1, b, b + 1))  # type: ignore[operator]
        for s in (pol.heartbeat_timeout_s, pol.progress_timeout_s, pol.delivery_timeout_s):
            n = int(s * 1_000_000)
            out.update(b + n + d for d in (-1, 0, 1, 2))  # type: ignore[operator]
    return {t for t in out if t >= 0}  # a real now is µs since the epoch


class DeadlineAgreement(LedgerCommands):
    @invariant()
    def scan_never_misses_a_run_needing_attention(self) -> None:
        store = self.lg.store
        for run in self.runs:
            cp = self.fold(run)
            nd = view_rows.next_deadline(cp)
            for now in sorted(instants(cp, self.clock())):
                h = stall.classify(cp, now_us=now)
                if h.needs_attention:
                    assert nd is not None and nd <= now, (
                        f"{run} needs attention at {now} ({h.classification}: {h.reason}) "
                        f"but next_deadline is {nd} (state {cp.state}, policy {cp.policy})")
            if nd is not None and not cp.terminal:
                # due_run_ids is monotonic in now: at the deadline itself is enough.
                assert run in queries.due_run_ids(store, nd), (run, nd)
                assert run in queries.due_run_ids(store, max(nd, self.clock()) + 1)
            else:
                assert run not in queries.due_run_ids(store, 2**62)

    @invariant()
    def stalls_equal_classifying_every_run(self) -> None:
        now = self.clock()
        for at in {now, now + 61_000_000, now + 10**10}:
            got = {cp.run_id: h for cp, h in self.lg.stalls(now=at)}
            want = {}
            for run in self.runs:
                h = stall.classify(self.fold(run), now_us=at)
                if h.needs_attention:
                    want[run] = h
            assert got == want

    @invariant()
    def ambiguous_deliveries_agree_with_the_reducer(self) -> None:
        for run in self.runs:
            cp = self.fold(run)
            pending = cp.delivery.pending
            nows = {self.clock()}
            if pending is not None:
                n = int(cp.policy.delivery_timeout_s * 1_000_000)
                nows |= {pending.at_us + n + d for d in (-1, 0, 1, 2)}
            for now in nows:
                [row] = [d for d in queries.deliveries(self.lg.store, now_us=now) if d["run_id"] == run]
                want, _ = dl.status(cp.delivery, ready=cp.delivery_ready, now_us=now,
                                    timeout_s=cp.policy.delivery_timeout_s)
                assert row["status"] == want, (run, now, row, want)
                amb = {d["run_id"] for d in queries.deliveries(self.lg.store, now_us=now, status="ambiguous")}
                assert (run in amb) == (want == "ambiguous")


DeadlineAgreement.TestCase.settings = settings(
    max_examples=200 if FULL else 30,
    stateful_step_count=60 if FULL else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestDeadlineAgreement = DeadlineAgreement.TestCase
