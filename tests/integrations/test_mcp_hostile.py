"""``handoff mcp`` fed what a prompt-injected or confused model writes, over stdio and over
HTTP (streamable HTTP on 127.0.0.1, the SDK's own client), on each backend a server process
can share.

- Every secret shape of tests/delivery/test_secret_shapes.py, pasted by a model into the
  texts the agent integrations scrub (a side effect's description, a note, how a side
  effect's outcome is known), is in neither the ledger's events, nor ``handoff log
  --json``, nor anything a tool answers.
- Hostile run ids, control and bidirectional characters, text past the ledger's limit and
  arguments of the wrong type are refused with the tool's error result naming the field,
  repeating no control character, and the ledger is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from handoff import Ledger
from handoff.ledger.inputs import CONTROL_RE, MAX_TEXT
from tests.support import Handoff
from tests.delivery.test_secret_shapes import _EXAMPLES

from .test_mcp_server import HttpServer, Seen, ok, refused, stdio

SHAPES = sorted(_EXAMPLES)
TRANSPORTS = ("stdio", "http")


@contextmanager
def servers(transport: str, db: str, tmp: Path, *roles: tuple[str, ...]) -> Iterator[list[Any]]:
    """Per role's arguments, what a client connects to: stdio arguments as they are, or a
    running HTTP server process (stopped afterwards)."""
    if transport == "stdio":
        yield list(roles)
        return
    started: list[HttpServer] = []
    try:
        for args in roles:
            started.append(HttpServer(db, "127.0.0.1", *args, tmp=tmp))
        yield started
    finally:
        for server in started:
            server.stop()


@asynccontextmanager
async def connect(db: str, to: Any) -> AsyncIterator[Client]:
    # Over HTTP a lease lives in a session: the handshake era (mode legacy) gives one.
    client = stdio(db, *to) if isinstance(to, tuple) else Client(to.url, mode="legacy")
    async with client:
        yield client


def worker_args(root: Path) -> tuple[str, ...]:
    return ("--as", "worker", "--name", "agent-1", "--root", str(root))


OWNER = ("--as", "owner", "--name", "alice")


def snapshot(db: str) -> dict[str, list[tuple[int, str]]]:
    """Every run and every event of the ledger."""
    with Ledger(db) as lg:
        return {run: [(r.seq, r.type) for r in lg.log(run)] for run in lg.run_ids()}


def _open(db: str, run: str) -> None:
    # A long heartbeat timeout: no beat falls due while a test runs, so only a tool's write
    # could change the log.
    with Ledger(db) as lg:
        lg.open(goal="Deploy v42", target="chat:#ops", owner="alice", run_id=run, heartbeat_timeout_s=3600)


# --- every secret shape, in every text the integrations scrub ------------------------------------


def _call(text: str) -> str:
    """How a model describes a deploy whose configuration holds ``text``."""
    return f"deploy({json.dumps({'env': 'prod', 'config': text})})"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_secret_a_model_writes_is_kept_nowhere(shared_backend, tmp_path, transport):
    db = shared_backend.address()
    root = tmp_path / "work"
    root.mkdir()
    run = "hostile-secrets"
    _open(db, run)
    seen = Seen()

    async def walk(worker_to: Any, owner_to: Any) -> None:
        async with connect(db, worker_to) as worker, connect(db, owner_to) as owner:
            async def w(tool: str, **args: Any) -> dict[str, Any]:
                return ok(seen.result(await worker.call_tool(tool, {"run_id": run, **args})))

            async def o(tool: str, **args: Any) -> dict[str, Any]:
                return ok(seen.result(await owner.call_tool(tool, {"run_id": run, **args})))

            await w("claim")
            await w("transition", to="planning")
            await w("progress", kind="plan_committed")
            await w("transition", to="executing")
            for i, shape in enumerate(SHAPES):
                text = _EXAMPLES[shape][0]
                await w("effect_start", effect_key=f"w-{i}", what=_call(text))
                await w("effect_confirm", effect_key=f"w-{i}", outcome="done", note=f"the deploy answered {text}")
                await w("progress", kind="note", detail=f"deploy failed: 401 for {text}")
                await w("effect_start", effect_key=f"o-{i}", what=_call(text))  # left open for the owner
            await o("revoke", reason="the worker hung")
            for i, shape in enumerate(SHAPES):
                await o("effect_confirm", effect_key=f"o-{i}", outcome="absent",
                        note=f"the provider's log has no call with {_EXAMPLES[shape][0]}")
            # What a model reads back of the run: its packet and its log.
            await o("status")
            await o("log", limit=500, fold=False)

    with servers(transport, db, tmp_path, worker_args(root), OWNER) as (worker_to, owner_to):
        anyio.run(walk, worker_to, owner_to)

    with Ledger(db) as lg:
        recs = list(lg.log(run))
    started = [r.event.what for r in recs if r.type == "side_effect_started"]
    notes = [r.event.detail for r in recs if r.type == "progress_recorded" and r.event.kind == "note"]
    confirmed = [r.event.note for r in recs if r.type == "reconciliation_recorded"]
    assert (len(started), len(notes), len(confirmed)) == (2 * len(SHAPES), len(SHAPES), len(SHAPES))
    # What is not a secret stays readable.
    assert all(w.startswith("deploy(") and '"env": "prod"' in w for w in started)
    assert all(n.startswith("deploy failed: 401 for ") for n in notes)
    events = repr(recs) + json.dumps([started, notes, confirmed])
    log = Handoff(db)("log", run, "--json").stdout
    shown = "\n".join(seen.texts)
    assert json.dumps(started[0])[1:-1] in shown  # the tools did show what was recorded
    for shape in SHAPES:
        secret = _EXAMPLES[shape][1]
        for where, text in (("ledger", events), ("handoff log --json", log), ("a tool's answer", shown)):
            assert secret not in text and json.dumps(secret)[1:-1] not in text, (shape, where)


# --- hostile arguments: refused, naming the field, nothing written ---------------------------------

#: Run ids a model may send: a line break, a NUL, a bidirectional override, a path, a
#: thread id of a chat framework, too long, empty, of the wrong type.
BAD_RUN_IDS: list[Any] = ["r1\n", "\x00", "r\u202e1", "../../etc/passwd", "thread 42", "user/42#thread",
                          "r" * 129, "", 42, None, ["r1"]]
LONG = "x" * (MAX_TEXT + 1)

#: (tool, arguments, the field the refusal must name): a worker's tools.
WORKER_CASES: list[tuple[str, dict[str, Any], str]] = [
    *[(tool, {"run_id": bad, **extra}, "run_id") for bad in BAD_RUN_IDS
      for tool, extra in (("claim", {}), ("progress", {"kind": "note", "detail": "d"}),
                          ("effect_start", {"effect_key": "k", "what": "w"}), ("status", {}))],
    ("effect_start", {"effect_key": "k2", "what": "deploy\x1b[2J v42"}, "what"),
    ("effect_start", {"effect_key": "k2", "what": "deploy \u202e24v"}, "what"),
    ("effect_start", {"effect_key": "k2", "what": "deploy\r\nApproved: yes"}, "what"),
    ("effect_start", {"effect_key": "k2", "what": LONG}, "what"),
    ("effect_start", {"effect_key": "k2", "what": 42}, "what"),
    ("effect_start", {"effect_key": "k2", "what": ["deploy"]}, "what"),
    ("effect_start", {"effect_key": "k2", "what": {"cmd": "deploy"}}, "what"),
    ("effect_start", {"effect_key": "k2", "what": ""}, "what"),
    ("effect_start", {"effect_key": "k2\u2066", "what": "deploy"}, "effect_key"),
    ("effect_start", {"effect_key": None, "what": "deploy"}, "effect_key"),
    ("progress", {"kind": "note", "detail": "a\x00b"}, "detail"),
    ("progress", {"kind": "note", "detail": "a\u2067b"}, "detail"),
    ("progress", {"kind": "note", "detail": LONG}, "detail"),
    ("progress", {"kind": "note", "detail": 7}, "detail"),
    ("progress", {"kind": "note\n", "detail": "d"}, "kind"),
    ("progress", {"kind": "note", "attrs": {"nested": {"a": 1}}}, "attrs"),
    ("progress", {"kind": "note", "attrs": {"bad key!": 1}}, "attrs"),
    ("progress", {"kind": "note", "attrs": {"model": "x\u202e"}}, "attrs"),
    ("effect_confirm", {"effect_key": "k1", "outcome": "done", "note": ["seen"]}, "note"),
    ("effect_confirm", {"effect_key": "k1", "outcome": "maybe"}, "outcome"),
    ("block", {"reason": "needs\x07 a key", "next_action": "ask"}, "reason"),
    ("block", {"reason": "needs a key", "next_action": LONG}, "next_action"),
    ("unblock", {"resolution": "ok", "blocker_id": "one"}, "blocker_id"),
]

#: The same for an owner's tools.
OWNER_CASES: list[tuple[str, dict[str, Any], str]] = [
    *[("open", {"goal": "g", "target": "chat:#ops", "run_id": bad}, "run_id")
      for bad in BAD_RUN_IDS if bad not in ("", None)],
    ("open", {"goal": "\u202egoal", "target": "chat:#ops"}, "goal"),
    ("open", {"goal": LONG, "target": "chat:#ops"}, "goal"),
    ("open", {"goal": "g", "target": "chat:#ops\x00"}, "target"),
    ("open", {"goal": "g", "target": "chat:#ops", "heartbeat_timeout_s": -1}, "heartbeat_timeout_s"),
    ("open", {"goal": "g", "target": "chat:#ops", "stop_rules": "stop"}, "stop_rules"),
    ("open", {"goal": 1, "target": "chat:#ops"}, "goal"),
    ("effect_confirm", {"run_id": "hostile-args", "effect_key": "k1", "outcome": "done", "note": "seen \u202e"}, "note"),
    ("effect_confirm", {"run_id": "hostile-args", "effect_key": "k1", "outcome": "done", "note": "seen\x85"}, "note"),
    ("effect_confirm", {"run_id": "hostile-args", "effect_key": "k1", "outcome": "done", "note": LONG}, "note"),
    ("revoke", {"run_id": "hostile-args", "reason": "hung\x1b]0;owned\x07"}, "reason"),
    ("fork", {"run_id": "hostile-args", "at_seq": 0}, "at_seq"),
    ("fork", {"run_id": "hostile-args", "at_seq": 2, "new_run_id": "child 1"}, "new_run_id"),
    ("transfer", {"run_id": "hostile-args", "action": "deliver", "to": "bob\u202e"}, "to"),
    *[(tool, {"run_id": bad, **extra}, "run_id") for bad in BAD_RUN_IDS
      for tool, extra in (("status", {}), ("effect_confirm", {"effect_key": "k1", "outcome": "done", "note": "n"}))],
]


def _repeats_a_control(sent: dict[str, Any], text: str) -> bool:
    """A refusal names what was wrong without repeating a control or bidirectional
    character the model sent (it could rewrite the line a host shows)."""
    return any(ch in text for value in sent.values() if isinstance(value, str) for ch in CONTROL_RE.findall(value))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_hostile_arguments_are_refused_naming_the_field_and_write_nothing(shared_backend, tmp_path, transport):
    db = shared_backend.address()
    root = tmp_path / "work"
    root.mkdir()
    run = "hostile-args"
    _open(db, run)

    async def walk(worker_to: Any, owner_to: Any) -> list[str]:
        problems: list[str] = []
        async with connect(db, worker_to) as worker, connect(db, owner_to) as owner:
            for tool, args in [("claim", {}), ("transition", {"to": "planning"}),
                               ("progress", {"kind": "plan_committed"}), ("transition", {"to": "executing"}),
                               ("effect_start", {"effect_key": "k1", "what": "POST /deploy v42"})]:
                ok(await worker.call_tool(tool, {"run_id": run, **args}))
            before = snapshot(db)
            for client, cases in ((worker, WORKER_CASES), (owner, OWNER_CASES)):
                for tool, args, field in cases:
                    if client is worker and "run_id" not in args:
                        args = {"run_id": run, **args}
                    r = await client.call_tool(tool, args)
                    if not r.is_error:
                        problems.append(f"{tool} {args!r:.120} was accepted")
                        continue
                    text = refused(r)
                    if field not in text:
                        problems.append(f"{tool} {args!r:.120}: the refusal does not name {field}: {text[:300]}")
                    if _repeats_a_control(args, text):
                        problems.append(f"{tool} {args!r:.120}: the refusal repeats a control character: {text!r}")
            if snapshot(db) != before:
                problems.append(f"the ledger changed: {snapshot(db)} != {before}")
            # The server is still there, and the lease still this session's.
            assert ok(await worker.call_tool("status", {"run_id": run}))["lease"] == 1
        return problems

    with servers(transport, db, tmp_path, worker_args(root), OWNER) as (worker_to, owner_to):
        problems = anyio.run(walk, worker_to, owner_to)
    assert not problems, "\n".join(problems)
