"""Matrix row 7: lock waits past the timeout and statements past the server's timeout.

Another process stands inside a write transaction on the run (tests/ledger/pg_agents.py
``staller``: an inline hook, the public ``attach`` API, that waits before COMMIT), so the
next writer of that run must wait. Past ``--busy-timeout`` (the lock timeout), or past a
``statement_timeout`` the address sets, the CLI must fail with a typed one-line store
error, exit 3, and nothing may be written. Out of connections: tests/faults/pg/test_pg_server.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse

import pytest

from handoff import Ledger
from tests.faults.conftest import ROOT, child_env, handoff, wait_until


def _with_option(url: str, option: str) -> str:
    parts = urllib.parse.urlsplit(url)
    q = urllib.parse.parse_qs(parts.query)
    q["options"] = [q.get("options", [""])[0] + " " + option]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(q, doseq=True, quote_via=urllib.parse.quote)))


@pytest.mark.parametrize("limit", ["lock_timeout", "statement_timeout"])
def test_a_wait_past_the_timeout_is_exit_3_and_writes_nothing(pg_url, tmp_path, procs, evidence, limit):
    with Ledger(pg_url) as lg:
        run = lg.open(goal="locked", target="chat:#ops", owner="alice")
    stalled, go = str(tmp_path / "stalled"), str(tmp_path / "go")
    st = subprocess.Popen([sys.executable, "-m", "tests.ledger.pg_agents", "staller", pg_url, run, stalled, go],
                          cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(st)
    wait_until(lambda: os.path.exists(stalled), timeout=60, what="the staller inside its transaction")
    with Ledger(pg_url) as lg:
        before = [(r.position, r.hash) for r in lg.store.read_all()]
    if limit == "lock_timeout":
        db, extra = pg_url, ("--busy-timeout", "0.3")
    else:
        db, extra = _with_option(pg_url, "-cstatement_timeout=300"), ("--busy-timeout", "30")
    r = handoff(*extra, "evidence", run, "--kind", "check", "--outcome", "pass", "--by", "alice", "--key", "k1",
                "--json", db=db)
    assert r.returncode == 3, r.stderr
    err = json.loads(r.stderr)["error"]
    assert err["type"] == "StoreUnavailable" and "nothing was written" in err["message"], err
    assert ("lock timeout" if limit == "lock_timeout" else "statement timeout") in err["message"], err
    with Ledger(pg_url) as lg:
        assert [(r.position, r.hash) for r in lg.store.read_all()] == before
    open(go, "w").close()
    assert st.wait(timeout=60) == 0, st.stderr.read()
    with Ledger(pg_url) as lg:  # the refused key was never used: it commits now, once
        out = lg.evidence(run, "check", "pass", actor=None, by="alice", key="k1")
        assert out.result.outcome == "committed"
        assert lg.verify() == []
    evidence.add(f"pg_row7_{limit}", exit=r.returncode, error=err["type"], message=err["message"][:200],
                 events_written_while_refused=0)
