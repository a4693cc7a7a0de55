"""``handoff hook`` and ``handoff hooks install|uninstall|flush``: coding agents' hooks.

``handoff hook HARNESS`` is the hook itself as a ``handoff`` command (what the lean
``python -m handoff.hooks HARNESS`` in the installed settings does, for a shell that has
``handoff`` on its path); ``handoff hooks`` installs it into a harness's settings, takes it
out, and writes what the journal holds. docs/coding-agents.md explains all three. Only
click and the standard library at import: the ``handoff`` command loads this module on
every run.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

HARNESS = click.Choice(("claude-code", "codex", "openhands", "goose"))


def _db() -> str:
    """The ledger the root command names (``--db``, ``$HANDOFF_DB``)."""
    return str(click.get_current_context().find_root().params.get("db") or "handoff.db")


def _open_options(fn: Any) -> Any:
    for option in reversed((
        click.option("--deny-revoked", is_flag=True,
                     help="Self-fencing: a PreToolUse hook answers the harness's 'deny' when the session's lease was "
                          "revoked or taken over, so the agent stops acting on a run it no longer holds. Each "
                          "PreToolUse then waits for the ledger (up to a few seconds)."),
        click.option("--owner", help="The owner of the sessions' runs (default: your login name)."),
        click.option("--target", help="Where a session's result goes (default: terminal:USER@HOST, this terminal)."),
        click.option("--heartbeat-timeout", type=float,
                     help="Seconds without any hook before a session counts as gone (default 600)."),
        click.option("--progress-timeout", type=float,
                     help="Seconds without a step before a session counts as stalled (default 1800)."),
    )):
        fn = option(fn)
    return fn


@click.command("hook", context_settings={"ignore_unknown_options": False, "help_option_names": ["-h", "--help"]})
@click.argument("harness", type=HARNESS)
@_open_options
def hook(harness: str, deny_revoked: bool, owner: str | None, target: str | None,
         heartbeat_timeout: float | None, progress_timeout: float | None) -> None:
    """Record one hook payload (JSON on stdin) of a coding agent's session in the ledger.

    Exits 0 and prints nothing, whatever happens, unless it denies a tool call
    (--deny-revoked): a hook never breaks the agent. The payload is journaled and
    written to the ledger by a replay in the background (docs/coding-agents.md).
    'handoff hooks install' puts the lean form, python -m handoff.hooks HARNESS, in the
    harness's settings; this command is the same hook for a shell with handoff on its path.

    \b
    Example:
        echo '{"hook_event_name": "UserPromptSubmit", "session_id": "s1", "prompt": "fix it"}' \\
            | handoff --db handoff.db hook claude-code
    """
    from handoff.hooks.entry import hook as run_hook
    from handoff.hooks.payloads import NotAHook

    opts = {"harness": harness, "db": _db(), "deny": deny_revoked, "owner": owner, "target": target,
            "heartbeat_timeout": heartbeat_timeout, "progress_timeout": progress_timeout}
    try:
        run_hook(opts, sys.stdin.buffer.read(), sys.stdout, os.environ)
    except NotAHook:
        pass
    except Exception as exc:  # never break the agent
        click.echo(f"handoff hook: nothing recorded ({type(exc).__name__}: {exc})", err=True)


@click.group("hooks", context_settings={"help_option_names": ["-h", "--help"]})
def hooks() -> None:
    """Install coding agents' hooks (Claude Code, Codex, OpenHands, Goose) so that every
    session is a run of this ledger; remove them; write what their journal holds.

    \b
    Example:
        handoff hooks install claude-code --owner alice
        handoff hooks flush
        handoff hooks uninstall claude-code
    """


def _scope(user: bool) -> str:
    return "user" if user else "project"


@hooks.command("install")
@click.argument("harness", type=HARNESS)
@click.option("--project", "project", type=click.Path(file_okay=False), default=None,
              help="Install into this project's settings (default: the working directory's).")
@click.option("--user", is_flag=True, help="Install into your own settings (every project).")
@_open_options
def install(harness: str, project: str | None, user: bool, deny_revoked: bool, owner: str | None,
            target: str | None, heartbeat_timeout: float | None, progress_timeout: float | None) -> None:
    """Add the hook to HARNESS's settings, beside the hooks already there.

    Installing again replaces only what an earlier install added. The ledger is created if
    it does not exist yet.

    \b
    Example:
        handoff --db ~/work/handoff.db hooks install claude-code --user --owner alice
    """
    from handoff.facade import init_ledger
    from handoff.hooks import settings

    if user and project:
        raise click.UsageError("give --project or --user, not both")
    db = _db()
    init_ledger(db)
    cmd = settings.command(harness, db, deny_revoked=deny_revoked, owner=owner, target=target,
                           heartbeat_timeout=heartbeat_timeout, progress_timeout=progress_timeout)
    done = settings.install(harness, cmd, scope=_scope(user), project=project)
    click.echo(f"{harness}: hooks for {', '.join(done['events'])} in {done['path']}"
               + (" (replacing the earlier install)" if done["replaced"] else ""))
    if harness == "codex":
        click.echo("codex: Codex runs a hook only once you trust it: open 'codex', review it in /hooks "
                   "(or run 'codex exec --dangerously-bypass-hook-trust' where you vet the hooks yourself)")


@hooks.command("uninstall")
@click.argument("harness", type=HARNESS)
@click.option("--project", "project", type=click.Path(file_okay=False), default=None,
              help="The project whose settings to change (default: the working directory).")
@click.option("--user", is_flag=True, help="Your own settings.")
def uninstall(harness: str, project: str | None, user: bool) -> None:
    """Remove what 'handoff hooks install' added to HARNESS's settings, and nothing else.

    \b
    Example:
        handoff hooks uninstall claude-code
    """
    from handoff.hooks import settings

    if user and project:
        raise click.UsageError("give --project or --user, not both")
    done = settings.uninstall(harness, scope=_scope(user), project=project)
    click.echo(f"{harness}: {done['removed']} hook(s) removed from {done['path']}")


@hooks.command("flush")
@click.option("--wait", "wait_s", type=float, default=60.0, show_default=True,
              help="Seconds to wait for a replay already running to finish.")
def flush(wait_s: float) -> None:
    """Write what the hooks' journal holds to the ledger now, in order.

    Hooks do this in the background; run it after a session to be sure everything is in,
    or when the ledger was out of reach. Records the ledger refuses are listed in the
    hooks' log (hooks.log beside the journal). Exits 3 when the ledger did not take
    everything.

    \b
    Example:
        handoff hooks flush --wait 10
    """
    from handoff.hooks import spool
    from handoff.hooks.replay import flush as run_flush
    from handoff.ledger.errors import StoreUnavailable

    db = _db()
    done = run_flush(db, wait_s=wait_s)
    left = spool.journal_size(spool.state_dir(db))
    click.echo(f"{done['written']} record(s) written, {done['refused']} refused"
               + (f"; {left} byte(s) left in the journal" if left else ""))
    if left:
        raise StoreUnavailable(f"the ledger at {db} did not take every record (it was locked or out of reach, or "
                               f"another replay held the journal past --wait {wait_s:g}s); run 'handoff hooks flush' "
                               "again")


COMMANDS = (hook, hooks)
