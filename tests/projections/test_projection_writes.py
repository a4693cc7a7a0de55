"""How inline upkeep writes the views: only the rows that differ from the table, with the
secondary indexes left alone when their columns did not move, and whatever another writer
left stale repaired. Real files throughout; writes are seen through TEMP triggers on the
store's own connection (the file's schema is untouched) and through the WAL's frames.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from handoff import Ledger
from handoff.ledger.sqlite import UNKEPT, SqliteStore
from handoff.ledger.sqlite.sqlite_view_store import Table
from handoff.ledger.view_tables import Index, TableSpec, columns
from handoff.projections import engine, queries
from handoff.reducers.checkpoint import Checkpoint
from tests.support import S, Clock, working_run

from projection_support import BUILDER, dump, integrity, run_events

CK_KEYS = ("state", "terminal", "owner", "target")  # what checkpoints' secondary indexes read


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "ledger.db")


def watch_writes(clocked_lg: Ledger, tables: list[str] | None = None) -> Callable[[], list[tuple[str, str, str]]]:
    """Log every row written to the view tables, as (table, op, run_id), from now on.

    ``UPDATE OF`` fires when a statement SETs one of the named columns, changed or not,
    which is exactly when SQLite rewrites the index entries built on them: the op
    "keys" marks a checkpoints write that touched its secondary indexes."""
    conn = clocked_lg.store.conn
    tables = tables or [p.table for p in engine.PROJECTIONS]
    with clocked_lg.store.lock:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS writes (tbl TEXT, op TEXT, run_id TEXT)")
        conn.execute("DELETE FROM writes")
        for t in tables:
            for op, ref in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
                conn.execute(
                    f"CREATE TEMP TRIGGER IF NOT EXISTS log_{t}_{op} AFTER {op} ON main.{t} "
                    f"BEGIN INSERT INTO writes VALUES ('{t}', '{op}', {ref}.run_id); END"
                )
        if "checkpoints" in tables:
            conn.execute(
                f"CREATE TEMP TRIGGER IF NOT EXISTS log_checkpoints_keys AFTER UPDATE OF {', '.join(CK_KEYS)} "
                "ON main.checkpoints BEGIN INSERT INTO writes VALUES ('checkpoints', 'keys', NEW.run_id); END"
            )

    def taken() -> list[tuple[str, str, str]]:
        with clocked_lg.store.lock:
            out = conn.execute("SELECT tbl, op, run_id FROM writes ORDER BY rowid").fetchall()
            conn.execute("DELETE FROM writes")
        return out

    return taken


def other_writer(path: str, *sql: str | tuple[str, tuple[Any, ...]]) -> None:
    """Rows changed behind the projector's back, by another connection."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for s in sql:
            conn.execute(*(s if isinstance(s, tuple) else (s,)))
    finally:
        conn.close()


def by_index(clocked_lg: Ledger, sql: str, *args: Any) -> list[Any]:
    with clocked_lg.store.lock:
        return [r[0] for r in clocked_lg.store.conn.execute(sql, args)]


# --- the statements ----------------------------------------------------------------------


def test_in_place_updates_leave_out_every_indexed_column():
    """The in-place UPDATE sets no column a secondary index reads (keys or partial WHERE);
    it matches them instead, so a row whose indexed values moved takes the upsert."""
    ck = Table(engine.BY_NAME["checkpoints"].spec, "checkpoints")
    assert ck.update is not None
    set_part, where = ck.update.split(" WHERE ", 1)
    for c in CK_KEYS:
        assert f"{c}=" not in set_part and f"{c} IS :{c}" in where
    assert "packet=:packet" in set_part and "last_seq=:last_seq" in set_part
    stall = Table(engine.BY_NAME["stall_watch"].spec, "stall_watch")
    set_part, where = stall.update.split(" WHERE ", 1)  # type: ignore[union-attr]
    for c in ("live", "next_deadline_us"):  # the due index's key and its partial WHERE
        assert f"{c}=" not in set_part and f"{c} IS :{c}" in where
    # An index name that merely contains a column's name does not count as reading it.
    owner = Table(engine.BY_NAME["owner_load"].spec, "owner_load")
    assert owner.update is not None and "SET lease=:lease" in owner.update


