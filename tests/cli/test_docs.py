"""docs/cli.md is generated from --help; it must be fresh and every command must explain itself."""

from __future__ import annotations

import os

import click
import pytest

from handoff import cli

from tests.support import ROOT, make_runner

DOC = os.path.join(ROOT, "docs", "cli.md")
COMMANDS = [name for name, cmd in cli.main.commands.items() if not cmd.hidden]


def test_cli_md_is_generated_from_the_current_help():
    with open(DOC, encoding="utf-8") as f:
        on_disk = f.read()
    assert on_disk == cli.render_docs(), (
        "docs/cli.md is stale: regenerate it with 'python -m handoff.cli --write-docs'")


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_an_example(name):
    cmd = cli.main.commands[name]
    assert cmd.help and cmd.help.strip(), f"{name} has no help text"
    assert cmd.get_short_help_str().strip(), f"{name} has no one-line summary"
    assert "Example:" in cmd.help, f"the help of {name} has no 'Example:' block"
    example = cmd.help.split("Example:", 1)[1]
    assert "handoff" in example and f" {name}" in example, f"the example of {name} does not run it"
    assert f"### handoff {name}\n" in open(DOC, encoding="utf-8").read()


@pytest.mark.parametrize("name", COMMANDS)
def test_help_runs(name):
    result = make_runner().invoke(cli.main, [name, "--help"])
    assert result.exit_code == 0 and "Example:" in result.output


#: Commands that report nothing: a walkthrough, a wrapper and a server (its stdout speaks MCP).
NOT_REPORTING = ("demo", "run", "mcp", "hook", "hooks", "serve")


@pytest.mark.parametrize("name", [n for n in COMMANDS if n not in NOT_REPORTING])
def test_every_reporting_command_takes_json(name):
    params = {p.name for p in cli.main.commands[name].params if isinstance(p, click.Option)}
    assert "as_json" in params, f"{name} has no --json"


def test_the_documented_exit_codes_are_the_ones_used():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    for code in range(5):
        assert f"| {code} |" in text
    # the codes themselves come from ledger.errors (tests/test_one_home.py checks each type's row)
    assert cli.EXIT_OK == 0
