"""``handoff mcp`` through the SDK's own client: real server processes over stdio and HTTP
on the backends another process can share, and in-process servers for the unit checks."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from handoff import Ledger
from handoff.aio import AsyncLedger
from handoff.integrations import mcp_http, mcp_session
from handoff.integrations import mcp_server as ms
from handoff.integrations.mcp_roles import tool_name, verb_tools
from handoff.ledger.errors import InvalidInput
from handoff.lease import heartbeat_interval
from handoff.ledger.store import lease_digest
from handoff.watchdog import watch_once

ROOT = Path(__file__).resolve().parents[2]
#: Runs ``handoff`` in the child, after writing its pid (so a test can SIGKILL the server itself).
LAUNCH = ("import os, sys\n"
          "if sys.argv[1] != '-':\n"
          "    open(sys.argv[1], 'w').write(str(os.getpid()))\n"
          "sys.argv = ['handoff', *sys.argv[2:]]\n"
          "from handoff.cli import main\n"
          "main()\n")
WRITE_TOOLS = {"open", "review", "sanitize", "deliver", "delivered", "delivery_failed", "reopen", "revoke",
               "transfer", "fork", "close", "claim", "heartbeat", "progress", "transition", "artifact",
               "withdraw_artifact", "evidence", "effect_start", "effect_confirm", "block", "unblock", "submit",
               "release"}


def verb_names(role: str) -> set[str]:
    """The verb tools the table of operations gives ``role``."""
    return {tool_name(op) for op in verb_tools(role)}


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("HANDOFF_DB", "HANDOFF_WORKER")}
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return e


def stdio(db: str, *args: str, pidfile: Path | None = None) -> Client:
    params = StdioServerParameters(command=sys.executable,
                                   args=["-c", LAUNCH, str(pidfile or "-"), "--db", db, "mcp", *args], env=env())
    return Client(params)


class Seen:
    """Everything the model was shown, to search for lease tokens afterwards."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def result(self, r: Any) -> Any:
        self.texts.extend(c.text for c in r.content if getattr(c, "text", None) is not None)
        if r.structured_content is not None:
            self.texts.append(json.dumps(r.structured_content))
        return r

    def resource(self, r: Any) -> Any:
        self.texts.extend(c.text for c in r.contents if getattr(c, "text", None) is not None)
        return r

    def assert_no_secret(self, digests: set[str]) -> None:
        """No 43-character URL-safe window of anything shown is a lease secret (its digest
        is what the ledger stored at the claim), nor does any shown text hold one whole."""
        assert digests
        for text in self.texts:
            for run in re.findall(r"[A-Za-z0-9_-]{43,}", text):
                for i in range(len(run) - 42):
                    assert lease_digest(run[i:i + 43]) not in digests, "a lease secret reached the model"


def ok(r: Any) -> dict[str, Any]:
    assert not r.is_error, r.content[0].text
    return r.structured_content if r.structured_content is not None else json.loads(r.content[0].text)


def refused(r: Any) -> str:
    assert r.is_error
    return r.content[0].text


def digests(lg: Ledger, run: str) -> set[str]:
    return {rec.event.token_digest for rec in lg.log(run) if rec.type == "lease_granted"}


def events(db: str, run: str) -> list[Any]:
    with Ledger(db) as lg:
        return list(lg.log(run))


# --- end to end over stdio -------------------------------------------------------------------