# --- unchanged rows and untouched indexes ------------------------------------------------


def test_a_progress_command_writes_two_view_rows_and_no_index(clocked_lg, clock):
    lease = working_run(clocked_lg, "r1")
    clock.advance(1)
    clocked_lg.heartbeat("r1", lease)
    writes = watch_writes(clocked_lg)
    for i in range(3):
        clock.advance(1)
        clocked_lg.progress("r1", lease, "tool_outcome", f"step {i}", key=f"k{i}")
        # In place: no upsert, no "keys" (checkpoints' four indexes untouched), and the
        # delivery and owner-load rows, equal to the table's, not written at all.
        assert writes() == [("checkpoints", "UPDATE", "r1"), ("stall_watch", "UPDATE", "r1")]
    assert clocked_lg.check() == []


def test_a_progress_command_dirties_no_view_index_page(clocked_lg, clock):
    """The same seen in the WAL: the pages one command appends, mapped to their b-trees."""
    conn = clocked_lg.store.conn
    try:
        conn.execute("SELECT 1 FROM dbstat LIMIT 1")
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    lease = working_run(clocked_lg, "r1")
    for i in range(3):  # settle the rows' sizes
        clocked_lg.progress("r1", lease, "tool_outcome", f"warm {i}", key=f"w{i}")
    with clocked_lg.store.lock:
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    clock.advance(1)
    clocked_lg.progress("r1", lease, "tool_outcome", "step", key="k")
    with open(clocked_lg.store.path + "-wal", "rb") as f:
        wal = f.read()
    size = int.from_bytes(wal[8:12], "big")
    pages = {int.from_bytes(wal[o : o + 4], "big") for o in range(32, len(wal) - size - 23, size + 24)}
    with clocked_lg.store.lock:
        btree = dict(conn.execute("SELECT pageno, name FROM dbstat"))
        views = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE tbl_name IN (%s)" % ",".join("?" * (len(engine.PROJECTIONS) + 2)),
            [*(p.table for p in engine.PROJECTIONS), engine.TRACKING, UNKEPT])}
    written = {btree.get(p) for p in pages}
    # Not stall_watch_due either: progress moves the progress deadline, and the run's next
    # deadline is still the heartbeat's, so the partial index's key stays put. And since
    # file schema 2 no tracking row (nor a views_unkept mark): the write kept every view.
    assert written & views == {"checkpoints", "stall_watch"}


def test_refolding_current_views_writes_no_row(clocked_lg):
    """catch_up over runs whose rows are already right compares and writes nothing."""
    a = working_run(clocked_lg, "a")
    clocked_lg.progress("a", a, "tool_outcome", "x")
    b = working_run(clocked_lg, "b", owner="bob")
    clocked_lg.release("b", b)
    clocked_lg.open(goal="g", target="t", owner="carol", run_id="c")
    before = dump(clocked_lg.store.path)
    writes = watch_writes(clocked_lg)
    with clocked_lg.store.lock:
        # Unbuilt: catch-up refolds every run (position 0 alone, with no write marked as
        # not keeping the views, means current since file schema 2).
        clocked_lg.store.conn.execute(f"UPDATE {engine.TRACKING} SET position=-1")
    assert clocked_lg.projector.catch_up() == 3
    assert writes() == []
    assert dump(clocked_lg.store.path) == before
    assert clocked_lg.check() == []


def test_a_late_run_refolded_beside_a_current_one_writes_only_its_own_rows(path):
    with Ledger(path) as clocked_lg:
        clocked_lg.open(goal="g", target="t", owner="o", run_id="a")
        bare = SqliteStore(path)  # a writer without the projections
        try:
            bare.append("b", run_events(1, 8), actor=BUILDER)
        finally:
            bare.close()
        lease = clocked_lg.claim("a", "w")
        clocked_lg.heartbeat("a", lease)
        writes = watch_writes(clocked_lg)
        assert clocked_lg.projector.catch_up() == 2  # a and b
        assert {run for _, _, run in writes()} == {"b"}
        assert clocked_lg.check() == []


# --- indexed columns that do move --------------------------------------------------------


