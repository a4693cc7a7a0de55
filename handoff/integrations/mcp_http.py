"""The MCP server's HTTP checks: which addresses only this machine reaches, the ``Host``
values a loopback server answers, the bearer token beyond loopback, and the ``Guard`` that
refuses what the SDK leaves to us (a missing token, a web page's ``Origin`` beyond
loopback). ``handoff.integrations.mcp_server.serve_http`` applies them, every one before
the port is bound or a request reaches a tool.
"""

import hmac
import ipaddress
from typing import Any

from handoff.ledger.errors import InvalidInput

#: Addresses an HTTP server may bind without a bearer token.
LOOPBACK_NAMES = ("localhost",)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` spells (an IPv4-mapped IPv6 address as its IPv4 one), or None."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback(host: str) -> bool:
    """Every spelling of an address only this machine reaches: ``localhost``, all of
    127/8, ``::1`` in any of its forms, and ``::ffff:127.x.y.z``."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    ip = _ip(host)
    return ip is not None and ip.is_loopback


def host_forms(host: str, port: int) -> list[str]:
    """The ``Host`` header values a request to this server may carry when it serves
    ``host`` on loopback: the address served, as given and in its short form (in
    brackets for IPv6), and ``localhost``, each with the port served (and without it on
    port 80). A page that DNS rebinding brought here carries its own name instead."""
    names = {"localhost", host.lower()}
    ip = ipaddress.ip_address(host) if _ip(host) is not None else None
    if ip is not None:
        names.add(str(ip))
    if host.lower() == "localhost":
        names.add("127.0.0.1")
    out = []
    for name in sorted(names):
        shown = f"[{name}]" if ":" in name else name
        out.append(f"{shown}:{port}")
        if port == 80:
            out.append(shown)
    return out


def url_host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8765`` for IPv6) as (host, port)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidInput(f"--http takes HOST:PORT, e.g. 127.0.0.1:8765 (port 0: any free port); got {text!r}",
                           field="http")
    return host.strip("[]"), int(port)


def read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read the token file {path}: {exc.strerror}", field="token_file") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise InvalidInput(f"the token in {path} must be one line of at least 16 characters without spaces "
                           "(e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(32))')",
                           field="token_file")
    return token


def check_http(host: str, token: str | None) -> None:
    """Beyond loopback, anyone who reaches the port could act in this server's role."""
    if not is_loopback(host) and token is None:
        raise InvalidInput(f"refusing to serve on {host}, which is reachable beyond this machine, without a bearer "
                           "token: give --token-file FILE (clients then send 'Authorization: Bearer <token>'), or "
                           "bind 127.0.0.1", field="http")


class Guard:
    """The HTTP checks the SDK leaves to us: a bearer token (when one is set) on every
    request, and beyond loopback no browser page at all (a request carrying an ``Origin``
    is refused: the DNS-rebinding case; an MCP host sends none). On loopback, where no
    token is asked for, the SDK's Host and Origin checks (``security``) refuse a request
    whose Host is not this server's address (421) or whose Origin is another site (403)."""

    def __init__(self, app: Any, token: str | None, loopback: bool) -> None:
        self.app, self.token, self.loopback = app, token, loopback

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            refusal = None
            if self.token is not None:
                given = headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                    refusal = (401, "a bearer token is required: send 'Authorization: Bearer <token>'")
            if refusal is None and not self.loopback and "origin" in headers:
                refusal = (403, "requests from a web page (with an Origin header) are refused")
            if refusal is not None:
                from starlette.responses import PlainTextResponse

                extra = {"WWW-Authenticate": "Bearer"} if refusal[0] == 401 else None
                await PlainTextResponse(refusal[1], status_code=refusal[0], headers=extra)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def security(host: str, port: int) -> Any:
    """The SDK's DNS-rebinding checks for a loopback server on ``host``:``port``: the Host
    header must be one of ``host_forms`` and an Origin, when sent, one of those pages."""
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = host_forms(host, port)
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=[f"http://{h}" for h in hosts])


def listen(host: str, port: int) -> Any:
    """A socket bound to ``host``:``port`` (port 0: any free one), before the app is made,
    so the Host check can name the port actually served."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {url_host(host)}:{port}: {exc.strerror or exc}; choose another "
                           "address or port (port 0: any free one)", field="http") from None
    return sock
