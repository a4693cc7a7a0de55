"""``handoff mcp`` against a web page and a model that read the wrong thing: DNS rebinding on
every loopback spelling, delivery targets only as --allow-target says, a lease kept through
a locked store, and no ledger made from a mistyped --db. Real server processes throughout
(the SDK's client over stdio, plain HTTP requests with the headers a browser would send)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from handoff import Ledger
from handoff.integrations import mcp_http, mcp_session
from handoff.integrations import mcp_server as ms
from handoff.lease import fence_margin, heartbeat_interval
from handoff.watchdog import watch_once

from .test_mcp_server import LAUNCH, env, ok, refused, stdio

#: Start-up of a server process only (an interpreter and the SDK loading on a busy machine);
#: no request and no wait of the ledger's is bounded by it.
START_S = 60


# --- HTTP on loopback: the Host and Origin a page brought here by DNS rebinding carries -------------


class Served:
    """``handoff mcp --http ADDRESS:0`` in a process of its own; the URL is the one it printed."""

    def __init__(self, db: str, address: str, *args: str, tmp: Path) -> None:
        self.errors = tmp / f"mcp-http-{os.getpid()}-{time.monotonic_ns()}.err"
        with open(self.errors, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "handoff.cli", "--db", db, "mcp", "--http",
                                          f"{address}:0", *args], env=env(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + START_S
        while not (found := re.search(r"serving (http://\S+/mcp) as", self.errors.read_text())):
            assert self.proc.poll() is None, self.errors.read_text()
            assert time.monotonic() < deadline, self.errors.read_text()
            time.sleep(0.05)
        self.url = found.group(1)
        m = re.fullmatch(r"http://(\[[^\]]+\]|[^:/]+):(\d+)/mcp", self.url)
        assert m, f"the printed URL {self.url} is not one a client can use"
        self.host, self.port = m.group(1), int(m.group(2))
        self.connect_to = self.host.strip("[]")

    def request(self, body: dict[str, Any], *, host: str, origin: str | None = None, session: str | None = None,
                era: str = "2025-06-18") -> tuple[int, dict[str, str], str]:
        """One POST with exactly these Host and Origin headers (as a browser would send them)."""
        conn = http.client.HTTPConnection(self.connect_to, self.port, timeout=START_S)
        try:
            conn.putrequest("POST", "/mcp", skip_host=True, skip_accept_encoding=True)
            headers = {"Host": host, "Content-Type": "application/json",
                       "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": era}
            if origin is not None:
                headers["Origin"] = origin
            if session is not None:
                headers["Mcp-Session-Id"] = session
            data = json.dumps(body).encode()
            headers["Content-Length"] = str(len(data))
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders(data)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def session(self, *, host: str, origin: str | None = None) -> tuple[int, str | None]:
        """The handshake (initialize, then initialized): its status and the session id given."""
        status, headers, _ = self.request({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}},
            host=host, origin=origin)
        sid = headers.get("mcp-session-id")
        if status == 200 and sid:
            self.request({"jsonrpc": "2.0", "method": "notifications/initialized"}, host=host, origin=origin,
                         session=sid)
        return status, sid

    def open_run(self, *, host: str, origin: str | None = None, session: str | None = None,
                 era: str = "2025-06-18") -> tuple[int, str]:
        status, _, text = self.request({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "open", "arguments": {"goal": "exfiltrate", "target": "chat:#attacker"}}},
            host=host, origin=origin, session=session, era=era)
        return status, text

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _runs(db: str) -> list[str]:
    with Ledger(db) as lg:
        return list(lg.run_ids())


#: Every spelling of a loopback address a server may be started on without a token.
LOOPBACK = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "localhost", "[::1]", "[0:0:0:0:0:0:0:1]",
            "[::ffff:127.0.0.1]"]


@pytest.mark.parametrize("address", LOOPBACK)
def test_a_page_brought_here_by_dns_rebinding_is_refused_on_every_loopback_spelling(tmp_path, address):
    db = str(tmp_path / "l.db")
    Ledger(db).close()
    assert mcp_http.is_loopback(address.strip("[]"))
    server = Served(db, address, "--as", "owner", "--name", "alice", tmp=tmp_path)
    try:
        port = server.port
        # The attack as the issue tried it: the page's own name in Host and Origin.
        evil_host, evil_origin = f"attacker.example:{port}", f"http://attacker.example:{port}"
        assert server.session(host=evil_host, origin=evil_origin) == (421, None)
        assert server.open_run(host=evil_host, origin=evil_origin)[0] == 421
        assert server.open_run(host=evil_host)[0] == 421
        # The stateless era of the protocol (no handshake, no session) is guarded the same.
        assert server.open_run(host=evil_host, origin=evil_origin, era="2026-07-28")[0] == 421
        assert server.open_run(host=f"{server.host}:{port}", era="2026-07-28")[0] != 421  # (the Host refused it)
        # The right Host but a foreign page: the Origin is refused.
        assert server.session(host=f"{server.host}:{port}", origin=evil_origin) == (403, None)
        # Another port of this machine is another site too.
        assert server.session(host=f"{server.host}:{port + 1}")[0] == 421
        assert _runs(db) == []
        # The host's own requests (its Host, no Origin or its own page's) are served, and write.
        status, sid = server.session(host=f"{server.host}:{port}")
        assert status == 200 and sid
        assert server.session(host=f"localhost:{port}", origin=f"http://localhost:{port}")[0] == 200
        status, text = server.open_run(host=f"{server.host}:{port}", session=sid)
        assert status == 200 and '"isError":false' in text.replace(" ", "")
        assert len(_runs(db)) == 1
    finally:
        server.stop()


def test_the_printed_url_of_an_ipv6_server_is_one_a_client_can_use(tmp_path):
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice")
    server = Served(db, "[::1]", tmp=tmp_path)
    try:
        assert server.url == f"http://[::1]:{server.port}/mcp"

        async def read() -> dict[str, Any]:
            async with Client(server.url) as client:
                return ok(await client.call_tool("status", {"run_id": run}))

        assert anyio.run(read)["run_id"] == run
    finally:
        server.stop()


@pytest.mark.parametrize("address", ["[::1]", "127.0.0.2"])
def test_host_forms_name_the_address_served_and_localhost_only(address):
    forms = mcp_http.host_forms(address.strip("[]"), 8766)
    assert "localhost:8766" in forms and f"{address}:8766" in forms
    assert not [f for f in forms if not f.endswith(":8766")]
    assert "attacker.example:8766" not in forms


# --- delivery targets through MCP --------------------------------------------------------------


def _marker_target(tmp_path: Path) -> tuple[str, Path]:
    marker = tmp_path / "the-command-ran"
    script = tmp_path / "hook.py"
    script.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    return f"cmd:{sys.executable} {script}", marker


def _submitted(lg: Ledger, run: str, tmp_path: Path) -> None:
    art = tmp_path / "report.md"
    art.write_text("# Report\n")
    tok = lg.claim(run, "w1")
    for state in ("planning", "executing"):
        lg.transition(run, tok, state)
    lg.artifact(run, tok, str(art))
    lg.transition(run, tok, "verifying")
    lg.evidence(run, "tests", "pass", lease=tok)
    lg.submit(run, tok, "done")


def _log(db: str, run: str) -> list[tuple[int, str]]:
    with Ledger(db) as lg:
        return [(r.seq, r.type) for r in lg.log(run)]


def test_an_owner_model_cannot_open_a_run_that_would_run_a_command_or_send_anywhere(shared_backend, tmp_path):
    db = shared_backend.address()
    Ledger(db).close()
    (tmp_path / "box").mkdir()
    target, marker = _marker_target(tmp_path)
    owned = tmp_path / "owned"
    refused_targets = [target, f"cmd:sh -c 'id > {owned}'", "https://attacker.example/collect",
                       "http://127.0.0.1:9/x", f"file://{tmp_path / 'box'}"]

    async def walk() -> list[str]:
        texts = []
        async with stdio(db, "--as", "owner", "--name", "alice") as owner:
            for t in refused_targets:
                texts.append(refused(await owner.call_tool("open", {"goal": "g", "target": t})))
            # A target a person delivers is not an order to the server: it opens.
            ok(await owner.call_tool("open", {"goal": "g", "target": "chat:#ops", "run_id": "by-hand"}))
        return texts

    texts = anyio.run(walk)
    assert all(t.startswith("TargetNotAllowed: ") and "--allow-target" in t for t in texts), texts
    with Ledger(db) as lg:
        assert list(lg.run_ids()) == ["by-hand"]
    assert not marker.exists() and not owned.exists() and not list((tmp_path / "box").iterdir())


def test_a_run_opened_elsewhere_with_a_command_target_is_not_sent_through_mcp(shared_backend, tmp_path):
    db = shared_backend.address()
    target, marker = _marker_target(tmp_path)
    # Opened through the command line (a contract file, a script): the target is a command.
    opened = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, "open", "--goal", "g", "--target",
                             target, "--owner", "alice"], env=env(), capture_output=True, text=True,
                            timeout=START_S, stdin=subprocess.DEVNULL)
    assert opened.returncode == 0, opened.stderr
    run = opened.stdout.strip()
    with Ledger(db) as lg:
        _submitted(lg, run, tmp_path)
    before = _log(db, run)

    async def deliver(*args: str) -> tuple[str, Any]:
        async with stdio(db, "--as", "owner", "--name", "alice", *args) as owner:
            text = refused(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1"})) if not args else ""
            if not args:
                return text, None
            return text, ok(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1"}))

    text, _ = anyio.run(deliver)
    assert text.startswith("TargetNotAllowed: ") and "is a command" in text
    assert _log(db, run) == before and not marker.exists()
    # Allowed by whoever started the server (a prefix of the command's words): it runs, once.
    prefix = target.rsplit(" ", 1)[0] + " *"
    _, sent = anyio.run(deliver, "--allow-target", prefix)
    assert sent["status"] == "confirmed" and marker.exists()


def test_the_ledgers_own_list_holds_even_when_the_server_allows_the_target(shared_backend, tmp_path):
    db = shared_backend.address()
    target, marker = _marker_target(tmp_path)
    with Ledger(db) as lg:
        run = lg.open(goal="g", target=target, owner="alice")
        _submitted(lg, run, tmp_path)
        lg.allow_targets("https://hooks.example.com/services/*")
    before = _log(db, run)

    async def deliver() -> str:
        async with stdio(db, "--as", "owner", "--name", "alice", "--allow-target", "cmd:*") as owner:
            return refused(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1"}))

    text = anyio.run(deliver)
    assert text.startswith("TargetNotAllowed: ") and "ledger's list" in text
    assert _log(db, run) == before and not marker.exists()


def test_a_bad_allow_target_stops_the_server_before_it_starts(tmp_path):
    db = str(tmp_path / "l.db")
    Ledger(db).close()
    proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, "mcp", "--as", "owner", "--name", "a",
                           "--allow-target", "https://hooks.example.com*"], env=env(), capture_output=True,
                          text=True, timeout=START_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "must end its prefix with '/'" in proc.stderr and "Traceback" not in proc.stderr


def test_the_in_process_check_refuses_at_open_and_deliver_and_writes_nothing(backend, tmp_path):
    """The same rule without processes, on every backend (the in-memory one included)."""
    from handoff.aio import AsyncLedger

    target, marker = _marker_target(tmp_path)

    async def body() -> None:
        async with AsyncLedger(backend.address()) as alg:
            server = ms.build(alg, ms.Config(role="owner", name="alice",
                                             allow_targets=("https://hooks.example.com/services/*",)),
                              mcp_session.Sessions(alg, single=mcp_session.Session("t")))
            async with Client(server) as owner:
                assert refused(await owner.call_tool("open", {"goal": "g", "target": target})).startswith(
                    "TargetNotAllowed: ")
                assert await alg.run(lambda lg: list(lg.run_ids())) == []
                run = await alg.open(goal="g", target=target, owner="alice")
                await alg.run(lambda lg: _submitted(lg, run, tmp_path))
                before = [(r.seq, r.type) async for r in alg.log(run)]
                assert refused(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1"})).startswith(
                    "TargetNotAllowed: ")
                assert [(r.seq, r.type) async for r in alg.log(run)] == before
                # Recording a delivery sent by hand runs nothing: allowed.
                assert ok(await owner.call_tool("deliver", {"run_id": run, "delivery_key": "v1", "send": False}))
                ok(await owner.call_tool("open", {"goal": "g", "target": "https://hooks.example.com/services/T1"}))

    anyio.run(body)
    assert not marker.exists()


def test_the_open_tool_tells_the_model_how_many_targets_are_allowed_never_which(tmp_path):
    """An exact webhook address carries the hook's token: the model learns the count and the
    kinds of the server's --allow-target patterns, not the patterns."""
    from handoff.aio import AsyncLedger

    hook = "https://hooks.slack.com/services/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"

    async def body() -> str:
        async with AsyncLedger(str(tmp_path / "l.db")) as alg:
            server = ms.build(alg, ms.Config(role="owner", name="alice", allow_targets=(hook, "cmd:/bin/true *")),
                              mcp_session.Sessions(alg, single=mcp_session.Session("t")))
            async with Client(server) as owner:
                return str([t.model_dump() for t in (await owner.list_tools()).tools])

    tools = anyio.run(body)
    assert "XyZsecretWebhookToken123" not in tools and "/bin/true" not in tools
    assert "2 pattern(s) of kind cmd:, https:" in tools


