"""The projections on every backend in tests/backends.py, through the neutral interface only.

Nothing here names SQL or a private attribute: rebuild equals incremental upkeep, check
finds and inline upkeep repairs a damaged row, catch-up brings views level with a log
written without them (and with a second handle writing behind the projector, where the
backend can open one ledger twice), and the view store's read vocabulary answers as
documented (ledger/view_tables.py). A new backend runs this file by adding its entry to
tests/backends.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from handoff import Ledger
from handoff.ledger.errors import InvalidInput
from handoff.ledger.store import Actor
from handoff.ledger.view_tables import NOT_NULL, ORDINAL, Index, TableSpec, columns
from handoff.projections import engine, queries
from handoff.reducers import liveness
from tests.support import Clock

from projection_support import BUILDER, run_events


def views_dump(store: Any) -> dict[str, Any]:
    """Every view's rows in key order, the one-row-per-run views' creation order, tracking."""
    vs = store.views
    out: dict[str, Any] = {}
    for p in engine.PROJECTIONS:
        out[p.table] = vs.select(p.table, p.columns, order=p.pk)
        if not p.many:
            out[f"{p.table}:order"] = [r[0] for r in vs.select(p.table, ("run_id",), order=(ORDINAL,))]
    out["positions"] = vs.positions()
    return out


def busy_ledger(store: Any, clock: Clock) -> Ledger:
    """A Ledger on ``store`` holding runs in many states, a fork and a watcher stream."""
    lg = Ledger(store=store, clock=clock)
    for i in range(8):
        store.append(f"bulk{i}", run_events(i, 10 + i), actor=BUILDER)
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id="w")
    lease = lg.claim("w", "w1")
    lg.transition("w", lease, "planning")
    lg.transition("w", lease, "executing")
    clock.advance(1)
    lg.heartbeat("w", lease)
    lg.progress("w", lease, "tool_outcome", "step", key="k1")
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id="q")
    lg.fork("w", 3, new_run_id="w.fork")
    lg.watcher_beat("wd", 5.0)
    clock.advance(1)
    return lg


def test_rebuild_equals_incremental_upkeep(backend_store, clock):
    lg = busy_ledger(backend_store, clock)
    assert lg.check() == []
    inline = views_dump(backend_store)
    assert [r[0] for r in inline["checkpoints"]] == sorted(
        ["bulk0", "bulk1", "bulk2", "bulk3", "bulk4", "bulk5", "bulk6", "bulk7", "w", "q", "w.fork"])
    counts = lg.rebuild()
    assert counts == {p.table: len(inline[p.table]) for p in engine.PROJECTIONS}
    assert views_dump(backend_store) == inline
    assert lg.check() == []
    # Rebuilding one view leaves the others as they were.
    lg.rebuild("stall_watch")
    assert views_dump(backend_store) == inline


def test_check_finds_a_damaged_row_and_the_next_command_repairs_it(backend_store, clock):
    lg = busy_ledger(backend_store, clock)
    p = engine.BY_NAME["checkpoints"]
    row = dict(zip(p.columns, backend_store.views.get(p.table, ("w",), p.columns)))
    with backend_store.write_transaction("damaging a view row for a test") as txn:
        txn.views.sync_one(backend_store.views.table(p.spec), {**row, "owner": "mallory"})
    assert [(d["run_id"], d["column"], d["kept"], d["folded"]) for d in lg.check()] == [
        ("w", "owner", "mallory", "alice")]
    # Any write of the run will do: inline upkeep compares with the table, so it rewrites the row.
    lg.evidence("w", "review", "pass", "seen by an operator", actor=Actor("operator", "ops"))
    assert lg.check() == []


def test_catch_up_brings_views_level_with_a_log_written_without_them(backend_store, clock):
    for i in range(12):
        backend_store.append(f"r{i}", run_events(i, 9 + i % 5), actor=BUILDER)
    lg = Ledger(store=backend_store, clock=clock)  # its projector catches up on attach
    last = backend_store.last_position()
    assert set(lg.projector.positions().values()) == {last}
    assert lg.check() == []
    caught = views_dump(backend_store)
    lg.rebuild()
    assert views_dump(backend_store) == caught
    # Events appended behind the projector's back (a second, bare handle would do the same
    # across processes) are refolded by the next catch-up.
    assert lg.projector.catch_up() == 0


def test_queries_answer_from_the_views(backend_store, clock):
    lg = busy_ledger(backend_store, clock)
    # A run as it stands is the log's fold joined with the beat kept beside the log: w's
    # beat after its claim went to its liveness row only, so the fold alone lags it.
    folded = lg.store.fold("w", engine.AGGREGATE)
    live = backend_store.liveness(["w"])["w"]
    assert folded.watch.last_heartbeat_us < live.beat_us
    assert queries.checkpoint(backend_store, "w") == liveness.overlay(folded, live)
    assert queries.checkpoint(backend_store, "w").watch.last_heartbeat_us == live.beat_us
    assert queries.checkpoint(backend_store, "nope") is None
    live = [cp.run_id for cp in queries.runs(backend_store)]
    assert live[-3:] == ["w", "q", "w.fork"]  # oldest first
    assert [cp.run_id for cp in queries.runs(backend_store, state="queued", owner="alice")] == ["q"]
    far = 2**62  # the store's own clock stamps events: any deadline is before this
    due = queries.due_run_ids(backend_store, far)
    assert [cp.run_id for cp in queries.stall_candidates(backend_store, far)] == due
    assert "w" in due and "q" not in due
    assert set(queries.due_run_ids(backend_store, 0)) < set(due)
    assert queries.stall_candidates(backend_store, -1) == []
    assert queries.owner_load(backend_store, "alice") == 1
    assert queries.owner_load(backend_store, "alice", exclude="w") == 0
    assert queries.owner_load(backend_store, "alice", exclude="q") == 1
    signals = queries.leased_signals(backend_store)
    assert ("w", lg.checkpoint("w").lease) in [(r[0], r[1]) for r in signals]
    everything = queries.deliveries(backend_store, now_us=far)
    pending = queries.deliveries(backend_store, now_us=far, status="pending")
    assert {d["status"] for d in pending} <= {"ready", "attempted", "ambiguous"}
    assert len(pending) <= len(everything)


# --- the read vocabulary -----------------------------------------------------------------------

VOCAB = TableSpec(
    "vocab_test",
    columns(k="text!", run_id="text!", flag="int!", n="int", s="text", b="blob"),
    pk=("k",),
    indexes=(Index("due", ("n", "k"), where=(("flag", 1), ("n", NOT_NULL))), Index("s", ("s",))),
)
ROWS = [
    {"k": f"k{i:02d}", "run_id": f"r{i % 3}", "flag": i % 2, "n": None if i % 4 == 0 else i,
     "s": "odd" if i % 2 else "even", "b": bytes([i])}
    for i in range(20)
]


@pytest.fixture
def vocab(backend_store):
    vs = backend_store.views
    handle = vs.table(VOCAB)
    with backend_store.write_transaction("preparing a test view"):
        vs.prepare({"vocab": (VOCAB, 1)})
    with backend_store.write_transaction("filling a test view") as txn:
        for row in reversed(ROWS):  # creation order differs from key order
            txn.views.sync_one(handle, row)
    return vs


def keys(rows: list[tuple[Any, ...]]) -> list[str]:
    return [r[0] for r in rows]


def test_get_and_get_many(vocab):
    assert vocab.get("vocab_test", ("k03",), ("n", "s", "b")) == (3, "odd", b"\x03")
    assert vocab.get("vocab_test", ("nope",), ("n",)) is None
    got = vocab.get_many("vocab_test", ["k01", "k02", "nope", "k01"], ("n",))
    assert got == {"k01": (1,), "k02": (2,)}
    many = vocab.get_many("vocab_test", [f"k{i:02d}" for i in range(20)] * 60, ("s",))
    assert len(many) == 20


def test_select_joined_pairs_each_row_with_the_other_tables_row_by_key(vocab, backend_store):
    """Rows of one view with their row of another by primary key (the stall scan: due
    rows with their packets), under the same filters, in the same order."""
    other = TableSpec("vocab_other", columns(k="text!", label="text!"), pk=("k",))
    handle = vocab.table(other)
    with backend_store.write_transaction("preparing a test view") as txn:
        vocab.prepare({"vocab": (VOCAB, 1), "other": (other, 1)})
        for i in range(0, 20, 3):  # only some rows have a partner
            txn.views.sync_one(handle, {"k": f"k{i:02d}", "label": f"L{i}"})
    got = vocab.select_joined("vocab_test", ("k", "n"), "vocab_other", ("label",), key="k",
                              where={"flag": 1}, between=("n", None, 15), order=("k",))
    want = [(r["k"], r["n"], f"L{int(r['k'][1:])}") for r in ROWS
            if r["flag"] == 1 and r["n"] is not None and r["n"] <= 15 and int(r["k"][1:]) % 3 == 0]
    assert got == want and want
    assert vocab.select_joined("vocab_test", ("k",), "vocab_other", ("label",), key="k", where={"s": "none"}) == []


def test_select_filters(vocab):
    k = lambda **f: keys(vocab.select("vocab_test", ("k",), order=("k",), **f))  # noqa: E731
    assert k(where={"s": "odd"}) == [r["k"] for r in ROWS if r["s"] == "odd"]
    assert k(where={"s": ("odd", "even"), "flag": 0}) == [r["k"] for r in ROWS if r["flag"] == 0]
    assert k(where={"n": None}) == [r["k"] for r in ROWS if r["n"] is None]
    assert k(where={"n": NOT_NULL}) == [r["k"] for r in ROWS if r["n"] is not None]
    assert k(where_not={"run_id": "r0"}) == [r["k"] for r in ROWS if r["run_id"] != "r0"]
    assert k(where_not={"run_id": None}) == [r["k"] for r in ROWS]
    # A range never includes nulls; bounds are inclusive, None is open.
    assert k(between=("n", 5, 9)) == ["k05", "k06", "k07", "k09"]
    assert k(between=("n", None, 3)) == ["k01", "k02", "k03"]
    # The partial index's own rows: flag = 1 and a deadline, by range.
    due = vocab.select("vocab_test", ("k",), where={"flag": 1}, between=("n", None, 10))
    assert sorted(keys(due)) == ["k01", "k03", "k05", "k07", "k09"]


def test_select_order_keyset_and_limit(vocab):
    created = keys(vocab.select("vocab_test", ("k",), order=(ORDINAL,)))
    assert created == [r["k"] for r in reversed(ROWS)]
    page = vocab.select("vocab_test", ("k", "n"), order=("k",), limit=5)
    assert keys(page) == ["k00", "k01", "k02", "k03", "k04"]
    rest = vocab.select("vocab_test", ("k",), order=("k",), after=("k04",), limit=100)
    assert keys(rest) == [f"k{i:02d}" for i in range(5, 20)]
    assert keys(list(vocab.pages("vocab_test", ("k",), order=("k",), page=3))) == sorted(r["k"] for r in ROWS)
    paged = list(vocab.pages("vocab_test", (ORDINAL, "k"), order=(ORDINAL,), page=7, where={"s": "odd"}))
    assert [r[1] for r in paged] == [r["k"] for r in reversed(ROWS) if r["s"] == "odd"]
    with pytest.raises(InvalidInput, match="order"):
        vocab.select("vocab_test", ("k",), after=("k04",))


def test_count(vocab):
    assert vocab.count("vocab_test") == 20
    assert vocab.count("vocab_test", where={"flag": 1}) == 10
    assert vocab.count("vocab_test", where={"run_id": "r1"}, where_not={"k": "k01"}) == 6


def test_sync_many_writes_only_what_changed_and_deletes_what_went(backend_store, vocab):
    handle = vocab.table(VOCAB)
    mine = [r for r in ROWS if r["run_id"] == "r2"]
    changed = [{**mine[0], "s": "moved"}, *mine[2:]]  # one changed, one gone, rest the same
    order_before = keys(vocab.select("vocab_test", ("k",), order=(ORDINAL,)))
    with backend_store.write_transaction("syncing a test view") as txn:
        txn.views.sync_many(handle, "r2", changed)
    got = vocab.select("vocab_test", ("k", "s"), where={"run_id": "r2"}, order=("k",))
    assert got == [(r["k"], r["s"]) for r in sorted(changed, key=lambda r: r["k"])]
    # Rows updated in place keep their place in creation order.
    assert keys(vocab.select("vocab_test", ("k",), order=(ORDINAL,))) == [
        k for k in order_before if k != mine[1]["k"]]


def test_names_are_checked(vocab):
    with pytest.raises(InvalidInput):
        vocab.select("vocab_test; DROP TABLE vocab_test", ("k",))
    with pytest.raises(InvalidInput):
        vocab.select("vocab_test", ("k FROM vocab_test --",))
    assert vocab.count("vocab_test") == 20


def test_catch_up_refolds_what_a_second_handle_wrote_behind_the_projector(backend, clock):
    """Two handles on one ledger (two processes, in practice): a bare store appends to an
    existing run and starts a new one; the Ledger's next catch-up folds exactly those."""
    if not backend.shared:
        pytest.skip(f"{backend.name}: a second handle cannot open the same ledger")
    address = backend.address()
    lg = Ledger(store=backend.open(address), clock=clock)
    bare = backend.open(address)  # no projector attached: writes the log only
    for i in range(4):
        lg.store.append(f"r{i}", run_events(i, 9), actor=BUILDER)
    assert lg.check() == []
    level = views_dump(lg.store)
    bare.append("r1", run_events(1, 12)[9:], actor=BUILDER)
    bare.append("late", run_events(7, 10), actor=BUILDER)
    assert views_dump(lg.store) == level  # nothing folded them yet
    assert lg.projector.catch_up() == 2  # r1 and late, not the runs already level
    assert set(lg.projector.positions().values()) == {lg.store.last_position()}
    assert lg.check() == []
    caught = views_dump(lg.store)
    lg.rebuild()
    assert views_dump(lg.store) == caught
