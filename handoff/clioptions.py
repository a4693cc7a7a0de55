"""The options and arguments several ``handoff`` commands share, as decorators.

One decorator per shared option (sqlite-utils' way), so an option's name, type,
environment variable and help are written once: ``--json``, ``--key``, ``--lease``,
``--attr``, ``--quiet``, ``--format``, the paging options, RUN, and the contract's
options that 'open' and 'run' both take; the help of ``--key``, ``--lease`` and
``--attr`` is the table of operations' description (handoff/operations.py). Apart from
cli.py so the commands read as commands; they import only click, the table and this
package's CLI modules at module level.
"""

from __future__ import annotations

from typing import Any

import click

from handoff import operations as ops
from handoff.clitypes import ATTR_HELP, LEASE_TOKEN, AttrParam
from handoff.completion import complete_runs
from handoff.output import FORMAT_HELP, FORMATS


def json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document instead of text (shapes in docs/cli.md).")(f)


def run_argument(f: Any) -> Any:
    return click.argument("run", metavar="RUN", shell_complete=complete_runs)(f)


def worker_run_argument(f: Any) -> Any:
    # Inside 'handoff run' the child has HANDOFF_RUN and HANDOFF_LEASE: RUN and --lease may go.
    return click.argument("run", metavar="RUN", envvar="HANDOFF_RUN", shell_complete=complete_runs)(f)


def lease_option(required: bool = True, help: str | None = None) -> Any:
    """--lease: a token (LEASE.SECRET), also from $HANDOFF_LEASE; its help is the table's."""
    default = (ops.LEASE if required else ops.LEASE_OPTIONAL).help
    return click.option("--lease", type=LEASE_TOKEN, required=required, envvar="HANDOFF_LEASE",
                        show_envvar=True, help=default if help is None else help)


def key_option(f: Any = None, *, help: str | None = None) -> Any:
    """--key, the idempotency key; its help is the table's."""
    deco = click.option("--key", default=None, help=ops.KEY.help if help is None else help)
    return deco if f is None else deco(f)


def attr_option(f: Any = None, *, help: str | None = None) -> Any:
    """--attr KEY=VALUE (repeatable): what the facts are (the table's help), then how a value is read."""
    deco = click.option("--attr", "attr_pairs", multiple=True, type=AttrParam(),
                        help=f"{ops.ATTRS.help if help is None else help} {ATTR_HELP}")
    return deco if f is None else deco(f)


def quiet_option(f: Any) -> Any:
    return click.option("-q", "--quiet", is_flag=True,
                        help="No progress bar (one is drawn on stderr, when it is a terminal, for long work).")(f)


def format_option(f: Any) -> Any:
    """--format table|json|jsonl|csv, with --json as its short form."""
    f = json_option(f)
    return click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help=FORMAT_HELP)(f)


def page_options(f: Any) -> Any:
    f = click.option("--after", "after", default=None, metavar="RUN",
                     help="Continue a listing after this run (the 'next' an earlier page printed).",
                     shell_complete=complete_runs)(f)
    return click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True,
                        help="Print at most this many runs; 0 prints them all.")(f)


