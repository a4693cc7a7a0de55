"""``handoff serve``: the click command (cli.py adds it with ``main.add_command(serve)``).

Only click and the standard library at import: the ``handoff`` command loads this module on
every run; the web stack loads when the command runs. ``python -m handoff.servecli`` runs
it without the root command (``--db`` then given here, or ``$HANDOFF_DB``).
"""

from __future__ import annotations

import os
from typing import Any

import click


def _root_param(name: str) -> Any:
    ctx = click.get_current_context()
    root = ctx.find_root()
    return None if root is ctx else root.params.get(name)


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--http", "address", default="127.0.0.1:8766", show_default=True, metavar="HOST:PORT",
              help="Where to listen (port 0: any free one). Beyond loopback only with --token-file.")
@click.option("--token-file", default=None, type=click.Path(dir_okay=False),
              help="A file holding the token a browser must present (open the address once with ?token=TOKEN); "
                   "required to serve beyond loopback.")
@click.option("--as", "role", type=click.Choice(["viewer", "operator"]), default="viewer", show_default=True,
              help="viewer reads only; operator adds the run page's actions (revoke, pause, unblock, close, "
                   "approve or reject a review), each after a confirmation, recorded under --name.")
@click.option("--name", default=None,
              help="Who the operator's actions are recorded as (default: $HANDOFF_ACTOR, else your login name).")
@click.option("--refresh", default=5.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds between reloads of the fleet and needs-attention pages.")
@click.option("--max-feeds", default=None, type=click.IntRange(1, 100_000), metavar="N",
              help="Run pages that may follow their run live at once (default 100); one more is answered "
                   "503 with the reason until one closes.")
@click.option("--db", "db_here", default=None, envvar="HANDOFF_DB", hidden=True)
def serve(address: str, token_file: str | None, role: str, name: str | None, refresh: float,
          max_feeds: int | None, db_here: str | None) -> None:
    """Serve the ledger to a browser: the fleet, what needs attention, each run live.

    The fleet page lists runs with their state, health, liveness (last heartbeat) and
    progress (last step) as separate columns, with filters and paging; needs attention
    lists what a person must act on; a run's page shows its incident report and follows
    new events as they are recorded. Read-only unless started with --as operator. Needs
    the serve extra: pip install '.[serve]' from the checkout. The ledger must exist.
    docs/serve.md explains each page and the security model.

    \b
    Example:
        handoff --db work.db serve
        handoff --db work.db serve --as operator --name alice --http 127.0.0.1:8080
    """
    try:
        from handoff.serve import Config
        from handoff.serve import serve as run_server
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("starlette", "uvicorn", "sse_starlette", "anyio"):
            raise
        from handoff.ledger.extras import install_hint

        raise click.UsageError(f"handoff serve needs the serve extra: {install_hint('serve')}") from None
    from handoff.names import operator_name
    from handoff.ledger.errors import LedgerError

    db = _root_param("db") or db_here or os.environ.get("HANDOFF_DB") or "handoff.db"
    busy = _root_param("busy_timeout") or 5.0
    config = Config(db=str(db), name=operator_name(name), operator=role == "operator", refresh_s=refresh,
                    busy_timeout_s=float(busy))
    if max_feeds is not None:
        config.max_feeds = max_feeds
    try:
        run_server(config, address, token_file=token_file)
    except LedgerError as exc:
        click.echo(f"Error: {exc.message}", err=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    serve(prog_name="handoff serve")
