"""The CLI offers the table's verbs as their rows say (handoff/operations.py).

Every row with ``cli`` has that command, taking exactly the row's parameters the CLI takes
(as the row spells them), the row's ``cli_extra`` and the options every command has; a
built command's option help is the parameter's one description; and a command that calls
a table verb is that verb's command. A parameter added to a row and not to its command,
or an option added to a command and not to its row, fails here.
"""

from __future__ import annotations

import inspect
import re
import string

import click
import pytest

from tests.cli.test_docs import NOT_REPORTING

from handoff import cli, clitable
from handoff import operations as ops
from handoff.clitypes import ATTR_HELP

#: The options every reporting command has beside its row's.
COMMON = ("--json", "--help")
CLI_ROWS = [op for op in ops.OPERATIONS if op.cli]
COMMANDS = cli.main.commands
CALL = re.compile(r"\blg\.(\w+)\(")


def spelled(param: click.Parameter) -> str:
    """How a user writes ``param``: an argument's metavar (RUN), an option's long names
    (``--approve/--reject`` for a pair)."""
    if isinstance(param, click.Argument):
        return (param.metavar or param.name or "").upper()
    return "/".join([o for o in param.opts if o.startswith("--")] + list(param.secondary_opts))


def offered(cmd: click.Command) -> list[str]:
    with click.Context(cmd, info_name=cmd.name) as ctx:
        return [spelled(p) for p in cmd.get_params(ctx)]


def expected(op: ops.Operation) -> list[str]:
    """What the row says the command takes, spelled as on the command line."""
    out = []
    for p in op.params:
        how = clitable.spelling(op, p)
        if how == "argument":
            out.append(p.metavar or p.name.upper())
        elif how:
            out.append(how)
    return out + list(op.cli_extra) + list(COMMON)


def differences(op: ops.Operation, cmd: click.Command) -> dict[str, list[str]]:
    want, got = expected(op), offered(cmd)
    return {"the command lacks": sorted(set(want) - set(got)),
            "the row does not list": sorted(set(got) - set(want)),
            "given twice": sorted({s for s in got if got.count(s) > 1})}


def test_the_common_options_are_on_every_command():
    for name, cmd in COMMANDS.items():
        if name not in NOT_REPORTING:  # no report (tests/cli/test_docs.py says why)
            assert set(COMMON) <= set(offered(cmd)), name


@pytest.mark.parametrize("op", CLI_ROWS, ids=lambda op: op.name)
def test_each_row_with_a_command_has_it_with_exactly_the_rows_parameters(op):
    assert op.cli in COMMANDS, f"the table offers {op.name} as 'handoff {op.cli}', which does not exist"
    assert differences(op, COMMANDS[op.cli]) == {"the command lacks": [], "the row does not list": [],
                                                 "given twice": []}


def test_a_missing_or_an_unlisted_option_is_noticed():
    op = ops.operation("block")

    @click.command("block")
    @click.argument("run", metavar="RUN")
    @click.option("--reason")
    @click.option("--lease")
    @click.option("--by")
    @click.option("--key")
    @click.option("--json")
    @click.option("--urgent")
    def block(**_: object) -> None:
        pass

    assert differences(op, block) == {"the command lacks": ["--next-action"], "the row does not list": ["--urgent"],
                                      "given twice": []}


def test_the_built_commands_are_the_rows_the_table_builds():
    built = {name for name, cmd in COMMANDS.items() if getattr(cmd, "operation", None) is not None}
    assert built == {op.cli for op in clitable.built_rows()}
    for name in built:
        assert COMMANDS[name].operation.cli == name
    assert len(built) >= 17


def option_help(op: ops.Operation, p: ops.Param) -> str:
    """The help a built option has: the parameter's description (for --attr, then how the
    CLI reads KEY=VALUE)."""
    return f"{p.help} {ATTR_HELP}" if p.name == "attrs" else p.help


@pytest.mark.parametrize("op", clitable.built_rows(), ids=lambda op: op.name)
def test_a_built_commands_help_is_the_rows(op):
    cmd = COMMANDS[op.cli]
    by_spelling = {spelled(p): p for p in cmd.params if isinstance(p, click.Option)}
    for p in op.params:
        how = clitable.spelling(op, p)
        if how and how != "argument":
            assert by_spelling[how].help == option_help(op, p), (op.name, p.name)
    assert cmd.help.startswith(op.summary)
    assert "Example:" in cmd.help and op.example in cmd.help


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_that_calls_a_table_verb_is_that_verbs_command(name):
    cmd = COMMANDS[name]
    row = getattr(cmd, "operation", None)
    if row is not None:
        assert row.cli == name
        return
    for verb in set(CALL.findall(inspect.getsource(cmd.callback))) & set(ops.BY_NAME):
        op = ops.operation(verb)
        # A variant without a command of its own (open_contract, claim_outcome) belongs to
        # the command of the row that issues the same ledger command.
        owner = op.cli or next((o.cli for o in CLI_ROWS if o.command == op.command), None)
        assert owner == name, f"'handoff {name}' calls {verb}, whose command is {owner}"


@pytest.mark.parametrize("op", [op for op in CLI_ROWS if not op.cli_built],
                         ids=lambda op: op.name)
def test_a_hand_written_command_calls_its_rows_verb(op):
    called = set(CALL.findall(inspect.getsource(COMMANDS[op.cli].callback)))
    assert {o.name for o in ops.OPERATIONS if o.command == op.command} & called, (op.cli, called)


@pytest.mark.parametrize("op", clitable.built_rows(), ids=lambda op: op.name)
def test_what_a_command_says_names_only_the_outcome_and_the_rows_parameters(op):
    text = op.said
    named = {re.split(r"[.\[]", field)[0] for _, field, _, _ in string.Formatter().parse(text) if field}
    assert named <= {"out"} | {p.name for p in op.params if clitable.spelling(op, p)}, (op.name, text)


def test_said_picks_a_word_by_truth():
    assert clitable.SAY.format("{a:?yes|no}, {b:?yes|no}", a=(1,), b=()) == "yes, no"
    assert clitable.SAY.format("{x} and {y:>3}", x="plain", y=7) == "plain and   7"
