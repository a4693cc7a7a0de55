"""docs/lifecycle.md cannot drift from reducers/transitions.py.

Three blocks of the doc are generated from the tables: the state diagram (``mermaid()``),
the progress table and the permissions table. Each sits between marker comments. When a
table changes, regenerate the doc with

    HANDOFF_UPDATE_DOCS=1 python -m pytest tests/reducers/test_lifecycle_doc.py

or, for the diagram alone, paste the output of ``python -m handoff.reducers.transitions``
between ``<!-- diagram:start -->`` and ``<!-- diagram:end -->`` inside a mermaid fence.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from handoff.reducers import transitions as T

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "lifecycle.md"
REGENERATE = "HANDOFF_UPDATE_DOCS=1 python -m pytest tests/reducers/test_lifecycle_doc.py"

_WHO = {"lease": "worker holding the lease", T.OWNER: "owner", T.OPERATOR: "operator",
        T.WATCHDOG: "watchdog", T.WORKER: "any worker"}
_HOW = {T.BLOCKED: "`block` with a reason and a next action; stored as `blocker_raised`",
        T.UNKNOWN: "`effect_confirm` by anyone but the lost lease; stored as `reconciliation_recorded`"}


def diagram() -> str:
    return "```mermaid\n" + T.mermaid() + "```\n"


def progress_table() -> str:
    rows = ["| state | counts as progress | recorded with |", "|---|---|---|"]
    for state, kinds in T.PROGRESS_KINDS.items():
        shown = ", ".join(f"`{k}`" for k in sorted(kinds))
        rows.append(f"| {state} | {shown} | {_HOW.get(state, '`progress`')} |")
    logged = ", ".join(f"`{k}`" for k in sorted(T.NOT_PROGRESS))
    advancing = ", ".join(f"`{k}`" for k in sorted(T.ADVANCING_EVENTS))
    declarable = ", ".join(s for s in T.STATES if s in T.DECLARABLE)
    who = [w for k, w in ((T.WORKER, "a worker"), (T.OWNER, "the owner"), (T.OPERATOR, "an operator"),
                          (T.WATCHDOG, "the watchdog")) if k in T.PROGRESS_ACTORS]
    actors = ", ".join(who[:-1]) + f" or {who[-1]}" if len(who) > 1 else who[0]
    lease_ends = ", ".join(f"{f} to {t}" for f, t in sorted(T.LEASE_END_MOVES))
    ends_by = " / ".join(f"`{v}`" for v in sorted(T.LEASE_ENDS))
    return "\n".join(rows) + (
        f"\n\nA run's contract may add kinds of its own in {declarable} (`progress_kinds`; "
        "`handoff open --progress-kind executing:llm_step`): they count there as the table's do, and are fixed "
        "when the run opens. A kind of the table or one logged without counting cannot be declared."
        f"\n\nLogged without counting, in any working state and in blocked or unknown: {logged}."
        f"\n\nEvents that advance `progress_seq` wherever they occur: {advancing}."
        f"\n\nWho: only an event recorded by {actors} advances it. Nothing the watchdog records "
        "does: its observations, its decisions, and what a decision carries out (the move to "
        "`unknown` after it revokes a lease, the blocker and the move to `blocked` when it pauses a run). "
        f"Lease events never do, nor a move that only the end of a lease makes ({ends_by}): {lease_ends}.\n"
    )


def permissions_table() -> str:
    rows = ["| command | who may issue it | owner may transfer it | accepted after the end |", "|---|---|---|---|"]
    for name, who in T.PERMISSIONS.items():
        people = ", ".join(_WHO[w] for w in sorted(who, key=lambda w: list(_WHO).index(w)))
        transferable = ("yes" if name in T.TRANSFERABLE
                        else f"comes with `{T.COMES_WITH[name]}`" if name in T.COMES_WITH else "")
        after = ("yes" if name in T.READ_ONLY
                 else "yes (a retention rule outlives the run)" if name in T.AFTER_END
                 else "only as a retry of the delivery that ended the run" if name in ("deliver", "delivered") else "")
        rows.append(f"| `{name}` | {people} | {transferable} | {after} |")
    return "\n".join(rows) + "\n"


def withdrawable() -> str:
    return ", ".join(f"`{s}`" for s in sorted(T.WITHDRAWABLE)) + ".\n"


BLOCKS = {"diagram": diagram, "progress": progress_table, "permissions": permissions_table,
          "withdrawable": withdrawable}


def _span(text: str, name: str) -> tuple[int, int]:
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    i, j = text.find(start), text.find(end)
    assert i >= 0 and j > i, f"docs/lifecycle.md lacks the {start.strip()} ... {end} markers"
    return i + len(start), j


def _regenerate_if_asked(text: str) -> str:
    if os.environ.get("HANDOFF_UPDATE_DOCS") != "1":
        return text
    for name, render in BLOCKS.items():
        i, j = _span(text, name)
        text = text[:i] + render() + text[j:]
    DOC.write_text(text, encoding="utf-8")
    return text


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_generated_block_is_current(name):
    text = _regenerate_if_asked(DOC.read_text(encoding="utf-8"))
    i, j = _span(text, name)
    assert text[i:j] == BLOCKS[name](), (
        f"the {name} in docs/lifecycle.md is stale: reducers/transitions.py changed. "
        f"Regenerate it with:\n    {REGENERATE}"
    )


def test_module_prints_the_diagram():
    proc = subprocess.run([sys.executable, "-m", "handoff.reducers.transitions"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == T.mermaid()


def test_diagram_covers_every_state_and_move():
    text = T.mermaid()
    for state in T.STATES:
        assert re.search(rf"\b{state}\b", text), f"{state} is missing from the diagram"
    for (f, t), vias in T.MOVES.items():
        if vias != ("close",):
            assert f"{f} --> {t}:" in text, (f, t)


def test_doc_names_every_state_and_every_seeds_vocabulary():
    text = DOC.read_text(encoding="utf-8")
    for state in T.STATES:
        assert f"`{state}`" in text, f"docs/lifecycle.md never names the state {state}"
    for word in ("running", "done", "no-op", "in progress", "ready for review", "STALLED",
                 "QUEUED", "PLANNING", "EXECUTING", "VERIFYING", "SUCCEEDED", "BLOCKED", "UNKNOWN"):
        assert word in text, f"docs/lifecycle.md does not map the seed term {word!r}"
