"""The web view over HTTP against a real ``handoff serve`` process, on both backends: what
each page lists, the live feed, the security rules (Host for every loopback spelling,
Origin, the token beyond loopback, CSRF, read-only by default), no secret rendered and
hostile text escaped on every page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from handoff import Ledger
from tests.support import ROOT

HOSTILE = '"><img src=x onerror=alert(1)><script>alert(2)</script>'
KEY = "idem-key-must-not-show-7f3a"


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: Any, tmp_path: Path) -> str:
    if request.param == "postgres":
        from tests.pg import fresh_url

        return fresh_url()
    return str(tmp_path / "serve.db")


def _populate(db: str) -> dict[str, str]:
    with Ledger(db) as lg:
        lg.open(run_id="h1", goal=HOSTILE, target=HOSTILE, owner="mallory<b>", key=KEY)
        token = lg.claim("h1", "agent<i>x</i>", key=KEY + "-claim")
        lg.transition("h1", token, "planning", key=KEY + "-t")
        lg.progress("h1", token, "plan_committed", HOSTILE, key=KEY + "-p")
        lg.block("h1", HOSTILE, HOSTILE, lease=token, key=KEY + "-b")
        lg.open(run_id="q1", goal="A queued one", target="chat:#ops", owner="alice")
        return {"token": str(token), "secret": str(token).split(".", 1)[1]}


def _pages(base: str) -> list[str]:
    return [base + p for p in ("/", "/attention", "/runs/h1", "/runs/h1/report", "/?q=img", "/?health=blocked",
                               "/?state=blocked", "/runs/h1/confirm/unblock?resolution=x")]


def test_pages_escape_hostile_text_and_show_no_secret(db: str, served: Any) -> None:
    secrets_ = _populate(db)
    s = served(db, "--as", "operator", "--name", "ops<x>")
    with httpx.Client() as c:
        for url in _pages(s.base):
            r = c.get(url)
            assert r.status_code == 200, (url, r.text[:300])
            body = r.text
            assert "<script>alert" not in body and "<img src=x" not in body, url
            assert KEY not in body and secrets_["secret"] not in body and secrets_["token"] not in body, url
            assert "Content-Security-Policy" in r.headers and "default-src 'none'" in r.headers["Content-Security-Policy"]
            assert "frame-ancestors 'self'" in r.headers["Content-Security-Policy"]
        fleet = c.get(s.base + "/").text
        assert "&lt;script&gt;alert(2)&lt;/script&gt;" in fleet
        assert 'src="http' not in fleet and "https://" not in fleet  # nothing to fetch from elsewhere


def test_fleet_pages_and_filters(db: str, served: Any) -> None:
    with Ledger(db) as lg:
        for i in range(230):
            lg.open(run_id=f"r{i:03d}", goal=f"goal {i}", target="chat:#a" if i % 2 else "chat:#b",
                    owner="alice" if i % 3 else "bob")
    s = served(db)
    with httpx.Client() as c:
        first = c.get(s.base + "/").text
        assert first.count('<tr data-run="') == 100 and 'data-run="r000"' in first and 'data-run="r100"' not in first
        assert 'data-count="total">230<' in first
        assert "next page (130 more)" in first
        second = c.get(s.base + "/?after=r099").text
        assert 'data-run="r100"' in second and 'data-run="r099"' not in second
        only = c.get(s.base + "/?owner=bob&queue=chat:%23b").text
        listed = [r for r in range(230) if not r % 3 and not r % 2][:100]
        assert only.count('<tr data-run="') == len(listed)
        text = c.get(s.base + "/?q=goal 22").text
        assert sorted(x.split('"')[0] for x in text.split('<tr data-run="')[1:]) == ["r022"] + [f"r{i}" for i in range(220, 230)]
        bad = c.get(s.base + "/?state=nope")
        assert bad.status_code == 400 and "no state" in bad.text


def test_feed_sends_new_events_of_the_run(db: str, served: Any) -> None:
    with Ledger(db) as lg:
        token = lg.claim(lg.open(run_id="f1", goal="g", target="chat:#ops", owner="alice"), "w1")
        start = lg.checkpoint("f1").last_seq
    s = served(db)
    with httpx.Client(timeout=10) as c, c.stream("GET", s.base + f"/runs/f1/feed?after={start}") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("event:")) == "event: status"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
        env["PYTHONPATH"] = ROOT
        subprocess.run([sys.executable, "-c", "import sys; from handoff import Ledger; lg = Ledger(sys.argv[1]); "
                        "lg.transition('f1', sys.argv[2], 'planning'); lg.close()", db, str(token)],
                       env=env, check=True, timeout=60)
        written = time.monotonic()
        for line in lines:
            if line.startswith("data:") and "state_changed" in line:
                rows = json.loads(line[5:])
                assert rows[0]["seq"] == start + 1 and "key" not in rows[0]
                break
        assert time.monotonic() - written < 2.0


def test_host_and_origin_checked_for_every_loopback_spelling(tmp_path: Path, served: Any) -> None:
    db = str(tmp_path / "s.db")
    _populate(db)
    s = served(db, "--as", "operator")
    port = s.base.rsplit(":", 1)[1]
    with httpx.Client() as c:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert c.get(s.base + "/", headers={"Host": host}).status_code == 200, host
        for host in (f"evil.example:{port}", f"127.0.0.2:{port}", "127.0.0.1", f"[::1]:{port}", f"localhost.evil:{port}"):
            assert c.get(s.base + "/", headers={"Host": host}).status_code == 421, host
        assert c.get(s.base + "/", headers={"Origin": "http://evil.example"}).status_code == 403
        assert c.get(s.base + "/runs/h1/feed", headers={"Origin": "http://evil.example"}).status_code == 403
        assert c.get(s.base + "/", headers={"Origin": s.base}).status_code == 200
        # A write: no Origin at all, another site's, or this site's without the CSRF token.
        form = {"resolution": "x", "csrf": "wrong"}
        assert c.post(s.base + "/runs/h1/do/unblock", data=form).status_code == 403
        assert c.post(s.base + "/runs/h1/do/unblock", data=form, headers={"Origin": "http://evil.example"}).status_code == 403
        r = c.post(s.base + "/runs/h1/do/unblock", data=form, headers={"Origin": s.base})
        assert r.status_code == 403 and "CSRF" in r.text
    with Ledger(db) as lg:
        assert lg.checkpoint("h1").state == "blocked"


def test_read_only_by_default(tmp_path: Path, served: Any) -> None:
    db = str(tmp_path / "s.db")
    _populate(db)
    s = served(db)
    with httpx.Client() as c:
        page = c.get(s.base + "/runs/h1").text
        assert 'id="actions"' not in page and "read-only" in page
        assert c.get(s.base + "/runs/h1/confirm/unblock?resolution=x").status_code == 403
        assert c.post(s.base + "/runs/h1/do/unblock", data={"resolution": "x"}, headers={"Origin": s.base}).status_code == 403


def test_operator_action_confirmed_with_csrf_is_the_ledgers_write(tmp_path: Path, served: Any) -> None:
    db = str(tmp_path / "s.db")
    _populate(db)
    s = served(db, "--as", "operator", "--name", "olga")
    with httpx.Client() as c:
        with Ledger(db) as lg:
            before = lg.checkpoint("h1").last_seq
        confirm = c.get(s.base + "/runs/h1/confirm/unblock", params={"resolution": "granted"}).text
        csrf = confirm.split('name="csrf" value="')[1].split('"')[0]
        r = c.post(s.base + "/runs/h1/do/unblock", data={"resolution": "granted", "csrf": csrf},
                   headers={"Origin": s.base})
        assert r.status_code == 303 and _said(c, s.base, r.headers["location"])[0] == "ok", r.headers["location"]
        # The ledger's rules still decide: a second unblock of an unblocked run is refused, nothing written.
        with Ledger(db) as lg:
            last = lg.checkpoint("h1").last_seq
            written = list(lg.log("h1", after_seq=before))
            assert "blocker_cleared" in [r.type for r in written], (r.headers["location"], [(x.seq, x.type, x.actor) for x in lg.log("h1")])
            assert {r.actor for r in written} == {"operator:olga"}
            assert lg.checkpoint("h1").state == "planning"
        r = c.post(s.base + "/runs/h1/do/close", data={"disposition": "nope", "reason": "x", "csrf": csrf},
                   headers={"Origin": s.base})
        assert r.status_code == 303
        kind, text = _said(c, s.base, r.headers["location"])
        assert kind == "refused" and "disposition" in text, text
        with Ledger(db) as lg:
            assert lg.checkpoint("h1").last_seq == last


def test_beyond_loopback_only_with_a_token(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    Ledger(db).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-m", "handoff.servecli", "--db", db, "--http", "0.0.0.0:0"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "without a bearer token" in r.stderr


def test_token_is_asked_and_traded_for_a_cookie(tmp_path: Path, served: Any) -> None:
    db = str(tmp_path / "s.db")
    _populate(db)
    token_file = tmp_path / "token"
    token = "t0ken-" + "x" * 30
    token_file.write_text(token + "\n")
    s = served(db, "--token-file", str(token_file))
    with httpx.Client() as c:
        assert c.get(s.base + "/").status_code == 401
        assert c.get(s.base + "/?token=wrong-token-xxxxxxxx").status_code == 401
        r = c.get(s.base + f"/?token={token}&state=blocked")
        assert r.status_code == 303 and r.headers["location"] == "/?state=blocked"
        assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=strict" in r.headers["set-cookie"]
        # The cookie is this process's session value under a name with the port, never the token.
        port = s.base.rsplit(":", 1)[1]
        assert token not in r.headers["set-cookie"]
        assert list(r.cookies) == [f"handoff_serve_session_{port}"], r.headers["set-cookie"]
        assert c.get(s.base + "/").status_code == 200  # the cookie now
        assert c.get(s.base + "/", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        # The trade never sends the browser to another site ('//host/x' is another host).
        r = c.get(s.base + f"//evil.example/x?token={token}")
        assert r.status_code == 303 and r.headers["location"] == "/evil.example/x"


def test_the_cookie_is_a_session_of_this_process_never_the_token(tmp_path: Path, served: Any) -> None:
    """Two servers on one host with one token: a browser keeps both sessions (its cookies
    are per host, not per port), a cookie holding the token is no session, and a session of
    one server opens nothing on the other."""
    db = str(tmp_path / "s.db")
    _populate(db)
    token_file = tmp_path / "token"
    token = "t0ken-" + "y" * 30
    token_file.write_text(token + "\n")
    a, b = served(db, "--token-file", str(token_file)), served(db, "--token-file", str(token_file))
    with httpx.Client() as c:
        for s in (a, b):
            assert c.get(s.base + f"/?token={token}").status_code == 303
        for s in (a, b):  # b's trade did not overwrite a's session
            assert c.get(s.base + "/").status_code == 200, s.base
        sessions = {name: value for name, value in c.cookies.items()}
        assert len(sessions) == 2 and token not in sessions.values()
    port_a, port_b = (s.base.rsplit(":", 1)[1] for s in (a, b))
    with httpx.Client() as c:
        assert c.get(a.base + "/", headers={"Cookie": f"handoff_serve_session_{port_a}={token}"}).status_code == 401
        stolen = sessions[f"handoff_serve_session_{port_a}"]
        assert c.get(b.base + "/", headers={"Cookie": f"handoff_serve_session_{port_b}={stolen}"}).status_code == 401
        assert c.get(a.base + "/", headers={"Cookie": f"handoff_serve_session_{port_a}={stolen}"}).status_code == 200


def test_flash_text_comes_only_from_this_server(tmp_path: Path, served: Any) -> None:
    """A link cannot make the run page say anything: free text in the address is ignored,
    and a flash this server signed shows only on its own run, unaltered."""
    import base64

    db = str(tmp_path / "s.db")
    _populate(db)
    s = served(db, "--as", "operator", "--name", "olga")
    with httpx.Client() as c:
        page = c.get(s.base + "/runs/h1", params={"done": "PWNED: approved by the CEO", "refused": "PWNED"}).text
        assert "PWNED" not in page and 'id="flash"' not in page
        where = _act(c, s.base, "h1", "unblock", {"resolution": "granted"})
        kind, text = _said(c, s.base, where)
        assert kind == "ok" and "recorded at seq" in text and "olga" in text
        flash = where.split("flash=")[1].split("#")[0]
        payload, mac = flash.split(".")
        forged = base64.urlsafe_b64encode(b'["h1","done","PWNED"]').decode().rstrip("=")
        for value in (f"{forged}.{mac}", f"{forged}.", forged, "x" * 5000, f"{payload}.{mac[:-1]}{'1' if mac[-1] != '1' else '2'}"):
            page = c.get(s.base + "/runs/h1", params={"flash": value}).text
            assert "PWNED" not in page and 'id="flash"' not in page, value[:80]
        # Signed for h1, shown on q1: nothing.
        assert 'id="flash"' not in c.get(s.base + "/runs/q1", params={"flash": flash}).text


def test_numbers_in_the_address_that_are_not_plain_digits_are_refused_not_a_crash(tmp_path: Path, served: Any
                                                                                   ) -> None:
    db = str(tmp_path / "s.db")
    _populate(db)
    run = "h1"
    s = served(db, "--as", "operator", "--name", "ops")
    with httpx.Client(timeout=10, headers={"Origin": s.base}) as c:
        for bad in ("\u00b2", "9" * 5000):
            r = c.get(s.base + f"/runs/{run}/confirm/unblock", params={"resolution": "x", "blocker_id": bad})
            assert r.status_code == 400 and "whole number" in r.text
        with c.stream("GET", s.base + f"/runs/{run}/feed", params={"after": "\u00b2"}) as r:
            assert r.status_code == 200  # read from the start, not a server error


def test_missing_ledger_exits_3(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-m", "handoff.servecli", "--db", str(tmp_path / "nope.db"), "--http",
                        "127.0.0.1:0"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr


def test_the_command_takes_the_root_commands_db(tmp_path: Path) -> None:
    """Registered under ``handoff`` (cli.py adds it), the command serves the root's --db."""
    import click

    from handoff.servecli import serve
    from tests.support import make_runner

    @click.group()
    @click.option("--db", default="handoff.db")
    @click.option("--busy-timeout", "busy_timeout", default=5.0, type=float)
    def root(db: str, busy_timeout: float) -> None:
        pass

    root.add_command(serve)
    missing = str(tmp_path / "missing.db")
    result = make_runner().invoke(root, ["--db", missing, "serve", "--http", "127.0.0.1:0"])
    assert result.exit_code == 3 and "missing.db" in result.stderr, (result.exit_code, result.output)


