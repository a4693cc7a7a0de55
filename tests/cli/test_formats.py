"""One output flag: --format table|json|jsonl|csv on status, stalls, log, runs and diff.

--format json prints exactly what --json printed (the documented shapes stay); jsonl is
the same rows one per line; csv has a header line and never hands a spreadsheet a formula.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.support import working_run

NOW = "2100-01-01T00:00:00Z"  # every leased run is long silent by then: stalls has rows


def _ledger(h):
    with h.ledger() as lg:
        working_run(lg, "r1")
        lg.open(run_id="r2", goal="=cmd|' /C calc'!A0", target="+t", owner="@bob")
        lg.claim("r2", "-w2")
        lg.fork("r1", 2, new_run_id="r1.f")


COMMANDS = [
    ["status", "--now", NOW], ["status", "--all", "--now", NOW], ["status", "r1", "--now", NOW], ["stalls", "--now", NOW],
    ["log", "r1"], ["log"], ["runs", "--now", NOW], ["diff", "r1", "r1.f"],
]


@pytest.mark.parametrize("args", COMMANDS)
def test_format_json_is_exactly_what_json_printed(h, args):
    _ledger(h)
    code = 1 if args[0] == "diff" else 0
    assert h(*args, "--format", "json", code=code).stdout == h(*args, "--json", code=code).stdout
    assert h(*args, "--format", "json", "--json", code=code).stdout == h(*args, "--json", code=code).stdout


@pytest.mark.parametrize("args", COMMANDS)
def test_jsonl_and_csv_hold_the_same_rows(h, args):
    _ledger(h)
    code = 1 if args[0] == "diff" else 0
    doc = json.loads(h(*args, "--json", code=code).stdout)
    lines = [json.loads(x) for x in h(*args, "--format", "jsonl", code=code).stdout.splitlines()]
    rows = list(csv.DictReader(io.StringIO(h(*args, "--format", "csv", code=code).stdout)))
    key = {"status": "runs", "runs": "runs", "stalls": "stalls", "log": "events"}.get(args[0])
    if args[0] in ("diff",) or (args[0] == "status" and "r1" in args):
        assert lines == [doc]  # one document: one line
        assert rows  # field by field
        if args[0] == "status":
            by = {r["field"]: r["value"] for r in rows}
            assert by["run_id"] == "r1" and by["state"] == doc["state"] and by["health.classification"]
        else:
            assert rows[0] == {"what": "run", "a": "r1", "b": "r1.f"}
            assert {r["what"] for r in rows} >= {"after.state", "first_divergence"}
        return
    assert lines == doc[key] and len(rows) == len(doc[key]) > 0
    ident = "seq" if args[:1] == ["log"] and args[1:] else "run_id"  # a run's log: its events by seq
    for row, want in zip(rows, doc[key]):
        assert row[ident].lstrip("'") == str(want[ident])


@pytest.mark.parametrize("args", [["status", "--now", NOW], ["runs", "--now", NOW], ["stalls", "--now", NOW], ["log"]])
def test_csv_cells_that_a_spreadsheet_would_run_are_text(h, args):
    _ledger(h)
    out = h(*args, "--format", "csv").stdout
    for row in csv.reader(io.StringIO(out)):
        for cell in row:
            assert cell[:1] not in ("=", "+", "-", "@"), (cell, out)
    assert "'-w2" in out


def test_a_listing_in_jsonl_or_csv_says_where_the_next_page_starts_on_stderr(h):
    _ledger(h)
    r = h("runs", "--limit", "1", "--format", "csv")
    assert len(list(csv.reader(io.StringIO(r.stdout)))) == 2  # the header and one run
    assert "--after r1" in r.stderr and "2 more" in r.stderr


def test_json_and_another_format_together_are_a_usage_error(h):
    _ledger(h)
    before = h.json("verify")["events"]
    for args in (["status", "--json", "--format", "csv"], ["log", "--jsonl", "--format", "csv"],
                 ["diff", "r1", "r1.f", "--json", "--format", "table"]):
        r = h(*args, code=2)
        assert r.stdout == "" and "choose one" in r.stderr
    assert h.json("verify")["events"] == before


def test_errors_under_format_json_are_json(h):
    _ledger(h)
    r = h("status", "nope", "--format", "json", code=1)
    assert json.loads(r.stderr)["error"]["type"] == "UnknownRun"


@pytest.mark.parametrize("args", [["log", "r1"], ["log", "r1.f"], ["log"], ["log", "--run", "r1", "--run", "r1.f"]],
                         ids=["one-run", "a-fork", "across-runs", "some-runs"])
def test_every_log_row_names_its_run_in_every_format(h, args):
    """A row of 'handoff log' carries run_id in --json, --jsonl and --csv alike, whether the
    listing is one run's or spans runs: a spreadsheet of a run's log says whose it is."""
    _ledger(h)
    want = [e["run_id"] for e in json.loads(h(*args, "--json").stdout)["events"]]
    assert want and all(want)
    if args[1:] and not args[1].startswith("--"):
        assert set(want) == {args[1]}
    lines = [json.loads(x)["run_id"] for x in h(*args, "--jsonl").stdout.splitlines()]
    rows = [r["run_id"] for r in csv.DictReader(io.StringIO(h(*args, "--csv").stdout))]
    assert lines == rows == want