def test_a_handoff_walked_end_to_end_by_a_worker_and_an_owner_server(shared_backend, tmp_path):
    db = shared_backend.address()
    root = tmp_path / "work"
    root.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    seen = Seen()
    Ledger(db).close()  # 'handoff mcp' never makes a ledger: a mistyped --db is refused

    async def walk() -> str:
        async with stdio(db, "--as", "owner", "--name", "alice", "--allow-target", f"file://{out}") as owner, \
                stdio(db, "--as", "worker", "--name", "agent-1", "--root", str(root)) as worker:
            owner_tools = {t.name for t in (await owner.list_tools()).tools}
            worker_tools = {t.name for t in (await worker.list_tools()).tools}
            assert {"open", "review", "deliver", "status"} <= owner_tools and "claim" not in owner_tools
            assert {"claim", "progress", "artifact", "submit"} <= worker_tools and "deliver" not in worker_tools
            opened = ok(seen.result(await owner.call_tool("open", {
                "goal": "Write the summary", "target": f"file://{out}", "result_path": str(root / "result.md"),
                "require_review": True})))
            run = opened["run_id"]
            assert opened["owner"] == "alice"
            claimed = ok(seen.result(await worker.call_tool("claim", {"run_id": run})))
            assert claimed["lease"] == 1 and claimed["packet"]["state"] == "queued"
            for tool, args in [("transition", {"to": "planning"}), ("progress", {"kind": "plan_committed"}),
                               ("transition", {"to": "executing"}),
                               ("progress", {"kind": "tool_outcome", "detail": "wrote it"})]:
                ok(seen.result(await worker.call_tool(tool, {"run_id": run, **args})))
            (root / "result.md").write_text("# Summary\n")
            art = ok(seen.result(await worker.call_tool("artifact", {"run_id": run, "path": "result.md"})))
            assert art["lease"] == 1
            ok(seen.result(await worker.call_tool("transition", {"run_id": run, "to": "verifying"})))
            ok(seen.result(await worker.call_tool("evidence", {"run_id": run, "kind": "tests", "outcome": "pass"})))
            assert ok(seen.result(await worker.call_tool("submit", {"run_id": run, "summary": "done"})))[
                "state"] == "ready_for_review"
            ok(seen.result(await owner.call_tool("review", {"run_id": run, "approve": True})))
            sent = ok(seen.result(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "d1"})))
            assert sent["status"] == "confirmed" and sent["state"] == "delivered"
            status = ok(seen.result(await owner.call_tool("status", {"run_id": run})))
            assert status["state"] == "delivered"
            seen.resource(await owner.read_resource(f"handoff://runs/{run}/packet"))
            seen.resource(await worker.read_resource(f"handoff://runs/{run}/report"))
            seen.resource(await worker.read_resource("handoff://runs"))
            for tool, args in [("log", {"run_id": run}), ("report", {"run_id": run}),
                               ("runs", {"include_terminal": True})]:
                assert not seen.result(await owner.call_tool(tool, args)).is_error
            return run

    run = anyio.run(walk)
    assert any(out.iterdir()), "the delivery wrote nothing to the file:// target"
    with Ledger(db) as lg:
        seen.assert_no_secret(digests(lg, run))
        assert lg.status(run)["state"] == "delivered"


def test_a_killed_worker_session_loses_the_lease_and_a_second_session_continues(shared_backend, tmp_path):
    db = shared_backend.address()
    root = tmp_path / "work"
    root.mkdir()
    timeout = 2.0
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout)
    pidfile = tmp_path / "first.pid"

    async def first_then_second() -> tuple[int, str]:
        async with stdio(db, "--as", "worker", "--name", "second", "--root", str(root)) as second_host_later, \
                AsyncExitStack() as stack:
            first = await stack.enter_async_context(
                stdio(db, "--as", "worker", "--name", "first", "--root", str(root), pidfile=pidfile))
            ok(await first.call_tool("claim", {"run_id": run}))
            ok(await first.call_tool("transition", {"run_id": run, "to": "planning"}))
            # The second session's claim is refused while the first holds the run.
            assert "LeaseHeld" in refused(await second_host_later.call_tool("claim", {"run_id": run}))
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            killed_at = time.monotonic()
            try:
                await stack.aclose()
            except Exception:  # the server is gone; whether the client's exit notices depends on timing
                pass
            # The watchdog revokes once the heartbeat timeout has passed since the last beat.
            deadline = killed_at + timeout * 20 + 30
            revoked_seq = None
            await anyio.sleep(timeout)
            while revoked_seq is None:
                assert time.monotonic() < deadline, "the watchdog never revoked the killed worker's lease"
                with Ledger(db) as lg:
                    watch_once(lg, name="test-watchdog")
                    revoked = [r for r in lg.log(run) if r.type == "lease_revoked"]
                if revoked:
                    revoked_seq = revoked[0].seq
                else:
                    await anyio.sleep(timeout / 4)
            claimed = ok(await second_host_later.call_tool("claim", {"run_id": run}))
            ok(await second_host_later.call_tool("progress", {"run_id": run, "kind": "plan_committed"}))
            return revoked_seq, claimed["lease"]

    revoked_seq, second_lease = anyio.run(first_then_second)
    assert second_lease == 2
    log = events(db, run)
    after = [r for r in log if r.seq > revoked_seq]
    assert after and all(r.lease != 1 for r in after), "the first session wrote after the revoke"
    # The second session ended when its host closed stdio: its lease was released, saying why.
    released = [r for r in log if r.type == "lease_released"]
    assert released and released[-1].lease == 2 and "MCP session ended" in released[-1].event.reason


