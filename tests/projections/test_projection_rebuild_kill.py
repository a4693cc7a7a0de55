"""kill -9 during a rebuild leaves the old projections intact; the next rebuild succeeds.

A subprocess rebuilds a few-thousand-event ledger in small batches; the test waits for
its ``*__new`` tables to appear, sleeps a random moment and SIGKILLs it. After each kill:
the kept tables are exactly as before, ``check`` is clean, the file passes
``PRAGMA integrity_check``, and the ledger still takes commands. Finally a rebuild runs to
completion and gives the same rows. More kills with HANDOFF_TEST_SCALE=full (--slow).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time

from handoff import Ledger

from tests.support import Clock, finish, spawn

from projection_support import FULL, build_log, dump, integrity, leftover_tables, schema_objects

REBUILD = """
import sys
from handoff import Ledger
lg = Ledger(sys.argv[1])
print("started", flush=True)
counts = lg.projector.rebuild(batch=int(sys.argv[2]))
print("done", counts, flush=True)
"""

# The same rebuild, held open inside the swap transaction (old tables dropped and the new
# ones renamed in, not yet committed) until the test kills it there.
REBUILD_HELD_IN_SWAP = """
import sys, time
from handoff import Ledger
lg = Ledger(sys.argv[1])
finish = lg.store.finish
def held(ok, doing):
    if doing.startswith("swapping"):
        print("swapping", flush=True)
        time.sleep(120)
    return finish(ok, doing)
lg.store.finish = held
lg.projector.rebuild(batch=int(sys.argv[2]))
print("done", flush=True)
"""


def has_new_tables(path: str) -> bool:
    conn = sqlite3.connect(path, timeout=5)
    try:
        return conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name LIKE '%\\_\\_new' ESCAPE '\\'"
        ).fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False  # a schema change in flight; ask again
    finally:
        conn.close()


def test_kill9_mid_rebuild_leaves_old_projections_intact(tmp_path):
    path = str(tmp_path / "ledger.db")
    clock = Clock(step_us=0)
    runs = 800 if FULL else 400
    with Ledger(path, synchronous="NORMAL", clock=clock) as lg:
        build_log(lg, runs, 10, clock=clock)
        # A few runs through commands too, so deliveries and owner_load hold varied rows.
        for i in range(5):
            rid = lg.open(goal="g", target="chat:#x", owner="zed", run_id=f"cmd-{i}")
            lease = lg.claim(rid, "w")
            lg.transition(rid, lease, "planning")
        assert lg.store.last_position() >= 4000
        assert lg.check() == []
    before = dump(path)
    indexes = schema_objects(path)

    seed = int(os.environ.get("PROJECTION_KILL_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    kills = 8 if FULL else 4
    landed = 0
    for k in range(kills):
        proc = spawn(REBUILD, path, 5)
        try:
            deadline = time.monotonic() + 30
            while not has_new_tables(path) and proc.poll() is None:
                assert time.monotonic() < deadline, "the rebuild never started"
                time.sleep(0.001)
            # Early in the rebuild: on a fast machine a late kill can miss it entirely.
            time.sleep(rng.uniform(0, 0.05))
            alive = proc.poll() is None
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        if alive and proc.returncode == -signal.SIGKILL:
            landed += 1
        # Whatever the moment: the kept tables are the old ones (or a completed swap of
        # identical rows), check is clean, and the file is sound.
        assert integrity(path) == "ok", f"seed {seed}, kill {k}"
        assert dump(path) == before, f"seed {seed}, kill {k}"
        assert schema_objects(path) == indexes
        with Ledger(path) as lg:
            assert lg.check() == [], f"seed {seed}, kill {k}"
    assert landed >= 1, f"no kill landed mid-rebuild (seed {seed}); the rebuild is too fast to interrupt"

    # The most delicate moment: inside the swap, before its commit.
    proc = spawn(REBUILD_HELD_IN_SWAP, path, 50)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "swapping", line + proc.stderr.read()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    assert integrity(path) == "ok"
    assert dump(path) == before
    assert schema_objects(path) == indexes
    with Ledger(path) as lg:
        assert lg.check() == []

    # The ledger keeps working beside the leftover *__new tables, inline as ever.
    with Ledger(path, clock=clock) as lg:
        clock.advance(1)
        rid = lg.open(goal="after the kills", target="chat:#x", owner="zed", run_id="after")
        lg.claim(rid, "w")
        assert lg.check() == []
    expected = dump(path)

    # A rebuild run to the end: same rows, no leftovers, clean check, sound file.
    out = finish(spawn(REBUILD, path, 5))
    assert "done" in out
    assert leftover_tables(path) == []
    assert dump(path) == expected
    assert schema_objects(path) == indexes
    with Ledger(path) as lg:
        assert lg.check() == []
        lg.rebuild()
        assert lg.check() == []
    assert dump(path) == expected
    assert integrity(path) == "ok"
