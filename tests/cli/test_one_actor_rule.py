"""The CLI and the API log the same actor for the same call: one rule picks the name.

Before, a worker's write made through the API without ``worker=`` was logged under the
login name, through the CLI under the lease's holder; the rule now lives in
``Ledger.worker_actor`` (and ``operator_name`` for people) and the CLI passes nothing of
its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from handoff import Ledger

from tests.support import Handoff

Step = tuple[str, Callable[[str, str], list[Any]], Callable[[Ledger, str, str], Any]]

STEPS: list[Step] = [
    ("heartbeat", lambda r, t: ["heartbeat", r, "--lease", t], lambda lg, r, t: lg.heartbeat(r, t)),
    ("transition", lambda r, t: ["transition", r, "--lease", t, "--to", "planning"],
     lambda lg, r, t: lg.transition(r, t, "planning")),
    ("progress", lambda r, t: ["progress", r, "--lease", t, "--kind", "plan_committed"],
     lambda lg, r, t: lg.progress(r, t, "plan_committed")),
    ("evidence by lease", lambda r, t: ["evidence", r, "--lease", t, "--kind", "tests", "--outcome", "pass"],
     lambda lg, r, t: lg.evidence(r, "tests", "pass", lease=t)),
    ("evidence by operator", lambda r, t: ["evidence", r, "--kind", "lint", "--outcome", "pass"],
     lambda lg, r, t: lg.evidence(r, "lint", "pass")),
    ("evidence --by", lambda r, t: ["evidence", r, "--kind", "review", "--outcome", "pass", "--by", "bob"],
     lambda lg, r, t: lg.evidence(r, "review", "pass", by="bob")),
    ("effect-start", lambda r, t: ["effect-start", r, "--lease", t, "--effect-key", "e1", "--what", "deploy"],
     lambda lg, r, t: lg.effect_start(r, t, "e1", "deploy")),
    ("effect-confirm by operator", lambda r, t: ["effect-confirm", r, "--effect-key", "e1", "--outcome", "done"],
     lambda lg, r, t: lg.effect_confirm(r, "e1", "done")),
    ("block by lease", lambda r, t: ["block", r, "--lease", t, "--reason", "x", "--next-action", "y"],
     lambda lg, r, t: lg.block(r, "x", "y", lease=t)),
    ("unblock by operator", lambda r, t: ["unblock", r, "--resolution", "z"], lambda lg, r, t: lg.unblock(r, "z")),
    ("release", lambda r, t: ["release", r, "--lease", t, "--key", "rel"], lambda lg, r, t: lg.release(r, t, key="rel")),
    ("fork", lambda r, t: ["fork", r, "--at", "2", "--run-id", f"{r}-child"],
     lambda lg, r, t: lg.fork(r, 2, new_run_id=f"{r}-child")),
]


@pytest.fixture
def twins(tmp_path, monkeypatch):
    for var in ("HANDOFF_WORKER", "HANDOFF_ACTOR", "LOGNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("USER", "carol")
    h = Handoff(str(tmp_path / "ledger.db"))
    with h.ledger() as lg:
        tokens = {}
        for run in ("by-cli", "by-api"):
            lg.open(run_id=run, goal="g", target="chat:#ops", owner="alice")
            tokens[run] = str(lg.claim(run, "w1"))
    return h, tokens


def _actors(lg: Ledger, run: str) -> list[str]:
    return [rec.actor for rec in lg.log(run)]


def test_every_verb_logs_the_same_actor_from_the_cli_and_the_api(twins):
    h, tokens = twins
    for name, cli_args, api_call in STEPS:
        h(*cli_args("by-cli", tokens["by-cli"]))
        with h.ledger() as lg:
            api_call(lg, "by-api", tokens["by-api"])
            got = _actors(lg, "by-cli"), _actors(lg, "by-api")
        assert got[0] == got[1], f"{name}: the CLI logged {got[0][-1]}, the API {got[1][-1]}"
    with h.ledger() as lg:
        actors = set(_actors(lg, "by-api"))
        assert _actors(lg, "by-cli-child")[0] == _actors(lg, "by-api-child")[0] == "operator:carol"
    assert {"worker:w1", "operator:carol", "operator:bob"} <= actors, actors


def test_a_keyed_retry_after_the_lease_ended_names_the_grant_in_both(twins):
    """An API caller retrying a keyed release (its lease has ended) is the same request as
    the first attempt: logged under the grant's worker, so the key replays instead of
    conflicting."""
    h, tokens = twins
    with h.ledger() as lg:
        first = lg.release("by-api", tokens["by-api"], key="rel")
        again = lg.release("by-api", tokens["by-api"], key="rel")
    assert (first.result.outcome, again.result.outcome) == ("committed", "duplicate")
    h("release", "by-cli", "--lease", tokens["by-cli"], "--key", "rel")
    assert h.json("release", "by-cli", "--lease", tokens["by-cli"], "--key", "rel")["outcome"] == "duplicate"