def test_a_state_change_moves_the_row_in_every_index(clocked_lg):
    for rid in ("r0", "r1", "r2"):
        clocked_lg.open(goal="g", target="chat:#a", owner="alice", run_id=rid)
    rowids = by_index(clocked_lg, "SELECT rowid FROM checkpoints ORDER BY run_id")
    writes = watch_writes(clocked_lg, ["checkpoints"])
    lease = clocked_lg.claim("r1", "w1")
    assert writes() == [("checkpoints", "UPDATE", "r1")]  # queued still: in place
    clocked_lg.transition("r1", lease, "planning")
    assert ("checkpoints", "keys", "r1") in writes()  # state moved: the upsert, indexes too

    def in_state(state: str, index: str = "checkpoints_state") -> list[str]:
        return by_index(clocked_lg, f"SELECT run_id FROM checkpoints INDEXED BY {index} WHERE state=? ORDER BY run_id", state)

    assert in_state("planning") == ["r1"] and in_state("queued") == ["r0", "r2"]
    assert by_index(clocked_lg, "SELECT run_id FROM checkpoints INDEXED BY checkpoints_owner "
                        "WHERE owner='alice' AND state='planning'") == ["r1"]
    assert by_index(clocked_lg, "SELECT run_id FROM checkpoints INDEXED BY checkpoints_target "
                        "WHERE target='chat:#a' AND state='queued' ORDER BY run_id") == ["r0", "r2"]
    clocked_lg.close_run("r2", "cancelled", by="alice")
    assert ("checkpoints", "keys", "r2") in writes()
    assert by_index(clocked_lg, "SELECT run_id FROM checkpoints INDEXED BY checkpoints_live "
                        "WHERE terminal=0 ORDER BY run_id") == ["r0", "r1"]
    assert by_index(clocked_lg, "SELECT run_id FROM checkpoints INDEXED BY checkpoints_live "
                        "WHERE terminal=1 AND state='cancelled'") == ["r2"]
    assert [cp.run_id for cp in queries.runs(clocked_lg.store, state="planning")] == ["r1"]
    assert [cp.run_id for cp in queries.runs(clocked_lg.store)] == ["r0", "r1"]
    # Every row kept its rowid (oldest first), and the indexes agree with the table.
    assert by_index(clocked_lg, "SELECT rowid FROM checkpoints ORDER BY run_id") == rowids
    assert integrity(clocked_lg.store.path) == "ok"
    assert clocked_lg.check() == []


def test_a_moved_deadline_moves_the_stall_row_in_its_partial_index(clocked_lg, clock):
    clocked_lg.open(goal="g", target="t", owner="alice", run_id="r1", heartbeat_timeout_s=60, progress_timeout_s=300)
    t1 = clock.advance(1)
    lease = clocked_lg.claim("r1", "w1")
    assert queries.due_run_ids(clocked_lg.store, t1 + 60 * S + 1) == ["r1"]
    clock.advance(10)
    # A beat kept beside the log moves no view row: the stall row keeps the log's deadline,
    # which is never later than the kept beat's, so the run stays among the scanned rows.
    assert clocked_lg.heartbeat("r1", lease).result.outcome == "unchanged"
    assert queries.due_run_ids(clocked_lg.store, t1 + 60 * S + 1) == ["r1"]
    t2 = clock.advance(31)  # a silence longer than half the timeout: this beat is logged
    assert clocked_lg.heartbeat("r1", lease).result.outcome == "committed"
    assert queries.due_run_ids(clocked_lg.store, t1 + 60 * S + 1) == []
    assert queries.due_run_ids(clocked_lg.store, t2 + 60 * S + 1) == ["r1"]
    clocked_lg.close_run("r1", "cancelled", by="alice")  # not live: out of the partial index
    assert queries.due_run_ids(clocked_lg.store, t2 + 10**12) == []
    assert integrity(clocked_lg.store.path) == "ok"
    assert clocked_lg.check() == []


# --- many-row views ------------------------------------------------------------------------


