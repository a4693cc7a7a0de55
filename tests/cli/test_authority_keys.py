"""Commands that create or change authority take an idempotency key, or say why not (issue 17).

``open --key K`` without ``--run-id`` derives the run id from the key and the owner, so
a retry (from the same process, another one, or two at once) never makes a second run.
"""

from __future__ import annotations

import json
import threading

import pytest

from handoff import Ledger
from handoff.ledger import errors as E

from tests.support import run_exe, working_run


OPEN = ["open", "--goal", "Write the report", "--target", "chat:#ops", "--owner", "alice"]


def runs(db: str) -> list[str]:
    with Ledger(db, readonly=True) as lg:
        return [h.run_id for h in lg.store.list_runs()]


def test_open_with_a_key_twice_makes_one_run(h):
    first = h.json(*OPEN, "--key", "req-1")
    again = h.json(*OPEN, "--key", "req-1")
    assert first["run_id"] == again["run_id"] and first["run_id"].startswith("run-k")
    assert runs(h.db) == [first["run_id"]]
    # Another owner's key of the same name is another request; a new key is a new run.
    assert h.json(*OPEN[:-1], "bob", "--key", "req-1")["run_id"] != first["run_id"]
    assert h.json(*OPEN, "--key", "req-2")["run_id"] != first["run_id"]
    assert len(runs(h.db)) == 3


def test_open_with_a_key_and_another_contract_is_a_conflict(h):
    h(*OPEN, "--key", "req-1")
    before = runs(h.db)
    r = h("open", "--goal", "Something else", "--target", "chat:#ops", "--owner", "alice", "--key", "req-1",
          "--json", code=1)
    assert json.loads(r.stderr)["error"]["type"] == "IdempotencyConflict"
    assert runs(h.db) == before


def test_open_without_a_key_makes_a_new_run_each_time(h):
    assert h(*OPEN).stdout != h(*OPEN).stdout and len(runs(h.db)) == 2


def test_the_api_derives_the_same_id(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        a = lg.open(goal="g", target="chat:#ops", owner="alice", key="k")
        b = lg.open(goal="g", target="chat:#ops", owner="alice", key="k")
        c = lg.open_contract({"goal": "g", "target": "chat:#ops", "owner": "alice"}, key="k")
        assert a == b == c and [h.run_id for h in lg.store.list_runs()] == [a]
        with pytest.raises(E.InvalidInput, match="idempotency key"):
            lg.open(goal="g", target="chat:#ops", owner="alice", key="")


def test_two_processes_opening_with_one_key_at_once_make_one_run(tmp_path):
    db = str(tmp_path / "l.db")
    run_exe("init", db=db)
    results: list = [None] * 4
    gate = threading.Barrier(len(results))

    def go(i: int) -> None:
        gate.wait()
        results[i] = run_exe(*OPEN, "--key", "deploy-42", db=db)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert len({r.stdout.strip() for r in results}) == 1
    assert runs(db) == [results[0].stdout.strip()]


@pytest.mark.parametrize("verb", ["transfer", "close", "release", "fork"])
def test_authority_verbs_retried_with_a_key_write_once(h, verb):
    with h.ledger() as lg:
        token = working_run(lg, "r1")
    args = {
        "transfer": ["transfer", "r1", "--by", "alice", "--action", "deliver", "--to", "bot"],
        "close": ["close", "r1", "--by", "alice", "--disposition", "no-op"],
        "release": ["release", "r1", "--lease", str(token)],
        "fork": ["fork", "r1", "--at", "3"],
    }[verb]
    first = h(*args, "--key", "once").stdout
    before = runs(h.db), h.json("verify")["events"]
    again = h(*args, "--key", "once").stdout
    assert (runs(h.db), h.json("verify")["events"]) == before
    if verb == "fork":
        assert again == first  # the same child, printed again
    else:
        assert "already recorded" in again


def test_heartbeat_says_why_it_needs_no_key(h):
    assert "changes no authority" in h("heartbeat", "--help").stdout
