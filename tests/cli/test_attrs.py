"""``--attr KEY=VALUE`` and ``--progress-kind STATE:KIND`` from the shell, and where
attributes show: the log (text and --json), the redacted export and the report."""

from __future__ import annotations

import json

import pytest

from handoff import clitypes, report
from handoff.ledger import events as ev

from tests.support import Handoff, working_run


@pytest.mark.parametrize("text, value", [
    ("true", True), ("false", False), ("42", 42), ("-7", -7), ("0", 0), ("0.25", 0.25), ("-1.5", -1.5),
    # Anything that would not print back as typed stays text, exactly as typed.
    ("3.10", "3.10"), ("007", "007"), ("1e3", "1e3"), ("-0", "-0"), ("+5", "+5"), ("1_000", "1_000"),
    ("0.1000", "0.1000"), ("True", "True"), ("nan", "nan"), ("inf", "inf"), ("", ""), ("a=b", "a=b"),
    ('"42"', "42"), ('"true"', "true"), ('"', '"'), ("claude-sonnet", "claude-sonnet"),
])
def test_how_a_value_is_read(text, value):
    got = clitypes.attr_value(text)
    assert got == value and type(got) is type(value)


def _attrs_of_last(h: Handoff, run: str) -> dict:
    return h.json("log", run)["events"][-1]["data"].get("attrs", {})


def test_every_command_with_attrs_records_them(h, tmp_path):
    lease = working_run(h.ledger())
    result = tmp_path / "report.md"
    result.write_text("# report\n")
    attrs = ["--attr", "model=claude-sonnet", "--attr", "gen_ai.usage.input_tokens=1200", "--attr", "cost_usd=0.012",
             "--attr", "cached=false", "--attr", 'build="42"']
    want = {"model": "claude-sonnet", "gen_ai.usage.input_tokens": 1200, "cost_usd": 0.012, "cached": False,
            "build": "42"}
    for args in (["heartbeat", "r1", "--lease", lease],
                 ["progress", "r1", "--lease", lease, "--kind", "tool_outcome"],
                 ["artifact", "r1", str(result), "--lease", lease],
                 ["evidence", "r1", "--lease", lease, "--kind", "tests", "--outcome", "pass"],
                 ["effect-start", "r1", "--lease", lease, "--effect-key", "e1", "--what", "deploy"],
                 ["effect-confirm", "r1", "--lease", lease, "--effect-key", "e1", "--outcome", "done"]):
        h(*args, *attrs)
        got = _attrs_of_last(h, "r1")
        assert got == want and [type(v) for v in got.values()] == [type(v) for v in want.values()], args[0]
    line = h("log", "r1").stdout.splitlines()[-1]
    assert "effect" in line and "{model=claude-sonnet, gen_ai.usage.input_tokens=1200" in line


def test_the_text_log_quotes_text_that_could_pass_for_more(h):
    lease = working_run(h.ledger())
    h("progress", "r1", "--lease", lease, "--kind", "note", "--attr", "tool=grep, fake=1}")
    assert 'note [not progress] {tool="grep, fake=1}"}' in h("log", "r1").stdout


@pytest.mark.parametrize("args, words", [
    (["--attr", "model"], "is not KEY=VALUE"),
    (["--attr", "=x"], "is not KEY=VALUE"),
    (["--attr", "a=1", "--attr", "a=2"], "given twice"),
    (["--attr", "n=9223372036854775808"], "double quotes"),
    (["--attr", "bad key=1"], "'bad key'"),
    (["--attr", "note=" + "x" * 1001], "attrs[note]"),
])
def test_bad_attrs_exit_2_and_write_nothing(h, args, words):
    lease = working_run(h.ledger())
    before = list(h.ledger().export())
    r = h("progress", "r1", "--lease", lease, "--kind", "tool_outcome", *args, code=2)
    assert words in r.stderr and "Traceback" not in r.stderr
    assert list(h.ledger().export()) == before


def test_the_largest_integer_is_a_number(h):
    lease = working_run(h.ledger())
    h("progress", "r1", "--lease", lease, "--kind", "note", "--attr", "n=9223372036854775807")
    assert _attrs_of_last(h, "r1") == {"n": 2**63 - 1}