def test_a_lease_that_ends_deletes_its_owner_load_row_and_nothing_else(clocked_lg, clock):
    a = working_run(clocked_lg, "a")
    working_run(clocked_lg, "b")
    writes = watch_writes(clocked_lg, ["deliveries", "owner_load"])
    clock.advance(31)  # a beat after a silence is logged: its upkeep leaves these rows alone
    assert clocked_lg.heartbeat("a", a).result.outcome == "committed"
    assert writes() == []
    clocked_lg.release("a", a)
    assert writes() == [("owner_load", "DELETE", "a")]
    assert by_index(clocked_lg, "SELECT run_id FROM owner_load WHERE owner='alice'") == ["b"]
    assert clocked_lg.owner_load("alice") == 1
    assert clocked_lg.check() == []


def _effect_rows(cp: Checkpoint, last_position: int) -> list[dict[str, Any]]:
    return [{"run_id": cp.run_id, "key": e.key, "what": e.what, "lost": int(e.lease != cp.lease),
             "holder": cp.lease} for e in cp.pending_effects]


# A view with 0..n rows per run, some of whose values move: one row per pending side effect.
EFFECTS = engine.Projection(
    name="effects",
    spec=TableSpec(
        "effects",
        columns(run_id="text!", key="text!", what="text!", lost="int!", holder="int"),
        pk=("run_id", "key"),
        indexes=(Index("lost", ("lost", "run_id")),),
    ),
    rows=_effect_rows,
    many=True,
)


@pytest.fixture
def with_effects(monkeypatch):
    monkeypatch.setattr(engine, "PROJECTIONS", engine.PROJECTIONS + (EFFECTS,))
    monkeypatch.setitem(engine.BY_NAME, EFFECTS.name, EFFECTS)


def test_a_many_row_view_writes_only_the_rows_that_differ(with_effects, path):
    with Ledger(path) as clocked_lg:
        lease = working_run(clocked_lg, "r1")
        working_run(clocked_lg, "r2", owner="bob")
        writes = watch_writes(clocked_lg, ["effects"])
        clocked_lg.effect_start("r1", lease, "k1", "send a mail")
        clocked_lg.effect_start("r1", lease, "k2", "post a note")
        assert writes() == [("effects", "INSERT", "r1"), ("effects", "INSERT", "r1")]
        # a logged beat (its attrs changed) refolds the run's rows: none of them differs
        assert clocked_lg.heartbeat("r1", lease, attrs={"n": 1}).result.outcome == "committed"
        assert writes() == []
        clocked_lg.effect_confirm("r1", "k1", "done", lease=lease)  # k1 goes away, k2 stays as it was
        assert writes() == [("effects", "DELETE", "r1")]
        assert by_index(clocked_lg, "SELECT key FROM effects") == ["k2"]
        clocked_lg.revoke("r1", "worker vanished")  # k2 is lost now: an indexed column moved
        assert writes() == [("effects", "UPDATE", "r1")]
        assert by_index(clocked_lg, "SELECT key FROM effects INDEXED BY effects_lost WHERE lost=1") == ["k2"]
        assert by_index(clocked_lg, "SELECT key FROM effects INDEXED BY effects_lost WHERE lost=0") == []
        clocked_lg.claim("r1", "w2")  # only the non-indexed holder moves
        assert writes() == [("effects", "UPDATE", "r1")]
        assert by_index(clocked_lg, "SELECT holder FROM effects") == [clocked_lg.checkpoint("r1").lease]
        assert integrity(path) == "ok"
        assert clocked_lg.check() == []
        before = dump(path)
        clocked_lg.rebuild()
        assert dump(path) == before
        clocked_lg.effect_confirm("r1", "k2", "absent", note="checked the outbox")
        assert by_index(clocked_lg, "SELECT count(*) FROM effects") == [0]
        assert clocked_lg.check() == []


# --- stale rows from other writers -----------------------------------------------------------


STALE = (
    # non-indexed columns, indexed ones, and the stall row's partial-index key
    "UPDATE checkpoints SET packet=x'00', lease=99, last_seq=0 WHERE run_id='a'",
    "UPDATE checkpoints SET state='bogus', terminal=1 WHERE run_id='b'",
    "UPDATE stall_watch SET retry_count=7, next_deadline_us=1, live=0 WHERE run_id='a'",
    "UPDATE stall_watch SET progress_seq=-1 WHERE run_id='b'",
    # a changed many-row row, a stray one, a missing one, one that should not be there
    "UPDATE deliveries SET status='confirmed', attempts=5 WHERE run_id='a'",
    "INSERT INTO deliveries (run_id, target, status, attempts) VALUES ('a', 'elsewhere', 'ready', 0)",
    "DELETE FROM owner_load WHERE run_id='a'",
    "INSERT INTO owner_load VALUES ('mallory', 'b', 3)",
    "UPDATE owner_load SET lease=42 WHERE run_id='c'",
)


