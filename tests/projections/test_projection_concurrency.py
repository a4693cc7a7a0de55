"""Several processes writing one ledger file: the inline views stay equal to the log.

Writers work on their own runs (sharing owners and targets, so owner_load and the
filters interleave), a claim race against an owner's cap admits exactly the cap, and a
rebuild running beside the writers loses none of their events.
"""

from __future__ import annotations

import time

from handoff import Ledger
from handoff.projections import queries
from handoff.reducers.checkpoint import AGGREGATE

from tests.support import finish, spawn

from projection_support import FULL, dump, integrity, leftover_tables

WRITER = """
import sys
from handoff import Ledger
path, me, n, result = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lg = Ledger(path, busy_timeout_s=60)
for i in range(n):
    rid, owner = f"{me}-{i:03d}", f"owner{i % 3}"
    lg.open(goal="g", target=f"chat:#{i % 2}", owner=owner, run_id=rid, owner_cap=10_000)
    lease = lg.claim(rid, me + "-worker")
    lg.transition(rid, lease, "planning")
    lg.progress(rid, lease, "plan_committed")
    lg.heartbeat(rid, lease)
    lg.transition(rid, lease, "executing")
    if i % 3 == 0:
        lg.release(rid, lease)
    elif i % 3 == 1:
        lg.close_run(rid, "cancelled", by=owner)
    else:
        lg.artifact(rid, lease, result)
        lg.transition(rid, lease, "verifying")
        lg.evidence(rid, "tests", "pass", lease=lease)
        lg.submit(rid, lease, "done")
        lg.deliver(rid, "k", by=owner)
        if i % 2:
            lg.delivered(rid, "k", "receipt")
    if i % 5 == 0:
        lg.watcher_beat(me, 5.0)
print("ok", flush=True)
"""

CLAIM_RACE = """
import os, sys, time
from handoff import Ledger, CapacityExceeded
path, run_id, go = sys.argv[1], sys.argv[2], sys.argv[3]
lg = Ledger(path, busy_timeout_s=60)
while not os.path.exists(go):
    time.sleep(0.001)
try:
    lg.claim(run_id, "w-" + run_id)
    print("claimed", flush=True)
except CapacityExceeded:
    print("capped", flush=True)
"""

REBUILDER = """
import os, sys
from handoff import Ledger
lg = Ledger(sys.argv[1], busy_timeout_s=60)
n = 0
while not os.path.exists(sys.argv[2]):  # no rebuild once the writers are done
    lg.projector.rebuild(batch=3)
    n += 1
print(n, flush=True)
"""


def assert_views_equal_log(path: str) -> None:
    with Ledger(path) as lg:
        assert lg.check() == []
        assert lg.verify() == []
        assert set(lg.projector.positions().values()) == {lg.store.last_position()}
        loads: dict[str, int] = {}
        for head in lg.store.list_runs():
            cp = lg.store.fold(head.run_id, AGGREGATE)
            if cp.opened and cp.lease is not None and not cp.terminal:
                loads[cp.owner] = loads.get(cp.owner, 0) + 1
        for owner in {f"owner{i}" for i in range(3)} | set(loads):
            assert queries.owner_load(lg.store, owner) == loads.get(owner, 0)
    assert integrity(path) == "ok"


def result_file(tmp_path) -> str:
    p = tmp_path / "result.md"
    p.write_text("result\n")
    return str(p)


def test_concurrent_writers_leave_check_clean(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger(path).close()
    procs = 4 if FULL else 3
    runs = 40 if FULL else 12
    started = [spawn(WRITER, path, f"p{k}", runs, result_file(tmp_path)) for k in range(procs)]
    for p in started:
        assert finish(p, timeout=120).strip() == "ok"
    assert_views_equal_log(path)
    with Ledger(path) as lg:
        assert len(list(lg.runs(include_terminal=True))) == procs * runs
        assert len(lg.deliveries(status="confirmed")) == sum(
            1 for i in range(runs) if i % 3 == 2 and i % 2) * procs


def test_claims_racing_for_an_owner_cap_admit_exactly_the_cap(tmp_path):
    path = str(tmp_path / "ledger.db")
    contenders = 4
    with Ledger(path) as lg:
        for k in range(contenders):
            lg.open(goal="g", target="t", owner="alice", run_id=f"r{k}", owner_cap=2)
    go = str(tmp_path / "go")
    started = [spawn(CLAIM_RACE, path, f"r{k}", go) for k in range(contenders)]
    time.sleep(0.5)  # let them import and wait at the line
    open(go, "w").close()
    outcomes = sorted(finish(p, timeout=120).strip() for p in started)
    assert outcomes == ["capped"] * (contenders - 2) + ["claimed"] * 2
    with Ledger(path) as lg:
        assert lg.owner_load("alice") == 2
    assert_views_equal_log(path)


def test_rebuild_beside_concurrent_writers_loses_nothing(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger(path).close()
    runs = 30 if FULL else 10
    stop = str(tmp_path / "stop")
    rebuilder = spawn(REBUILDER, path, stop)  # rebuilds over and over until the writers end
    writers = [spawn(WRITER, path, f"p{k}", runs, result_file(tmp_path)) for k in range(2)]
    # The views are checked as the last rebuild left them: none runs after the writers.
    for p in writers:
        assert finish(p, timeout=120).strip() == "ok"
    open(stop, "w").close()
    assert int(finish(rebuilder, timeout=120)) >= 1
    assert leftover_tables(path) == []
    assert_views_equal_log(path)
    before = dump(path)
    with Ledger(path) as lg:
        lg.rebuild()
    assert dump(path) == before
