"""docs/testing.md documents the whole kit: every command the machine can issue (with its
fields and who may send it), every rule group and rule, and every public attribute a
subclass uses. (The page's examples run in tests/test_doc_examples.py.)
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

from hypothesis.stateful import RuleBasedStateMachine

from handoff.testing import RULE_GROUPS, LedgerMachine
from handoff.reducers import commands as C
from handoff.reducers import transitions as T

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
MACHINE = (ROOT / "handoff" / "testing" / "machine.py").read_text(encoding="utf-8")


def table_rows(heading: str) -> dict[str, list[str]]:
    """The rows of the first table under ``## heading``, keyed by their first cell."""
    section = DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_every_command_is_documented_with_its_tag_fields_and_senders():
    rows = table_rows("The commands the machine issues")
    commands = typing.get_args(C.AnyCommand)
    assert {f"`{c.__name__}`" for c in commands} == set(rows) - {"command"}
    words = {"lease", "owner", "operator", "watchdog", "worker"}
    for cls in commands:
        tag, fields, senders, _ = rows[f"`{cls.__name__}`"]
        assert tag == f"`{cls.__struct_config__.tag}`", cls.__name__
        assert ticked(fields) == list(cls.__struct_fields__), f"{cls.__name__}: the fields drifted"
        assert set(re.findall(r"\w+", senders)) & words == set(T.PERMISSIONS[cls.__struct_config__.tag]), cls.__name__


def test_every_command_the_machine_sends_is_in_the_table():
    rows = table_rows("The commands the machine issues")
    sent = set(re.findall(r"\bC\.([A-Z]\w+)\(", MACHINE))
    assert sent and {f"`{name}`" for name in sent} <= set(rows)


def test_every_rule_group_and_rule_is_documented():
    rows = table_rows("Choosing which rules run")
    assert {f"`{g}`" for g in RULE_GROUPS} == set(rows) - {"group"}
    for group, names in RULE_GROUPS.items():
        assert ticked(rows[f"`{group}`"][0]) == list(names), group


def test_every_public_attribute_of_the_machine_is_documented():
    rows = table_rows("What a subclass can use")
    documented = {re.match(r"\w+", name).group(0) for cell in rows for name in ticked(cell)}
    rules = {name for names in RULE_GROUPS.values() for name in names} | {"first_run", "reviewed_run"}
    inherited = set(dir(RuleBasedStateMachine))
    public = {n for n in dir(LedgerMachine) if not n.startswith("_") and n not in inherited | rules}
    invariants = {n for n in public if hasattr(getattr(LedgerMachine, n), "hypothesis_stateful_invariant")}
    own_init = inspect.getsource(LedgerMachine.__init__)  # hypothesis's own fields are not the kit's
    public |= {n for n in re.findall(r"self\.(\w+)(?:: [^=]+)? =", own_init) if not n.startswith("_")}
    public |= {"teardown"}
    missing = sorted(public - invariants - documented)
    assert not missing, f"docs/testing.md does not document LedgerMachine's {missing}"
    stale = sorted(n for n in documented - public if not hasattr(LedgerMachine, n))
    assert not stale, f"docs/testing.md documents what LedgerMachine does not have: {stale}"


def test_the_documented_signatures_are_the_real_ones():
    rows = table_rows("What a subclass can use")
    for cell in rows:
        for shown in ticked(cell):
            m = re.fullmatch(r"(\w+)\((.*)\)", shown)
            if not m:
                continue
            real = inspect.signature(getattr(LedgerMachine, m.group(1)))
            names = [p for p in real.parameters if p != "self"]
            assert [re.match(r"[*\w]+", a.strip()).group(0).lstrip("*") for a in m.group(2).split(",")
                    if a.strip() not in ("*", "")] == names, f"{shown} vs {real}"