# --- a lease kept through a locked store ---------------------------------------------------------

#: Holds the ledger's write lock from the moment it reads a line on stdin for the seconds
#: given, then lets go; says "locked" and "free" on stdout. SQLite: BEGIN IMMEDIATE on the
#: file. PostgreSQL: the heads table locked against writes (reads go on, as under SQLite's WAL).
LOCKER = ("import sys, time\n"
          "db, hold = sys.argv[1], float(sys.argv[2])\n"
          "if db.startswith('postgresql://'):\n"
          "    import psycopg\n"
          "    conn = psycopg.connect(db)\n"
          "    sys.stdin.readline()\n"
          "    conn.execute('LOCK TABLE heads IN EXCLUSIVE MODE')\n"
          "else:\n"
          "    import sqlite3\n"
          "    conn = sqlite3.connect(db.removeprefix('sqlite://'), isolation_level=None)\n"
          "    sys.stdin.readline()\n"
          "    conn.execute('BEGIN IMMEDIATE')\n"
          "print('locked', flush=True)\n"
          "time.sleep(hold)\n"
          "conn.commit()\n"
          "print('free', flush=True)\n")


def test_a_worker_keeps_its_lease_through_a_locked_store_and_gives_it_back_when_stdio_closes(shared_backend,
                                                                                            tmp_path):
    db = shared_backend.address()
    timeout, busy, locked_s = 6.0, 0.3, 1.5
    interval, limit = heartbeat_interval(timeout), timeout - fence_margin(timeout)
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout)
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, db, str(locked_s)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)

    def beats() -> int:
        with Ledger(db) as lg:
            return len([r for r in lg.log(run) if r.type == "heartbeat_recorded"])

    async def work() -> tuple[int, int]:
        params = StdioServerParameters(command=sys.executable, env=env(), args=[
            "-c", LAUNCH, "-", "--db", db, "--busy-timeout", str(busy), "mcp", "--as", "worker", "--name", "w1",
            "--root", str(tmp_path)])
        async with Client(params) as worker:
            claimed_at = time.monotonic()
            ok(await worker.call_tool("claim", {"run_id": run}))
            # The server took the lease before answering: an interval from the answer, a beat is due.
            await anyio.sleep(interval)
            assert locker.stdin is not None and locker.stdout is not None
            locker.stdin.write("go\n")
            locker.stdin.flush()
            assert await anyio.to_thread.run_sync(locker.stdout.readline) == "locked\n"
            # The host calls while the file is locked: the due beat cannot be recorded.
            ok(await worker.call_tool("status", {"run_id": run}))
            during = await anyio.to_thread.run_sync(beats)
            assert await anyio.to_thread.run_sync(locker.stdout.readline) == "free\n"
            # The host keeps calling, as a live host does, until the beat lands (or the
            # lease could no longer be proven: then it was lost).
            while (after := await anyio.to_thread.run_sync(beats)) == during:
                assert time.monotonic() - claimed_at < limit, "no heartbeat was recorded after the store answered"
                ok(await worker.call_tool("status", {"run_id": run}))
                await anyio.sleep(interval / 8)
            # Alive, so the watchdog leaves it alone; and the worker still writes under it.
            with Ledger(db) as lg:
                watch_once(lg, name="test-watchdog")
            ok(await worker.call_tool("transition", {"run_id": run, "to": "planning"}))
            return during, after

    try:
        during, after = anyio.run(work)
    finally:
        if locker.poll() is None and locker.stdin is not None:
            locker.stdin.close()  # never told to lock: it ends at end of input
        locker.wait(timeout=START_S)
    assert during == 0 and after == 1
    with Ledger(db) as lg:
        log = list(lg.log(run))
    assert not [r for r in log if r.type == "lease_revoked"]
    # Closing stdio ended the session: the lease was given back, saying why.
    [released] = [r for r in log if r.type == "lease_released"]
    assert released.lease == 1 and released.event.reason == mcp_session.SESSION_ENDED_STDIO