def open_options(required: bool) -> Any:
    """The contract's options, shared by 'open' and 'run'."""

    from handoff.ledger.events import Policy, SendPolicy  # the defaults' one home

    default = Policy()
    send = SendPolicy()

    def deco(f: Any) -> Any:
        opts = [
            click.option("--goal", required=required, help="What the run must achieve."),
            click.option("--target", required=required, help="Where the result is delivered (e.g. chat:#ops)."),
            click.option("--owner", required=required, help="Who owns the run: reviews, delivers, closes."),
            click.option("--origin", default="", help="Where the request came from."),
            click.option("--run-id", default=None,
                         help="Choose the run id (default: run-<time>-<random>; for 'open --key', one "
                         "derived from the key and the owner, so a retried open finds the run it made)."),
            click.option("--result", "result_path", default=None, type=click.Path(dir_okay=False),
                         help="The result file the run must produce (submit checks it was recorded)."),
            click.option("--stop-rule", "stop_rules", multiple=True, help="A rule for when to stop (repeatable)."),
            click.option("--heartbeat-timeout", type=float, default=default.heartbeat_timeout_s, show_default=True,
                         help="Seconds without a heartbeat before the worker is unavailable."),
            click.option("--progress-timeout", type=float, default=default.progress_timeout_s, show_default=True,
                         help="Seconds without progress (heartbeats alone) before the run is stalled."),
            click.option("--retry-budget", type=int, default=default.retry_budget, show_default=True,
                         help="Stalled windows the watchdog tolerates before it pauses the run."),
            click.option("--delivery-timeout", type=float, default=default.delivery_timeout_s, show_default=True,
                         help="Seconds a delivery attempt may go without an outcome before it is ambiguous."),
            click.option("--owner-cap", type=int, default=default.owner_cap, show_default=True,
                         help="Most runs of this owner that may hold a lease at once."),
            click.option("--require-review", is_flag=True, help="The owner must approve the result before delivery."),
            click.option("--public", is_flag=True, default=None,
                         help="The target is visible to others: delivery is refused unless a sanitization "
                         "check ('handoff sanitize') passed over exactly what is sent."),
            click.option("--sanitize-pattern", "sanitize_patterns", multiple=True,
                         help="A regular expression of your own that must not reach the target, checked with "
                         "the built-in detectors (repeatable)."),
            click.option("--send-timeout", type=float, default=send.timeout_s, show_default=True,
                         help="Seconds one send by 'deliver --send' may take before its outcome is unknown."),
            click.option("--send-retries", type=int, default=send.retries, show_default=True,
                         help="Further tries of a send of unknown outcome (only to a target that honours keys)."),
            click.option("--send-reference", is_flag=True,
                         help="Send artifacts' names, sizes and sha256 only, not their content."),
            click.option("--token-env", default="", metavar="VAR",
                         help="Environment variable holding a bearer token for a webhook target; its name "
                         "must start with HANDOFF_TOKEN_ (no other variable is sent). Only the name is stored."),
            click.option("--progress-kind", "progress_kinds", multiple=True, metavar="STATE:KIND",
                         help="A progress kind of this run's own, counted as progress in a working state, e.g. "
                         "executing:llm_step (repeatable). Fixed at open: later, any other kind is refused."),
        ]
        for opt in reversed(opts):
            f = opt(f)
        return f

    return deco


def open_kwargs(p: dict[str, Any]) -> dict[str, Any]:
    return dict(
        goal=p["goal"], target=p["target"], owner=p["owner"], origin=p["origin"], run_id=p["run_id"],
        result_path=p["result_path"], stop_rules=tuple(p["stop_rules"]), require_review=p["require_review"],
        heartbeat_timeout_s=p["heartbeat_timeout"], progress_timeout_s=p["progress_timeout"],
        retry_budget=p["retry_budget"], delivery_timeout_s=p["delivery_timeout"], owner_cap=p["owner_cap"],
        public=bool(p["public"]), sanitize_patterns=tuple(p["sanitize_patterns"]),
        send=_send_policy(p), progress_kinds=_progress_kinds(p["progress_kinds"]),
    )


def _progress_kinds(given: tuple[str, ...]) -> dict[str, list[str]] | None:
    """--progress-kind STATE:KIND pairs as the contract's map; the library checks names."""
    out: dict[str, list[str]] = {}
    for item in given:
        state, colon, kind = item.partition(":")
        if not colon or not state or not kind:
            raise click.UsageError(f"--progress-kind {item[:60]!r} must be STATE:KIND, e.g. executing:llm_step")
        out.setdefault(state, []).append(kind)
    return out or None


def _send_policy(p: dict[str, Any]) -> Any:
    from handoff.ledger.events import SendPolicy

    return SendPolicy(timeout_s=p["send_timeout"], retries=p["send_retries"], inline=not p["send_reference"],
                      token_env=p["token_env"])
