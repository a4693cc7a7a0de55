"""Who may reach the web view: the address rules of the MCP server's HTTP mode, for a browser.

The rules are ``handoff.integrations.mcp_http``'s, used from there: loopback by default
(``is_loopback``), any other address only with a token (``check_http``, ``read_token``), the
``Host`` values a loopback server answers (``host_forms``), the socket bound before the app
is made (``listen``). What differs is the client: an MCP host sends a bearer header and no
``Origin``; a browser cannot add a header to a page it navigates to, and sends an
``Origin`` with every form it posts. So here:

- a token (required beyond loopback, allowed on loopback) is taken from
  ``Authorization: Bearer``; a browser opens the address once with ``?token=...`` and
  trades it for a session cookie (HttpOnly, SameSite=Strict, so another site's page never
  sends it). The cookie holds a random value drawn when the process started, never the
  token: a cookie read off a disk or a proxy's log dies with the server, and the
  long-lived token stays in its file. Its name carries the port, because browsers keep
  cookies per host, not per port: two servers on one host would otherwise overwrite (and
  be sent) each other's;
- on loopback, a ``Host`` that is not one of ``host_forms`` is refused (421): a page that
  DNS rebinding brought here names its own host;
- an ``Origin``, when sent, must be this server's own page, and every request that writes
  (POST) must carry one (or a ``Referer`` of this server): 403 otherwise.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from handoff.integrations.mcp_http import host_forms, is_loopback

#: The session cookie a browser gets for the token (``?token=``), followed by the port.
SESSION_COOKIE = "handoff_serve_session_"


def cookie_name(port: int) -> str:
    """The session cookie of the server on ``port``."""
    return f"{SESSION_COOKIE}{port}"


def _headers(scope: Any) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _cookies(header: str) -> dict[str, str]:
    out = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name] = value
    return out


class BrowserGuard:
    """ASGI middleware: the Host, Origin and token checks, before any page or action runs."""

    def __init__(self, app: Any, *, host: str, port: int, token: str | None) -> None:
        self.app, self.token = app, token
        self.cookie = cookie_name(port)
        #: What the cookie holds: drawn once per process, so a restart signs every browser out.
        self.session = secrets.token_urlsafe(32)
        self.loopback = is_loopback(host)
        self.hosts = set(host_forms(host, port)) if self.loopback else None

    def _origin_ok(self, origin: str, host_header: str) -> bool:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        if self.hosts is not None:
            return parts.netloc.lower() in self.hosts
        return parts.netloc.lower() == host_header.lower()

    def refusal(self, scope: Any) -> tuple[int, str, dict[str, str]] | None:
        """What to answer instead of the page, or None when the request may go on."""
        h = _headers(scope)
        host = h.get("host", "")
        if self.hosts is not None and host.lower() not in self.hosts:
            return (421, f"this server answers only to {', '.join(sorted(self.hosts))}; a request naming "
                         "another host (a page that DNS rebinding brought here) is refused", {})
        origin = h.get("origin")
        if origin is not None and not self._origin_ok(origin, host):
            return (403, "requests from another site's page are refused", {})
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            referer = h.get("referer")
            if origin is None and (referer is None or not self._origin_ok(referer, host)):
                return (403, "a write must come from this server's own page (no Origin or Referer of it)", {})
        if self.token is not None and not self._token_ok(scope, h):
            return (401, "a token is required: open this server's address once with ?token=TOKEN (the token "
                         "file's line), or send 'Authorization: Bearer TOKEN'", {"WWW-Authenticate": "Bearer"})
        return None

    def _token_ok(self, scope: Any, h: dict[str, str]) -> bool:
        want = self.token.encode()  # type: ignore[union-attr]
        given = h.get("authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), want):
            return True
        cookie = _cookies(h.get("cookie", "")).get(self.cookie, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self.session.encode())

    def _token_in_query(self, scope: Any) -> str | None:
        if self.token is None or scope.get("method") != "GET":
            return None
        for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
            if name == "token" and hmac.compare_digest(value.encode(), self.token.encode()):
                return value
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.responses import PlainTextResponse, RedirectResponse

        token = self._token_in_query(scope)
        if token is not None and self.refusal({**scope, "headers": [
                *scope.get("headers", []), (b"authorization", f"Bearer {token}".encode())]}) is None:
            # Trade the address's token for the session cookie, and drop it from the address
            # bar and history.
            rest = urlencode([(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"))
                              if k != "token"])
            # One leading slash: '//host/x' would send the browser to another site.
            target = "/" + scope.get("path", "/").lstrip("/") + (f"?{rest}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(self.cookie, self.session, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        refused = self.refusal(scope)
        if refused is not None:
            status, text, extra = refused
            await PlainTextResponse(text, status_code=status, headers=extra)(scope, receive, send)
            return
        await self.app(scope, receive, send)
