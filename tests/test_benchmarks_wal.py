"""The WAL-per-command benchmarks (benchmarks/bench_wal.py): the counting they rest on,
proved on known writes, and their smoke run.

Never a speed and never a goal: what is asserted is that the figures are counted right
(a frame read across a WAL restart, a statement that fires a trigger counted once, every
frame of the breakdown named) and that both scenarios run and report.
"""

import json
import os
import sqlite3
import subprocess
import sys

from benchmarks.bench_wal import StatementCounter, WalFrames, frame_label, page_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_UNAVAILABLE = {"no server", "psycopg not installed"}


def _wal_db(path):
    conn = sqlite3.connect(path, isolation_level=None)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY, y TEXT)")
    return conn


def test_frames_are_counted_across_a_wal_restart_where_the_file_size_stops_growing(tmp_path):
    path = str(tmp_path / "w.db")
    conn = _wal_db(path)
    wal = WalFrames(path)
    wal.mark()
    for i in range(10):  # one small row per commit: the table's one leaf page each time
        conn.execute("INSERT INTO t (y) VALUES (?)", (f"row {i}",))
        wal.scan()
    assert len(wal.frames) == 10 and all(commit for _, commit in wal.frames)
    # SQLite's own count of the frames in the WAL agrees.
    busy, log_frames, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
    assert busy == 0
    size = os.path.getsize(path + "-wal")
    assert log_frames >= 10  # the table's creation is in the WAL too
    for i in range(5):
        conn.execute("INSERT INTO t (y) VALUES (?)", (f"after {i}",))
        wal.scan()
    # The next writer started the WAL again from the top: the file did not grow, the
    # frames were still counted.
    assert os.path.getsize(path + "-wal") == size
    assert len(wal.frames) == 15
    assert sum(commit for _, commit in wal.frames) == 15
    assert {p for p, _ in wal.frames} == {2}  # table t's root page, the only one written
    assert set(wal.kinds) == {"leaf"}
    assert page_names(path)[2] == ("t", "leaf")
    conn.close()


def test_a_root_page_written_while_a_leaf_is_named_a_leaf_after_its_tree_grew(tmp_path):
    """dbstat, read after the writes, calls a b-tree's root internal once the tree has
    grown a level; the frames written before that held a leaf, and say so."""
    path = str(tmp_path / "w.db")
    conn = _wal_db(path)
    wal = WalFrames(path)
    wal.mark()
    conn.execute("INSERT INTO t (y) VALUES (?)", ("x" * 1500,))
    wal.scan()
    for _ in range(5):  # 1,500-byte rows: the 4 KiB root splits on the third
        conn.execute("INSERT INTO t (y) VALUES (?)", ("x" * 1500,))
        wal.scan()
    names = page_names(path)
    assert names[2] == ("t", "internal")
    labels = [frame_label(names, p, k) for (p, _), k in zip(wal.frames, wal.kinds)]
    assert labels[0] == "t"  # the first commit wrote the root as a leaf
    assert "t (internal)" in labels  # later ones wrote it as the tree's interior page
    conn.close()


def test_frames_of_a_transaction_not_yet_committed_are_not_counted(tmp_path):
    path = str(tmp_path / "w.db")
    conn = _wal_db(path)
    conn.execute("PRAGMA cache_size=1")  # spill dirty pages to the WAL before the commit
    wal = WalFrames(path)
    wal.mark()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t (y) VALUES (?)", [("x" * 2000,) for _ in range(50)])
    wal.scan()
    spilled = os.path.getsize(path + "-wal")
    assert spilled > 32 and wal.frames == []  # written, not committed: not counted
    conn.execute("COMMIT")
    wal.scan()
    assert len(wal.frames) > 1 and wal.frames[-1][1] and sum(c for _, c in wal.frames) == 1
    conn.close()


def test_a_statement_that_fires_triggers_counts_once():
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("CREATE TABLE u (x)")
    conn.execute("CREATE TRIGGER a BEFORE INSERT ON t BEGIN INSERT INTO u VALUES (new.x); END")
    conn.execute("CREATE TRIGGER b AFTER INSERT ON t WHEN new.x > 1 BEGIN INSERT INTO u VALUES (0); END")
    counter = StatementCounter()
    conn.set_trace_callback(counter)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (?)", (1,))
    conn.execute("INSERT INTO t VALUES (?)", (2,))
    conn.execute("COMMIT")
    conn.set_trace_callback(None)
    assert counter.count == 4
    assert conn.execute("SELECT count(*) FROM u").fetchone()[0] == 3  # the triggers did run


def _metrics(side):
    return {k: v[0] for k, v in side["metrics"].items()}


def test_both_scenarios_run_in_their_quick_size_and_account_for_every_frame(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--quiet", "--json", "--dir", str(tmp_path),
         "--only", "wal-per-command,pg-wal-per-command"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    scenarios = {s["scenario"]: s for s in json.loads(done.stdout)["scenarios"]}
    assert set(scenarios) == {"wal-per-command", "pg-wal-per-command"}

    lite = scenarios["wal-per-command"]
    sides = {s["name"]: s for s in lite["sides"]}
    ours, raw = _metrics(sides["handoff-ledger"]), _metrics(sides["raw sqlite3"])
    assert sides["handoff-ledger"]["status"] == "ok", sides["handoff-ledger"]["error"]
    for group in ("progress", "heartbeat", "progress_fleet", "heartbeat_fleet"):
        assert ours[f"{group}_commits"] == 1, group  # one durable commit per command
        assert ours[f"{group}_pages"] >= 1 and ours[f"{group}_stmts"] >= 1, group
        assert abs(ours[f"{group}_bytes"] - ours[f"{group}_pages"] * (4096 + 24)) < 1e-6, group
        # The breakdown names every frame the group wrote.
        named = sum(v for k, v in ours.items() if k.startswith(f"{group}@"))
        assert abs(named - ours[f"{group}_pages"]) < 1e-9, group
    assert ours["progress@events_run_seq"] >= 1  # an append writes the run's index entry
    # BEGIN IMMEDIATE; INSERT; COMMIT: three statements, the table's leaf and its key's index.
    assert raw["insert_stmts"] == 3 and raw["insert_commits"] == 1
    assert raw["insert@events"] >= 1 and raw["insert@sqlite_autoindex_events_1"] >= 1
    for peer in ("eventsourcing", "langgraph SqliteSaver"):
        if sides[peer]["status"] == "ok":
            figures = _metrics(sides[peer])
            assert any(k.endswith("_commits") and v >= 1 for k, v in figures.items()), peer

    pg = scenarios["pg-wal-per-command"]
    subject = pg["sides"][0]
    if subject["status"] in PG_UNAVAILABLE and os.environ.get("CI", "").lower() != "true":
        return
    assert subject["status"] == "ok", subject["error"]
    ours, raw = _metrics(subject), _metrics(pg["sides"][1])
    assert raw["insert_stmts"] == 1  # one autocommit INSERT
    if "insert_wal_bytes" in raw:  # pg_walinspect could be created: this database's records
        assert raw["insert_commits"] == 1 and raw["insert_records"] >= 3  # heap, 2 indexes, commit
        for group in ("progress", "progress_fleet"):
            assert ours[f"{group}_commits"] == 1 and ours[f"{group}_x_raw"] > 0, group
            named = sum(v for k, v in ours.items() if k.startswith(f"{group}@"))
            assert abs(named - ours[f"{group}_nofpi_bytes"]) < 1e-6, group
