"""``handoff serve``: the fleet in a browser, live, with liveness and progress as two columns.

Server-rendered pages (handoff/serve/pages.py) from the ledger's listings a page at a time
(handoff/serve/listing.py: the orders an index keeps, and how far a search reads), a run
page that follows the run over server-sent events (handoff/serve/feed.py, bounded), and,
for a server started as an operator, the actions of the table of operations after a
confirmation with a CSRF token (handoff/serve/actions.py), whose outcome the run page shows
only as this server signed it (handoff/serve/flash.py). Who may reach it is the MCP HTTP mode's rule
(handoff/serve/guard.py): loopback by default, anything else only with a token, Host and
Origin checked. docs/serve.md is the user's guide. Needs the ``serve`` extra (Starlette,
uvicorn, sse-starlette).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from .app import Config, make_app

__all__ = ["Config", "make_app", "serve"]


def serve(config: Config, address: str = "127.0.0.1:8766", *, token_file: str | None = None,
          ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted. Every check (the address, the token, the ledger) is made
    before the port is bound; once it listens, ``ready`` is told the URL (by default a line
    on stderr, so port 0 can be used)."""
    import uvicorn

    from handoff.facade import Ledger
    from handoff.integrations.mcp_http import check_http, listen, parse_address, read_token, url_host

    from .guard import BrowserGuard

    host, port = parse_address(address)
    token = read_token(token_file)
    check_http(host, token)
    Ledger(config.db, create=False, busy_timeout_s=config.busy_timeout_s).close()  # a mistyped --db exits 3 here
    sock = listen(host, port)
    bound = sock.getsockname()[1]
    app = BrowserGuard(make_app(config), host=host, port=bound, token=token)
    url = f"http://{url_host(host)}:{bound}/"
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2))
    if ready is None:
        def ready(url: str) -> None:
            role = f"operator {config.name}" if config.operator else "read-only"
            print(f"handoff serve: {url} ({role})", file=sys.stderr, flush=True)

    startup = uv.startup

    async def started(sockets: list | None = None) -> None:
        await startup(sockets=sockets)
        ready(url)

    uv.startup = started  # type: ignore[method-assign]
    try:
        uv.run(sockets=[sock])
    finally:
        sock.close()