def test_the_second_claim_is_refused_while_the_first_session_holds_the_run(shared_backend, tmp_path):
    db = shared_backend.address()
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")

    async def both() -> str:
        async with stdio(db, "--as", "worker", "--name", "a", "--root", str(tmp_path)) as a, \
                stdio(db, "--as", "worker", "--name", "b", "--root", str(tmp_path)) as b:
            ok(await a.call_tool("claim", {"run_id": run}))
            before = len(events(db, run))
            text = refused(await b.call_tool("claim", {"run_id": run}))
            assert len(events(db, run)) == before
            return text

    assert "LeaseHeld" in anyio.run(both)


# --- roles, refusals and liveness, in process -------------------------------------------------


async def _inprocess(address: str, config: ms.Config, body: Any, mode: str = "auto") -> Any:
    async with AsyncLedger(address) as alg:
        session = mcp_session.Session("test")
        server = ms.build(alg, config, mcp_session.Sessions(alg, single=session))
        async with Client(server, mode=mode) as client:
            return await body(client, alg, session)


def test_the_auditor_lists_no_write_tool_and_a_forged_call_is_refused(backend, tmp_path):
    address = backend.address()

    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="alice")
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"runs", "status", "stalls", "log", "replay", "diff", "report"}
        assert not names & WRITE_TOOLS
        before = [r.seq async for r in alg.log(run)]
        for tool, args in [("open", {"goal": "g", "target": "chat:#x"}), ("claim", {"run_id": run}),
                           ("revoke", {"run_id": run, "reason": "r"}), ("close", {"run_id": run,
                                                                                 "disposition": "cancelled"})]:
            assert tool in refused(await client.call_tool(tool, args))
        assert [r.seq async for r in alg.log(run)] == before

    anyio.run(_inprocess, address, ms.Config(), body)


def test_the_worker_role_cannot_deliver(backend, tmp_path):
    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="w1")
        names = {t.name for t in (await client.list_tools()).tools}
        assert "deliver" not in names and "review" not in names and "claim" in names
        before = [r.seq async for r in alg.log(run)]
        assert refused(await client.call_tool("deliver", {"run_id": run, "delivery_key": "k"}))
        assert [r.seq async for r in alg.log(run)] == before

    anyio.run(_inprocess, backend.address(), ms.Config(role="worker", name="w1", root=str(tmp_path)), body)


def test_refusals_are_tool_errors_with_the_ledgers_message_and_write_nothing(backend, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("x")

    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="alice")
        assert "InvalidInput" in refused(await client.call_tool("progress", {"run_id": run, "kind": "note"}))
        ok(await client.call_tool("claim", {"run_id": run}))
        before = [r.seq async for r in alg.log(run)]
        # The ledger's rule, in its own words: plan_committed is progress in planning only.
        text = refused(await client.call_tool("progress", {"run_id": run, "kind": "plan_committed"}))
        assert "IllegalProgress" in text and "planning" in text
        # A path outside --root.
        assert "outside the declared root" in refused(
            await client.call_tool("artifact", {"run_id": run, "path": str(outside)}))
        # Bad arguments are the schema's: the field is named.
        text = refused(await client.call_tool("transition", {"run_id": run}))
        assert "to" in text and "required" in text.lower()
        text = refused(await client.call_tool("evidence", {"run_id": run, "kind": "tests", "outcome": "maybe"}))
        assert "outcome" in text
        assert [r.seq async for r in alg.log(run)] == before
        # The server is still there.
        assert ok(await client.call_tool("status", {"run_id": run}))["lease"] == 1

    anyio.run(_inprocess, backend.address(), ms.Config(role="worker", name="w1", root=str(tmp_path)), body)


def test_pings_heartbeat_a_held_lease_and_silence_does_not(tmp_path):
    timeout = 0.6
    interval = heartbeat_interval(timeout)

    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout)

        async def beats() -> int:
            return len([r async for r in alg.log(run) if r.type == "heartbeat_recorded"])

        ok(await client.call_tool("claim", {"run_id": run}))
        await anyio.sleep(interval * 2)
        assert await beats() == 0  # silence: nothing beats for the session
        await client.send_ping()
        assert await beats() == 1  # the ping proved the host alive, and a beat was due
        await client.send_ping()
        assert await beats() == 1  # not due again yet
        assert session.held[run].number == 1

    # ping exists in the handshake era only (the 2026 protocol dropped it; tool calls count there).
    anyio.run(_inprocess, f"sqlite://{tmp_path / 'l.db'}", ms.Config(role="worker", name="w1", root=str(tmp_path)),
              body, "legacy")