def _stale_history(clocked_lg: Ledger) -> dict[str, int]:
    leases = {"a": working_run(clocked_lg, "a"), "c": working_run(clocked_lg, "c", owner="carol")}
    b = working_run(clocked_lg, "b", owner="bob")
    clocked_lg.release("b", b)
    return leases


def test_stale_rows_are_repaired_by_the_next_command(path, clock):
    with Ledger(path, clock=clock) as clocked_lg:
        leases = _stale_history(clocked_lg)
        other_writer(path, *STALE)
        assert {d["run_id"] for d in clocked_lg.check()} == {"a", "b", "c"}
        clock.advance(31)  # beats after a silence longer than half the timeout: commands
        assert clocked_lg.heartbeat("a", leases["a"]).result.outcome == "committed"
        assert clocked_lg.heartbeat("c", leases["c"]).result.outcome == "committed"
        clocked_lg.claim("b", "w2")
        assert clocked_lg.check() == []
        assert queries.due_run_ids(clocked_lg.store, clock() + 10**12) == ["a", "b", "c"]
        assert by_index(clocked_lg, "SELECT run_id FROM checkpoints INDEXED BY checkpoints_state "
                            "WHERE state='bogus'") == []
        assert integrity(path) == "ok"
        inline = dump(path)
        clocked_lg.rebuild()
        assert dump(path) == inline


def test_stale_rows_are_repaired_by_catch_up(path, clock):
    with Ledger(path, clock=clock) as clocked_lg:
        _stale_history(clocked_lg)
    other_writer(path, *STALE, f"UPDATE {engine.TRACKING} SET position=-1")  # unbuilt: refold all
    with Ledger(path, clock=clock) as clocked_lg:  # catches up on open
        assert clocked_lg.check() == []
        assert integrity(path) == "ok"
        caught_up = dump(path)
        clocked_lg.rebuild()
        assert dump(path) == caught_up


# --- inline, caught up and rebuilt agree ----------------------------------------------------------


@pytest.fixture
def result_file(tmp_path) -> str:
    p = tmp_path / "result.md"
    p.write_text("the report\n")
    return str(p)


def _mixed_history(clocked_lg: Ledger, clock: Clock, result_file: str) -> None:
    """Every kind of row change: new runs, in-place updates, state changes, rows deleted
    and re-added, deliveries, terminal runs, a fork, and runs touched out of order."""
    leases = {rid: working_run(clocked_lg, rid, owner=f"o{i % 2}", target=f"chat:#{i % 3}")
              for i, rid in enumerate(("r0", "r1", "r2", "r3"))}
    clocked_lg.open(goal="g", target="mail:x", owner="o0", run_id="idle")
    for step in range(3):
        for rid, lease in leases.items():
            clock.advance(7)
            clocked_lg.progress(rid, lease, "tool_outcome", f"{rid} {step}")
            clocked_lg.heartbeat(rid, lease)
    clocked_lg.block("r1", "needs a key", "ask ops", lease=leases["r1"])
    clocked_lg.effect_start("r2", leases["r2"], "e1", "send")
    clocked_lg.release("r2", leases["r2"])  # orphaned effect: unknown, owner-load row deleted
    clocked_lg.effect_confirm("r2", "e1", "absent", note="checked")
    leases["r2"] = clocked_lg.claim("r2", "w2")  # and re-added
    clocked_lg.artifact("r3", leases["r3"], result_file)
    clocked_lg.transition("r3", leases["r3"], "verifying")
    clocked_lg.evidence("r3", "tests", "pass", lease=leases["r3"])
    clocked_lg.submit("r3", leases["r3"], "done")
    clock.advance(2)
    clocked_lg.deliver("r3", "k1", by="o1")
    clocked_lg.delivery_failed("r3", "k1", "500")
    clocked_lg.deliver("r3", "k2", by="o1")
    clocked_lg.delivered("r3", "k2", "receipt")
    clocked_lg.fork("r0", 3, new_run_id="r0-fork", by="op")
    clocked_lg.unblock("r1", "got it", lease=leases["r1"])
    clocked_lg.close_run("r0", "cancelled", by="o0")
    clocked_lg.observe("r1", "stalled", progress_seq=clocked_lg.checkpoint("r1").progress_seq, watcher="wd")


