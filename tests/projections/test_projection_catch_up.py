"""Catch-up: a projection whose table is missing, or whose tracking position lags the log,
is brought level when the ledger opens, from its tracking position, with no migration of
the log. The base ledger has 10,000 events (500 runs of 20) and is built once per module.
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from handoff import Ledger
from handoff import facade
from handoff.ledger.view_tables import Index, TableSpec, columns
from handoff.projections import engine
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint
from tests.support import Clock

from projection_support import BULK_TOKEN, build_log, dump, integrity, schema_objects

RUNS, PER_RUN = 500, 20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """(path, rows, indexes) of a closed 10,000-event ledger; copy it before changing it."""
    path = str(tmp_path_factory.mktemp("big") / "ledger.db")
    clock = Clock(step_us=0)
    with Ledger(path, synchronous="NORMAL", clock=clock) as lg:
        assert build_log(lg, RUNS, PER_RUN, clock=clock) == RUNS * PER_RUN
        assert lg.check() == []
    return path, dump(path), schema_objects(path)


@pytest.fixture
def ledger_copy(big, tmp_path):
    src, rows, indexes = big
    dst = str(tmp_path / "ledger.db")
    shutil.copyfile(src, dst)  # closed cleanly: the WAL was checkpointed into the file
    return dst, rows, indexes


def raw(path: str, *sql: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for s in sql:
            conn.execute(s)
    finally:
        conn.close()


@pytest.fixture
def catch_ups(monkeypatch):
    """Records how many runs each Projector.catch_up refolded."""
    seen: list[int] = []
    original = engine.Projector.catch_up

    def spy(self, **kw):
        n = original(self, **kw)
        seen.append(n)
        return n

    monkeypatch.setattr(engine.Projector, "catch_up", spy)
    return seen


def test_dropped_checkpoints_table_is_recreated_and_caught_up(ledger_copy, catch_ups):
    path, rows, indexes = ledger_copy
    raw(path, "DROP TABLE checkpoints", "DELETE FROM projection_positions WHERE name='checkpoints'")
    with Ledger(path) as lg:
        assert catch_ups == [RUNS]
        assert lg.check() == []
        assert lg.projector.positions() == {p.name: RUNS * PER_RUN for p in engine.PROJECTIONS}
        assert len(list(lg.runs(include_terminal=True))) == RUNS
    assert dump(path) == rows
    assert schema_objects(path) == indexes


def test_every_projection_dropped_is_caught_up(ledger_copy, catch_ups):
    path, rows, indexes = ledger_copy
    raw(path, *(f"DROP TABLE {p.table}" for p in engine.PROJECTIONS), "DROP TABLE projection_positions")
    progress: list[tuple[int, int]] = []
    with Ledger(path) as lg:
        assert catch_ups == [RUNS]
        assert lg.check() == []
        lg.projector.catch_up(progress=lambda i, n: progress.append((i, n)))  # level: a no-op
        assert catch_ups == [RUNS, 0] and progress == []
    assert dump(path) == rows
    assert schema_objects(path) == indexes
    assert integrity(path) == "ok"


def test_lagging_projections_catch_up_from_their_position(ledger_copy, catch_ups, monkeypatch):
    path, rows, _ = ledger_copy
    clock = Clock(2_000_000_000_000_000, step_us=0)
    # A ledger that keeps only the checkpoints view inline (as an older version might).
    with monkeypatch.context() as m:
        m.setattr(facade, "Projector", lambda store: engine.Projector(store, ["checkpoints"]))
        with Ledger(path, clock=clock) as lg:
            lagging_from = lg.store.last_position()
            for i in range(10):
                lg.open(goal="late", target="chat:#late", owner="late-owner", run_id=f"late-{i}")
            for i in range(0, 40, 4):  # and touch some old runs
                rid = f"bulk-{i:05d}"
                lg.release(rid, BULK_TOKEN)
            assert lg.check("checkpoints") == []
            diffs = lg.check()
            assert diffs and {d["projection"] for d in diffs} <= {"stall_watch", "deliveries", "owner_load"}
            positions = lg.projector.positions()
    assert positions["checkpoints"] == lagging_from + 20
    assert all(positions[n] == lagging_from for n in ("stall_watch", "deliveries", "owner_load"))
    catch_ups.clear()

    with Ledger(path, clock=clock) as lg:
        assert catch_ups == [20]  # only the runs with events after the lagging position
        assert lg.check() == []
        assert set(lg.projector.positions().values()) == {lg.store.last_position()}
        assert lg.owner_load("late-owner") == 0
        assert {cp.run_id for cp in lg.runs(owner="late-owner")} == {f"late-{i}" for i in range(10)}
        caught_up = dump(path)
        lg.rebuild()
    assert dump(path) == caught_up  # caught up == rebuilt, byte for byte
    assert caught_up["checkpoints"][:RUNS] != rows["checkpoints"][:RUNS]  # (it did change)


def _beats_rows(cp: Checkpoint, last_position: int) -> list[dict]:
    return [{"run_id": cp.run_id, "state": cp.state, "last_heartbeat_us": cp.watch.last_heartbeat_us,
             "events": cp.last_seq}]


NEW = engine.Projection(
    name="heartbeats",
    spec=TableSpec(
        "heartbeats",
        columns(run_id="text!", state="text!", last_heartbeat_us="int", events="int!"),
        pk=("run_id",),
        indexes=(Index("beat", ("last_heartbeat_us",)),),
    ),
    rows=_beats_rows,
)


def test_a_new_projection_is_added_to_a_10k_event_ledger(ledger_copy, catch_ups, monkeypatch):
    path, rows, _ = ledger_copy
    monkeypatch.setattr(engine, "PROJECTIONS", engine.PROJECTIONS + (NEW,))
    monkeypatch.setitem(engine.BY_NAME, NEW.name, NEW)
    with Ledger(path) as lg:
        assert catch_ups == [RUNS]
        assert lg.check() == []
        got = lg.store.conn.execute("SELECT run_id, state, last_heartbeat_us, events FROM heartbeats ORDER BY run_id").fetchall()
        want = []
        for head in lg.store.list_runs():
            cp = lg.store.fold(head.run_id, AGGREGATE)
            want.append((cp.run_id, cp.state, cp.watch.last_heartbeat_us, cp.last_seq))
        assert got == sorted(want)
        # From now on it is kept inline, and it rebuilds like the others.
        rid = lg.open(goal="g", target="t", owner="o", run_id="fresh")
        lease = lg.claim(rid, "w")
        lg.heartbeat(rid, lease)
        assert lg.check() == []
        assert lg.store.conn.execute("SELECT count(*) FROM heartbeats").fetchone()[0] == RUNS + 1
        before = dump(path)
        assert lg.rebuild("heartbeats") == {"heartbeats": RUNS + 1}
        assert dump(path) == before
        assert lg.check() == []
    # The existing views were untouched by the addition.
    after = dump(path)
    assert after["checkpoints"][:RUNS] == rows["checkpoints"]


def test_events_from_a_writer_without_views_are_not_skipped(tmp_path, catch_ups):
    """A bare SqliteStore (or an older version without these projections) appends beside a
    Ledger; the Ledger's next inline append must not mark those events as applied."""
    from handoff.ledger.sqlite import SqliteStore

    from projection_support import BUILDER, run_events

    path = str(tmp_path / "ledger.db")
    with Ledger(path) as lg:
        lg.open(goal="g", target="t", owner="o", run_id="a")
        bare = SqliteStore(path)
        try:
            bare.append("b", run_events(1, 8), actor=BUILDER)
        finally:
            bare.close()
        lease = lg.claim("a", "w")  # inline upkeep for run a, after b's events
        lg.heartbeat("a", lease)
        assert {d["run_id"] for d in lg.check()} == {"b"}  # b has no rows yet: expected
        assert lg.projector.catch_up() == 2  # b, and a (it has events after the gap too)
        assert lg.check() == []
    with Ledger(path) as lg:
        assert lg.check() == []
        assert lg.checkpoint("b").owner == "owner1"
