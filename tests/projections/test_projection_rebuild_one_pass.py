"""The one-pass rebuild (projections/rebuild.py) gives exactly the rows of folding run by run.

Runs are interleaved event by event and in stretches, with forks (folded whole, since the
scan may have passed their parent's prefix) and a watcher's stream (no rows); the memory
bound is set low so that partial folds are spilled and read back, some more than once.
Rows are compared byte for byte, with their rowids (the order rows were written in).
"""

from __future__ import annotations

import pytest

from handoff import Actor, Ledger
from handoff.ledger import events as ev
from handoff.ledger.errors import CorruptLedger
from handoff.ledger.sqlite import SqliteStore
from handoff.projections import rebuild

from projection_support import BUILDER, Clock, dump, run_events


def _interleaved(lg: Ledger, clock: Clock, runs: int, per_run: int, prefix: str = "mix") -> None:
    """Each run's events in pieces of 1 to 5 events, round-robin over the runs."""
    bodies = {f"{prefix}-{i:03d}": run_events(i, per_run) for i in range(runs)}
    at = {r: 0 for r in bodies}
    step = 0
    while any(at[r] < len(b) for r, b in bodies.items()):
        for r, body in bodies.items():
            n = 1 + (step + len(r)) % 5
            if at[r] < len(body):
                clock.advance(1_000)
                lg.store.append(r, body[at[r]: at[r] + n], actor=BUILDER)
                at[r] += n
            step += 1
        if step % 7 == 0:
            lg.watcher_beat("wd-1", 30.0)


@pytest.fixture
def ledger(tmp_path):
    clock = Clock()
    lg = Ledger(str(tmp_path / "ledger.db"), clock=clock)
    _interleaved(lg, clock, runs=12, per_run=16)
    lg.fork("mix-003", 4, new_run_id="mix-003.child", by="op")
    token = lg.claim("mix-003.child", "w9")
    lg.heartbeat("mix-003.child", token)
    lg.fork("mix-003.child", 2, new_run_id="mix-003.grandchild", by="op")
    lg.progress("mix-003.child", token, "plan_committed", "after the fork")
    for _ in range(3):  # the parent goes on past the fork point, among other runs
        lg.store.append("mix-003", [ev.HeartbeatRecorded()], actor=BUILDER)
        _interleaved(lg, clock, runs=1, per_run=9, prefix=f"late{_}")
    yield lg
    lg.close()


def _run_by_run(lg: Ledger) -> dict:
    lg.store.scans_in_order = False
    try:
        lg.rebuild()
    finally:
        del lg.store.scans_in_order
    return dump(lg.store.path)


@pytest.mark.parametrize("hold", [1, 2, 3, 5, 11, 100])
def test_one_pass_rows_equal_run_by_run(ledger, monkeypatch, hold):
    inline = dump(ledger.store.path)
    assert _run_by_run(ledger) == inline
    monkeypatch.setattr(rebuild, "HOLD", hold)
    counts = ledger.rebuild()
    assert dump(ledger.store.path) == inline
    assert counts["checkpoints"] == 12 + 2 + 3  # the watcher's stream has no row
    assert ledger.check() == []


def test_one_pass_folds_match_the_store_fold(ledger):
    """What the scan gives each run is the store's own fold of it (a fork: None, folded later)."""
    store = ledger.store
    seen = []
    for run_id, last, cp in rebuild.fold_in_one_pass(store, store.last_position(), hold=2):
        head = store.head(run_id)
        seen.append(run_id)
        if run_id.endswith("child"):
            assert cp is None  # its rows come from a fold of its lineage when written
        else:
            assert last == head.last_position
            assert cp == store.fold(run_id, rebuild.AGGREGATE)
    assert seen == [h.run_id for h in store.list_runs()]  # the order runs began in


def test_scan_runs_gives_every_event_once_in_order(ledger):
    store = ledger.store
    assert isinstance(store, SqliteStore)
    last = store.last_position()
    got = [(run_id, s.seq) for run_id, first, end, steps in store.scan_runs(until_position=last, page=7)
           for s in steps]
    assert got == [(r.run_id, r.seq) for r in store.read_all()]
    # the generic scan (from read_all), which a backend without its own gives, agrees
    generic = super(SqliteStore, store).scan_runs(until_position=last)
    mine = store.scan_runs(until_position=last, page=1000)
    assert [(r, f, e, [(s.seq, s.type, s.recorded_us, s.event) for s in st]) for r, f, e, st in generic] == \
        [(r, f, e, [(s.seq, s.type, s.recorded_us, s.event) for s in st]) for r, f, e, st in mine]


def test_a_damaged_payload_stops_the_rebuild_and_leaves_the_views(tmp_path):
    path = str(tmp_path / "ledger.db")
    with Ledger(path) as lg:
        for i in range(3):
            lg.store.append(f"r-{i}", run_events(i, 10), actor=BUILDER)
        before = dump(path)
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET payload=? WHERE position=15", (ev.encode(ev.HeartbeatRecorded()),))
    conn.commit()
    conn.close()
    with Ledger(path) as lg:
        with pytest.raises(CorruptLedger) as err:
            lg.rebuild()
        assert err.value.details["position"] == 15
        assert "run 'handoff verify'" in err.value.message.lower()
    assert dump(path) == before


def test_watcher_only_ledger_rebuilds_to_no_rows(tmp_path):
    with Ledger(str(tmp_path / "w.db")) as lg:
        lg.store.append("watcher:wd", [ev.WatchdogObserved(watcher="wd", classification="alive",
                                                           progress_seq=0, interval_s=5.0)],
                        actor=Actor("watchdog", "wd"))
        assert lg.rebuild()["checkpoints"] == 0
