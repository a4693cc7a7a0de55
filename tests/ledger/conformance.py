"""The EventStore contract in code, written once against ledger/store.py.

It runs on every backend in tests/backends.py through the ``backend`` fixture
(tests/conftest.py): tests/ledger/test_store_conformance.py collects it, and a new backend
adds its entry there, not a subclass. ``make_store()`` returns a fresh, empty store of the
backend under test (tests that need two ledgers, such as export then import, call it
again); ``self.tmp_path`` is a per-test temporary directory.

Every refusal test also proves the refusal wrote nothing, with ``refused()``: it
snapshots every event and every head before the call and compares them after.

The suite covers the whole interface: appends and commands, reads, fencing, idempotency,
forks, counts, export and import, ``verify``, ``diagnostics``, the ledger-wide chain and
copies, and the transactions and inline hook the projections use. A test in
test_store_conformance.py fails if a public name of ``EventStore`` or ``Transaction`` is
used by no test here. The projections' own backend-neutral suite is
tests/projections/test_projection_backends.py; the Ledger and CLI level's is
tests/test_ledger_conformance.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timezone
from typing import Any

import msgspec
import pytest

from handoff.ledger import events as ev
from handoff.ledger.errors import (
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    PayloadTooLarge,
    ReservedKey,
    SeqConflict,
    StaleLease,
    UnknownEventType,
    ValueNotStored,
)
from handoff.ledger.store import (
    DEFAULT_MAX_PAYLOAD,
    GENESIS_HASH,
    Actor,
    Aggregate,
    AppendResult,
    Decision,
    EventStore,
    Head,
    LeaseToken,
    Liveness,
    Recorded,
    Transaction,
    chain_hash,
    lease_digest,
    value_digest,
)
from handoff.ledger.view_tables import TableSpec, columns

def token_secret(run: str, number: int) -> str:
    """A fixed, well-formed lease secret per (run, number), so tests can forge and replay."""
    import base64
    import hashlib

    return base64.urlsafe_b64encode(hashlib.sha256(f"{run}/{number}".encode()).digest()).decode().rstrip("=")


W1 = Actor("worker", "w1")
W2 = Actor("worker", "w2")
OWNER = Actor("owner", "alice")
WATCHDOG = Actor("watchdog", "wd")

BAD_RUN_IDS = [
    pytest.param("", id="empty"),
    pytest.param("x" * 129, id="129-chars"),
    pytest.param("has space", id="space"),
    pytest.param("../x", id="path-traversal"),
    pytest.param("x'; DROP TABLE events;--", id="sql-injection"),
    pytest.param("run\n", id="trailing-newline"),
    pytest.param("r\u00e9sum\u00e9", id="non-ascii"),
    pytest.param(5, id="int"),
    pytest.param(None, id="none"),
    pytest.param(b"run", id="bytes"),
]


def step(i: int, detail: str = "") -> ev.ProgressRecorded:
    return ev.ProgressRecorded(kind=f"step-{i}", detail=detail)


def hb() -> ev.HeartbeatRecorded:
    return ev.HeartbeatRecorded()


# --- the "nothing was written" helpers ---------------------------------------------


def snapshot(store: EventStore) -> tuple[Any, ...]:
    """Everything a reader can observe: every event, every head and the last position."""
    heads = sorted(store.list_runs(), key=lambda h: h.run_id)
    return (
        list(store.read_all()),
        heads,
        {h.run_id: store.head(h.run_id) for h in heads},
        store.last_position(),
    )


def assert_unchanged(store: EventStore, before: tuple[Any, ...]) -> None:
    after = snapshot(store)
    assert after[3] == before[3], f"last position moved from {before[3]} to {after[3]}"
    assert after[1] == before[1], "a refusal changed the heads"
    assert after[2] == before[2], "a refusal changed head()"
    assert after[0] == before[0], "a refusal changed the events"


@contextlib.contextmanager
def refused(
    store: EventStore, exc_type: type[BaseException] | tuple[type[BaseException], ...],
    match: str | None = None,
) -> Iterator[pytest.ExceptionInfo[Any]]:
    """``pytest.raises`` that also proves the log (events and heads) did not change."""
    before = snapshot(store)
    with pytest.raises(exc_type, match=match) as info:
        yield info
    assert_unchanged(store, before)


# --- small aggregates for execute() --------------------------------------------------


class Count(Aggregate[int]):
    """How many events the run (with its lineage) holds."""

    def initial(self, run_id: str) -> int:
        return 0

    def evolve(self, state: int, recorded: Recorded) -> int:
        return state + 1


class Types(Aggregate[tuple[str, ...]]):
    """The event types in order: a different state shape than Count on purpose."""

    def initial(self, run_id: str) -> tuple[str, ...]:
        return ()

    def evolve(self, state: tuple[str, ...], recorded: Recorded) -> tuple[str, ...]:
        return state + (recorded.type,)


class Explodes(Aggregate[int]):
    """Fails while folding a progress event of kind 'boom' (after the store inserted it)."""

    def initial(self, run_id: str) -> int:
        return 0

    def evolve(self, state: int, recorded: Recorded) -> int:
        event = recorded.event
        if isinstance(event, ev.ProgressRecorded) and event.kind == "boom":
            raise RuntimeError("evolve failed on purpose")
        return state + 1


def up_to(n: int, lease: int | None = None):
    """A decide that adds one progress event while the count is below ``n``."""

    def decide(state: int, head: Head | None) -> Decision:
        if state >= n:
            return Decision(())
        return Decision((step(state + 1),), lease=lease)

    return decide


def seqs(records: list[Recorded]) -> list[int]:
    return [r.seq for r in records]


def positions(records: list[Recorded]) -> list[int]:
    return [r.position for r in records]


# --- the suite -------------------------------------------------------------------------


class StoreConformance:
    """The suite; collected once, by tests/ledger/test_store_conformance.py, per backend."""

    tmp_path: Any
    backend: Any

    def make_store(self) -> EventStore:
        """A fresh, empty store of the backend under test (closed after the test)."""
        return self.backend.new_store()

    @pytest.fixture(autouse=True)
    def _conformance_backend(self, backend, tmp_path):
        self.backend, self.tmp_path = backend, tmp_path

    @pytest.fixture
    def store(self):
        s = self.make_store()
        try:
            yield s
        finally:
            s.close()

    @staticmethod
    def fill(store: EventStore, run_id: str, n: int, actor: Actor = W1) -> AppendResult:
        return store.append(run_id, [step(i) for i in range(n)], actor=actor)

    # --- an empty store ----------------------------------------------------------------

    def test_new_store_is_empty(self, store):
        assert list(store.read_all()) == []
        assert list(store.list_runs()) == []
        assert store.last_position() == 0
        assert store.head("nobody") is None
        assert list(store.read_run("nobody")) == []
        assert store.verify() == []

    def test_context_manager_closes(self):
        with self.make_store() as s:
            s.append("r", [hb()], actor=W1)
            assert s.last_position() == 1

    # --- what the backend declares beyond the interface ---------------------------------

    def test_the_capability_record_says_what_the_store_offers(self, store):
        """Each capability is either offered (the method works) or refused with a typed
        error that writes nothing; the clock stamps what the store records."""
        caps = store.capabilities
        before = store.clock()
        assert isinstance(before, int) and before > 0
        rec = next(iter(store.read_run("k", after_seq=self.fill(store, "k", 1).first_seq - 1)))
        assert rec.recorded_us >= before
        if caps.group_commit:
            store.enable_group_commit()
            assert self.fill(store, "k", 2).last_seq == 3
        else:
            with pytest.raises(InvalidInput, match="group commit"):
                store.enable_group_commit()
        if caps.attested_roles:
            roles = store.access_roles("audit")
            assert set(roles) == {"schema", "roles", "sql"} and roles["roles"]["writer"] == "audit_writer"
        else:
            with pytest.raises(InvalidInput):
                store.access_roles()
        assert store.verify() == []

    # --- ordering ------------------------------------------------------------------------

    def test_seq_counts_per_run_and_positions_are_global(self, store):
        plan = [("a", 1), ("b", 3), ("a", 2), ("c", 1), ("b", 1), ("a", 4), ("c", 2)]
        expected_seq: dict[str, int] = {}
        expected_pos = 0
        written: list[tuple[str, int, ev.Event]] = []
        for i, (run, n) in enumerate(plan):
            batch = [step(i * 10 + j, detail=f"{run}-{i}-{j}") for j in range(n)]
            result = store.append(run, batch, actor=W1)
            first = expected_seq.get(run, 0) + 1
            assert result == AppendResult(
                run_id=run,
                outcome="committed",
                first_seq=first,
                last_seq=first + n - 1,
                positions=tuple(range(expected_pos + 1, expected_pos + n + 1)),
            )
            for j, e in enumerate(batch):
                written.append((run, first + j, e))
            expected_seq[run] = first + n - 1
            expected_pos += n
        everything = list(store.read_all())
        assert positions(everything) == list(range(1, expected_pos + 1))
        assert [(r.run_id, r.seq, r.event) for r in everything] == written
        for run, last in expected_seq.items():
            assert seqs(list(store.read_run(run))) == list(range(1, last + 1))
        assert store.last_position() == expected_pos

    def test_recorded_envelope(self, store):
        e = ev.HandoffOpened(goal="g", target="slack:#x", owner="alice", stop_rules=("a",))
        store.append("env", [e, hb()], actor=OWNER, idempotency_key="open-1")
        first, second = store.read_run("env")
        assert first.run_id == "env" and first.seq == 1 and first.position == 1
        assert first.type == "handoff_opened" and second.type == "heartbeat_recorded"
        assert first.actor == "owner:alice" and Actor.parse(first.actor) == OWNER
        assert first.lease is None
        assert first.idempotency_key == "open-1"
        assert second.idempotency_key is None, "only the batch's first event carries the key"
        assert first.schema_version == ev.SCHEMA_VERSION
        assert first.event == e and second.event == hb()
        assert first.payload == ev.encode(e)
        assert first.recorded_at.tzinfo == timezone.utc
        assert first.recorded_us > 0

    def test_generator_batch_is_stored_whole(self, store):
        result = store.append("gen", (step(i) for i in range(3)), actor=W1)
        assert (result.first_seq, result.last_seq, result.positions) == (1, 3, (1, 2, 3))
        assert seqs(list(store.read_run("gen"))) == [1, 2, 3]
        assert store.head("gen").last_seq == 3
        assert store.verify() == []

    # --- atomic batches ----------------------------------------------------------------

    @pytest.mark.parametrize("existing", [0, 2], ids=["new-run", "existing-run"])
    def test_batch_with_oversized_event_writes_nothing(self, store, existing):
        if existing:
            self.fill(store, "atom", existing)
        big = step(99, detail="x" * (DEFAULT_MAX_PAYLOAD + 1))
        with refused(store, PayloadTooLarge, match="event #2") as info:
            store.append("atom", [step(1), big, step(3)], actor=W1)
        assert info.value.field == "events[1]"
        assert info.value.exit_code == 2

    def test_batch_with_unknown_event_writes_nothing(self, store):
        self.fill(store, "atom", 1)

        class Rogue(msgspec.Struct, tag="rogue"):
            x: int = 1

        with refused(store, UnknownEventType, match="event #3"):
            store.append("atom", [step(1), hb(), Rogue()], actor=W1)

    def test_batch_with_non_increasing_lease_writes_nothing(self, store):
        store.append("atom", [ev.LeaseGranted(worker="w1", lease=5)], actor=OWNER)
        with refused(store, StaleLease, match="only grow"):
            store.append(
                "atom",
                [ev.LeaseRevoked(lease=5, reason="r"), ev.LeaseGranted(worker="w2", lease=5)],
                actor=OWNER,
            )
        assert store.head("atom").lease == 5

    def test_failure_after_insert_rolls_back_the_whole_batch(self, store):
        # Explodes fails while execute folds the rows it has already inserted: the
        # transaction must roll back rather than leave half a command behind.
        self.fill(store, "atom", 2)

        def decide(state, head):
            return Decision((step(1), ev.ProgressRecorded(kind="boom"), step(3)))

        with refused(store, RuntimeError, match="on purpose"):
            store.execute("atom", Explodes(), decide, actor=W1)
        assert store.append("atom", [hb()], actor=W1).positions == (3,)

    # --- expected seq ------------------------------------------------------------------

    def test_expected_seq_zero_creates_and_then_conflicts(self, store):
        assert store.append("cas", [hb()], actor=W1, expected_seq=0).first_seq == 1
        with refused(store, SeqConflict, match=r"run cas is at seq 1, not 0") as info:
            store.append("cas", [hb()], actor=W1, expected_seq=0)
        assert info.value.details["actual_seq"] == 1
        assert info.value.exit_code == 1

    @pytest.mark.parametrize("expected", [0, 1, 2, 4, 100])
    def test_wrong_expected_seq_conflicts_and_names_the_head(self, store, expected):
        self.fill(store, "cas", 3)
        with refused(store, SeqConflict, match=r"is at seq 3\b") as info:
            store.append("cas", [hb()], actor=W1, expected_seq=expected)
        assert info.value.details["actual_seq"] == 3
        assert info.value.details["expected_seq"] == expected

    def test_expected_seq_on_missing_run_names_seq_zero(self, store):
        with refused(store, SeqConflict, match=r"is at seq 0\b"):
            store.append("fresh", [hb()], actor=W1, expected_seq=2)

    def test_right_expected_seq_and_none_both_append(self, store):
        self.fill(store, "cas", 3)
        assert store.append("cas", [hb()], actor=W1, expected_seq=3).first_seq == 4
        assert store.append("cas", [hb()], actor=W1, expected_seq=None).first_seq == 5

    @pytest.mark.parametrize("bad", [-1, "3", 1.0])
    def test_malformed_expected_seq_is_invalid_input(self, store, bad):
        self.fill(store, "cas", 1)
        with refused(store, InvalidInput):
            store.append("cas", [hb()], actor=W1, expected_seq=bad)

    # --- idempotency ---------------------------------------------------------------------

    def test_same_key_same_request_is_a_duplicate_with_original_positions(self, store):
        self.fill(store, "other", 2)
        batch = [step(1), step(2), step(3)]
        first = store.append("idem", batch, actor=W1, idempotency_key="k1")
        assert first.outcome == "committed"
        self.fill(store, "idem", 2)
        self.fill(store, "other", 1)
        before = snapshot(store)
        again = store.append("idem", list(batch), actor=W1, idempotency_key="k1")
        assert again == AppendResult("idem", "duplicate", 1, 3, first.positions)
        # A retry whose expected_seq is now stale is still answered as the duplicate.
        stale = store.append("idem", batch, actor=W1, idempotency_key="k1", expected_seq=0)
        assert stale == again
        assert_unchanged(store, before)

    @pytest.mark.parametrize(
        "change",
        ["payload", "longer-batch", "shorter-batch", "actor", "lease"],
    )
    def test_same_key_different_request_conflicts(self, store, change):
        one = self.grant(store, "idem", 1)
        batch = [step(1), step(2)]
        store.append("idem", batch, actor=W1, idempotency_key="k1", lease=one)
        kw: dict[str, Any] = dict(actor=W1, idempotency_key="k1", lease=one)
        if change == "payload":
            batch = [step(1), step(2, detail="changed")]
        elif change == "longer-batch":
            batch = batch + [step(3)]
        elif change == "shorter-batch":
            batch = batch[:1]
        elif change == "actor":
            kw["actor"] = W2
        else:
            kw["lease"] = None
        with refused(store, IdempotencyConflict, match="'k1'") as info:
            store.append("idem", batch, **kw)
        assert info.value.details["seq"] == 2

    @pytest.mark.parametrize("actor", [W1, OWNER, Actor("operator", "op")])
    def test_watch_keys_are_the_watchdogs_alone(self, store, actor):
        with refused(store, ReservedKey, match="belong to the watchdog"):
            store.append("idem", [hb()], actor=actor, idempotency_key="watch:idem:revoke_lease:0:1")
        with refused(store, ReservedKey, match="belong to the watchdog"):
            store.execute("idem", Count(), up_to(1), actor=actor, idempotency_key="watch:idem:pause:0:1")
        assert store.append("idem", [hb()], actor=WATCHDOG,
                            idempotency_key="watch:idem:revoke_lease:0:1").outcome == "committed"

    def test_keys_are_scoped_to_their_run(self, store):
        a = store.append("idem-a", [hb()], actor=W1, idempotency_key="k")
        b = store.append("idem-b", [step(1)], actor=W1, idempotency_key="k")
        assert a.outcome == b.outcome == "committed"
        assert b.positions == (2,)

    @pytest.mark.parametrize("key", ["", "x" * 129, "tab\there", "nul\x00"])
    def test_malformed_idempotency_key_is_invalid_input(self, store, key):
        with refused(store, InvalidInput, match="idempotency key"):
            store.append("idem", [hb()], actor=W1, idempotency_key=key)

    # --- fencing -------------------------------------------------------------------------

    def grant(self, store, run, number, worker="w1"):
        """Grant lease ``number`` as a claim would (with its token's digest); return the token."""
        secret = token_secret(run, number)
        store.append(run, [ev.LeaseGranted(worker=worker, lease=number, token_digest=lease_digest(secret))],
                     actor=OWNER)
        return LeaseToken(f"{number}.{secret}")

    def test_lease_granted_sets_the_current_lease(self, store):
        one = self.grant(store, "fence", 1)
        head = store.head("fence")
        assert (head.lease, head.lease_holder) == (1, "w1")
        store.append("fence", [hb()], actor=W1, lease=one)
        assert list(store.read_run("fence"))[-1].lease == 1

    def test_superseded_lease_is_stale_and_reveals_nothing_to_retry_with(self, store):
        one = self.grant(store, "fence", 1)
        two = self.grant(store, "fence", 2, worker="w2")
        with refused(store, StaleLease, match="lease 1 of run fence has ended") as info:
            store.append("fence", [step(1)], actor=W1, lease=one)
        assert info.value.details["why"] == "ended"
        assert info.value.details["lease"] == 1
        assert "current_lease" not in info.value.details
        assert "w2" not in info.value.message and two.secret not in info.value.message
        store.append("fence", [step(1)], actor=W2, lease=two)

    @pytest.mark.parametrize("end", ["revoked", "released"])
    def test_ended_lease_is_stale(self, store, end):
        seven = self.grant(store, "fence", 7)
        if end == "revoked":
            store.append("fence", [ev.LeaseRevoked(lease=7, reason="stalled")], actor=WATCHDOG)
        else:
            store.append("fence", [ev.LeaseReleased(lease=7)], actor=W1, lease=seven)
        head = store.head("fence")
        assert (head.lease, head.lease_holder) == (None, None)
        with refused(store, StaleLease, match="has ended") as info:
            store.append("fence", [hb()], actor=W1, lease=seven)
        assert info.value.details["why"] == "ended"

    def test_future_lease_was_never_issued(self, store):
        self.grant(store, "fence", 1)
        with refused(store, StaleLease, match="never issued") as info:
            store.append("fence", [hb()], actor=W1, lease=LeaseToken(f"2.{token_secret('fence', 2)}"))
        assert info.value.details["why"] == "never_issued"
        assert "replaced" not in info.value.message

    def test_lease_on_missing_run_was_never_issued(self, store):
        with refused(store, StaleLease, match="never issued"):
            store.append("ghost", [hb()], actor=W1, lease=LeaseToken(f"1.{token_secret('ghost', 1)}"))

    def test_current_number_with_a_wrong_secret_is_refused(self, store):
        one = self.grant(store, "fence", 1)
        for forged in (f"1.{token_secret('other', 1)}", f"1.{'A' * 43}", f"1.{lease_digest(one.secret)}"):
            with refused(store, StaleLease, match="not that lease's token") as info:
                store.append("fence", [hb()], actor=W1, lease=forged)
            assert info.value.details["why"] == "wrong_token"
            assert one.secret not in info.value.message

    # --- liveness beside the log (EventStore.beat, liveness, put_liveness, state_at) ------

    def test_a_beat_moves_the_liveness_row_of_the_current_lease_only(self, store):
        one = self.grant(store, "live", 1)
        head = store.head("live")
        assert store.liveness(["live", "nobody"]) == {}
        # No row for the lease yet: the beat must go through the log.
        assert store.beat("live", one, b"", mark_us=10**12) is None
        at = store.clock()
        store.put_liveness(Liveness("live", 1, at, 0, at, b"", 10**9), LeaseToken(f"1.{'A' * 43}"))  # forged
        assert store.liveness(["live"]) == {}
        store.put_liveness(Liveness("live", 1, at, 0, at, b"", 10**9), one)
        live, seq, h = store.beat("live", one, b"", mark_us=10**12)
        assert (live.lease, live.beats, live.logged_us, live.quiet_us) == (1, 1, at, 10**9) and live.beat_us >= at
        assert (seq, h) == (head.last_seq, head.last_hash)  # the head, read in the same statement
        assert store.liveness(["live"]) == {"live": live}
        # Other attrs, a window gone by, a silence past the row's limit: the log's turn.
        assert store.beat("live", one, b'{"model":"m"}', mark_us=10**12) is None
        assert store.beat("live", one, b"", mark_us=0) is None
        store.put_liveness(Liveness("live", 1, at - 10**7, 0, at, b"", 1), one)  # an earlier beat: kept as is
        assert store.liveness(["live"])["live"].beat_us == live.beat_us
        store.put_liveness(Liveness("live", 1, live.beat_us, 0, at, b"", 0), one)  # a silence limit of 0
        assert store.beat("live", one, b"", mark_us=10**12) is None or store.clock() == live.beat_us
        store.put_liveness(Liveness("live", 1, live.beat_us, 0, at, b"", 10**9), one)
        # A forged, ended or other run's token moves nothing and writes nothing.
        before = (list(store.read_run("live")), store.liveness(["live"]))
        for token in (LeaseToken(f"1.{'A' * 43}"), LeaseToken(f"2.{token_secret('live', 2)}")):
            assert store.beat("live", token, b"", mark_us=10**12) is None
        assert store.liveness(["live"]) == before[1]
        store.append("live", [ev.LeaseRevoked(lease=1, reason="stalled")], actor=WATCHDOG)
        assert store.beat("live", one, b"", mark_us=10**12) is None
        assert store.liveness(["live"]) == before[1]
        assert list(store.read_run("live"))[: len(before[0])] == before[0]

    def test_put_liveness_never_goes_back_to_an_older_lease_or_beat(self, store):
        one = self.grant(store, "keep", 1)
        two = self.grant(store, "keep", 2, worker="w2")
        store.put_liveness(Liveness("keep", 1, 500, 3, 500, b"", 7), one)  # not the current lease: ignored
        store.put_liveness(Liveness("keep", 2, 500, 3, 500, b"", 7), one)  # another lease's token: ignored
        store.put_liveness(Liveness("keep", 2, 500, 3, 500, b"", 7), LeaseToken(f"2.{'B' * 43}"))  # forged
        assert store.liveness(["keep"]) == {}
        store.put_liveness(Liveness("keep", 2, 1_000, 4, 1_000, b"", 7), two)
        store.put_liveness(Liveness("keep", 2, 900, 2, 900, b'{"a":1}', 7), two)  # an earlier beat of it
        assert store.liveness(["keep"])["keep"] == Liveness("keep", 2, 1_000, 4, 900, b'{"a":1}', 7)
        store.put_liveness(Liveness("keep", 2, 1_100, 1, 1_100, b"", 7), two, one_more=True)  # a logged beat
        assert store.liveness(["keep"])["keep"] == Liveness("keep", 2, 1_100, 5, 1_100, b"", 7)
        store.put_liveness(Liveness("nobody", 1, 1, 1, 1, b"", 7), one)  # no such run: nothing stored
        assert store.liveness(["nobody"]) == {}

    def test_state_at_answers_only_for_the_exact_head(self, store):
        agg = Count()
        store.append("cached", [hb(), hb()], actor=W1)
        assert store.state_at("cached", agg, 2, store.head("cached").last_hash) is None  # never folded here
        store.execute("cached", agg, lambda state, head: Decision((hb(),)), actor=W1)
        head = store.head("cached")
        assert store.state_at("cached", agg, head.last_seq, head.last_hash) == 3  # what the command folded
        assert store.state_at("cached", agg, head.last_seq - 1, head.last_hash) is None
        assert store.state_at("cached", agg, head.last_seq, GENESIS_HASH) is None

    def test_a_lease_granted_without_a_digest_takes_no_writes(self, store):
        # A lease from before tokens (schema 2): nothing can prove it, so it must be revoked.
        store.append("fence", [ev.LeaseGranted(worker="w1", lease=1)], actor=OWNER)
        with refused(store, StaleLease, match="revoke") as info:
            store.append("fence", [hb()], actor=W1, lease=LeaseToken(f"1.{token_secret('fence', 1)}"))
        assert info.value.details["why"] == "no_token"
        store.append("fence", [ev.LeaseRevoked(lease=1, reason="upgrade")], actor=WATCHDOG)
        two = self.grant(store, "fence", 2)
        store.append("fence", [hb()], actor=W1, lease=two)

    def test_a_new_grant_replaces_the_digest(self, store):
        one = self.grant(store, "fence", 1)
        store.append("fence", [ev.LeaseRevoked(lease=1, reason="r")], actor=WATCHDOG)
        two = self.grant(store, "fence", 2, worker="w2")
        # The old secret under the new number is a forgery, not a proof.
        with refused(store, StaleLease, match="not that lease's token"):
            store.append("fence", [hb()], actor=W1, lease=f"2.{one.secret}")
        store.append("fence", [hb()], actor=W2, lease=two)

    def test_lease_tokens_only_grow(self, store):
        self.grant(store, "fence", 3)
        for number in (3, 2, 1):
            with refused(store, StaleLease, match="only grow") as info:
                self.grant(store, "fence", number, worker="w2")
            assert info.value.details["lease"] == number
        # The high-water mark survives a revoke: a number can never be reissued.
        store.append("fence", [ev.LeaseRevoked(lease=3, reason="r")], actor=WATCHDOG)
        with refused(store, StaleLease, match="only grow"):
            self.grant(store, "fence", 3, worker="w2")
        self.grant(store, "fence", 4, worker="w2")
        assert store.head("fence").lease == 4

    def test_ending_an_old_token_keeps_the_current_lease(self, store):
        self.grant(store, "fence", 1)
        two = self.grant(store, "fence", 2, worker="w2")
        store.append("fence", [ev.LeaseRevoked(lease=1, reason="late")], actor=WATCHDOG)
        store.append("fence", [ev.LeaseReleased(lease=1)], actor=W1)
        head = store.head("fence")
        assert (head.lease, head.lease_holder) == (2, "w2")
        store.append("fence", [hb()], actor=W2, lease=two)

    def test_write_without_a_lease_is_not_fenced(self, store):
        # The contract fences only writes that carry a lease ("when given"); whether
        # a write must carry one is the reducers' rule, not the store's.
        self.grant(store, "fence", 1)
        assert store.append("fence", [hb()], actor=OWNER).outcome == "committed"

    def test_lease_is_checked_against_the_head_before_the_batch(self, store):
        # A batch cannot grant itself a lease and use it: the fence is the pre-batch head.
        secret = token_secret("fence", 1)
        grant = ev.LeaseGranted(worker="w1", lease=1, token_digest=lease_digest(secret))
        with refused(store, StaleLease):
            store.append("fence", [grant, hb()], actor=W1, lease=f"1.{secret}")

    @pytest.mark.parametrize("bad", [0, -3, 1, "1", True, "1.short", "1." + "x" * 200, " 1." + "A" * 43])
    def test_malformed_lease_is_invalid_input(self, store, bad):
        self.grant(store, "fence", 1)
        with refused(store, InvalidInput, match="lease"):
            store.append("fence", [hb()], actor=W1, lease=bad)

    # --- hash chain ----------------------------------------------------------------------

    def test_hash_chain_links_every_event(self, store):
        self.fill(store, "chain", 3)
        self.fill(store, "other", 2)
        store.append("chain", [hb()], actor=W2, idempotency_key="k")
        records = list(store.read_run("chain"))
        assert records[0].prev_hash == GENESIS_HASH
        for prev, rec in zip(records, records[1:]):
            assert rec.prev_hash == prev.hash
        for rec in records:
            assert len(rec.hash) == 32
            assert rec.hash == chain_hash(
                rec.prev_hash, rec.run_id, rec.seq, rec.type, rec.actor, rec.lease,
                rec.idempotency_key, rec.recorded_us, rec.schema_version, rec.payload,
            )
        assert store.head("chain").last_hash == records[-1].hash
        assert list(store.read_run("other"))[0].prev_hash == GENESIS_HASH

    def test_verify_is_empty_on_a_good_log(self, store):
        self.fill(store, "a", 5)
        one = self.grant(store, "a", 1)
        store.append("a", [hb()], actor=W1, lease=one, idempotency_key="x")
        self.fill(store, "b", 1)
        store.append("c", [ev.RunForked(parent="a", parent_seq=3), hb()], actor=OWNER)
        assert store.verify() == []
        for run in ("a", "b", "c"):
            assert store.verify(run) == []

    # --- streaming reads -----------------------------------------------------------------

    @pytest.fixture
    def big(self, store):
        """Run 'big' with 2500 events (more than two read pages), interleaved with 'side'."""
        for i in range(10):
            store.append("big", [step(i * 250 + j) for j in range(250)], actor=W1)
            store.append("side", [hb()], actor=W2)
        return store

    def test_read_run_streams_past_the_page_size(self, big):
        it = big.read_run("big")
        assert iter(it) is it, "read_run must return an iterator, not a list"
        records = list(it)
        assert seqs(records) == list(range(1, 2501))
        assert [r.event.kind for r in records] == [f"step-{i}" for i in range(2500)]
        assert seqs(list(big.read_run("side"))) == list(range(1, 11))

    @pytest.mark.parametrize(
        "after, until, first, last",
        [
            (999, 2001, 1000, 2001),
            (0, 1000, 1, 1000),
            (1000, 2000, 1001, 2000),
            (1000, None, 1001, 2500),
            (2499, None, 2500, 2500),
            (0, 1, 1, 1),
            (2000, 99999, 2001, 2500),
        ],
    )
    def test_read_run_window(self, big, after, until, first, last):
        got = seqs(list(big.read_run("big", after_seq=after, until_seq=until)))
        assert got == list(range(first, last + 1))

    @pytest.mark.parametrize("after, until", [(2500, None), (0, 0), (10, 10), (20, 5), (9999, None)])
    def test_read_run_empty_windows(self, big, after, until):
        assert list(big.read_run("big", after_seq=after, until_seq=until)) == []

    def test_read_all_streams_in_global_order(self, big):
        it = big.read_all()
        assert iter(it) is it
        records = list(it)
        assert positions(records) == list(range(1, 2511))
        assert positions(list(big.read_all(after_position=1000))) == list(range(1001, 2511))
        assert positions(list(big.read_all(after_position=999, until_position=2001))) == list(
            range(1000, 2002)
        )
        assert list(big.read_all(after_position=2510)) == []

    def test_read_all_tail_never_skips_while_appends_continue(self, big):
        seen: list[int] = []
        for n, rec in enumerate(big.read_all(after_position=0)):
            seen.append(rec.position)
            if n in (5, 1500):
                big.append("late", [hb(), hb()], actor=W1)
        assert seen == list(range(1, len(seen) + 1))
        assert len(seen) >= 2510
        # A fresh tail from where that one stopped picks up whatever it did not see.
        rest = positions(list(big.read_all(after_position=seen[-1])))
        assert seen + rest == list(range(1, big.last_position() + 1))

    # --- head / list_runs --------------------------------------------------------------

    def test_head_tracks_the_run(self, store):
        self.fill(store, "h", 2)
        self.fill(store, "other", 3)
        self.grant(store, "h", 4, worker="w9")
        head = store.head("h")
        last = list(store.read_run("h"))[-1]
        assert head == Head(
            run_id="h", last_seq=3, last_hash=last.hash, lease=4, lease_holder="w9",
            first_position=1, last_position=6,
        )
        assert store.head("H") is None, "run ids are case-sensitive"

    def test_list_runs_returns_every_head(self, store):
        for run, n in [("z", 1), ("a", 2), ("m", 1), ("a", 1)]:
            self.fill(store, run, n)
        runs = list(store.list_runs())
        assert sorted(h.run_id for h in runs) == ["a", "m", "z"]
        for h in runs:
            assert h == store.head(h.run_id)
        by_first = sorted(runs, key=lambda h: h.first_position)
        assert [h.run_id for h in by_first] == ["z", "a", "m"]
        assert store.last_position() == 5

    def test_list_runs_by_prefix_is_a_key_range(self, store):
        for run in ("watcher:a", "watcher:b", "watcher", "watches", "w", "x:watcher:c"):
            self.fill(store, run, 1)
        assert [h.run_id for h in store.list_runs(prefix="watcher:")] == ["watcher:a", "watcher:b"]
        assert [h.run_id for h in store.list_runs(prefix="x")] == ["x:watcher:c"]
        assert list(store.list_runs(prefix="nothing")) == []

    # --- execute -------------------------------------------------------------------------

    def test_execute_appends_and_returns_the_folded_state(self, store):
        agg = Count()
        for i in range(1, 4):
            result, state = store.execute("cmd", agg, up_to(3), actor=W1)
            assert result.outcome == "committed"
            assert (result.first_seq, result.last_seq, result.positions) == (i, i, (i,))
            assert state == i
        assert store.fold("cmd", Count()) == 3

    def test_execute_decide_returning_no_events_writes_nothing(self, store):
        self.fill(store, "cmd", 3)
        before = snapshot(store)
        result, state = store.execute("cmd", Count(), up_to(3), actor=W1)
        assert state == 3
        assert result.positions == ()
        assert result.last_seq == 3
        assert result.outcome != "committed"
        assert_unchanged(store, before)
        # ... also on a run that does not exist yet: no head appears.
        result, state = store.execute("nothing", Count(), up_to(0), actor=W1)
        assert (state, result.positions, result.last_seq) == (0, (), 0)
        assert store.head("nothing") is None
        assert_unchanged(store, before)

    def test_execute_with_nothing_to_add_is_unchanged_not_a_duplicate(self, store):
        # "duplicate" means a replayed idempotency key; a decide that returns no events
        # is its own outcome, with both seqs at the run's head (not head+1..head).
        self.fill(store, "cmd", 3)
        result, _ = store.execute("cmd", Count(), up_to(3), actor=W1)
        assert (result.outcome, result.first_seq, result.last_seq, result.positions) == ("unchanged", 3, 3, ())
        keyed, _ = store.execute("cmd", Count(), up_to(3), actor=W1, idempotency_key="u1", digest_of=b"r")
        assert (keyed.outcome, keyed.first_seq, keyed.last_seq) == ("unchanged", 3, 3)
        result, _ = store.execute("nothing", Count(), up_to(0), actor=W1)
        assert (result.outcome, result.first_seq, result.last_seq) == ("unchanged", 0, 0)

    def test_execute_decide_sees_state_and_head(self, store):
        seen: list[tuple[int, int | None]] = []

        def decide(state, head):
            seen.append((state, head.last_seq if head else None))
            return Decision((hb(),))

        store.execute("cmd", Count(), decide, actor=W1)
        store.execute("cmd", Count(), decide, actor=W1)
        assert seen == [(0, None), (1, 1)]

    def test_execute_sees_events_appended_behind_its_cache(self, store):
        agg = Count()
        assert store.execute("cmd", agg, up_to(1), actor=W1)[1] == 1
        self.fill(store, "cmd", 2)
        result, state = store.execute("cmd", agg, up_to(10), actor=W1)
        assert (state, result.last_seq) == (4, 4)

    def test_execute_never_hands_one_aggregate_another_ones_state(self, store):
        # Fresh aggregate objects each time: a cache keyed by id() would hand a
        # recycled id the state of a dead object of a different class.
        for i in range(40):
            _, n = store.execute("cmd", Count(), lambda s, h: Decision((hb(),)), actor=W1)
            assert n == i + 1
            _, types = store.execute("cmd", Types(), lambda s, h: Decision(()), actor=W1)
            assert isinstance(types, tuple) and len(types) == i + 1

    def test_execute_idempotency(self, store):
        calls = []

        def decide(state, head):
            calls.append(state)
            return Decision((step(state + 1),))

        first, s1 = store.execute("cmd", Count(), decide, actor=W1, idempotency_key="c1", digest_of=b"req")
        self.fill(store, "cmd", 1)
        before = snapshot(store)
        again, s2 = store.execute("cmd", Count(), decide, actor=W1, idempotency_key="c1", digest_of=b"req")
        assert again.outcome == "duplicate"
        assert (again.first_seq, again.last_seq, again.positions) == (1, 1, first.positions)
        assert len(calls) == 1, "a duplicate command must not decide again"
        assert s2 == 2
        assert_unchanged(store, before)
        with refused(store, IdempotencyConflict):
            store.execute("cmd", Count(), decide, actor=W1, idempotency_key="c1", digest_of=b"other")
        with refused(store, IdempotencyConflict):
            store.execute("cmd", Count(), decide, actor=W2, idempotency_key="c1", digest_of=b"req")

    def test_execute_refusal_from_decide_writes_nothing(self, store):
        self.fill(store, "cmd", 1)

        def decide(state, head):
            raise IllegalTransition("not from here")

        with refused(store, IllegalTransition):
            store.execute("cmd", Count(), decide, actor=W1)

    def test_execute_fences_the_decision_lease(self, store):
        self.grant(store, "cmd", 1)
        two = self.grant(store, "cmd", 2)
        # A number without its token, an ended lease's token, a token for another number.
        with refused(store, StaleLease, match="must carry"):
            store.execute("cmd", Count(), up_to(5, lease=2), actor=W1)
        with refused(store, StaleLease, match="has ended"):
            store.execute("cmd", Count(), up_to(5, lease=1), actor=W1, lease=f"1.{token_secret('cmd', 1)}")
        with refused(store, StaleLease, match="must carry"):
            store.execute("cmd", Count(), up_to(5, lease=1), actor=W1, lease=two)
        result, _ = store.execute("cmd", Count(), up_to(5, lease=2), actor=W1, lease=two)
        assert list(store.read_run("cmd"))[-1].lease == 2

    def test_execute_checks_the_token_before_deciding(self, store):
        self.grant(store, "cmd", 1)
        asked = []

        def decide(state, head):
            asked.append(state)
            raise IllegalTransition("decide must not be reached")

        with refused(store, StaleLease, match="not that lease's token"):
            store.execute("cmd", Count(), decide, actor=W1, lease=f"1.{token_secret('x', 1)}")
        assert asked == []

    @pytest.mark.parametrize("what", ["oversized", "unknown", "bad-field"])
    def test_execute_validates_decided_events(self, store, what):
        self.fill(store, "cmd", 1)

        class Rogue(msgspec.Struct, tag="rogue"):
            pass

        bad = {
            "oversized": step(1, detail="x" * (DEFAULT_MAX_PAYLOAD + 1)),
            "unknown": Rogue(),
            "bad-field": ev.ProgressRecorded(kind=5),  # type: ignore[arg-type]
        }[what]
        with refused(store, InvalidInput):
            store.execute("cmd", Count(), lambda s, h: Decision((hb(), bad)), actor=W1)

    # --- fork lineage --------------------------------------------------------------------

    def forked(self, store):
        self.fill(store, "parent", 5)
        store.append("child", [ev.RunForked(parent="parent", parent_seq=3), step(100), step(101)], actor=OWNER)
        self.fill(store, "parent", 2)  # the parent goes on after the fork
        store.append("grandchild", [ev.RunForked(parent="child", parent_seq=2), step(200)], actor=OWNER)
        return store

    def test_history_yields_the_parent_prefix_first(self, store):
        self.forked(store)
        got = [(r.run_id, r.seq) for r in store.history("child")]
        assert got == [("parent", 1), ("parent", 2), ("parent", 3),
                       ("child", 1), ("child", 2), ("child", 3)]
        assert [r.type for r in store.history("child")][3] == "run_forked"

    def test_history_follows_lineage_recursively(self, store):
        self.forked(store)
        got = [(r.run_id, r.seq) for r in store.history("grandchild")]
        assert got == [("parent", 1), ("parent", 2), ("parent", 3),
                       ("child", 1), ("child", 2), ("grandchild", 1), ("grandchild", 2)]
        got = [(r.run_id, r.seq) for r in store.history("grandchild", until_seq=1)]
        assert got[-1] == ("grandchild", 1) and len(got) == 6

    def test_history_of_an_unforked_run_is_read_run(self, store):
        self.forked(store)
        assert list(store.history("parent")) == list(store.read_run("parent"))
        assert list(store.history("nobody")) == []

    def test_fold_and_execute_see_the_lineage(self, store):
        self.forked(store)
        assert store.fold("child", Count()) == 6
        assert store.fold("grandchild", Count()) == 7
        _, state = store.execute("child", Count(), lambda s, h: Decision((hb(),)), actor=W1)
        assert state == 7

    def test_execute_that_creates_a_fork_child_folds_the_parent_prefix(self, store):
        self.fill(store, "parent", 4)
        agg = Count()

        def fork(state, head):
            assert head is None
            return Decision((ev.RunForked(parent="parent", parent_seq=2),))

        result, state = store.execute("child", agg, fork, actor=OWNER)
        assert result.outcome == "committed" and state == 3 == store.fold("child", Count())
        # ... and the state it keeps for the next command is that one too.
        _, state = store.execute("child", agg, lambda s, h: Decision((hb(),)), actor=W1)
        assert state == 4 == store.fold("child", Count())
        _, state = store.execute("child", agg, lambda s, h: Decision(()), actor=W1)
        assert state == 4

    @pytest.mark.parametrize(
        "case",
        ["self", "unknown-parent", "beyond-parent-head", "negative-seq", "not-first", "bad-parent-id"],
    )
    def test_fork_that_would_loop_or_dangle_is_refused(self, store, case):
        self.fill(store, "parent", 3)
        run, fork = "kid", ev.RunForked(parent="parent", parent_seq=2)
        if case == "self":
            run, fork = "parent", ev.RunForked(parent="parent", parent_seq=1)
            with refused(store, InvalidInput):
                store.append("loop", [ev.RunForked(parent="loop", parent_seq=0)], actor=OWNER)
        elif case == "unknown-parent":
            fork = ev.RunForked(parent="nobody", parent_seq=0)
        elif case == "beyond-parent-head":
            fork = ev.RunForked(parent="parent", parent_seq=4)
        elif case == "negative-seq":
            fork = ev.RunForked(parent="parent", parent_seq=-1)
        elif case == "not-first":
            self.fill(store, run, 1)
        else:
            fork = ev.RunForked(parent="../parent", parent_seq=1)
        with refused(store, InvalidInput):
            store.append(run, [fork], actor=OWNER)
        # history stays finite for every run
        for h in store.list_runs():
            list(store.history(h.run_id))

    # --- malformed input -----------------------------------------------------------------

    @pytest.mark.parametrize("run_id", BAD_RUN_IDS)
    def test_invalid_run_id_is_refused_everywhere(self, store, run_id):
        self.fill(store, "ok", 1)
        with refused(store, InvalidInput, match="not a valid run id") as info:
            store.append(run_id, [hb()], actor=W1)
        assert info.value.field == "run_id" and info.value.exit_code == 2
        with refused(store, InvalidInput):
            store.execute(run_id, Count(), up_to(1), actor=W1)
        with refused(store, InvalidInput):
            store.head(run_id)
        with refused(store, InvalidInput):
            list(store.read_run(run_id))
        with refused(store, InvalidInput):
            list(store.history(run_id))

    def test_longest_and_punctuated_run_ids_are_valid(self, store):
        for run in ("x" * 128, "a.b_c:d-e", "0"):
            store.append(run, [hb()], actor=W1)
            assert store.head(run).last_seq == 1

    def test_unknown_event_type_is_refused(self, store):
        class Unlisted(ev.Event, tag="unlisted_event"):
            note: str = ""

        class Plain(msgspec.Struct):
            pass

        for bad in (Unlisted(), Plain(), {"type": "heartbeat_recorded"}, None, "heartbeat_recorded"):
            with refused(store, UnknownEventType) as info:
                store.append("u", [bad], actor=W1)
            assert info.value.field == "events[0]"

    def test_event_with_a_wrongly_typed_field_is_refused(self, store):
        # msgspec does not check types at construction; the store must not accept an
        # event it could not read back.
        for bad in (
            ev.ProgressRecorded(kind=5),  # type: ignore[arg-type]
            ev.EvidenceRecorded(kind="t", outcome="maybe"),  # type: ignore[arg-type]
            ev.WatchdogObserved(watcher="w", classification="c", progress_seq=1, interval_s=float("nan")),
        ):
            with refused(store, InvalidInput, match="read back"):
                store.append("typed", [hb(), bad], actor=W1)

    def test_payload_size_limit_is_exact(self, store):
        limit = getattr(store, "max_payload", DEFAULT_MAX_PAYLOAD)
        base = len(ev.encode(step(0, detail="")))
        at_limit = step(0, detail="x" * (limit - base))
        assert len(ev.encode(at_limit)) == limit
        store.append("size", [at_limit], actor=W1)
        assert list(store.read_run("size"))[0].payload == ev.encode(at_limit)
        over = step(0, detail="x" * (limit - base + 1))
        with refused(store, PayloadTooLarge, match=f"{limit + 1} bytes") as info:
            store.append("size", [over], actor=W1)
        assert isinstance(info.value, InvalidInput)

    @pytest.mark.parametrize(
        "events",
        [[], (), hb()],
        ids=["empty-list", "empty-tuple", "bare-event"],
    )
    def test_batch_must_be_a_non_empty_sequence(self, store, events):
        with refused(store, InvalidInput, match="event"):
            store.append("b", events, actor=W1)

    @pytest.mark.parametrize(
        "actor",
        [Actor("robot", "r"), Actor("worker", ""), Actor("worker", "x" * 129),
         Actor("worker", "a\nb"), "worker:w1"],
    )
    def test_malformed_actor_is_invalid_input(self, store, actor):
        with refused(store, InvalidInput, match="actor"):
            store.append("act", [hb()], actor=actor)

    # --- threads sharing one store ---------------------------------------------------------

    def test_threads_sharing_one_store(self, store):
        errors: list[BaseException] = []
        n_threads, n_each = 4, 40

        def work(t: int) -> None:
            try:
                for i in range(n_each):
                    store.append(f"own-{t}", [step(i)], actor=W1)
                    while True:
                        head = store.head("shared")
                        try:
                            store.append("shared", [step(i, detail=f"{t}")], actor=W1,
                                         expected_seq=head.last_seq if head else 0)
                            break
                        except SeqConflict:
                            continue
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert seqs(list(store.read_run("shared"))) == list(range(1, n_threads * n_each + 1))
        for t in range(n_threads):
            assert seqs(list(store.read_run(f"own-{t}"))) == list(range(1, n_each + 1))
        assert positions(list(store.read_all())) == list(range(1, 2 * n_threads * n_each + 1))
        assert store.verify() == []


    # --- counts, export and import ---------------------------------------------------------

    def history_of_three(self, store: EventStore) -> None:
        """Three runs: one under a lease with a keyed append, a plain one, and a fork."""
        self.fill(store, "a", 3)
        token = self.grant(store, "a", 1)
        store.append("a", [hb(), hb()], actor=W1, lease=token, idempotency_key="k-a")
        self.fill(store, "b", 2, actor=OWNER)
        store.append("c", [ev.RunForked(parent="a", parent_seq=2), hb()], actor=OWNER)

    def test_counts(self, store):
        assert store.counts() == {"events": 0, "runs": 0}
        self.history_of_three(store)
        assert store.counts() == {"events": 10, "runs": 3}
        assert store.count_runs() == 3

    def test_wait_for_events_returns_at_once_when_the_log_is_ahead_and_waits_out_the_timeout(self, store):
        import time

        assert store.wait_for_events(0, 0) == 0
        t0 = time.monotonic()
        assert store.wait_for_events(0, 0.2) == 0  # nothing comes: the whole timeout
        assert time.monotonic() - t0 >= 0.2
        self.fill(store, "a", 2)
        assert store.wait_for_events(0, 30) == 2  # already there: no wait
        assert store.wait_for_events(2, 0.05) == 2

    def test_who_inserted_each_event_is_the_servers_word_or_nothing(self, store):
        self.history_of_three(store)
        roles, counts = store.db_roles(1, 10), store.db_role_counts()
        if store.records_roles:  # a server says it: one role per event, counted
            assert sorted(roles) == list(range(1, 11)) and sum(counts.values()) == 10
            assert set(counts) == set(roles.values())
            assert sum(store.db_role_counts("a").values()) == store.head("a").last_seq
            assert store.db_roles(4, 5) == {p: roles[p] for p in (4, 5)}
        else:  # no server: nothing claimed that the store cannot back
            assert roles == {} and counts == {} and store.db_role_counts("a") == {}

    def test_export_then_import_gives_the_same_log(self, store):
        self.history_of_three(store)
        items = list(store.read_for_export())
        assert [r.position for r, _, _ in items] == list(range(1, 11))
        keyed = [(r, d, n) for r, d, n in items if r.idempotency_key == "k-a"]
        assert len(keyed) == 1 and isinstance(keyed[0][1], bytes) and keyed[0][2] == 2
        copy = self.make_store()
        try:
            assert copy.import_records(items) == {"imported": 10, "skipped": 0, "runs": 3}
            assert list(copy.read_all()) == list(store.read_all())
            assert list(copy.list_runs()) == list(store.list_runs())
            assert copy.verify() == []
            # The same export again changes nothing.
            before = snapshot(copy)
            assert copy.import_records(items) == {"imported": 0, "skipped": 10, "runs": 3}
            assert_unchanged(copy, before)
            # The imported key still answers its request as a duplicate.
            again = copy.append("a", [hb(), hb()], actor=W1, lease=f"1.{token_secret('a', 1)}", idempotency_key="k-a")
            assert again.outcome == "duplicate" and again.first_seq == 5
        finally:
            copy.close()

    def test_export_of_chosen_runs(self, store):
        self.history_of_three(store)
        assert {r.run_id for r, _, _ in store.read_for_export(["b"])} == {"b"}
        assert list(store.read_for_export([])) == []

    def test_import_that_extends_a_run_appends_only_the_new_events(self, store):
        self.fill(store, "a", 2)
        items = list(store.read_for_export())
        store.append("a", [hb()], actor=W1)
        longer = list(store.read_for_export())
        copy = self.make_store()
        try:
            copy.import_records(items)
            assert copy.import_records(longer) == {"imported": 1, "skipped": 2, "runs": 1}
            assert list(copy.read_all()) == list(store.read_all())
        finally:
            copy.close()

    def test_import_that_contradicts_a_stored_run_writes_nothing(self, store):
        self.fill(store, "a", 2)
        items = list(store.read_for_export())
        other = self.make_store()
        try:
            other.append("a", [hb(), hb()], actor=W2)
            other.append("z", [hb()], actor=W2)
            with refused(other, InvalidInput, match="different event"):
                other.import_records(items)
        finally:
            other.close()

    def test_import_whose_chain_does_not_continue_writes_nothing(self, store):
        self.fill(store, "a", 3)
        items = [item for item in store.read_for_export() if item[0].seq != 2]  # a hole at seq 2
        copy = self.make_store()
        try:
            copy.append("keep", [hb()], actor=W1)
            with refused(copy, InvalidInput, match="does not continue"):
                copy.import_records(items)
        finally:
            copy.close()

    # --- verify and diagnostics --------------------------------------------------------

    def test_verify_of_one_run_and_of_the_whole_log(self, store):
        self.history_of_three(store)
        assert store.verify() == []
        assert store.verify("c") == []
        seen: list[tuple[int, int]] = []
        assert store.verify(progress=lambda done, total: seen.append((done, total))) == []

    def test_diagnostics_name_the_backend_as_json(self, store):
        facts = store.diagnostics()
        assert isinstance(facts["backend"], str) and facts["backend"]
        assert isinstance(facts["backend_version"], str) and facts["backend_version"]
        assert msgspec.json.decode(msgspec.json.encode(facts)) == facts
        assert store.diagnostics() == facts  # reading them writes nothing
        assert store.last_position() == 0

    # --- transactions and the inline hook ----------------------------------------------------

    def test_read_transaction_answers_under_one_snapshot(self, store):
        self.history_of_three(store)
        with store.read_transaction() as txn:
            assert txn.head("a") == store.head("a")
            assert txn.head("nope") is None
            assert txn.state("a", Count()) == 6
            assert txn.state("c", Count()) == 4  # the fork folds its parent's prefix
            assert txn.fold("c", Types()) == ("progress_recorded",) * 2 + ("run_forked", "heartbeat_recorded")
            assert txn.last_position() == 10
            assert txn.count_runs() == 3
            assert txn.count_runs(begun_by=8) == 2
            assert txn.runs_since(0) == ["a", "b", "c"]  # first-appearance order
            assert txn.runs_since(5) == ["a", "b", "c"]
            assert txn.runs_since(6) == ["b", "c"]
            assert txn.runs_since(10) == []

    def test_write_transaction_that_raises_writes_nothing(self, store):
        self.fill(store, "a", 2)
        with refused(store, RuntimeError, match="on purpose"):
            with store.write_transaction("testing") as txn:
                assert txn.last_position() == 2
                raise RuntimeError("on purpose")
        with store.write_transaction("testing") as txn:  # the store is usable afterwards
            assert txn.head("a").last_seq == 2

    def test_inline_hook_sees_the_write_in_its_transaction(self, store):
        seen: list[tuple[str, int, int, int]] = []

        def hook(txn, run_id, state, last_position):
            assert isinstance(txn, Transaction)
            head = txn.head(run_id)
            seen.append((run_id, state, last_position, head.last_position))

        store.attach(Count(), hook)
        self.fill(store, "a", 2)
        store.execute("a", Count(), up_to(3), actor=W1)
        # The hook sees its own write: the fold after it, and a head that agrees with the
        # position it is given. That position is the ledger position where the backend
        # knows it before the commit (SQLite), the write id where positions are sealed
        # after the commit (PostgreSQL: docs/architecture.md, "PostgreSQL: what a write does"); it grows either way.
        assert [(r, st) for r, st, _, _ in seen] == [("a", 2), ("a", 3)]
        assert all(pos == head_pos for _, _, pos, head_pos in seen)
        assert seen[0][2] < seen[1][2]
        assert store.head("a").last_position == store.last_position() == 3

    def test_failing_inline_hook_rolls_the_append_back(self, store):
        self.fill(store, "a", 1)

        def hook(txn, run_id, state, last_position):
            if state == 3:
                raise RuntimeError("hook failed on purpose")

        store.attach(Count(), hook)
        store.append("a", [hb()], actor=W1)
        with refused(store, RuntimeError, match="on purpose"):
            store.append("a", [hb()], actor=W1)
        with refused(store, RuntimeError, match="on purpose"):
            store.execute("a", Count(), up_to(5), actor=W1)

    # --- the ledger-wide chain, copies and what a store says about itself -----------------

    def test_ledger_head_and_global_hash_at_follow_the_ledger_wide_chain(self, store):
        assert store.ledger_head() == (0, GENESIS_HASH)
        assert store.global_hash_at(1) is None
        self.history_of_three(store)
        last, top = store.ledger_head()
        assert last == store.last_position() == 10
        assert store.global_hash_at(10) == top
        chain = [store.global_hash_at(p) for p in range(1, 11)]
        assert all(isinstance(h, bytes) and len(h) == 32 for h in chain)
        assert len(set(chain)) == 10  # each position binds its own hash
        assert store.global_hash_at(11) is None
        with refused(store, InvalidInput, match="position"):
            store.global_hash_at(-1)
        store.append("a", [hb()], actor=W1, lease=f"1.{token_secret('a', 1)}")
        assert store.global_hash_at(10) == top  # an append never rewrites what was there
        assert store.ledger_head()[0] == 11 and store.ledger_head()[1] != top

    def test_the_store_refuses_updates_and_deletes_by_itself(self, store):
        assert store.append_only_problems() == []
        self.fill(store, "a", 2)
        assert store.append_only_problems() == []

    def test_backup_is_one_consistent_copy_that_names_its_head(self, store):
        self.history_of_three(store)
        target = self.tmp_path / "backup-copy"
        assert not target.exists()
        position, top, runs = store.backup_to(str(target))
        assert (position, top, runs) == (*store.ledger_head(), 3)
        assert target.exists()
        assert store.verify() == []  # the original goes on as it was
        store.append("b", [hb()], actor=OWNER)
        assert store.ledger_head()[0] == 11

    def test_an_open_that_made_the_schema_says_so_and_a_second_one_does_not(self):
        address = self.backend.address()
        first = self.backend.open(address)
        assert first.created_schema is True
        if self.backend.shared:  # a second handle on the same ledger finds the schema there
            assert self.backend.open(address).created_schema is False

    def test_what_a_store_says_about_itself(self, store):
        assert store.readonly is False
        assert isinstance(store.path, str) and store.path
        assert store.views is store.views  # one view store per store
        assert store.views.positions() == {}  # no projection attached to a bare store
        store.close()
        store.close()  # closing twice is harmless

    def test_view_writes_commit_and_roll_back_with_their_transaction(self, store):
        spec = TableSpec("conformance_view", columns(run_id="text!", n="int!"), pk=("run_id",))
        handle = store.views.table(spec)
        with store.write_transaction("preparing a test view") as txn:
            store.views.prepare({"conformance": (spec, 1)})
            txn.views.sync_one(handle, {"run_id": "a", "n": 1})
        assert store.views.positions() == {"conformance": 0}
        with pytest.raises(RuntimeError, match="on purpose"):
            with store.write_transaction("writing a test view") as txn:
                txn.views.sync_one(handle, {"run_id": "a", "n": 2})
                txn.views.set_positions({"conformance": 7})
                raise RuntimeError("on purpose")
        assert store.views.get("conformance_view", ("a",), ("n",)) == (1,)
        assert store.views.positions() == {"conformance": 0}
        with store.write_transaction("writing a test view") as txn:
            txn.views.sync_one(handle, {"run_id": "a", "n": 2})
        assert store.views.get("conformance_view", ("a",), ("n",)) == (2,)

    # --- ledger-wide settings ------------------------------------------------------------

    def test_a_setting_is_kept_beside_the_log_until_it_is_unset(self, store):
        before = snapshot(store)
        assert store.setting("conformance") is None
        store.put_setting("conformance", '["cmd:*"]')
        store.put_setting("conformance", '["https://*"]')  # replaced, not added
        assert store.setting("conformance") == '["https://*"]'
        assert store.setting("other") is None
        assert_unchanged(store, before)  # a setting is not an event: the log is as it was
        store.put_setting("conformance", None)
        assert store.setting("conformance") is None
        store.put_setting("conformance", None)  # unsetting what is not set changes nothing
        assert store.setting("conformance") is None

    # --- values beside the log -------------------------------------------------------

    def test_values_are_kept_per_run_once_each_and_deleted_only_when_asked(self, store):
        a, b = b"msgpack\x00one", b"json\x00[2]"
        da, db_ = value_digest(a), value_digest(b)
        before = snapshot(store)
        assert store.put_values("r1", {da: a, db_: b}) == 2
        assert store.put_values("r1", {da: a}) == 0  # written once
        assert store.put_values("r2", {da: a}) == 1  # another run keeps its own copy
        assert_unchanged(store, before)  # values are not events: the log is as it was
        assert store.get_values("r1", [da, db_, "f" * 64]) == {da: a, db_: b}
        assert store.value_digests("r1") == {da: da, db_: db_}
        assert store.delete_values("r1", [da]) == 0  # no recorded erasure names it: kept
        store.append("r1", [ev.ValuesErased(reason="test", values=(da,))], actor=W1)
        assert store.delete_values("r1", [da, db_, "f" * 64]) == 1  # only what the record names
        assert store.get_values("r1", [da, db_]) == {db_: b}
        assert store.get_values("r2", [da]) == {da: a}  # untouched
        assert store.value_digests("nobody") == {} and store.get_values("nobody", [da]) == {}
        # What a write that continues a value needs: stored, and named by no recorded erasure.
        store.require_values("r1", [db_])
        store.require_values("r1", [])
        before = snapshot(store)
        for gone in (da, "f" * 64):  # erased (recorded and deleted), never stored
            with pytest.raises(ValueNotStored, match="does not store") as refused:
                store.require_values("r1", [db_, gone])
            assert refused.value.details["sha256"] == gone
        assert_unchanged(store, before)
        store.append("r2", [ev.ValuesErased(reason="test", values=(da,))], actor=W1)
        before = snapshot(store)
        with pytest.raises(ValueNotStored):  # recorded, not yet deleted: gone all the same
            store.require_values("r2", [da])
        assert_unchanged(store, before)
        assert isinstance(store.values_join_writes, bool)
        if store.values_join_writes:  # a put inside a write commits or rolls back with it
            with pytest.raises(RuntimeError, match="on purpose"):
                with store.write_transaction("a write that fails"):
                    store.put_values("r3", {da: a})
                    raise RuntimeError("on purpose")
            assert store.value_digests("r3") == {}