def test_inline_caught_up_and_rebuilt_views_agree_after_a_mixed_history(path, clock, result_file):
    with Ledger(path, clock=clock) as clocked_lg:
        _mixed_history(clocked_lg, clock, result_file)
        assert clocked_lg.check() == []
        inline = dump(path)
        assert len(inline["checkpoints"]) == 6
        clocked_lg.rebuild()
        assert dump(path) == inline  # rowids included: "oldest first" survives
    other_writer(path, *(f"DROP TABLE {p.table}" for p in engine.PROJECTIONS), f"DROP TABLE {engine.TRACKING}")
    with Ledger(path, clock=clock) as clocked_lg:
        assert clocked_lg.check() == []
    assert dump(path) == inline
    assert integrity(path) == "ok"


def test_a_bare_append_keeps_the_views_from_the_rows_it_wrote(path):
    """store.append evolves the hooks' states over the rows it wrote (no read-back): warm
    and cold runs, a new run, and a fork child whose fold starts with its parent's prefix."""
    from handoff.ledger import events as ev
    from handoff.ledger.store import Actor

    op = Actor("operator", "op")
    clocked_lg = Ledger(path)
    clocked_lg.open(goal="g", target="file:out", owner="alice", run_id="p")
    clocked_lg.store.append("p", [ev.ProgressRecorded(kind="note", detail=str(i)) for i in range(3)], actor=op)
    clocked_lg.store.append("p", [ev.EvidenceRecorded(kind="test", outcome="pass")], actor=op)  # warm
    clocked_lg.store.append("c", [ev.RunForked(parent="p", parent_seq=3), ev.HeartbeatRecorded()], actor=op)
    clocked_lg.close()
    cold = Ledger(path)  # a new process: nothing cached
    cold.store.append("p", [ev.ArtifactRecorded(path="/o", kind="result", bytes=1, sha256="0" * 64)], actor=op)
    cold.store.append("c", [ev.ProgressRecorded(kind="note", detail="child")], actor=op)
    assert cold.check() == []
    for run in ("p", "c"):
        assert queries.checkpoint(cold.store, run) == cold.checkpoint(run, at_seq=cold.store.head(run).last_seq)
    child = queries.checkpoint(cold.store, "c")
    assert child.fork_parent == "p" and child.goal == "g" and child.last_seq == 3
    cold.close()


def test_a_rebuild_ends_however_fast_new_runs_arrive(path, monkeypatch):
    """The rebuild walks the runs that existed when it began; runs begun meanwhile are
    folded once, by the swap. A writer that opens a full page of runs per batch used to
    keep the walk going for ever."""
    from handoff.ledger import events as ev
    from handoff.ledger.sqlite import sqlite_store
    from handoff.ledger.store import Actor

    monkeypatch.setattr(sqlite_store, "PAGE", 5)
    op = Actor("operator", "op")
    opened = ev.HandoffOpened(goal="g", target="chat:#x", owner="alice")
    clocked_lg = Ledger(path)
    for i in range(10):
        clocked_lg.store.append(f"r{i}", [opened], actor=op)
    batches: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        batches.append((done, total))
        assert len(batches) < 50, "the rebuild is still walking runs begun after it started"
        for k in range(5):  # another writer opens a page of runs per batch
            clocked_lg.store.append(f"n{len(batches)}-{k}", [opened], actor=op)

    counts = clocked_lg.projector.rebuild(batch=5, progress=progress)
    assert batches == [(5, 10), (10, 10)]
    assert counts["checkpoints"] == 10 + 10 == clocked_lg.store.count_runs()
    assert clocked_lg.check() == []
    clocked_lg.close()
