"""Control characters: refused on the way in, escaped on the way out.

In: C1 controls (U+0080-U+009F) and bidirectional overrides and isolates are refused like
the C0 controls, by the CLI and the library, naming the field and leaving the file as it
was. Out: a log can still hold them (an older ledger, or text written beneath the rules),
and free text may hold newlines; every text renderer prints such text through one helper
(``render.visible``), so a blocker's reason cannot forge a line of ``status`` nor a
terminal escape reach the terminal. The ledger's path in an error is escaped the same way.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from handoff import cli, output, render
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.store import Actor
from handoff.watchdog import Action

from tests.support import make_runner, working_run

#: What no line of text output may hold: the characters the ledger refuses (tab and
#: newline aside), carriage return, the Unicode line separators.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")

C1_AND_BIDI = {"C1 CSI": "\x9b", "C1 NEL": "\x85", "right-to-left override": "\u202e",
               "left-to-right isolate": "\u2066", "pop directional isolate": "\u2069"}


@pytest.mark.parametrize("char", list(C1_AND_BIDI.values()), ids=list(C1_AND_BIDI))
def test_c1_controls_and_bidi_overrides_are_refused_naming_the_field(h, char):
    with h.ledger() as lg:
        token = working_run(lg)
    db = Path(h.db)
    before = db.read_bytes()
    for args, field in (
        (["open", "--goal", f"pay{char}lad", "--target", "chat:#ops", "--owner", "alice"], "goal"),
        (["progress", "r1", "--lease", token, "--kind", "note", "--detail", f"a{char}b"], "detail"),
        (["block", "r1", "--lease", token, "--reason", f"r{char}", "--next-action", "n"], "reason"),
        (["claim", "r1", "--worker", f"w{char}2"], "name"),
        (["progress", "r1", "--lease", token, "--kind", "note", "--key", f"k{char}"], "idempotency key"),
    ):
        r = h(*args, code=2)
        assert field in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert db.read_bytes() == before, args
    with h.ledger() as lg:
        for call, field in ((lambda: lg.open(goal=f"g{char}", target="chat:#ops", owner="o"), "goal"),
                            (lambda: lg.progress("r1", token, "note", f"d{char}"), "detail"),
                            (lambda: lg.evidence("r1", "tests", "pass", f"d{char}", lease=token), "detail"),
                            (lambda: lg.claim("r1", f"w{char}"), "actor.name"),
                            (lambda: lg.open_contract(json.dumps({"goal": f"g{char}", "target": "chat:#x",
                                                                  "owner": "o"})), "goal")):
            with pytest.raises(E.InvalidInput) as info:
                call()
            assert info.value.field == field
    assert db.read_bytes() == before


HOSTILE = "\x1b[2J\x9b31m\u202eFORGED\rFORGED\nFORGED line\u2028FORGED\x85end"


def _older_log(lg) -> None:
    """r1 as a ledger written before these rules could hold it: control characters and
    newlines in a reason, a detail and an evidence record, written beneath decide."""
    working_run(lg)
    owner = Actor("owner", "alice")
    head = lg.store.head("r1").last_seq
    lg.store.append("r1", [ev.StateChanged(from_state="executing", to_state="blocked", reason=HOSTILE),
                           ev.BlockerRaised(blocker_id=1, reason=HOSTILE, next_action=HOSTILE)],
                    actor=owner, expected_seq=head)
    lg.store.append("r1", [ev.EvidenceRecorded(kind="tests", outcome="fail", detail=HOSTILE)],
                    actor=owner, expected_seq=head + 2)


def _assert_escaped(text: str, what: str) -> None:
    for line in text.split("\n"):
        assert RAW.search(line) is None, f"{what}: a raw control character in {line!r}"
        assert not line.startswith("FORGED"), f"{what}: a forged line {line!r}"


def test_status_does_not_let_a_blocker_reason_forge_lines(h):
    with h.ledger() as lg:
        token = working_run(lg)
        lg.block("r1", "vendor down\nstate      delivered  (terminal)\nFORGED", "wait", lease=token)
    out = h("status", "r1").stdout
    assert [line for line in out.splitlines() if line.startswith("state")] == ["state      blocked"]
    _assert_escaped(out, "status r1")
    assert "vendor down\\nstate" in out  # shown, escaped


@pytest.mark.parametrize("args", [["status", "r1"], ["status"], ["log", "r1"], ["log"],
                                  ["report", "r1", "--format", "md", "-o", "-"], ["replay", "r1", "--at", "6"]],
                         ids=lambda a: " ".join(a))
def test_every_text_renderer_escapes_what_an_older_log_holds(h, args):
    with h.ledger() as lg:
        _older_log(lg)
    r = h(*args, code=None)
    assert r.exit_code == 0, r.stderr
    _assert_escaped(r.stdout, " ".join(args))
    assert "FORGED" in r.stdout or args == ["status"]  # the text is shown, escaped, not dropped


def test_a_diff_escapes_what_differs(h):
    with h.ledger() as lg:
        _older_log(lg)
        working_run(lg, "r2")
        lg.store.append("r2", [ev.StateChanged(from_state="executing", to_state="blocked", reason="2" + HOSTILE)],
                        actor=Actor("owner", "alice"), expected_seq=lg.store.head("r2").last_seq)
    r = h("diff", "r1", "r2", code=None)
    assert r.exit_code in (0, 1), r.stderr  # 1: the runs differ
    assert "reason: a" in r.stdout  # the differing reasons are shown
    _assert_escaped(r.stdout, "diff")


def test_a_watchdog_line_escapes_its_reason():
    a = Action("r1", "unavailable", "revoke_lease", "committed", "k", 3, 1, f"no heartbeat from {HOSTILE}")
    _assert_escaped(a.line(), "watch")
    assert "\n" not in a.line()


def test_visible_is_idempotent_and_json_through_it_stays_the_same_json():
    once = render.visible(HOSTILE)
    assert render.visible(once) == once
    doc = {"reason": HOSTILE, "nested": [HOSTILE]}
    printed = output.printable(json.dumps(doc, indent=2, ensure_ascii=False))
    _assert_escaped(printed, "json")
    assert json.loads(printed) == doc


def test_the_ledger_path_in_an_error_is_escaped(tmp_path):
    bad = str(tmp_path / "no\x1b[31mpe\nFORGED line\u202e")
    r = make_runner().invoke(cli.main, ["status"], env={"HANDOFF_DB": bad})
    assert r.exit_code == 3, (r.exit_code, r.stderr)
    _assert_escaped(r.stderr, "error")
    assert "\\u001b[31m" in r.stderr and "\\nFORGED line\\u202e" in r.stderr
    assert not Path(bad).exists()
