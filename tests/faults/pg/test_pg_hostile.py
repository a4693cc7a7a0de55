"""The hostile-input cases thrown at SQLite (tests/faults/test_hostile.py), thrown at PostgreSQL.

Each case of ``CASES`` that targets the good ledger (not a hostile database file, which
has no PostgreSQL counterpart; bad addresses are tests/faults/pg/test_pg_access.py) runs
through the CLI (``--db postgresql://...``) and through the Python API against a
PostgreSQL ledger holding the same run as the SQLite template, and must be refused with
the same exit code, the same words and, for the API, the same field, with the log and
every run's head unchanged.

One ledger serves every case of the module (each case compares the ledger before and
after itself), so the whole list costs one schema, not one per case.
"""

from __future__ import annotations

import os

import pytest

from handoff.facade import Ledger
from handoff.ledger.errors import InvalidInput, LedgerError
from handoff.ledger.store import Actor, lease_digest
from handoff.reducers import commands as C
from tests.faults.test_hostile import CASES, CLEAN_ENV, SECRET, TOKEN, invoke, no_traceback

GOOD = [c for c in CASES if c.db is None]


@pytest.fixture(scope="module")
def pg_world(tmp_path_factory) -> dict[str, str]:
    from tests.pg import fresh_url

    url = fresh_url()
    with Ledger(url) as lg:
        lg.open(run_id="r1", goal="the goal", target="chat:#ops", owner="alice")
        lg.execute("r1", C.Claim(worker="w1", token_digest=lease_digest(SECRET)), actor=Actor("worker", "w1"))
        lg.transition("r1", TOKEN, "planning", worker="w1")
        lg.transition("r1", TOKEN, "executing", worker="w1")
        lg.progress("r1", TOKEN, "tool_outcome", "one step", key="s1", worker="w1")
        export = tmp_path_factory.mktemp("pg-hostile-export") / "export.jsonl"
        export.write_bytes(b"\n".join(lg.export(["r1"])) + b"\n")
    d = tmp_path_factory.mktemp("pg-hostile")
    root = d / "root"
    root.mkdir()
    (root / "ok.txt").write_text("fine\n")
    (root / "sub").mkdir()
    outside = d / "secret.txt"
    outside.write_text("outside the root\n")
    (root / "escape").symlink_to(outside)
    os.mkfifo(root / "fifo")
    return {"db": url, "root": str(root), "outside": str(outside), "tmp": str(d), "export": str(export)}


_readers: dict[str, Ledger] = {}


def snapshot(url: str) -> tuple[list[tuple[int, bytes]], list[tuple[str, int, bytes, int | None]]]:
    """Every event (position, hash) and every run's head: what no refusal may change."""
    lg = _readers.get(url)
    if lg is None:
        lg = _readers[url] = Ledger(url, readonly=True)
    events = [(r.position, r.hash) for r in lg.store.read_all()]
    heads = [(h.run_id, h.last_seq, h.last_hash, h.lease) for h in lg.store.list_runs()]
    return events, heads


@pytest.fixture(scope="module", autouse=True)
def _close_readers():
    yield
    for lg in _readers.values():
        lg.close()
    _readers.clear()


def test_the_postgres_list_is_the_sqlite_list():
    """Only hostile database files are left out (they are files; PostgreSQL has addresses)."""
    assert len(GOOD) >= 60 and all(c.db is not None for c in CASES if c not in GOOD)


@pytest.mark.parametrize("case", [c for c in GOOD if c.cli is not None], ids=lambda c: f"{c.category}: {c.name}")
def test_cli_refuses_hostile_input_on_postgres(pg_world, case, evidence):
    args = case.cli(pg_world) if callable(case.cli) else case.cli
    before = snapshot(pg_world["db"])
    res = invoke(["--db", pg_world["db"], *args], env={**CLEAN_ENV, **(case.env or {})}, stdin=case.stdin)
    no_traceback(res)
    assert res.exit_code == case.code, f"exit {res.exit_code}, wanted {case.code}: {res.stderr}"
    assert case.says.lower() in res.stderr.lower(), res.stderr
    assert res.stdout == "" or case.code == 0
    assert snapshot(pg_world["db"]) == before, "the PostgreSQL ledger changed"
    evidence.add("pg_hostile.cli", category=case.category, case=case.name, exit=res.exit_code)


@pytest.mark.parametrize("case", [c for c in GOOD if c.api is not None], ids=lambda c: f"{c.category}: {c.name}")
def test_api_refuses_hostile_input_on_postgres(pg_world, case, evidence):
    before = snapshot(pg_world["db"])
    with pytest.raises(LedgerError) as info:
        with Ledger(pg_world["db"]) as lg:
            case.api(lg, pg_world)
    err = info.value
    assert err.exit_code == (case.api_code or case.code), (type(err).__name__, err.message)
    if case.field is not None:
        assert isinstance(err, InvalidInput) and err.field == case.field, (err.field, err.message)
    assert snapshot(pg_world["db"]) == before, "the PostgreSQL ledger changed"
    evidence.add("pg_hostile.api", category=case.category, case=case.name, error=err.type, exit=err.exit_code)
