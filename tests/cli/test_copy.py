"""handoff copy: a ledger from one backend to another and back, proven by verify and folds."""

from __future__ import annotations

import json

import pytest

from handoff import Ledger
from handoff.facade import copy_ledger
from handoff.ledger import errors as E
from handoff.reducers.checkpoint import AGGREGATE

from tests.support import invoke, working_run


def _folds(address: str) -> dict[str, object]:
    with Ledger(address, create=False) as lg:
        return {h.run_id: lg.store.fold(h.run_id, AGGREGATE) for h in lg.store.list_runs()}


@pytest.fixture
def source(tmp_path) -> str:
    path = str(tmp_path / "src.db")
    with Ledger(path) as lg:
        token = working_run(lg, "r1")
        lg.progress("r1", token, "tool_outcome", "half way", key="p1")
        lg.open(run_id="r2", goal="another", target="chat:#ops", owner="bob")
        lg.fork("r1", 3, new_run_id="r1.fork")
    return path


def test_sqlite_to_postgres_and_back_keeps_every_fold(source, tmp_path):
    from tests.pg import fresh_url

    url = fresh_url()
    res = invoke("copy", source, url, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert (doc["runs"], doc["checked"], doc["skipped"]) == (3, 3, 0) and doc["imported"] > 0
    back = str(tmp_path / "back.db")
    res = invoke("copy", url, f"sqlite://{back}", "--json")
    assert res.exit_code == 0, res.output
    assert _folds(back) == _folds(source) == _folds(url)
    with Ledger(back) as lg:
        assert lg.verify() == [] and lg.check() == []
    # Again: nothing new to copy, and still proven.
    again = json.loads(invoke("copy", source, url, "--json").output)
    assert (again["imported"], again["skipped"], again["checked"]) == (0, doc["imported"], 3)


def test_some_runs_only_and_a_fork_brings_its_parent(source, tmp_path):
    dst = str(tmp_path / "some.db")
    doc = copy_ledger(source, dst, run_ids=["r1.fork"])
    assert doc["runs"] == 2 and doc["checked"] == 1
    assert set(_folds(dst)) == {"r1", "r1.fork"}


def test_a_missing_source_writes_nothing(tmp_path):
    dst = tmp_path / "dst.db"
    res = invoke("copy", str(tmp_path / "nope.db"), str(dst))
    assert res.exit_code == 3 and "no ledger at" in res.output
    assert not dst.exists()
    with pytest.raises(E.StoreUnavailable):
        copy_ledger(str(tmp_path / "nope.db"), str(dst))
    assert not dst.exists()


def test_a_copy_into_a_ledger_that_does_not_verify_exits_4(source, tmp_path):
    """The proof runs on what DST holds after the copy: a damaged DST is reported, not
    called a good copy (here its append-only trigger was dropped behind its back)."""
    import sqlite3

    dst = str(tmp_path / "damaged.db")
    Ledger(dst).close()
    conn = sqlite3.connect(dst)
    conn.execute("DROP TRIGGER events_no_delete")
    conn.commit()
    conn.close()
    res = invoke("copy", source, dst)
    assert res.exit_code == 4 and "does not verify" in res.output
