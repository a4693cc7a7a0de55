"""Artifacts are sent under names that are distinct by construction, whatever their paths:
a ``cmd:`` target gets every one as its own file, and no clash can make a send fail after
its attempt was recorded."""

from __future__ import annotations

import json
import os
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from handoff.facade import Ledger
from handoff.delivery.bundle import _names, build

from .conftest import log_types, outbox

CLASHING = ("a/report.md", "b/report.md", "c/1-report.md")

#: Copies every artifact it was given into $OUT, so the test sees what the command saw.
COPIER = """
import os, shutil, sys
arts, out = os.environ["HANDOFF_ARTIFACTS"], os.environ["OUT"]
for name in os.listdir(arts):
    shutil.copy(os.path.join(arts, name), os.path.join(out, name))
"""


def run_with(lg: Ledger, tmp_path, target: str, rel_paths: tuple[str, ...]) -> str:
    run = lg.open(goal="write the reports", target=target, owner="alice")
    tok = lg.claim(run, "w1")
    lg.transition(run, tok, "planning")
    lg.transition(run, tok, "executing")
    for rel in rel_paths:
        p = tmp_path / "work" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"content of {rel}\n")
        lg.artifact(run, tok, str(p))
    lg.transition(run, tok, "verifying")
    lg.evidence(run, "tests", "pass", lease=tok)
    lg.submit(run, tok, "three reports")
    return run


def test_clashing_names_reach_a_command_as_distinct_files(lg, tmp_path):
    script = tmp_path / "copier.py"
    script.write_text(COPIER)
    box = outbox(tmp_path)
    run = run_with(lg, tmp_path, f"cmd:{sys.executable} {script}", CLASHING)
    sent = lg.send_delivery(run, "v1", env={**os.environ, "OUT": str(box)}, by="alice")
    assert sent.status == "confirmed", sent.error
    got = {p.name: p.read_text() for p in box.iterdir()}
    assert sorted(got.values()) == sorted(f"content of {rel}\n" for rel in CLASHING)
    bundle = json.loads(build(lg.checkpoint(run)).data)
    names = [a["name"] for a in bundle["artifacts"]]
    assert sorted(names) == sorted(got) and len(set(names)) == 3
    # Each artifact keeps its own name when no earlier one took it.
    assert names[0] == "report.md" and names[2] == "1-report.md"
    assert log_types(lg, run).count("delivery_confirmed") == 1


PATHS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]),
              st.sampled_from(["r", "1-r", "2-r", "1-1-r", "r.md", "1-r.md", "artifact", ""])),
    max_size=12,
).map(lambda ps: [f"/{d}/{n}" for d, n in ps])


@settings(max_examples=300, deadline=None)
@given(paths=PATHS)
def test_sent_names_are_distinct_and_keep_unclashed_names(paths):
    names = _names(paths)
    assert len(names) == len(paths) and len(set(names)) == len(names)
    bases = [os.path.basename(p) or "artifact" for p in paths]
    for i, (base, name) in enumerate(zip(bases, names)):
        if base not in bases[:i]:  # the first of its name keeps it
            assert name == base
        else:
            assert name.endswith("-" + base)
        assert "/" not in name and name not in ("", ".", "..")
    assert _names(paths) == names
