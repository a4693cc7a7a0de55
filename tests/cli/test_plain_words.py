"""Output that says what happened in the user's words.

- ``diff`` prints a value one run lacks as '-', as the tables do, never Python's ``None``.
- A revoke by the run's owner is logged as the owner (``owner:alice``), not as an operator,
  from the library and from the command line, on every backend.
- ``close`` names the outcome with ``--disposition``, the library's own word; ``--as`` is
  refused as an unknown option and writes nothing.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from handoff import Ledger
from handoff.ledger.errors import InvalidInput, UnknownRun
from handoff.ledger.store import Actor
from tests.support import executable, working_run


def test_diff_prints_a_value_one_run_lacks_as_a_dash(h):
    with h.ledger() as lg:
        lg.open(run_id="a", goal="g", target="t", owner="o")
        lg.open(run_id="b", goal="g", target="t", owner="o", result_path="out.md")
        lg.evidence("a", "tests", "pass", actor=Actor("operator", "x"))
    out = h("diff", "a", "b", code=1).stdout
    assert "None" not in out, out
    assert "  result_path: a - | b " in out, out
    assert "evidence: tests a pass b -" in out, out
    for fmt in ("table", "csv"):
        assert "None" not in h("diff", "a", "b", "--format", fmt, code=1).stdout


def _actors(lg: Ledger, run: str) -> list[str]:
    return [r.actor for r in lg.log(run)]


def test_a_revoke_by_the_runs_owner_is_logged_as_the_owner(backend):
    with Ledger(store=backend.new_store()) as lg:
        for run in ("r1", "r2", "r3"):
            working_run(lg, run, owner="alice")
        lg.revoke("r1", "host drained", by="alice")
        assert _actors(lg, "r1")[-1] == "owner:alice"
        lg.revoke("r2", "host drained", by="bob")
        assert _actors(lg, "r2")[-1] == "operator:bob"
        lg.revoke("r3", "host drained", actor=Actor("operator", "alice"))  # an explicit actor is kept
        assert _actors(lg, "r3")[-1] == "operator:alice"
        # Refusals are typed and write nothing: a run that does not exist, an empty name.
        before = {run: _actors(lg, run) for run in ("r1", "r2", "r3")}
        with pytest.raises(UnknownRun):
            lg.revoke("nope", "x", by="alice")
        with pytest.raises(InvalidInput) as info:
            lg.revoke("r1", "x", by=" ")
        assert info.value.field == "by"
        assert {run: _actors(lg, run) for run in before} == before
        assert lg.run_ids("nope") == []


def test_the_cli_logs_an_owners_revoke_as_the_owner(backend):
    if not backend.shared:
        pytest.skip(f"{backend.name}: a 'handoff' process would open a ledger of its own")
    address = backend.address()
    with Ledger(store=backend.open(address)) as lg:
        for run in ("r1", "r2", "r3"):
            working_run(lg, run, owner="alice")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_") and k not in ("USER", "LOGNAME")}

    def revoke(run: str, *args: str, **extra: str) -> None:
        proc = subprocess.run([*executable(), "--db", address, "revoke", run, "--reason", "drained", *args],
                              capture_output=True, text=True, env={**env, **extra}, timeout=60)
        assert proc.returncode == 0, proc.stderr

    revoke("r1", "--by", "alice")
    revoke("r2", HANDOFF_ACTOR="alice")  # the name from the environment counts the same
    revoke("r3", "--by", "bob")
    with Ledger(store=backend.open(address)) as lg:
        assert [_actors(lg, r)[-1] for r in ("r1", "r2", "r3")] == ["owner:alice", "owner:alice", "operator:bob"]


def test_close_names_the_outcome_with_disposition(h):
    with h.ledger() as lg:
        lg.open(run_id="r1", goal="g", target="t", owner="alice")
        lg.open(run_id="r2", goal="g", target="t", owner="alice")
    assert "closed as no_op" in h("close", "r1", "--by", "alice", "--disposition", "no-op").stdout
    with h.ledger() as lg:
        before = [(r.seq, r.type) for r in lg.log("r2")]
    refused = h("close", "r2", "--by", "alice", "--as", "cancelled", code=2)
    assert "--as" in refused.stderr and "No such option" in refused.stderr, refused.stderr
    with h.ledger() as lg:
        assert [(r.seq, r.type) for r in lg.log("r2")] == before
        assert lg.checkpoint("r2").state == "queued"
