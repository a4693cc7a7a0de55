"""Fencing a confused worker cannot walk around (issue 17): lease tokens, keyed claim
retries, the watchdog's reserved keys, and refusals that say what really happened.

Each test plays the worker the way a model-driven agent would: it reads whatever the
ledger shows and retries with it. Every refusal must leave the log as it was.
"""

from __future__ import annotations

import json
import re

import pytest

from handoff import Ledger
from handoff.watchdog import action_key, watch_once
from handoff.ledger import errors as E
from handoff.ledger import inputs
from handoff.ledger.store import Actor, LeaseToken

from tests.support import working_run


def log_rows(db: str) -> list[tuple]:
    with Ledger(db, readonly=True) as lg:
        return [(r.position, r.run_id, r.seq, r.hash) for r in lg.store.read_all()] + [
            (h.run_id, h.last_seq, h.lease, h.lease_holder) for h in lg.store.list_runs()]


def everything_a_reader_sees(h, run: str) -> str:
    """All a worker can read about the run without holding its lease."""
    outs = [h("status").stdout, h("status", run).stdout, h("status", "--json").stdout,
            h("status", run, "--json").stdout, h("log", run).stdout, h("log", run, "--json").stdout,
            h("export", run).stdout, h("stalls", "--json").stdout, h("verify", "--json").stdout,
            h("replay", run, "--at", "2", "--json").stdout]
    return "\n".join(outs)


def candidates(seen: str) -> set[str]:
    """Every value a guessing agent might try as --lease, built from what it read."""
    numbers = set(re.findall(r"\b\d{1,3}\b", seen)) | {"1", "2", "3"}
    words = set(re.findall(r"[A-Za-z0-9_-]{22,128}", seen))  # digests, hashes, ids
    out = set(numbers)
    for n in ("1", "2", "3"):
        out |= {f"{n}.{w}" for w in words}
    return out


def test_a_replaced_worker_that_reads_everything_and_retries_writes_nothing(h):
    with h.ledger() as lg:
        old = working_run(lg, "r1")
        lg.revoke("r1", "stopped answering", actor=Actor("watchdog", "wd"))
    new = h("claim", "r1", "--worker", "w2").stdout.strip()
    seen = everything_a_reader_sees(h, "r1")
    assert new not in seen and LeaseToken.parse(new).secret not in seen
    assert old.secret not in seen
    before = log_rows(h.db)
    tried = sorted(candidates(seen) | {str(old)})
    assert len(tried) > 20
    for lease in tried:
        for args in (("progress", "r1", "--kind", "tool_outcome", "--detail", "still here"),
                     ("release", "r1", "--reason", "taking it back"),
                     ("heartbeat", "r1")):
            r = h(*args, "--lease", lease, code=None)
            assert r.exit_code in (1, 2), (lease, args, r.stdout)
            assert new not in r.stderr
    # The same through the environment a wrapped child would use.
    r = h("progress", "--kind", "note", code=None, env={"HANDOFF_RUN": "r1", "HANDOFF_LEASE": "2"})
    assert r.exit_code == 2 and "bare lease number" in r.stderr
    assert log_rows(h.db) == before
    # The real holder is unaffected.
    h("progress", "r1", "--lease", new, "--kind", "note", "--detail", "w2 works")


def test_the_token_appears_only_in_the_claims_own_output(h, tmp_path):
    with h.ledger() as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=1)
    claimed = h.json("claim", "r1", "--worker", "w1")
    token = claimed["token"]
    secret = LeaseToken.parse(token).secret
    h("transition", "r1", "--lease", token, "--to", "planning")
    failed = h("progress", "r1", "--lease", token, "--kind", "made_up", "--json", code=2)
    released = h("release", "r1", "--lease", token, "--json")
    outputs = [failed.stderr, released.stdout, everything_a_reader_sees(h, "r1"),
               h("watch", "--once", "--name", "wd", "--now", "2100-01-01T00:00:00Z", "--commit").stdout,
               h("doctor", "--json").stdout]
    for text in outputs:
        assert secret not in text
    with open(h.db, "rb") as f:  # nor anywhere in the file: only its digest is stored
        assert secret.encode() not in f.read()