def test_declared_kinds_from_the_shell(h):
    run = h("open", "--goal", "g", "--target", "chat:#ops", "--owner", "alice", "--run-id", "d1",
            "--progress-kind", "executing:llm_step", "--progress-kind", "verifying:judge_scored").stdout.strip()
    assert run == "d1"
    lease = h("claim", "d1", "--worker", "w1").stdout.strip()
    h("transition", "d1", "--lease", lease, "--to", "planning")
    r = h("progress", "d1", "--lease", lease, "--kind", "llm_step", code=1)
    assert "IllegalProgress" in r.stderr or "progress in executing" in r.stderr
    h("transition", "d1", "--lease", lease, "--to", "executing")
    doc = h.json("progress", "d1", "--lease", lease, "--kind", "llm_step", "--attr", "model=m")
    assert doc["progress_seq"] == 3
    r = h("progress", "d1", "--lease", lease, "--kind", "judge", code=2)
    assert "llm_step" in r.stderr and "tool_outcome" in r.stderr


@pytest.mark.parametrize("kind, words", [
    ("llm_step", "STATE:KIND"), ("executing:", "STATE:KIND"), ("queued:llm_step", "not a working state"),
    ("executing:note", "never counts"),
])
def test_bad_declarations_exit_2_and_open_nothing(h, kind, words):
    r = h("open", "--goal", "g", "--target", "t", "--owner", "alice", "--run-id", "d1", "--progress-kind", kind,
          code=2)
    assert words in r.stderr
    assert h.ledger().store.head("d1") is None


def test_a_contract_file_declares_kinds_and_excludes_the_option(h, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"goal": "g", "target": "t", "owner": "alice", "run_id": "d1",
                                "progress_kinds": {"executing": ["llm_step"]}}))
    r = h("open", "--contract", str(path), "--progress-kind", "executing:x", code=2)
    assert "--progress-kind" in r.stderr
    h("open", "--contract", str(path))
    assert h.ledger().checkpoint("d1").progress_kinds == {"executing": ("llm_step",)}


def test_redacted_exports_treat_attrs_as_free_text(h, tmp_path):
    lease = working_run(h.ledger())
    h("progress", "r1", "--lease", lease, "--kind", "note", "--attr", "kind=mail bob@example.com",
      "--attr", "host=db.internal", "--attr", "tokens=12", "--attr", "ok=true")
    out = tmp_path / "red.jsonl"
    h("export", "r1", "--redact", "-o", str(out))
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    attrs = next(x["payload"]["attrs"] for x in lines[1:] if "attrs" in x.get("payload", {}))
    text = json.dumps(attrs)
    assert "bob@example.com" not in text and "db.internal" not in text
    # The redaction keeps only what its allow-list names; a worker's own map is not on it:
    # every value is a digest, and so is every key that is not a field name of the schema
    # (a key named like a kept field, ``kind``, keeps its name but never its value).
    assert len(attrs) == 4 and "host" not in attrs and "tokens" not in attrs
    assert all(isinstance(v, str) and v.startswith("[") and "~" in v for v in attrs.values()), attrs
    assert attrs["kind"].startswith("[text~")


def test_the_report_shows_attrs_as_text(h):
    lg = h.ledger()
    lease = working_run(lg)
    lg.progress("r1", lease, "tool_outcome", worker="w1",
                attrs={"model": "<script>alert(1)</script>", "md": "[x](http://e.example/a.png)|"})
    tl = lg.report("r1")
    page = report.render(tl, "html")
    assert "<script>alert(1)" not in page
    assert "model=\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in page or "&lt;script&gt;" in page
    rec = next(r for r in tl.records if r["type"] == "progress_recorded")
    assert rec["data"]["attrs"]["model"] == "<script>alert(1)</script>"  # the side panel's payload, whole
    md = report.render(tl, "md")
    assert "[x](" not in md and "\\[x\\](" in md
    assert ev.attrs_of(list(lg.log("r1"))[-1].event)["md"].endswith("|")