def test_the_worker_role_refuses_to_start_without_a_root(tmp_path):
    with pytest.raises(InvalidInput, match="--root"):
        ms.check_config(ms.Config(role="worker", name="w1"))
    proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", str(tmp_path / "l.db"), "mcp", "--as",
                           "worker"], env=env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "--root" in proc.stderr and "Traceback" not in proc.stderr


def test_without_the_extra_the_command_says_how_to_install_it(tmp_path):
    code = ("import sys\nsys.modules['mcp'] = None\n"
            f"sys.argv = ['handoff', '--db', {str(tmp_path / 'l.db')!r}, 'mcp']\n"
            "from handoff.cli import main\nmain()\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    from handoff.ledger.extras import install_hint
    assert install_hint("mcp") in " ".join(proc.stderr.split())
    assert "handoff-ledger[" not in proc.stderr and "Traceback" not in proc.stderr


# --- HTTP ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    def __init__(self, db: str, host: str, *args: str, tmp: Path) -> None:
        self.port = free_port()
        self.errors = tmp / f"http-{self.port}.err"
        with open(self.errors, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "handoff.cli", "--db", db, "mcp", "--http",
                                          f"{host}:{self.port}", *args], env=env(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60  # start-up only; no request is timed
        while "serving http://" not in self.errors.read_text():  # the server names its address once it listens
            assert self.proc.poll() is None, self.errors.read_text()
            assert time.monotonic() < deadline, self.errors.read_text()
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def post(self, headers: dict[str, str]) -> int:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        req = urllib.request.Request(self.url, data=body.encode(), method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_http_beyond_loopback_refuses_to_start_without_a_token(tmp_path):
    with pytest.raises(InvalidInput, match="--token-file"):
        mcp_http.check_http("0.0.0.0", None)
    mcp_http.check_http("127.0.0.1", None)
    mcp_http.check_http("::1", None)
    proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", str(tmp_path / "l.db"), "mcp", "--http",
                           "0.0.0.0:0"], env=env(), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "--token-file" in proc.stderr and "Traceback" not in proc.stderr


def test_http_on_loopback_serves_the_sdk_client_and_refuses_a_foreign_origin(shared_backend, tmp_path):
    db = shared_backend.address()
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")
    server = HttpServer(db, "127.0.0.1", tmp=tmp_path)
    try:
        assert server.post({"Origin": "http://evil.example"}) == 403
        assert server.post({}) == 200

        async def read() -> dict[str, Any]:
            async with Client(server.url) as client:
                return ok(await client.call_tool("status", {"run_id": run}))

        assert anyio.run(read)["run_id"] == run
    finally:
        server.stop()


def test_http_beyond_loopback_needs_the_token_and_refuses_any_origin(shared_backend, tmp_path):
    db = shared_backend.address()
    Ledger(db).close()  # 'handoff mcp' never makes a ledger
    token = "t0k3n-" + os.urandom(16).hex()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    # 0.0.0.0 is what "beyond loopback" means; without the token nothing is served.
    server = HttpServer(db, "0.0.0.0", "--token-file", str(token_file), tmp=tmp_path)
    try:
        assert server.post({}) == 401
        assert server.post({"Authorization": "Bearer wrong-token-of-some-length"}) == 401
        assert server.post({"Authorization": f"Bearer {token}"}) == 200
        assert server.post({"Authorization": f"Bearer {token}", "Origin": "http://evil.example"}) == 403
    finally:
        server.stop()


def test_a_refusal_reads_exactly_as_the_ledgers_typed_message(backend, tmp_path):
    """No SDK wrapping ("Error executing tool ..."): the model reads the ledger's own text."""

    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="alice")
        ok(await client.call_tool("claim", {"run_id": run}))
        before = [r.seq async for r in alg.log(run)]
        r = await client.call_tool("progress", {"run_id": run, "kind": "plan_committed"})
        assert r.is_error and len(r.content) == 1
        # The same refusal straight from the library, with the same token: the text must match it.
        try:
            await alg.progress(run, session.held[run].token, "plan_committed")
        except ms.LedgerError as exc:
            expected = f"{exc.type}: {exc.message}"
        else:
            raise AssertionError("the ledger accepted plan_committed in queued")
        assert r.content[0].text == expected and expected.startswith("IllegalProgress: ")
        assert [r.seq async for r in alg.log(run)] == before

    anyio.run(_inprocess, backend.address(), ms.Config(role="worker", name="w1", root=str(tmp_path)), body)


# --- the owner's and the operator's paths, in process ------------------------------------------


async def _people(address: str, root: Path, body: Any, *roles: ms.Config) -> Any:
    """One ledger, one in-process server per config (each its own session), their clients."""
    async with AsyncLedger(address) as alg, AsyncExitStack() as stack:
        clients = []
        for config in roles:
            server = ms.build(alg, config, mcp_session.Sessions(alg, single=mcp_session.Session(config.role)))
            clients.append(await stack.enter_async_context(Client(server)))
        return await body(alg, *clients)


def owner_cfg(name: str = "alice") -> ms.Config:
    return ms.Config(role="owner", name=name)


def worker_cfg(root: Path, name: str = "w1") -> ms.Config:
    return ms.Config(role="worker", name=name, root=str(root))


async def seqs(alg: AsyncLedger, run: str) -> list[int]:
    return [r.seq async for r in alg.log(run)]


def test_an_owner_finishes_a_public_delivery_through_the_gate_a_reopen_and_a_send_by_hand(backend, tmp_path):
    """The gate refuses a result with a private path; the owner checks, reopens, the worker
    withdraws and records the clean file, the check passes, and the owner records a send by
    hand: first failed, then delivered under a new key."""
    root = tmp_path / "work"
    root.mkdir()
    report = root / "report.md"

    async def body(alg: AsyncLedger, owner: Client, worker: Client) -> None:
        run = ok(await owner.call_tool("open", {"goal": "g", "target": f"file://{tmp_path / 'out'}",
                                                "result_path": str(report), "public": True}))["run_id"]
        ok(await worker.call_tool("claim", {"run_id": run}))
        for tool, args in [("transition", {"to": "planning"}), ("transition", {"to": "executing"})]:
            ok(await worker.call_tool(tool, {"run_id": run, **args}))
        report.write_text("# Report\n\nLogs are in /home/alice/incident/logs.txt\n")
        ok(await worker.call_tool("artifact", {"run_id": run, "path": "report.md"}))
        ok(await worker.call_tool("transition", {"run_id": run, "to": "verifying"}))
        ok(await worker.call_tool("evidence", {"run_id": run, "kind": "tests", "outcome": "pass"}))
        assert ok(await worker.call_tool("submit", {"run_id": run}))["state"] == "succeeded"

        before = await seqs(alg, run)
        assert refused(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1", "send": False})
                       ).startswith("SanitizationRequired: ")
        assert await seqs(alg, run) == before
        checked = ok(await owner.call_tool("sanitize", {"run_id": run}))
        assert checked["passed"] is False and checked["findings"]
        assert "/home/alice" not in json.dumps(checked)  # where, never what
        assert ok(await owner.call_tool("reopen", {"run_id": run, "reason": "a private path"}))["state"] == \
            "verifying"

        # The worker still holds its lease after submit; its claim (a confused retry) answers with it.
        assert ok(await worker.call_tool("claim", {"run_id": run}))["lease"] == 1
        ok(await worker.call_tool("withdraw_artifact", {"run_id": run, "path": "report.md",
                                                        "reason": "it named a private path"}))
        report.write_text("# Report\n\nThe service recovered at 10:04.\n")
        ok(await worker.call_tool("artifact", {"run_id": run, "path": "report.md"}))
        assert ok(await worker.call_tool("submit", {"run_id": run}))["state"] == "succeeded"

        assert ok(await owner.call_tool("sanitize", {"run_id": run}))["passed"] is True
        ok(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1", "send": False}))
        ok(await owner.call_tool("delivery_failed", {"run_id": run, "delivery_key": "v1", "error": "the channel refused"}))
        ok(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v2", "send": False}))
        done = ok(await owner.call_tool("delivered", {"run_id": run, "delivery_key": "v2", "receipt": "msg-42"}))
        assert done["state"] == "delivered"
        packet = ok(await owner.call_tool("status", {"run_id": run}))
        assert packet["state"] == "delivered"
        people = [r.actor async for r in alg.log(run) if r.type in (
            "sanitization_checked", "run_reopened", "delivery_failed", "delivery_confirmed")]
        assert people and set(people) == {"owner:alice"}

    anyio.run(_people, backend.address(), root, body,
              ms.Config(role="owner", name="alice", allow_targets=(f"file://{tmp_path / 'out'}",)), worker_cfg(root))


def test_an_owner_clears_a_blocker_reconciles_a_side_effect_and_forks_its_own_run_only(backend, tmp_path):
    async def body(alg: AsyncLedger, owner: Client, worker: Client, mallory: Client) -> None:
        run = ok(await owner.call_tool("open", {"goal": "g", "target": "chat:#ops"}))["run_id"]
        ok(await worker.call_tool("claim", {"run_id": run}))
        ok(await worker.call_tool("transition", {"run_id": run, "to": "planning"}))
        ok(await worker.call_tool("block", {"run_id": run, "reason": "needs the deploy key",
                                            "next_action": "the owner grants it"}))
        assert ok(await owner.call_tool("unblock", {"run_id": run, "resolution": "granted"}))["state"] == "planning"
        ok(await worker.call_tool("transition", {"run_id": run, "to": "executing"}))
        ok(await worker.call_tool("effect_start", {"run_id": run, "effect_key": "deploy-1", "what": "POST /deploy"}))
        assert ok(await owner.call_tool("revoke", {"run_id": run, "reason": "the worker hung"}))["state"] == \
            "unknown"
        ok(await owner.call_tool("effect_confirm", {"run_id": run, "effect_key": "deploy-1", "outcome": "done",
                                                    "note": "the deploy log shows v42"}))
        packet = ok(await owner.call_tool("status", {"run_id": run}))
        assert packet["pending_effects"] == [] and packet["health"]["action"] == "claim"

        # Another owner may not fork alice's run: refused, no child written.
        at = (await seqs(alg, run))[2]
        text = refused(await mallory.call_tool("fork", {"run_id": run, "at_seq": at, "new_run_id": "child-m"}))
        assert text.startswith("NotAuthorized: ")
        with pytest.raises(ms.LedgerError):
            await alg.status("child-m")
        forked = ok(await owner.call_tool("fork", {"run_id": run, "at_seq": at, "new_run_id": "child-a"}))
        assert forked["run_id"] == "child-a" and forked["packet"]["state"] == "planning"
        assert [r.actor async for r in alg.log("child-a")][-1] == "owner:alice"

    anyio.run(_people, backend.address(), tmp_path, body, owner_cfg(), worker_cfg(tmp_path), owner_cfg("mallory"))


def test_an_operator_reconciles_forks_and_closes_with_a_reason(backend, tmp_path):
    async def body(alg: AsyncLedger, operator: Client, worker: Client) -> None:
        names = {t.name for t in (await operator.list_tools()).tools}
        assert names >= verb_names("operator") and not names & {"open", "review", "deliver", "sanitize", "claim"}
        run = await alg.open(goal="g", target="chat:#ops", owner="alice")
        ok(await worker.call_tool("claim", {"run_id": run}))
        ok(await worker.call_tool("transition", {"run_id": run, "to": "planning"}))
        ok(await worker.call_tool("effect_start", {"run_id": run, "effect_key": "k", "what": "charge the card"}))
        ok(await operator.call_tool("revoke", {"run_id": run, "reason": "stuck"}))
        ok(await operator.call_tool("effect_confirm", {"run_id": run, "effect_key": "k", "outcome": "absent"}))
        child = ok(await operator.call_tool("fork", {"run_id": run, "at_seq": 1}))["run_id"]
        assert [r.actor async for r in alg.log(child)][-1] == "operator:ops"
        before = await seqs(alg, run)
        assert refused(await operator.call_tool("close", {"run_id": run, "disposition": "cancelled"})
                       ).startswith("InvalidInput: ")
        assert await seqs(alg, run) == before
        ok(await operator.call_tool("close", {"run_id": run, "disposition": "cancelled", "reason": "superseded"}))
        assert [r.actor async for r in alg.log(run) if r.type == "run_closed"] == ["operator:ops"]

    anyio.run(_people, backend.address(), tmp_path, body, ms.Config(role="operator", name="ops"),
              worker_cfg(tmp_path))


def test_a_worker_and_an_auditor_cannot_call_the_owners_or_the_operators_tools(backend, tmp_path):
    async def body(alg: AsyncLedger, worker: Client, auditor: Client) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="w1")
        people = verb_names("owner") | verb_names("operator")
        args = {"run_id": run, "delivery_key": "k", "effect_key": "k", "receipt": "r", "error": "e", "reason": "r", "at_seq": 1,
                "goal": "g", "target": "chat:#x", "approve": True, "disposition": "cancelled", "action": "deliver",
                "to": "w2", "resolution": "r", "outcome": "done"}
        for client, mine in ((worker, {"unblock", "effect_confirm"}), (auditor, set())):
            names = {t.name for t in (await client.list_tools()).tools}
            assert not names & (people - mine)
            before = await seqs(alg, run)
            for tool in sorted(people - mine):
                assert tool in refused(await client.call_tool(tool, args))
            assert await seqs(alg, run) == before
            assert [r.run_id async for r in alg.log(run)]  # the run is still there, and nothing else was made

    anyio.run(_people, backend.address(), tmp_path, body, worker_cfg(tmp_path, "w1"), ms.Config())


def test_a_claim_by_the_session_that_holds_the_run_answers_with_its_lease(backend, tmp_path):
    """The ledger's LeaseHeld would tell a model to use a token it never saw: a session's
    repeated claim answers with the lease it holds, and writes nothing."""

    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        run = await alg.open(goal="g", target="chat:#ops", owner="alice")
        assert ok(await client.call_tool("claim", {"run_id": run}))["lease"] == 1
        before = await seqs(alg, run)
        again = ok(await client.call_tool("claim", {"run_id": run}))
        assert again["lease"] == 1 and again["already_held"] is True
        assert await seqs(alg, run) == before
        # Once the lease is gone (revoked), the session's claim takes a new one.
        await alg.revoke(run, "test", by="ops")
        assert ok(await client.call_tool("claim", {"run_id": run}))["lease"] == 2
        assert session.held[run].number == 2

    anyio.run(_inprocess, backend.address(), worker_cfg(tmp_path), body)


# --- a worker over streamable HTTP --------------------------------------------------------------


def test_the_installed_sdk_still_keeps_the_connection_where_connection_of_reads_it():
    """connection_of reads ServerSession._connection (no public route in mcp 2.x): if an SDK
    release moves it, this fails here, by name, before any lease goes unreleased."""
    from mcp.server.connection import Connection
    from mcp.server.session import ServerSession

    connection = Connection.for_loop(None, session_id="s-1")  # type: ignore[arg-type]
    assert mcp_session.connection_of(ServerSession(None, connection)) is connection  # type: ignore[arg-type]
    assert isinstance(connection.state, dict) and hasattr(connection.exit_stack, "push_async_callback")

    class Moved:
        pass

    with pytest.raises(mcp_session.SdkChanged, match="_connection"):
        mcp_session.connection_of(Moved())


def test_an_sdk_that_moved_the_connection_leaves_reads_working_and_refuses_claim(backend, tmp_path, monkeypatch):
    """What a user would meet if an SDK release moved the attribute before the server followed."""

    def moved(request_session: Any) -> Any:
        raise mcp_session.SdkChanged("moved")

    monkeypatch.setattr(mcp_session, "connection_of", moved)

    async def body() -> None:
        async with AsyncLedger(backend.address()) as alg:
            run = await alg.open(goal="g", target="chat:#ops", owner="alice")
            server = ms.build(alg, worker_cfg(tmp_path), mcp_session.Sessions(alg))  # the HTTP kind: no single session
            async with Client(server, mode="legacy") as client:
                assert ok(await client.call_tool("status", {"run_id": run}))["run_id"] == run
                before = await seqs(alg, run)
                assert (await client.call_tool("claim", {"run_id": run})).is_error
                assert await seqs(alg, run) == before

    anyio.run(body)


def worker_http(db: str, root: Path, tmp: Path, name: str = "agent-1") -> HttpServer:
    return HttpServer(db, "127.0.0.1", "--as", "worker", "--name", name, "--root", str(root), tmp=tmp)


def wait_for(what: str, deadline_s: float, probe: Any, pause_s: float) -> Any:
    """``probe()`` until it returns something truthy, failing after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not (got := probe()):
        assert time.monotonic() < deadline, f"{what} did not happen within {deadline_s:.0f}s"
        time.sleep(pause_s)
    return got


def test_a_worker_over_http_claims_works_submits_and_its_lease_is_released_when_the_session_ends(
        shared_backend, tmp_path):
    db = shared_backend.address()
    root = tmp_path / "work"
    root.mkdir()
    (root / "result.md").write_text("# Result\n")
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", result_path=str(root / "result.md"))
    server = worker_http(db, root, tmp_path)
    seen = Seen()
    try:
        async def work() -> None:
            # A lease needs a session: the handshake era (mode legacy) gives one an Mcp-Session-Id.
            async with Client(server.url, mode="legacy") as worker:
                claimed = ok(seen.result(await worker.call_tool("claim", {"run_id": run})))
                assert claimed["lease"] == 1
                for tool, args in [("transition", {"to": "planning"}), ("progress", {"kind": "plan_committed"}),
                                   ("transition", {"to": "executing"}), ("artifact", {"path": "result.md"}),
                                   ("transition", {"to": "verifying"}),
                                   ("evidence", {"kind": "tests", "outcome": "pass"})]:
                    ok(seen.result(await worker.call_tool(tool, {"run_id": run, **args})))
                assert ok(seen.result(await worker.call_tool("submit", {"run_id": run})))["state"] == "succeeded"
            # Leaving the block closes the session (DELETE); the server releases what it held.

        anyio.run(work)

        def released() -> list[Any]:
            return [r for r in events(db, run) if r.type == "lease_released"]

        # The release follows the DELETE without any timer: the deadline only bounds a broken server.
        [rec] = wait_for("the release at session end", 60, released, 0.05)
        assert rec.lease == 1 and rec.event.reason == mcp_session.SESSION_ENDED_HTTP
    finally:
        server.stop()
    with Ledger(db) as lg:
        seen.assert_no_secret(digests(lg, run))
        assert lg.status(run)["state"] == "succeeded" and lg.status(run)["lease"] is None


def test_an_http_session_that_goes_silent_loses_its_lease_to_the_watchdog(shared_backend, tmp_path):
    db = shared_backend.address()
    timeout = 1.5
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout)
    server = worker_http(db, tmp_path, tmp_path)
    try:
        async def silent() -> tuple[int, str]:
            async with Client(server.url, mode="legacy") as worker:
                ok(await worker.call_tool("claim", {"run_id": run}))
                ok(await worker.call_tool("transition", {"run_id": run, "to": "planning"}))
                # Silence: no call, no ping. The watchdog revokes once the timeout has passed.
                await anyio.sleep(timeout)

                def revoked() -> list[Any]:
                    with Ledger(db) as lg:
                        watch_once(lg, name="test-watchdog")
                        return [r.seq for r in lg.log(run) if r.type == "lease_revoked"]

                [seq] = await anyio.to_thread.run_sync(
                    lambda: wait_for("the watchdog's revoke", timeout * 20 + 30, revoked, timeout / 4))
                # The session's next write is refused in the ledger's words, and lands nothing.
                text = refused(await worker.call_tool("progress", {"run_id": run, "kind": "plan_committed"}))
                return seq, text

        revoked_seq, text = anyio.run(silent)
        assert text.startswith("StaleLease: ")
    finally:
        server.stop()
    log = events(db, run)
    assert not [r for r in log if r.seq > revoked_seq and r.actor == "worker:agent-1"], \
        "the silent session wrote after the revoke"
    assert not [r for r in log if r.type == "lease_released"]  # a revoked lease is not released again


def test_the_runs_listing_filters_and_pages_through_the_librarys_listing(backend, tmp_path):
    async def body(client: Client, alg: AsyncLedger, session: Any) -> None:
        mine = [await alg.open(goal="g", target="chat:#ops", owner="alice") for _ in range(3)]
        other = await alg.open(goal="g", target="chat:#other", owner="alice")
        await alg.open(goal="g", target="chat:#ops", owner="bob")
        seen: list[str] = []
        after = None
        while True:
            page = ok(await client.call_tool("runs", {"owner": "alice", "target": "chat:#ops", "limit": 2,
                                                      **({"after": after} if after else {})}))
            seen += [row["run_id"] for row in page["runs"]]
            if not page["next"]:
                break
            after = page["next"]
        assert sorted(seen) == sorted(mine)
        assert ok(await client.call_tool("runs", {"states": ["planning"]}))["runs"] == []
        # The worker and health filters are the library's own (``handoff runs``).
        await alg.claim(mine[0], "agent-7")
        held = ok(await client.call_tool("runs", {"worker": "agent-7"}))["runs"]
        assert [row["run_id"] for row in held] == [mine[0]]
        unclaimed = ok(await client.call_tool("runs", {"health": ["unclaimed"], "owner": "alice"}))["runs"]
        assert {row["run_id"] for row in unclaimed} == {*mine[1:], other}

    anyio.run(_inprocess, backend.address(), ms.Config(), body)
