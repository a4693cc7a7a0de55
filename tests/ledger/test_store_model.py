"""A hypothesis state machine: random interleavings against a real SqliteStore file and
a plain-Python model of what the log must hold.

After every step the store's runs must equal the model's, every refusal must have left
the log unchanged (checked inside the refusing rule) and verify() must be empty.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from handoff.ledger import events as ev
from handoff.ledger.errors import IdempotencyConflict, InvalidInput, SeqConflict, StaleLease
from handoff.ledger.sqlite import SqliteStore
from handoff.ledger.store import Actor, AppendResult, lease_digest
from tests.ledger.conformance import OWNER, WATCHDOG, Count, refused, token_secret, up_to


def tok(run: str, number: int) -> str:
    """The token of lease ``number`` of ``run`` as this machine grants it."""
    return f"{number}.{token_secret(run, number)}"

RUNS = ("r1", "r2", "r3")
WORKERS = ("w1", "w2", "w3")
runs = st.sampled_from(RUNS)
workers = st.sampled_from(WORKERS)
small_text = st.text(alphabet="abcxyz \u00e9\u4e2d", max_size=8)

plain_events = st.one_of(
    st.builds(ev.HeartbeatRecorded),
    st.builds(
        ev.ProgressRecorded,
        kind=st.text(alphabet="abcdef", min_size=1, max_size=6),
        detail=small_text,
        advances=st.booleans(),
    ),
    st.builds(
        ev.EvidenceRecorded,
        kind=st.sampled_from(["tests", "lint"]),
        outcome=st.sampled_from(["pass", "fail", "skipped"]),
        detail=small_text,
    ),
    st.builds(
        ev.StateChanged,
        from_state=st.sampled_from(["open", "working"]),
        to_state=st.sampled_from(["working", "stalled"]),
    ),
)
batches = st.lists(plain_events, min_size=1, max_size=4)


class LedgerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ledger-model-")
        self.path = os.path.join(self.dir, "ledger.db")
        self.store = SqliteStore(self.path, synchronous="NORMAL")
        self.log: dict[str, list[tuple[str, bytes]]] = {r: [] for r in RUNS}
        self.order: list[tuple[str, int]] = []
        self.lease: dict[str, tuple[int, str] | None] = {r: None for r in RUNS}
        self.max_lease: dict[str, int] = {r: 0 for r in RUNS}
        self.keys: dict[tuple[str, str], tuple[tuple[ev.Event, ...], Actor, int | None, AppendResult]] = {}
        self.next_key = 0
        self.agg = Count()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- the model -------------------------------------------------------------------------

    def seq(self, run: str) -> int:
        return len(self.log[run])

    def apply(self, run: str, events: list[ev.Event], result: AppendResult) -> None:
        """Record a committed append in the model and check the store's answer."""
        assert result.outcome == "committed"
        n = len(events)
        first = self.seq(run) + 1
        assert (result.first_seq, result.last_seq) == (first, first + n - 1)
        assert result.positions == tuple(range(len(self.order) + 1, len(self.order) + n + 1))
        for e in events:
            self.log[run].append((ev.tag_of(e), ev.encode(e)))
            self.order.append((run, self.seq(run)))
            if isinstance(e, ev.LeaseGranted):
                self.lease[run] = (e.lease, e.worker)
                self.max_lease[run] = e.lease
            elif isinstance(e, (ev.LeaseReleased, ev.LeaseRevoked)):
                if self.lease[run] and self.lease[run][0] == e.lease:
                    self.lease[run] = None

    def append(self, run: str, events: list[ev.Event], actor: Actor, **kw: Any) -> AppendResult:
        result = self.store.append(run, events, actor=actor, **kw)
        self.apply(run, events, result)
        key = kw.get("idempotency_key")
        if key:
            self.keys[(run, key)] = (tuple(events), actor, kw.get("lease"), result)
        return result

    # --- valid writes ----------------------------------------------------------------------

    @rule(run=runs, events=batches, worker=workers, use_expected=st.booleans(),
          with_key=st.booleans(), with_lease=st.booleans())
    def append_valid(self, run, events, worker, use_expected, with_key, with_lease):
        kw: dict[str, Any] = {}
        if use_expected:
            kw["expected_seq"] = self.seq(run)
        if with_key:
            self.next_key += 1
            kw["idempotency_key"] = f"k{self.next_key}"
        current = self.lease[run]
        if with_lease and current:
            kw["lease"] = tok(run, current[0])
            worker = current[1]
        self.append(run, events, Actor("worker", worker), **kw)

    @rule(run=runs, worker=workers, bump=st.integers(1, 3))
    def grant_lease(self, run, worker, bump):
        token = self.max_lease[run] + bump
        digest = lease_digest(token_secret(run, token))
        self.append(run, [ev.LeaseGranted(worker=worker, lease=token, token_digest=digest)], OWNER)

    @precondition(lambda self: any(self.lease.values()))
    @rule(data=st.data(), how=st.sampled_from(["revoke", "release"]))
    def end_lease(self, data, how):
        run = data.draw(st.sampled_from([r for r in RUNS if self.lease[r]]))
        token, holder = self.lease[run]
        if how == "revoke":
            self.append(run, [ev.LeaseRevoked(lease=token, reason="stalled")], WATCHDOG)
        else:
            self.append(run, [ev.LeaseReleased(lease=token)], Actor("worker", holder), lease=tok(run, token))

    @rule(run=runs, worker=workers)
    def execute_command(self, run, worker):
        n = self.seq(run)
        result, state = self.store.execute(run, self.agg, up_to(n + 1), actor=Actor("worker", worker))
        self.apply(run, [ev.ProgressRecorded(kind=f"step-{n + 1}")], result)
        assert state == n + 1

    @rule()
    def reopen(self):
        self.store.close()
        self.store = SqliteStore(self.path, synchronous="NORMAL")

    # --- refusals (each proves the log unchanged via refused()) ----------------------------

    @rule(run=runs, events=batches, delta=st.integers(-3, 3).filter(bool))
    def append_wrong_expected_seq(self, run, events, delta):
        expected = self.seq(run) + delta
        if expected < 0:
            expected = self.seq(run) + 1
        with refused(self.store, SeqConflict, match=rf"is at seq {self.seq(run)}\b"):
            self.store.append(run, events, actor=Actor("worker", "w1"), expected_seq=expected)

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data())
    def retry_same_request(self, data):
        run, key = data.draw(st.sampled_from(sorted(self.keys)))
        events, actor, lease, original = self.keys[(run, key)]
        before = (list(self.store.read_all()), list(self.store.list_runs()))
        # Even with the lease since revoked or a stale expected_seq, a retry of the
        # same request is answered with the original result.
        again = self.store.append(run, list(events), actor=actor, lease=lease,
                                  idempotency_key=key, expected_seq=0)
        assert again == AppendResult(run, "duplicate", original.first_seq, original.last_seq,
                                     original.positions)
        assert (list(self.store.read_all()), list(self.store.list_runs())) == before

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data(), events=batches, change=st.sampled_from(["events", "actor"]))
    def reuse_key_for_other_request(self, data, events, change):
        run, key = data.draw(st.sampled_from(sorted(self.keys)))
        old_events, actor, lease, _ = self.keys[(run, key)]
        if change == "actor":
            events = list(old_events)
            actor = Actor("operator", "someone-else")
        elif [ev.encode(e) for e in events] == [ev.encode(e) for e in old_events]:
            events = events + [ev.HeartbeatRecorded()]
        with refused(self.store, IdempotencyConflict, match=repr(key)):
            self.store.append(run, events, actor=actor, lease=lease, idempotency_key=key)

    @precondition(lambda self: any(self.max_lease.values()))
    @rule(data=st.data(), back=st.integers(0, 2), worker=workers)
    def grant_non_increasing_lease(self, data, back, worker):
        run = data.draw(st.sampled_from([r for r in RUNS if self.max_lease[r]]))
        token = max(1, self.max_lease[run] - back)
        with refused(self.store, StaleLease, match="only grow"):
            self.store.append(run, [ev.LeaseGranted(worker=worker, lease=token)], actor=OWNER)

    @rule(run=runs, events=batches, token=st.integers(1, 8), forged=st.booleans())
    def write_under_stale_lease(self, run, events, token, forged):
        current = self.lease[run]
        if forged and current:
            # The current number with another lease's secret: a forgery, refused the same way.
            with refused(self.store, StaleLease, match="not that lease's token"):
                self.store.append(run, events, actor=Actor("worker", "w1"),
                                  lease=f"{current[0]}.{token_secret(run, current[0] + 100)}")
            return
        if current and current[0] == token:
            token += 1
        shown = "never issued" if token > self.max_lease[run] else "has ended"
        with refused(self.store, StaleLease, match=shown):
            self.store.append(run, events, actor=Actor("worker", "w1"), lease=tok(run, token))

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def store_equals_model(self):
        for run in RUNS:
            got = [(r.type, r.payload, r.seq) for r in self.store.read_run(run)]
            want = [(t, p, i + 1) for i, (t, p) in enumerate(self.log[run])]
            assert got == want, run
            head = self.store.head(run)
            if not self.log[run]:
                assert head is None
                continue
            assert head.last_seq == self.seq(run)
            lease = self.lease[run]
            assert (head.lease, head.lease_holder) == (lease if lease else (None, None))
        everything = list(self.store.read_all())
        assert [(r.run_id, r.seq) for r in everything] == self.order
        assert [r.position for r in everything] == list(range(1, len(self.order) + 1))

    @invariant()
    def chain_verifies(self):
        assert self.store.verify() == []


FULL = os.environ.get("HANDOFF_TEST_SCALE") == "full"

LedgerModel.TestCase.settings = settings(
    max_examples=500 if FULL else 50,
    stateful_step_count=50 if FULL else 30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerModel = LedgerModel.TestCase
