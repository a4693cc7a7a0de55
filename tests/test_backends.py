"""Opening a ledger by address, the one write path, and the layers a second backend needs.

- ``Ledger`` (and the CLI's --db / HANDOFF_DB) take a path, ``:memory:``, an ``sqlite:``
  URL with the backend's settings, or ``store=``; ``postgresql://`` opens the PostgreSQL backend (an unreachable server is a typed refusal).
- Nothing outside the SQLite backend's modules names sqlite3, a PRAGMA, an SQLite-only
  construct or a private attribute of the store (a grep of the tree).
- The watchdog and the API's shortcuts write through the Ledger, not the store.
- Importing the reducers does not load a database driver.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger.backends import open_store, parse
from handoff.ledger.errors import InvalidInput, StoreUnavailable
from handoff.ledger.store import Actor
from tests.ledger.conformance import refused
from tests.support import executable

ROOT = Path(__file__).resolve().parent.parent


# --- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, location, options",
    [
        ("handoff.db", "handoff.db", {}),
        ("/srv/x/ledger.db", "/srv/x/ledger.db", {}),
        (":memory:", ":memory:", {}),
        ("sqlite:///abs/ledger.db", "/abs/ledger.db", {}),
        ("sqlite:rel/ledger.db", "rel/ledger.db", {}),
        ("sqlite::memory:", ":memory:", {}),
        ("sqlite:///abs/l.db?synchronous=NORMAL", "/abs/l.db", {"synchronous": "NORMAL"}),
        ("SQLite:l.db", "l.db", {}),
        ("run:1.db", "run:1.db", {}),  # a file name with a colon is still a file
        ("C:/ledgers/x.db", "C:/ledgers/x.db", {}),
    ],
)
def test_addresses_name_the_sqlite_backend(given, location, options):
    a = parse(given)
    assert (a.backend, a.location, a.options) == ("sqlite", location, options)


@pytest.mark.parametrize(
    "given, match",
    [
        ("sqlite://host/x.db", "names a host"),
        ("sqlite:", "names no file"),
        ("sqlite:///x.db?journal=off", "no setting 'journal'"),
        ("sqlite:///x.db?synchronous", "name=value"),
        ("mysql://db/x", "'mysql'"),
        ("", "non-empty"),
        ("a\x00b", "NUL"),
        (5, "file path or a ledger URL"),
    ],
)
def test_malformed_addresses_are_invalid_input(given, match):
    with pytest.raises(InvalidInput, match=match) as info:
        parse(given)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("url", ["postgresql://u:secret@db.invalid/handoff", "postgres://db.invalid/handoff"])
def test_an_unreachable_postgresql_is_a_typed_refusal_that_creates_nothing(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreUnavailable, match="cannot reach the PostgreSQL server") as info:
        Ledger(url)
    assert info.value.exit_code == 3
    assert "secret" not in info.value.message
    assert list(tmp_path.iterdir()) == []


def test_the_cli_takes_the_same_addresses(tmp_path):
    handoff = executable()
    env = {**os.environ, "HANDOFF_DB": f"sqlite://{tmp_path}/via-env.db?synchronous=NORMAL"}
    out = subprocess.run([*handoff, "init", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "via-env.db").exists()
    doctor = subprocess.run([*handoff, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=60)
    facts = json.loads(doctor.stdout)
    assert (facts["backend"], facts["synchronous"]) == ("sqlite", "NORMAL")
    before = sorted(os.listdir(tmp_path))
    refusal = subprocess.run([*handoff, "--db", "postgresql://db.invalid/h", "status", "--json"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert refusal.returncode == 3
    assert "StoreUnavailable" in refusal.stdout + refusal.stderr
    assert sorted(os.listdir(tmp_path)) == before


def test_synchronous_is_the_sqlite_backends_setting(tmp_path):
    path = tmp_path / "l.db"
    with Ledger(f"sqlite://{path}?synchronous=normal") as lg:
        assert lg.doctor()["synchronous"] == "NORMAL"
    with Ledger(path, synchronous="NORMAL") as lg:  # the shorthand keeps working
        assert lg.doctor()["synchronous"] == "NORMAL"
    with Ledger(str(path)) as lg:
        assert lg.doctor()["synchronous"] == "FULL"
    with pytest.raises(InvalidInput, match="give it once"):
        Ledger(f"sqlite://{path}?synchronous=NORMAL", synchronous="FULL")
    with pytest.raises(InvalidInput, match="synchronous"):
        open_store(path, synchronous="SOMETIMES")


def test_ledger_on_a_given_store(tmp_path):
    store = open_store(f"sqlite:{tmp_path}/given.db")
    with Ledger(store=store) as lg:
        run = lg.open(goal="g", target="t", owner="o")
        assert lg.checkpoint(run).state == "queued"
        facts = lg.doctor()
        assert facts["backend"] == "sqlite" and facts["events"] == 1 and facts["runs"] == 1
        assert facts["path"] == str(tmp_path / "given.db")
    with pytest.raises(InvalidInput, match="EventStore"):
        Ledger(store="not a store")  # type: ignore[arg-type]


def test_memory_ledger():
    with Ledger(":memory:") as lg:
        run = lg.open(goal="g", target="t", owner="o")
        assert [cp.run_id for cp in lg.runs()] == [run]


# --- one write path --------------------------------------------------------------------------


def test_append_stream_refuses_a_runs_stream_and_writes_nothing():
    with Ledger(":memory:") as lg:
        run = lg.open(goal="g", target="t", owner="o")
        beat = ev.WatchdogObserved(watcher="wd", classification="alive", progress_seq=0, interval_s=10.0)
        with refused(lg.store, InvalidInput, match="is a handoff run"):
            lg.append_stream(run, [beat], actor=Actor("watchdog", "wd"))
        assert lg.watcher_beat("wd", 10.0) is not None
        assert lg.watchers()["wd"][1] == 10.0


WRITES_OUTSIDE = re.compile(r"\.store\.(append|execute|import_records)\(")


def test_only_the_ledger_writes_to_the_store():
    """handoff/ and cli.py write through Ledger.execute / preview (rolled back) / append_stream /
    import_lines."""
    offenders = []
    for path in [*sorted((ROOT / "handoff").glob("*.py")), ROOT / "cli.py"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if WRITES_OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    allowed = {"Ledger.execute", "Ledger.preview", "Ledger.append_stream", "Ledger.import_lines"}
    facade = (ROOT / "handoff" / "facade.py").read_text()
    where = {}
    for o in offenders:
        assert o.startswith("handoff/facade.py:"), f"a write that bypasses the Ledger: {o}"
        lineno = int(o.split(":")[1])
        defs = [m for m in re.finditer(r"^    def (\w+)", facade, re.M) if facade[:m.start()].count("\n") < lineno]
        where[o] = f"Ledger.{defs[-1].group(1)}"
    assert set(where.values()) <= allowed, where


# --- the layers a second backend needs --------------------------------------------------------

SQLITE_BACKEND = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ledger" / "sqlite").rglob("*.py")}
#: The PostgreSQL backend's own modules hold its connection, lock and DDL the same way.
POSTGRES_BACKEND = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ledger" / "postgres").rglob("*.py")}
#: The backend-neutral core the dialects fill in: it speaks no SQL, but it is where the
#: store's transaction-bound reads (``_head_locked``, ``_state_locked``) are declared.
CORE = {"ledger/store_core.py", "ledger/importing.py"}
SPEAKS_SQL = (r"sqlite3|PRAGMA|sqlite_master|INDEXED BY|\browid\b|IS NOT \?|INSERT OR REPLACE|ALTER TABLE"
              r"|\._conn\b|\._lock\b|\._begin\b|\._finish\b|\b_explain\b"
              # what a dialect's own modules share with its store, public within its package only
              r"|\bstore\.(?:conn|lock|begin|finish|x|gather|fast|mapped|ready|writing|exclusive|lock_views)\b")
FORBIDDEN = re.compile(SPEAKS_SQL + r"|_head_locked|_state_locked")
#: The core owns the store's lock (FoldingStore makes it; ``_reading`` holds it) and
#: declares the begin / finish a dialect fills in (``write_transaction`` calls them).
CORE_FORBIDDEN = re.compile(SPEAKS_SQL.replace("conn|lock|begin|finish|", "conn|"))
#: The readable copy (``export --sqlite``) writes a plain SQLite file of its own for people
#: and SQL tools, through sqlite-utils: it may speak SQLite to that file, but never reach
#: into the ledger's store.
READABLE_COPY = {"handoff/sqlite_export.py"}
STORE_PRIVATE = re.compile(r"\._conn\b|\._lock\b|\._begin\b|\._finish\b|\b_explain\b|_head_locked|_state_locked"
                           r"|\bstore\.(?:conn|lock|begin|finish|x|gather|fast|mapped|ready|writing|exclusive|lock_views)\b")


def library_files() -> list[Path]:
    out = [ROOT / "cli.py"]
    for pkg in ("ledger", "reducers", "projections", "handoff"):
        out += sorted((ROOT / pkg).rglob("*.py"))
    return out


def test_nothing_outside_the_sqlite_backend_speaks_sqlite():
    offenders = []
    for path in library_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel in SQLITE_BACKEND or rel in POSTGRES_BACKEND:
            continue
        forbidden = CORE_FORBIDDEN if rel in CORE else STORE_PRIVATE if rel in READABLE_COPY else FORBIDDEN
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if forbidden.search(line) and not _own_lock(rel, line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def _own_lock(rel: str, line: str) -> bool:
    """``self._lock`` of a class's own (handoff/testing/machine.py's FakeClock keeps one) is not the store's."""
    return "self._lock" in line and ".store._lock" not in line


def test_the_grep_would_catch_what_it_looks_for():
    for bad in ["import sqlite3", "conn.execute('PRAGMA x')", "lg.store._conn", "store._lock",
                "ORDER BY rowid", "x IS NOT ?", "INSERT OR REPLACE INTO t", "store._begin('x')",
                "lg.store.conn.execute('x')", "with self.store.lock:", "store.x('SELECT 1')"]:
        assert FORBIDDEN.search(bad) and not _own_lock("x.py", bad), bad


def test_importing_the_reducers_loads_no_database_driver():
    code = ("import sys, handoff.ledger, handoff.reducers.checkpoint, handoff.reducers.decide, "
            "handoff.projections.view_rows; "
            "print(sorted(m for m in ('sqlite3', '_sqlite3', 'handoff.ledger.sqlite') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