def test_api_refusals_name_the_problem_and_write_nothing(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        token = working_run(lg, "r1")
        assert isinstance(token, str) and token.lease == 1 and "secret=..." in repr(token)
        before = list(lg.store.read_all())
        cases = [
            (lambda: lg.progress("r1", 1, "note"), E.InvalidInput, "bare lease number"),
            (lambda: lg.progress("r1", "1", "note"), E.InvalidInput, "bare lease number"),
            (lambda: lg.progress("r1", f"1.{'A' * 43}", "note"), E.StaleLease, "not that lease's token"),
            (lambda: lg.progress("r1", f"5.{token.secret}", "note"), E.StaleLease, "never issued"),
            # Ledger.execute with a bare number in the command and no token: refused too.
            (lambda: lg.execute("r1", S_progress(1), actor=Actor("worker", "w1")), E.StaleLease, "must carry"),
            (lambda: lg.execute("r1", S_progress(2), actor=Actor("worker", "w1"), token=token),
             E.InvalidInput, "token is for lease 1"),
        ]
        for call, error, words in cases:
            with pytest.raises(E.LedgerError) as info:
                call()
            assert type(info.value) is error and words in info.value.message, info.value.message
            assert token.secret not in info.value.message
        assert list(lg.store.read_all()) == before
        never = pytest.raises(E.StaleLease, lg.heartbeat, "r1", f"2.{token.secret}").value
        assert "replaced" not in never.message and never.details["why"] == "never_issued"


def S_progress(lease: int):
    from handoff.reducers import commands as C

    return C.Progress(lease=lease, kind="note")


# --- keyed claims -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["held", "moved_on", "ended"])
def test_a_keyed_claim_retried_is_refused_with_what_the_first_claim_got(h, path):
    with h.ledger() as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
    first = h("claim", "r1", "--worker", "w1", "--key", "c1").stdout.strip()
    with h.ledger() as lg:
        if path in ("moved_on", "ended"):
            lg.revoke("r1", "gone", actor=Actor("operator", "op"))
        if path == "moved_on":
            lg.claim("r1", "w2")
    before = log_rows(h.db)
    r = h("claim", "r1", "--worker", "w1", "--key", "c1", "--json", code=1)
    err = json.loads(r.stderr)["error"]
    assert r.stdout == "" and err["type"] == "ClaimAlreadyMade"
    msg = err["message"]
    assert "'c1'" in msg and "lease 1" in msg and "printed once" in msg
    assert first not in msg and LeaseToken.parse(first).secret not in msg
    want = {"held": "still held", "moved_on": "another claim holds the run", "ended": "claim again with a new key"}
    assert want[path] in msg
    assert log_rows(h.db) == before
    with h.ledger() as lg:  # the API says the same, typed; never a bare AssertionError
        with pytest.raises(E.ClaimAlreadyMade) as info:
            lg.claim("r1", "w1", key="c1")
        assert info.value.details == {"run_id": "r1", "lease": 1, "seq": 2, "state": path}
        assert info.value.exit_code == 1
    assert log_rows(h.db) == before
    if path == "held":  # whoever kept the token goes on writing with it
        h("heartbeat", "r1", "--lease", first)


def test_a_keyed_claim_with_another_worker_is_a_conflict(h):
    with h.ledger() as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lg.claim("r1", "w1", key="c1")
        before = list(lg.store.read_all())
        with pytest.raises(E.IdempotencyConflict):
            lg.claim("r1", "w2", key="c1")
        assert list(lg.store.read_all()) == before


def test_a_worker_reclaiming_its_own_run_is_not_told_to_wait_for_itself(h):
    with h.ledger() as lg:
        working_run(lg, "r1")
    before = log_rows(h.db)
    own = json.loads(h("claim", "r1", "--worker", "w1", "--json", code=1).stderr)["error"]
    assert own["type"] == "LeaseHeld" and "already held by worker w1 under lease 1" in own["message"]
    assert "keep using the token" in own["message"] and "wait for it" not in own["message"]
    other = json.loads(h("claim", "r1", "--worker", "w2", "--json", code=1).stderr)["error"]
    assert "wait for it to release" in other["message"]
    # A second worker is not handed the command that would take the run from its holder.
    assert "handoff revoke" not in own["message"] + other["message"]
    assert "does not revoke another worker's lease" in other["message"]
    assert log_rows(h.db) == before


def test_nobody_opens_a_run_on_a_watchers_stream(h):
    """A run opened at watcher:NAME made that watcher's every pass fail (switching it off);
    those ids are the watchdogs' own streams, refused to every command."""
    h("init")
    h("watch", "--once", "--name", "wd")
    before = log_rows(h.db)
    err = json.loads(h("open", "--goal", "g", "--target", "chat:x", "--owner", "a", "--run-id", "watcher:wd",
                       "--json", code=2).stderr)["error"]
    assert err["type"] == "InvalidInput" and "watchdogs' own streams" in err["message"]
    with h.ledger() as lg, pytest.raises(E.InvalidInput):
        lg.open(run_id="watcher:other", goal="g", target="chat:x", owner="a")
    assert log_rows(h.db) == before
    h("watch", "--once", "--name", "wd")  # still works


# --- the watchdog's keys ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["worker", "owner", "operator"])
def test_nobody_but_the_watchdog_writes_under_its_keys(tmp_path, kind):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        token = working_run(lg, "r1", heartbeat_timeout_s=1)
        key = action_key("r1", "revoke_lease", lg.checkpoint("r1").progress_seq, 1)  # what the watchdog will use
        before = list(lg.store.read_all())
        with pytest.raises(E.ReservedKey, match="belong to the watchdog"):
            if kind == "worker":
                lg.progress("r1", token, "note", "blinding the watchdog", key=key, worker="w1")
            else:
                lg.evidence("r1", "tests", "pass", actor=Actor(kind, "x"), key=key)
        assert list(lg.store.read_all()) == before
        actions = watch_once(lg, name="wd", now_us=lg.clock() + 5_000_000)
        assert [(a.action, a.outcome, a.key) for a in actions] == [("revoke_lease", "committed", key)]
        assert lg.checkpoint("r1").lease is None


def test_the_cli_refuses_a_watch_key_too(h):
    with h.ledger() as lg:
        token = working_run(lg, "r1")
    before = log_rows(h.db)
    r = h("progress", "r1", "--lease", str(token), "--kind", "note", "--key", "watch:r1:revoke_lease:3:1",
          "--json", code=1)
    assert json.loads(r.stderr)["error"]["type"] == "ReservedKey"
    assert log_rows(h.db) == before


def test_a_key_taken_before_the_reservation_is_a_failed_action_not_done(tmp_path, monkeypatch):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        token = working_run(lg, "r1", heartbeat_timeout_s=1)
        key = action_key("r1", "revoke_lease", lg.checkpoint("r1").progress_seq, 1)
        with monkeypatch.context() as m:  # a ledger written before watch: keys were reserved
            m.setattr(inputs, "RESERVED_KEY_PREFIXES", {})
            lg.progress("r1", token, "note", "blinding the watchdog", key=key, worker="w1")
        lines = []
        actions = watch_once(lg, name="wd", now_us=lg.clock() + 5_000_000, on_action=lambda a: lines.append(a.line()))
        (a,) = actions
        assert (a.action, a.outcome, a.seq) == ("revoke_lease", "failed", None)
        assert "progress_recorded event by worker:w1" in a.reason and "not recorded" in a.reason
        assert "FAILED revoke_lease" in lines[0]
        assert lg.checkpoint("r1").lease == 1  # nothing pretended to be done


def test_the_cli_prints_a_failed_watchdog_action(h, monkeypatch):
    with h.ledger() as lg:
        token = working_run(lg, "r1", heartbeat_timeout_s=1)
        with monkeypatch.context() as m:
            m.setattr(inputs, "RESERVED_KEY_PREFIXES", {})
            lg.progress("r1", token, "note", "x", key=action_key("r1", "revoke_lease", 2, 1))
    out = h("watch", "--once", "--name", "wd", "--now", "2100-01-01T00:00:00Z", "--commit").stdout
    assert "r1 unavailable -> FAILED revoke_lease" in out and "this decision was not recorded" in out


def test_two_watchdogs_still_act_once(tmp_path):
    with Ledger(str(tmp_path / "l.db")) as lg:
        working_run(lg, "r1", heartbeat_timeout_s=1)
        later = lg.clock() + 5_000_000
        first = watch_once(lg, name="wd-a", now_us=later)
        second = watch_once(lg, name="wd-b", now_us=later)
        assert [a.outcome for a in first] == ["committed"] and second == []
        assert sum(r.type == "lease_revoked" for r in lg.store.read_run("r1")) == 1