def _said(c: httpx.Client, base: str, location: str) -> tuple[str, str]:
    """What the run page an action sent us to says: (ok or refused, the text), or ("", "")."""
    import re

    page = c.get(base + location.split("#")[0]).text
    m = re.search(r'<p class="flash (ok|refused)" id="flash">([^<]*)</p>', page)
    return (m.group(1), m.group(2)) if m else ("", "")


def _act(c: httpx.Client, base: str, run: str, action: str, fields: dict[str, str]) -> str:
    """Confirm then post one action as the run page does; returns where the server sent us."""
    confirm = c.get(base + f"/runs/{run}/confirm/{action}", params=fields)
    assert confirm.status_code == 200, confirm.text[:300]
    csrf = confirm.text.split('name="csrf" value="')[1].split('"')[0]
    r = c.post(base + f"/runs/{run}/do/{action}", data={**fields, "csrf": csrf}, headers={"Origin": base})
    assert r.status_code == 303
    return r.headers["location"]


def test_every_action_appends_its_event_under_the_operator_or_is_refused(tmp_path: Path, served: Any) -> None:
    from tests.support import working_run

    db = str(tmp_path / "s.db")
    with Ledger(db) as lg:
        working_run(lg, "p1")
        working_run(lg, "c1")
        lg.open(run_id="v1", goal="to review", target="chat:#ops", owner="olga", require_review=True)
        tok = lg.claim("v1", "w9")
        for state in ("planning", "executing", "verifying"):
            lg.transition("v1", tok, state)
        result = tmp_path / "result.md"
        result.write_text("# done\n")
        lg.artifact("v1", tok, str(result))
        lg.submit("v1", tok, "done")
    s = served(db, "--as", "operator", "--name", "olga")
    with httpx.Client() as c, Ledger(db) as lg:
        assert "ok" == _said(c, s.base, _act(c, s.base, "p1", "pause",
                                             {"reason": "hold on", "next_action": "olga looks"}))[0]
        assert lg.checkpoint("p1").state == "blocked"
        assert "ok" == _said(c, s.base, _act(c, s.base, "p1", "unblock", {"resolution": "looked"}))[0]
        assert "ok" == _said(c, s.base, _act(c, s.base, "c1", "close",
                                             {"disposition": "cancelled", "reason": "superseded"}))[0]
        assert lg.checkpoint("c1").state == "cancelled"
        # olga owns v1: her approval is the owner's review.
        assert "ok" == _said(c, s.base, _act(c, s.base, "v1", "approve", {"notes": "fine"}))[0]
        assert lg.checkpoint("v1").review.approved is True
        for run in ("p1", "c1"):
            actors = {r.actor for r in lg.log(run) if r.type in ("blocker_raised", "blocker_cleared", "run_closed")}
            assert actors == {"operator:olga"}, (run, actors)
        # A review of a run olga does not own is the ledger's refusal, shown, with nothing written.
        working_run(lg, "x1")
        before = lg.checkpoint("x1").last_seq
        where = _act(c, s.base, "x1", "reject", {"notes": "no"})
        assert _said(c, s.base, where)[0] == "refused"
        assert lg.checkpoint("x1").last_seq == before


def test_ipv6_loopback_is_served_and_its_host_checked(tmp_path: Path) -> None:
    import socket

    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    db = str(tmp_path / "s.db")
    _populate(db)
    from tests.serve.conftest import start_server

    s = start_server(db, "--http", "[::1]:0")
    try:
        port = s.base.rsplit(":", 1)[1]
        with httpx.Client() as c:
            assert c.get(s.base + "/").status_code == 200
            assert c.get(s.base + "/", headers={"Host": f"localhost:{port}"}).status_code == 200
            assert c.get(s.base + "/", headers={"Host": f"127.0.0.1:{port}"}).status_code == 421
            assert c.get(s.base + "/", headers={"Origin": f"http://[::1]:{port}"}).status_code == 200
    finally:
        s.stop()
