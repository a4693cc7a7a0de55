"""Who wrote each event, said by the server, shown by export and verify (PostgreSQL);
on SQLite nothing is claimed that the file cannot back."""

from __future__ import annotations

import json


from handoff.facade import Ledger
from handoff.ledger import jsonl
from tests.pg import fresh_url
from tests.support import invoke


def _fill(address: str) -> None:
    with Ledger(address) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lg.claim("r1", "w1")


def test_export_and_verify_show_the_role_the_server_recorded():
    import psycopg

    url = fresh_url()
    _fill(url)
    with psycopg.connect(url) as conn:
        role = conn.execute("SELECT session_user").fetchone()[0]
    with Ledger(url) as lg:
        raw = list(lg.export())
        lines = [json.loads(x) for x in raw]
        assert lines and {x["db_role"] for x in lines} == {role}
        assert lg.verify_report()["db_roles"] == {role: len(lines)}
        assert lg.verify_report("r1")["db_roles"] == {role: len(lines)}
    out = invoke("--db", url, "verify")
    assert out.exit_code == 0 and f"written by database roles: {role} ({len(lines)} events)" in out.output
    # An export carrying db_role imports elsewhere; the copy records its own importer.
    other = fresh_url()
    with Ledger(other) as dst:
        dst.import_lines(raw)
        assert {json.loads(x)["db_role"] for x in dst.export()} == {role}


def test_sqlite_exports_read_as_before_and_claim_no_role(tmp_path):
    path = str(tmp_path / "l.db")
    _fill(path)
    with Ledger(path) as lg:
        lines = list(lg.export())
        assert all(b"db_role" not in x for x in lines)
        assert lg.verify_report()["db_roles"] == {}
    parsed = list(jsonl.parse_lines(lines))
    assert len(parsed) == len(lines)


def test_log_shows_the_role_the_server_recorded(tmp_path):
    import psycopg

    url = fresh_url()
    _fill(url)
    with psycopg.connect(url) as conn:
        role = conn.execute("SELECT session_user").fetchone()[0]
    for args in (["log", "r1", "--json"], ["log", "--json"]):
        out = invoke("--db", url, *args)
        assert out.exit_code == 0, out.output
        assert {e["db_role"] for e in json.loads(out.output)["events"]} == {role}
    table = invoke("--db", url, "log", "r1")
    assert "DB ROLE" in table.output and role in table.output
    csv_out = invoke("--db", url, "log", "--csv")
    assert csv_out.output.splitlines()[0].endswith(",db_role") and csv_out.output.splitlines()[1].endswith("," + role)
    path = str(tmp_path / "l.db")
    _fill(path)
    out = invoke("--db", path, "log", "r1", "--json")
    assert {e["db_role"] for e in json.loads(out.output)["events"]} == {None}
    assert "DB ROLE" not in invoke("--db", path, "log", "r1").output
