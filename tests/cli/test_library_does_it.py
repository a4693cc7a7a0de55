"""What the CLI does, a Python caller can do with the same result: the logic lives in the
library and the command only prints it."""

from __future__ import annotations

import json
import os

from handoff import Ledger
from handoff.facade import init_ledger

from tests.support import Handoff, working_run


def test_init_through_a_sqlite_url_names_the_file_and_sees_it_exists(tmp_path):
    """Before, 'init' looked for a file literally named 'sqlite:///...': it reported a new
    ledger every time and printed a path that does not exist."""
    path = tmp_path / "l.db"
    h = Handoff(f"sqlite://{path}")
    first = h.json("init")
    second = h.json("init")
    assert first == {"db": str(path), "created": True, "runs": 0}
    assert second == {"db": str(path), "created": False, "runs": 0}
    assert init_ledger(f"sqlite://{path}") == second


def test_verify_json_is_the_ledger_s_verify_report(h):
    with h.ledger() as lg:
        working_run(lg)
    doc = h.json("verify")
    run_doc = h.json("verify", "r1")
    with h.ledger() as lg:
        assert doc == lg.verify_report()
        assert run_doc == lg.verify_report("r1")
    assert doc["ok"] and run_doc["skipped"]


def test_written_gives_the_events_a_write_stands_for(h):
    with h.ledger() as lg:
        token = working_run(lg)
        out = lg.progress("r1", token, "tool_outcome", "step", key="k1")
        again = lg.progress("r1", token, "tool_outcome", "step", key="k1")
        assert [r.seq for r in lg.written(out)] == [r.seq for r in lg.written(again)] == [out.result.first_seq]
        lg.effect_start("r1", token, "e1", "deploy")
        lg.effect_confirm("r1", "e1", "done", lease=token)
        settled = lg.effect_confirm("r1", "e1", "done", lease=token)
        assert settled.result.outcome == "unchanged" and lg.written(settled) == []
    assert os.path.exists(h.db) and json.loads(h("log", "r1", "--json").stdout)["events"]


def test_watch_names_itself_the_way_the_library_does(h):
    from handoff.watchdog import default_name

    with h.ledger() as lg:
        working_run(lg)
    doc = h.json("watch", "--once")
    assert doc["watcher"] == default_name()
    with Ledger(h.db) as lg:
        assert default_name() in lg.watchers()
