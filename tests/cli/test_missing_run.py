"""A run that does not exist: every verb that names a run exits the same way.

The exit-code table (docs/cli.md) files UnknownRun under "refused by the ledger's rules",
exit 1; a script that retries on 2 (a usage mistake it could fix) must not loop on a
mistyped run id, and a confused agent must read the same error whichever verb it tried.
"""

from __future__ import annotations

import json

import click
import pytest

from handoff import cli
from handoff.ledger.errors import UnknownRun

from tests.support import working_run

TOKEN = "<token>"
#: Each verb that takes RUN, with the fewest options that get it past its own usage checks.
ARGS = {
    "claim": ["--worker", "w9"],
    "heartbeat": ["--lease", TOKEN],
    "transition": ["--lease", TOKEN, "--to", "planning"],
    "progress": ["--lease", TOKEN, "--kind", "note"],
    "artifact": ["f.txt", "--lease", TOKEN],
    "artifact-withdraw": ["f.txt", "--reason", "typo", "--by", "op"],
    "evidence": ["--kind", "tests", "--outcome", "pass", "--by", "op"],
    "block": ["--reason", "r", "--next-action", "n", "--by", "op"],
    "unblock": ["--resolution", "r", "--by", "op"],
    "effect-start": ["--lease", TOKEN, "--effect-key", "k", "--what", "w"],
    "effect-confirm": ["--effect-key", "k", "--outcome", "done", "--by", "op"],
    "submit": ["--lease", TOKEN],
    "review": ["--by", "alice", "--approve"],
    "transfer": ["--by", "alice", "--action", "review", "--to", "bob"],
    "deliver": ["--by", "alice", "--delivery-key", "k"],
    "sanitize": ["--by", "alice"],
    "delivered": ["--delivery-key", "k", "--receipt", "r"],
    "delivery-failed": ["--delivery-key", "k", "--error", "e"],
    "release": ["--lease", TOKEN],
    "revoke": ["--reason", "r"],
    "close": ["--by", "alice", "--disposition", "cancelled"],
    "reopen": ["--by", "alice", "--reason", "r"],
    "fork": ["--at", "1"],
    "status": [],
    "log": [],
    "replay": ["--at", "1"],
    "report": ["-o", "out.html"],
    "verify": [],
    "export": ["-o", "out.jsonl"],
    "otel": ["-o", "out.json"],
}


def _takes_run(cmd: click.Command) -> bool:
    return any(isinstance(p, click.Argument) and p.name in ("run", "run_a", "runs") for p in cmd.params)


def test_every_verb_that_takes_a_run_is_covered():
    assert {name for name, cmd in cli.main.commands.items() if _takes_run(cmd)} == set(ARGS) | {"diff"}


def _check(h, args):
    before = h.json("verify")["events"]
    text = h(*args, code=UnknownRun.exit_code)
    assert text.stdout == "" and text.stderr.startswith("Error: ") and "run nope" in text.stderr
    as_json = h(*args, "--json", code=UnknownRun.exit_code) if "--json" not in args else text
    assert json.loads(as_json.stderr)["error"]["type"] == "UnknownRun"
    assert h.json("verify")["events"] == before  # nothing written


@pytest.mark.parametrize("verb", sorted(ARGS))
def test_a_missing_run_exits_as_unknown_run(h, tmp_path, monkeypatch, verb):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.txt").write_text("x")
    with h.ledger() as lg:
        lease = working_run(lg, "r1")
    token = str(lease).replace("1.", "7.", 1)  # well formed, and names no lease of any run
    args = [token if a == TOKEN else a for a in ARGS[verb]]
    _check(h, [verb, "nope", *args])


@pytest.mark.parametrize("pair", [("nope", "r1"), ("r1", "nope")])
def test_diff_with_a_missing_run_exits_as_every_verb_does(h, pair):
    with h.ledger() as lg:
        working_run(lg, "r1")
    _check(h, ["diff", *pair])