class WriteLock:
    """This test's own connection holding the ledger's write lock (see LOCKER) until closed."""

    def __init__(self, db: str) -> None:
        if db.startswith("postgresql://"):
            import psycopg

            self.conn: Any = psycopg.connect(db)
            self.conn.execute("LOCK TABLE heads IN EXCLUSIVE MODE")
        else:
            self.conn = sqlite3.connect(db.removeprefix("sqlite://"), isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")

    def close(self) -> None:
        self.conn.commit()
        self.conn.close()


def test_a_store_that_stays_locked_past_the_margin_fences_the_lease_and_nothing_is_written(shared_backend,
                                                                                         tmp_path):
    """Only the margin (or the ledger's word) ends the lease: then writes are refused with
    LeaseLost and nothing lands, even once the store answers again."""
    from handoff.aio import AsyncLedger

    db = shared_backend.address()
    timeout = 1.2
    limit = timeout - fence_margin(timeout)
    with Ledger(db) as lg:
        run = lg.open(goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout)

    async def body() -> str:
        async with AsyncLedger(db, busy_timeout_s=0.05) as alg:
            session = mcp_session.Session("t")
            server = ms.build(alg, ms.Config(role="worker", name="w1", root=str(tmp_path)),
                              mcp_session.Sessions(alg, single=session))
            async with Client(server, mode="legacy") as client:
                ok(await client.call_tool("claim", {"run_id": run}))
                fence = session.held[run].fence
                holder = WriteLock(db)
                try:
                    while not fence.fenced:
                        assert fence.time_left() > -limit, "the fence never tripped"
                        await client.send_ping()
                        await anyio.sleep(fence.interval_s / 4)
                    assert not fence.lost  # the ledger never said the lease ended
                finally:
                    holder.close()
                before = [(r.seq, r.type) async for r in alg.log(run)]
                text = refused(await client.call_tool("progress", {"run_id": run, "kind": "note"}))
                assert [(r.seq, r.type) async for r in alg.log(run)] == before
                return text

    text = anyio.run(body)
    assert text.startswith("LeaseLost: ") and "can no longer be proven" in text


# --- a mistyped --db ----------------------------------------------------------------------------


@pytest.mark.parametrize("how", [(), ("--http", "127.0.0.1:0")])
def test_a_mistyped_db_never_starts_an_empty_ledger(tmp_path, how):
    typo = tmp_path / "typo.db"
    proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", str(typo), "mcp", *how], env=env(),
                          capture_output=True, text=True, timeout=START_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 3, proc.stderr
    assert "handoff init" in proc.stderr and "Traceback" not in proc.stderr
    assert not typo.exists() and not list(tmp_path.glob("typo.db*"))
