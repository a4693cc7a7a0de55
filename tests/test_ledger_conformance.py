"""The Ledger and the CLI on every backend in tests/backends.py: the third backend-neutral suite.

The store conformance suite proves the storage interface and the projections suite the
views; this one proves what a user sees is the same whatever holds the log:

- a whole run's story through ``Ledger(store=...)``: open, claim, transitions, progress,
  artifact, evidence, submit, review, deliver, delivered;
- refusals: each a typed error with its documented exit code, the log unchanged;
- the packet, the log and a replay agree across backends for the same history;
- an export of one backend imported into another folds to the same runs;
- the watchdog revokes a silent worker's lease, once;
- the story, the refusals and the watchdog the same through ``AsyncLedger`` (``face``);
- the ``handoff`` command on the backend's address (``--db``), in-process and as a real
  process, where the backend lets another process open the same ledger.

Nothing here names a backend: a new one runs this file by adding its entry to
tests/backends.py.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from handoff import cli
from handoff import Ledger
from handoff.watchdog import watch_once
from handoff.ledger import errors as E
from handoff.ledger.store import Actor
from handoff.projections.engine import AGGREGATE
from tests.backends import BACKENDS, OnBackend
from tests.ledger.conformance import assert_unchanged, refused, snapshot
from tests.support import Clock, executable
from tests.workers.faces import FACES, Blocking
from handoff.aio import AsyncLedger

OPS = Actor("operator", "ops")


@pytest.fixture(params=FACES)
def face(request):
    """``face(ledger)``: the Ledger itself, or the same ledger through ``AsyncLedger``
    (tests/workers/faces.py ``Blocking``): the tests taking it hold for both faces."""
    made: list[Blocking] = []

    def wrap(lg: Ledger) -> Any:
        if request.param == "sync":
            return lg
        made.append(Blocking(AsyncLedger(ledger=lg)))
        return made[-1]

    yield wrap
    for b in made:
        b.close()


def story(lg: Ledger, clock: Clock, tmp: Path, run: str = "r1") -> str:
    """A run from its contract to a proven delivery; returns the (spent) lease token."""
    report = tmp / f"{run}-report.md"
    report.write_text("# Report\n\nEvery part is done.\n")
    assert lg.open(run_id=run, goal="Draft the report", target="chat:#ops", owner="alice",
                   result_path=str(report), require_review=True, heartbeat_timeout_s=30) == run
    lease = lg.claim(run, "w1")
    assert lease.lease == 1
    clock.advance(1)
    assert lg.transition(run, lease, "planning", worker="w1").checkpoint.state == "planning"
    lg.progress(run, lease, "plan_committed", "3 parts", key="p1", worker="w1")
    clock.advance(1)
    assert lg.transition(run, lease, "executing", worker="w1").checkpoint.state == "executing"
    lg.heartbeat(run, lease, worker="w1")
    lg.progress(run, lease, "tool_outcome", "part 1", worker="w1")
    art = lg.artifact(run, lease, str(report), worker="w1")
    assert art.checkpoint.artifacts[-1].bytes == report.stat().st_size
    lg.transition(run, lease, "verifying", worker="w1")
    lg.evidence(run, "tests", "pass", "12 passed", lease=lease, actor=Actor("worker", "w1"))
    assert lg.submit(run, lease, "done", worker="w1").checkpoint.state == "ready_for_review"
    lg.review(run, True, "fine", by="alice")
    clock.advance(1)
    sent = lg.deliver(run, "d1", by="alice")
    assert sent.result.outcome == "committed"
    done = lg.delivered(run, "d1", "msg 1")
    assert done.checkpoint.state == "delivered"
    return lease


# --- the story through the Ledger ---------------------------------------------------------


def test_a_whole_run_through_the_ledger(backend, tmp_path, face):
    clock = Clock()
    lg = face(backend.ledger(clock))
    story(lg, clock, tmp_path)
    packet = lg.status("r1")
    assert (packet["state"], packet["terminal"], packet["delivery"]["status"]) == ("delivered", True, "confirmed")
    assert packet["delivery"]["receipt"] == "msg 1"
    types = [r.type for r in lg.log("r1")]
    assert types[:3] == ["handoff_opened", "lease_granted", "state_changed"]
    assert {"artifact_recorded", "evidence_recorded", "delivery_confirmed"} <= set(types)
    # A retried delivery is not a second send: nothing is written, and it says so.
    before = snapshot(lg.store)
    again = lg.deliver("r1", "d1", by="alice")
    assert again.result.outcome == "unchanged" and again.duplicate
    assert_unchanged(lg.store, before)
    # Replay: the packet as it stood after the claim.
    assert lg.checkpoint("r1", at_seq=2).state == "queued" and lg.checkpoint("r1", at_seq=2).lease == 1
    assert [cp.run_id for cp in lg.runs(include_terminal=True)] == ["r1"]
    assert lg.verify() == [] and lg.check() == []
    assert lg.doctor()["events"] == len(types)


# --- refusals: typed, with their exit code, and the log unchanged -------------------------


def refusals(lg: Ledger, lease: str, spent: str) -> list[tuple[str, Any, type[E.LedgerError], int]]:
    """(what, call, error type, exit code): r1 is delivered (``spent`` was its lease), r2 is
    planning under ``lease`` with progress keyed p1."""
    forged = f"{lease.partition('.')[0]}.{'A' * 43}"
    return [
        ("second claim", lambda: lg.claim("r2", "w2"), E.LeaseHeld, 1),
        ("bare lease number", lambda: lg.heartbeat("r2", "1"), E.InvalidInput, 2),
        ("forged token", lambda: lg.heartbeat("r2", forged), E.StaleLease, 1),
        ("illegal move", lambda: lg.transition("r2", lease, "delivered", worker="w1"), E.IllegalTransition, 1),
        ("run exists", lambda: lg.open(run_id="r2", goal="g", target="t", owner="alice"), E.RunExists, 1),
        ("unknown run", lambda: lg.checkpoint("nobody"), E.UnknownRun, 1),
        ("bad run id", lambda: lg.heartbeat("../x", lease), E.InvalidInput, 2),
        ("key reused", lambda: lg.progress("r2", lease, "tool_outcome", "other", key="p1", worker="w1"),
         E.IdempotencyConflict, 1),
        ("submit while planning", lambda: lg.submit("r2", lease, worker="w1"), E.IllegalTransition, 1),
        ("lease spent by delivery", lambda: lg.transition("r1", spent, "executing", worker="w1"), E.StaleLease, 1),
        ("close a delivered run", lambda: lg.close_run("r1", "cancelled", by="alice"), E.TerminalRun, 1),
        ("second delivery", lambda: lg.deliver("r1", "d2", by="alice"), E.DeliveryRefused, 1),
    ]


def test_refusals_are_typed_carry_their_exit_code_and_write_nothing(backend, tmp_path, face):
    clock = Clock()
    lg = face(backend.ledger(clock))
    spent = story(lg, clock, tmp_path)
    lg.open(run_id="r2", goal="g", target="chat:#ops", owner="alice")
    lease = lg.claim("r2", "w1")
    lg.transition("r2", lease, "planning", worker="w1")
    lg.progress("r2", lease, "plan_committed", "p", key="p1", worker="w1")
    views = lg.check()
    for what, call, error, code in refusals(lg, lease, spent):
        with refused(lg.store, error) as info:
            call()
        assert type(info.value) is error, what
        assert info.value.exit_code == code, what
        assert info.value.message, what
    assert lg.check() == views == []


def test_a_revoked_lease_is_refused_and_writes_nothing(backend, tmp_path, face):
    clock = Clock()
    lg = face(backend.ledger(clock))
    lg.open(run_id="r", goal="g", target="chat:#ops", owner="alice")
    old = lg.claim("r", "w1")
    lg.revoke("r", "drain", actor=OPS)
    with refused(lg.store, E.StaleLease) as info:
        lg.heartbeat("r", old, worker="w1")
    assert info.value.exit_code == 1 and info.value.details["why"] == "ended"
    assert lg.claim("r", "w2").lease == 2


# --- the watchdog -------------------------------------------------------------------------


def test_the_watchdog_revokes_a_silent_worker_once(backend, face):
    clock = Clock()
    lg = face(backend.ledger(clock))
    lg.open(run_id="r", goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=10)
    lease = lg.claim("r", "w1")
    lg.transition("r", lease, "planning", worker="w1")
    clock.advance(5)
    assert [a for a in watch_once(lg, name="wd") if a.outcome == "committed"] == []
    clock.advance(6)
    acted = [(a.run_id, a.action) for a in watch_once(lg, name="wd") if a.outcome == "committed"]
    assert acted == [("r", "revoke_lease")]
    assert lg.checkpoint("r").lease is None
    assert [a for a in watch_once(lg, name="wd") if a.outcome == "committed"] == []
    assert [r.type for r in lg.log("r")].count("lease_revoked") == 1
    with refused(lg.store, E.StaleLease):
        lg.heartbeat("r", lease, worker="w1")
    assert "wd" in lg.watchers()
    assert lg.check() == []


def test_a_beat_between_the_scan_and_the_action_keeps_the_lease(backend, face):
    """The stall scan judges from the view row and the watchdog reads the run's packet
    later: a beat landing in between must make the revoke skip, on every backend."""
    clock = Clock()
    lg = face(backend.ledger(clock))
    lg.open(run_id="r", goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=10)
    lease = lg.claim("r", "w1")
    lg.transition("r", lease, "planning", worker="w1")
    clock.advance(11)
    scan = lg.stalls

    def stalls_then_beat(now=None):
        found = scan(now=now)
        lg.heartbeat("r", lease, worker="w1")
        return found

    lg.stalls = stalls_then_beat
    acts = watch_once(lg, name="wd")
    assert [(a.action, a.outcome) for a in acts] == [("revoke_lease", "skipped")]
    assert "lease_revoked" not in [r.type for r in lg.log("r")]
    assert lg.checkpoint("r").lease == 1


# --- the same history on every backend ------------------------------------------------------

VOLATILE = {"hash", "prev_hash", "payload", "token_digest", "path", "result_path", "db"}


def masked(value: Any) -> Any:
    """``value`` without what differs by design between two ledgers given the same steps:
    lease secrets (so their digests, the payload bytes holding them and the hashes over
    those) and where the ledger lives. Each event is compared decoded, digest aside."""
    if isinstance(value, dict):
        return {k: ("<varies>" if k in VOLATILE else masked(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v) for v in value]
    if isinstance(value, bytes):
        return "<bytes>"
    if isinstance(value, str) and os.sep in value and value.startswith(os.sep):
        return "<path>"
    return value


def reports(lg: Ledger, now: int) -> dict[str, Any]:
    """What a reader can ask of the ledger about its runs, as plain data."""
    out: dict[str, Any] = {}
    for head in lg.store.list_runs():
        run = head.run_id
        if run.startswith("watch"):
            continue
        records = [{**msgspec.to_builtins(r), "event": msgspec.to_builtins(r.event)} for r in lg.log(run)]
        out[run] = {
            "status": lg.status(run, now=now),
            "log": records,
            "replay": [lg.status(run, at_seq=seq) for seq in range(1, len(records) + 1)],
        }
    out["runs"] = [cp.run_id for cp in lg.runs(include_terminal=True)]
    out["stalls"] = [(cp.run_id, msgspec.to_builtins(h)) for cp, h in lg.stalls(now=now)]
    out["deliveries"] = lg.deliveries(now=now)
    out["counts"] = lg.store.counts()
    return masked(msgspec.to_builtins(out))


def history(lg: Ledger, clock: Clock, tmp: Path) -> None:
    """The story, a second run left working, and a fork of it."""
    story(lg, clock, tmp)
    lg.open(run_id="r2", goal="Second", target="chat:#ops", owner="bob", progress_timeout_s=20)
    lease = lg.claim("r2", "w2")
    lg.transition("r2", lease, "planning", worker="w2")
    lg.progress("r2", lease, "plan_committed", "2 parts", worker="w2")
    lg.fork("r2", 3, new_run_id="r2.fork", by="bob")
    clock.advance(60)


def test_the_same_history_reads_the_same_on_every_backend(tmp_path):
    seen = {}
    for name, backend in sorted(BACKENDS.items()):
        on = OnBackend(backend, tmp_path / name)
        (tmp_path / name).mkdir()
        try:
            clock = Clock()
            lg = on.ledger(clock)
            history(lg, clock, tmp_path)
            seen[name] = reports(lg, clock.now)
        finally:
            on.close()
    first, *others = seen.items()
    assert first[1]["runs"] == ["r1", "r2", "r2.fork"]
    assert first[1]["stalls"], "the history should leave a stalled run to report"
    for name, got in others:
        assert got == first[1], f"{name} reads differently from {first[0]}"


# --- export from one backend, import into another -------------------------------------------

PAIRS = [pytest.param(a, b, id=f"{a}->{b}") for a, b in itertools.product(sorted(BACKENDS), repeat=2)]


@pytest.mark.parametrize("source, target", PAIRS)
def test_export_then_import_across_backends_folds_the_same(tmp_path, source, target):
    src_on, dst_on = OnBackend(BACKENDS[source], tmp_path / "src"), OnBackend(BACKENDS[target], tmp_path / "dst")
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    try:
        clock = Clock()
        src = src_on.ledger(clock)
        history(src, clock, tmp_path)
        lines = list(src.export())
        dst = dst_on.ledger(clock)
        assert dst.import_lines(lines) == {"imported": src.store.last_position(), "skipped": 0,
                                          "runs": src.store.count_runs()}
        assert list(dst.store.read_all()) == list(src.store.read_all())
        for head in src.store.list_runs():
            assert dst.store.fold(head.run_id, AGGREGATE) == src.store.fold(head.run_id, AGGREGATE)
        assert dst.verify() == [] and dst.check() == []
        assert reports(dst, clock.now) == reports(src, clock.now)
        # The same export again changes nothing.
        before = snapshot(dst.store)
        assert dst.import_lines(lines)["imported"] == 0
        assert_unchanged(dst.store, before)
    finally:
        src_on.close()
        dst_on.close()


# --- the CLI on the backend's address -------------------------------------------------------


def needs_cli(backend: OnBackend) -> None:
    if not backend.shared:
        pytest.skip(f"{backend.name}: every 'handoff' process would open a ledger of its own")


class Shell:
    """``sh("status", "r1", "--json")``: the CLI in-process with ``--db`` set to the address."""

    def __init__(self, address: str) -> None:
        self.address = address
        try:
            self.runner = CliRunner(mix_stderr=False)  # click < 8.2
        except TypeError:
            self.runner = CliRunner()

    def __call__(self, *args: str, code: int = 0) -> Any:
        env = {k: None for k in ("HANDOFF_DB", "HANDOFF_RUN", "HANDOFF_LEASE", "HANDOFF_WORKER")}
        result = self.runner.invoke(cli.main, ["--db", self.address, *args], env=env, catch_exceptions=False)
        assert result.exit_code == code, f"{args}: exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
        return result

    def json(self, *args: str, code: int = 0) -> Any:
        return json.loads(self(*args, "--json", code=code).stdout)


def cli_story(sh: Shell, tmp: Path) -> str:
    report = tmp / "cli-report.md"
    report.write_text("# Report\n\nEvery part is done.\n")
    sh("open", "--run-id", "c1", "--goal", "Draft the report", "--target", "chat:#ops", "--owner", "alice",
       "--result", str(report))
    lease = sh("claim", "c1", "--worker", "w1").stdout.strip()
    sh("transition", "c1", "--lease", lease, "--to", "planning")
    sh("progress", "c1", "--lease", lease, "--kind", "plan_committed", "--detail", "3 parts", "--key", "p1")
    sh("transition", "c1", "--lease", lease, "--to", "executing")
    sh("heartbeat", "c1", "--lease", lease)
    sh("artifact", "c1", "--lease", lease, "--kind", "result", str(report))
    sh("transition", "c1", "--lease", lease, "--to", "verifying")
    sh("evidence", "c1", "--lease", lease, "--kind", "tests", "--outcome", "pass")
    sh("submit", "c1", "--lease", lease, "--summary", "done")
    assert sh.json("deliver", "c1", "--by", "alice", "--delivery-key", "d1")["send"] is True
    assert sh.json("delivered", "c1", "--delivery-key", "d1", "--receipt", "msg 1")["state"] == "delivered"
    return lease


#: The two --json fields whose values say what the backend records (docs/cli.md): who
#: inserted each event, by the server's word, a role name on PostgreSQL and null on
#: SQLite; and a map of role -> events ({} on SQLite). Their shape is the same: a
#: nullable name, a map of counts.
BACKEND_SAID = {"db_role": "role name or null", "db_roles": "map of role to count"}


def shape(doc: Any) -> Any:
    """A JSON document's keys and value types, recursively: what --json promises to keep."""
    if isinstance(doc, dict):
        return {k: BACKEND_SAID[k] if k in BACKEND_SAID else shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return sorted({json.dumps(shape(v), sort_keys=True) for v in doc})
    return type(doc).__name__


def test_a_whole_run_through_the_cli(backend, tmp_path):
    needs_cli(backend)
    address = backend.address()
    sh = Shell(address)
    lease = cli_story(sh, tmp_path)
    packet = sh.json("status", "c1")
    assert (packet["state"], packet["delivery"]["status"]) == ("delivered", "confirmed")
    assert [e["type"] for e in sh.json("log", "c1")["events"]][:2] == ["handoff_opened", "lease_granted"]
    assert sh.json("replay", "c1", "--at", "2")["state"] == "queued"
    # The Ledger on the same address reads what the CLI wrote.
    lg = Ledger(store=backend.open(address))
    assert lg.status("c1")["state"] == "delivered" and lg.verify() == []
    # Refusals through the CLI: the exit code of the error's type, and the log unchanged.
    before = snapshot(lg.store)
    out = sh("heartbeat", "c1", "--lease", "1", code=2)
    assert "token" in out.stderr + out.stdout
    sh("transition", "c1", "--lease", lease, "--to", "executing", code=1)
    sh("claim", "c1", "--worker", "w2", code=1)
    sh("status", "nobody", code=1)
    assert_unchanged(lg.store, before)


def test_cli_json_shapes_are_the_same_on_every_backend_that_serves_the_cli(tmp_path):
    shapes = {}
    for name, backend in sorted(BACKENDS.items()):
        if not backend.shared:
            continue
        (tmp_path / name).mkdir()
        on = OnBackend(backend, tmp_path / name)
        sh = Shell(on.address())
        cli_story(sh, tmp_path / name)
        shapes[name] = {
            "status": shape(sh.json("status", "c1")),
            "runs": shape(sh.json("status", "--all")),
            "log": shape(sh.json("log", "c1")),
            "replay": shape(sh.json("replay", "c1", "--at", "3")),
            "verify": shape(sh.json("verify")),
        }
        on.close()
    assert shapes, "no backend in tests/backends.py serves the CLI"
    first, *others = shapes.items()
    for name, got in others:
        assert got == first[1], f"{name}'s --json differs from {first[0]}'s"


def test_doctor_prints_only_the_rows_its_backend_has(backend, tmp_path):
    """doctor's text printed SQLite's rows on every backend (``sqlite None``, ``journal
    None`` on PostgreSQL): its rows are now what the backend's ``diagnostics()`` returned,
    so each row names a fact of this backend and none is empty or None."""
    needs_cli(backend)
    sh = Shell(backend.address())
    cli_story(sh, tmp_path)
    facts = sh.json("doctor")
    own = {"file", "address", "backend", "events", "projections", "append-only"}
    rows = [re.split(r"\s{2,}", line, maxsplit=1) for line in sh("doctor").stdout.splitlines()]
    assert rows and all(len(r) == 2 for r in rows), rows
    for label, value in rows:
        assert label in own or label.replace(" ", "_") in facts, f"row {label!r} is not a fact this backend gave"
        assert value.strip() and "None" not in value, f"row {label!r} says {value!r}"
    labels = [label for label, _ in rows]
    assert len(set(labels)) == len(labels)
    assert facts["backend"] in dict(rows)["backend"]
    # Every fact the backend gave is printed (a JSON reader and a text reader see the same).
    assert {k.replace("_", " ") for k in facts} - set(labels) <= {"path", "backend version", "runs", "problems"}


#: Keys of a status packet that depend on the moment it was read.
TIME_DEPENDENT = {"health", "now", "generated_at", "age_s", "watchers", "heartbeat_age_s", "progress_age_s"}


def test_the_handoff_command_as_a_real_process(backend, tmp_path):
    needs_cli(backend)
    address = backend.address()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["HANDOFF_DB"] = address

    def handoff(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*executable(), *args], env=env, capture_output=True, text=True, timeout=60)

    opened = handoff("open", "--run-id", "p1", "--goal", "g", "--target", "chat:#ops", "--owner", "alice")
    assert opened.returncode == 0, opened.stderr
    lease = handoff("claim", "p1", "--worker", "w1").stdout.strip()
    lg = Ledger(store=backend.open(address))
    before = snapshot(lg.store)
    stale = handoff("heartbeat", "p1", "--lease", f"{lease.partition('.')[0]}.{'A' * 43}")
    assert stale.returncode == 1 and "not that lease's token" in stale.stderr
    assert_unchanged(lg.store, before)
    status = json.loads(handoff("status", "p1", "--json").stdout)
    assert status["lease"] == 1 and status["state"] == "queued"
    # The CLI prints the packet the API returns: the same keys and values, the clock aside.
    assert status == lg.status("p1") | {k: status[k] for k in status if k in TIME_DEPENDENT}
