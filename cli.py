"""The ``handoff`` command: a thin click shell over ``handoff.Ledger``.

Every command opens the ledger, makes one library call and prints a table, a short line
or (``--json``) one JSON document. Nothing heavy is imported at module level: a shell
agent pays for ``handoff progress`` on every event, so each command imports what it uses.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import click


def _load_msgspec() -> None:
    """Import msgspec as this process's first user of it, without typing_extensions.

    msgspec's helper module imports ``typing_extensions`` whenever it is installed (and
    pydantic installs it), for ``get_type_hints`` and ``Required``; that import loads
    ``inspect``, ``ast`` and ``dis``, ~17 ms of every command's ~100 ms of imports. On the
    Pythons this package supports (3.11+) ``typing`` has both, and msgspec falls back to it
    when the import fails; the event types use plain ``typing`` only. So the import is
    made to fail while msgspec loads, and only then: pydantic, when a contract file is
    read, imports typing_extensions as usual. A process that already loaded either (a
    test run, a caller embedding the CLI) is left as it is.
    """
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # "import" raises ImportError
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]


_load_msgspec()

from handoff.reducers.transitions import CLOSE_DISPOSITIONS, DELIVERED  # noqa: E402  (data only: imports nothing)

EXIT_OK = 0  # every other code is an error class's exit_code (ledger.errors), never a literal here
WIDTH = 88  # help and docs are rendered at this width so docs/cli.md is reproducible


# --- the group: error and exit-code policy in one place -------------------------------


def _json_wanted(args: list[str]) -> bool:
    """Whether errors should print as JSON: --json, or --format json/jsonl, before any --."""
    head = args[: args.index("--")] if "--" in args else args
    if "--json" in head or any(a in ("--format=json", "--format=jsonl") for a in head):
        return True
    return any(a == "--format" and nxt in ("json", "jsonl") for a, nxt in zip(head, head[1:]))


def _error(kind: str, message: str, *, as_json: bool) -> None:
    if as_json:
        import json

        click.echo(json.dumps({"error": {"type": kind, "message": message}}), err=True)
    else:
        from handoff.render import visible

        click.echo(f"Error: {visible(message)}", err=True)  # a path or a value it names may hold escapes


def _undecodable(value: str) -> int | None:
    """Where a string stops being UTF-8 (a lone surrogate: an invalid byte in argv), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


class HandoffCommand(click.Command):
    """Refuses text arguments that are not valid UTF-8 (usage error, exit 2, naming the
    option) before the command runs: the ledger stores UTF-8 text only. File names
    (click.Path, click.File) and the CMD of 'handoff run' are passed on as they are."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for param in self.get_params(ctx):
            if isinstance(param.type, (click.Path, click.File)) or param.type is click.UNPROCESSED:
                continue
            value = ctx.params.get(param.name) if param.name else None
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, str) and (at := _undecodable(item)) is not None:
                    raise click.BadParameter(
                        f"not valid UTF-8 text (an undecodable byte at character {at}); pass UTF-8",
                        ctx=ctx, param=param,
                    )
        return rest


class HandoffGroup(click.Group):
    """Keeps commands in the order they are defined, and maps every failure to an exit code."""

    command_class = HandoffCommand

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if os.environ.get(complete_var or COMPLETE_VAR, "").startswith("bash"):
            from click.shell_completion import add_completion_class

            add_completion_class(_completion_class("bash"), "bash")  # the line as bash has it
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        args = list(sys.argv[1:] if args is None else args)
        as_json = _json_wanted(args)
        try:
            rv = super().main(args, prog_name or "handoff", complete_var, False, **extra)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            if as_json:
                _error(type(exc).__name__, exc.format_message(), as_json=True)
            else:
                from handoff.render import visible

                exc.message = visible(exc.message)  # click quotes what it refused, escapes and all
                exc.show()
            sys.exit(exc.exit_code)
        except BrokenPipeError:
            # `handoff log RUN | head`: the reader left; that is not an error.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_OK)
        except Exception as exc:
            code = _ledger_exit(exc)
            if code is None:
                raise
            _error(getattr(exc, "type", type(exc).__name__), getattr(exc, "message", str(exc)), as_json=as_json)
            sys.exit(code)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def _ledger_exit(exc: BaseException) -> int | None:
    """The exit code of a library error, or None for a bug (which keeps its traceback)."""
    if "handoff.ledger.errors" not in sys.modules:  # no store was opened: nothing of ours failed
        return None
    from handoff.ledger.errors import LedgerError

    if isinstance(exc, LedgerError):
        return int(exc.exit_code)
    from handoff.ledger.backends import is_driver_error

    if is_driver_error(exc):
        from handoff.ledger.errors import StoreError

        return StoreError.exit_code
    return None


class State:
    def __init__(self, db: str, busy_timeout: float) -> None:
        self.db = db
        self.busy_timeout = busy_timeout


class IsoTime(click.ParamType):
    """An ISO 8601 time; a time without an offset is taken as UTC. Converted to UTC µs."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from datetime import datetime, timezone

        try:
            dt = datetime.fromisoformat(str(value).strip())
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time; write it like 2026-05-01T12:00:00Z", param, ctx)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        try:  # an offset can push a time at either end of the calendar out of it
            dt = dt.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            self.fail(f"{value!r} falls outside years 1 to 9999 in UTC", param, ctx)
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        delta = dt - epoch
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


ISO_TIME = IsoTime()


class Seconds(click.FloatRange):
    """A FloatRange that also refuses nan and infinities (which compare false to any bound)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv


@click.group(cls=HandoffGroup, name="handoff", context_settings={"help_option_names": ["-h", "--help"],
                                                                 "max_content_width": WIDTH})
@click.option("--db", default="handoff.db", envvar="HANDOFF_DB", show_default=True, show_envvar=True,
              type=click.Path(dir_okay=False), help="The ledger file (SQLite).")
@click.option("--busy-timeout", default=5.0, show_default=True, type=Seconds(min=0, max=86_400),
              help="Seconds to wait for another writer's lock before giving up (exit 3).")
@click.version_option(package_name="handoff-ledger", prog_name="handoff")
@click.pass_context
def main(ctx: click.Context, db: str, busy_timeout: float) -> None:
    """An append-only ledger for long-running agent work: contract, lease, heartbeats,
    progress, evidence and a delivery proven once, all folded from one event log.

    Exit codes: 0 ok; 1 refused by the ledger's rules (conflict, stale lease, illegal
    transition, double delivery, terminal run); 2 usage or malformed input; 3 store
    problem (not a ledger, locked past the timeout, read-only, disk full, corrupt);
    4 verify, check or doctor found damage. Errors are one sentence on stderr, or with --json
    {"error": {"type": ..., "message": ...}} on stderr.

    Times are ISO 8601 in UTC, printed with a Z; a time given without an offset is
    taken as UTC.

    \b
    Example:
        RUN=$(handoff open --goal "Draft the report" --target chat:#ops --owner alice)
        LEASE=$(handoff claim $RUN --worker w1)
        handoff transition $RUN --lease $LEASE --to planning
        handoff progress $RUN --lease $LEASE --kind plan_committed --detail "3 steps"
        handoff status $RUN
    """
    ctx.obj = State(db, busy_timeout)


# --- shared pieces -------------------------------------------------------------------


def _state() -> State:
    return click.get_current_context().find_object(State)  # type: ignore[return-value]


def _ledger(*, create: bool = False) -> Any:
    from handoff.api import Ledger

    st = _state()
    return Ledger(st.db, create=create, busy_timeout_s=st.busy_timeout)


def json_option(f: Any) -> Any:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document instead of text (shapes in docs/cli.md).")(f)


# --- shell completion: names the shell offers on Tab ('handoff completion') -------------

#: At most this many run ids are offered per Tab: one bounded range scan of an index.
COMPLETE_RUNS = 50
#: The environment variable the scripts set when they ask for completions (click's machinery).
COMPLETE_VAR = "_HANDOFF_COMPLETE"


def _complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Run ids of the ledger --db (or HANDOFF_DB) names that begin with what is typed, read
    only (a Tab never creates or changes a ledger); nothing when it cannot be read."""
    from click.shell_completion import CompletionItem

    try:
        from handoff.projections import queries

        with _completion_store(ctx) as store:
            return [] if store is None else [
                CompletionItem(r) for r in queries.run_ids_starting(store, incomplete, COMPLETE_RUNS)]
    except Exception:  # a Tab must never print a traceback into the command line being typed
        return []


def _completion_store(ctx: click.Context) -> Any:
    """The ledger --db (or HANDOFF_DB, else ./handoff.db) names, opened read-only for a Tab
    (a context manager), or a null context giving None when there is no such file."""
    import contextlib

    from handoff.ledger.backends import open_store

    db = ctx.find_root().params.get("db") or os.environ.get("HANDOFF_DB") or "handoff.db"
    if "://" not in db and not os.path.isfile(db):
        return contextlib.nullcontext(None)
    return open_store(db, readonly=True, create=False, busy_timeout_s=0.2)


#: click's bash script, also handing over the line as bash has it (COMP_LINE, COMP_POINT)
#: and where bash breaks words (COMP_WORDBREAKS): COMP_WORDS alone has a run id such as
#: 'job:7' split in three at its ':'.
BASH_SOURCE = """\
%(complete_func)s() {
    local IFS=$'\\n'
    local response

    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD COMP_LINE="$COMP_LINE" \\
COMP_POINT=$COMP_POINT COMP_WORDBREAKS="$COMP_WORDBREAKS" %(complete_var)s=bash_complete $1)

    for completion in $response; do
        IFS=',' read type value <<< "$completion"

        if [[ $type == 'dir' ]]; then
            COMPREPLY=()
            compopt -o dirnames
        elif [[ $type == 'file' ]]; then
            COMPREPLY=()
            compopt -o default
        elif [[ $type == 'plain' ]]; then
            COMPREPLY+=($value)
        fi
    done

    return 0
}

%(complete_func)s_setup() {
    complete -o nosort -F %(complete_func)s %(prog_name)s
}

%(complete_func)s_setup;
"""


def _completion_class(shell: str) -> Any:
    """click's completion for ``shell``; for bash, one that reads the words from the line
    itself, so a word holding ':' (a run id may) is one word. bash replaces only the part
    of the word after its last ':' or '=' (COMP_WORDBREAKS), so an offer drops what comes
    before, as bash-completion's __ltrim_colon_completions does."""
    from click.shell_completion import BashComplete, get_completion_class, split_arg_string

    if shell != "bash":
        return get_completion_class(shell)

    class LineBashComplete(BashComplete):
        source_template = BASH_SOURCE
        word = ""  # the word being completed, whole (empty: bash's own words are used)

        def get_completion_args(self) -> tuple[list[str], str]:
            line, point = os.environ.get("COMP_LINE"), os.environ.get("COMP_POINT", "")
            if not line or not point.isdigit():
                return super().get_completion_args()
            before = line[: int(point)]
            words = split_arg_string(before)
            self.word = words.pop() if words and not before[-1:].isspace() else ""
            return words[1:], self.word

        def format_completion(self, item: Any) -> str:
            value, word = item.value, self.word
            breaks = set(os.environ.get("COMP_WORDBREAKS", "")) & {":", "="}
            cut = max((word.rfind(c) for c in breaks), default=-1) + 1
            if item.type == "plain" and cut:
                # An offer for --opt=VALUE is VALUE (click splits the word at '=').
                whole = word.partition("=")[0] + "=" + value if word.startswith("-") and "=" in word else value
                if whole.startswith(word[:cut]):
                    value = whole[cut:]  # what replaces the part bash replaces
            return f"{item.type},{value}"

    return LineBashComplete


def _complete_from(names: Any) -> Any:
    """A completion of fixed names (states, progress kinds, health), read when first asked."""
    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(n) for n in sorted(names()) if n.startswith(incomplete)]
    return complete


def _states() -> Any:
    from handoff.reducers.transitions import STATES

    return STATES


def _progress_kind_names(declared: Any = None) -> Any:
    """What 'progress' takes, with the contract's own kinds (``declared``)."""
    from handoff.reducers import transitions as T

    return T.progress_command_kinds(declared or {})


def _complete_kinds(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """``_progress_kind_names`` with the kinds the run's contract declared, when the run
    (RUN, already typed) can be read from the ledger."""
    declared = None
    # While an option's value is typed, click's lenient parse leaves RUN among ctx.args.
    run = ctx.params.get("run") or next(iter(ctx.args), None)
    try:
        if run:
            from handoff.projections import queries

            with _completion_store(ctx) as store:
                cp = None if store is None else queries.checkpoint(store, run)
            declared = None if cp is None else cp.progress_kinds
    except Exception:  # a Tab must never print a traceback into the command line being typed
        declared = None
    return _complete_from(lambda: _progress_kind_names(declared))(ctx, param, incomplete)


def _health_names() -> Any:
    from handoff.reducers.stall import CLASSIFICATIONS

    return CLASSIFICATIONS


COMPLETE_STATE = _complete_from(_states)
COMPLETE_KIND = _complete_kinds
COMPLETE_HEALTH = _complete_from(_health_names)


def run_argument(f: Any) -> Any:
    return click.argument("run", metavar="RUN", shell_complete=_complete_runs)(f)


def worker_run_argument(f: Any) -> Any:
    # Inside 'handoff run' the child has HANDOFF_RUN and HANDOFF_LEASE: RUN and --lease may go.
    return click.argument("run", metavar="RUN", envvar="HANDOFF_RUN", shell_complete=_complete_runs)(f)


class LeaseTokenParam(click.ParamType):
    """A lease token as claim printed it (LEASE.SECRET); a bare number is a usage error."""

    name = "TOKEN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from handoff.ledger.errors import InvalidInput
        from handoff.ledger.store import LeaseToken

        try:
            return LeaseToken.parse(value)
        except InvalidInput as exc:
            # Say what was given only by its kind: an argument may be someone's real token.
            self.fail(exc.message.replace("lease is ", "this is ", 1), param, ctx)


LEASE_TOKEN = LeaseTokenParam()


def lease_option(required: bool = True) -> Any:
    help_ = ("Your lease token, exactly as claim printed it (LEASE.SECRET); the lease number alone is refused."
             if required else
             "Act as the worker holding this lease, given as the token claim printed; without it you act "
             "as an operator (--by, else $HANDOFF_ACTOR, else your login name).")
    return click.option("--lease", type=LEASE_TOKEN, required=required, envvar="HANDOFF_LEASE",
                        show_envvar=True, help=help_)


def key_option(f: Any) -> Any:
    return click.option("--key", default=None,
                        help="Idempotency key: repeating the same command with it writes nothing new.")(f)


#: How ``--attr KEY=VALUE`` reads VALUE, in words for --help and docs/cli.md.
ATTR_HELP = ("A fact about this step as KEY=VALUE (repeatable), e.g. model=claude-sonnet, "
             "gen_ai.usage.input_tokens=1200, cost_usd=0.012. VALUE true or false is a boolean; a number "
             "written as it prints (42, -7, 0.25) is a number; anything else is text, as given (007, 1e3 "
             "and 3.10 stay text). To keep a number as text, put it in double quotes: build='\"42\"'.")
_ATTR_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_ATTR_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)\.[0-9]+")


def attr_value(text: str) -> Any:
    """VALUE of ``--attr KEY=VALUE``: a number only when it reads back as the very text
    given, so nothing typed is changed on the way in (3.10 stays "3.10", 007 stays "007")."""
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if _ATTR_INT.fullmatch(text) and text != "-0":
        from handoff.reducers.decide import ATTR_INT_RANGE

        low, high = ATTR_INT_RANGE
        if len(text) > 20 or not low <= int(text) <= high:
            raise click.BadParameter(f"{text[:30]} is a whole number outside the 64-bit range; to record it as "
                                     f"text, put it in double quotes ('\"{text[:30]}\"')")
        return int(text)
    if _ATTR_DECIMAL.fullmatch(text) and repr(float(text)) == text:
        return float(text)
    return text


class AttrParam(click.ParamType):
    """``KEY=VALUE``, read as (key, value); the bounds are the library's (check_attrs)."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        key, eq, text = str(value).partition("=")
        if not eq or not key:
            self.fail(f"{value[:60]!r} is not KEY=VALUE (for example model=claude-sonnet)", param, ctx)
        try:
            return key, attr_value(text)
        except click.BadParameter as exc:
            self.fail(f"{key[:64]}: {exc.message}", param, ctx)


def attr_option(f: Any) -> Any:
    return click.option("--attr", "attr_pairs", multiple=True, type=AttrParam(), help=ATTR_HELP)(f)


def _attrs(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any] | None:
    """The --attr pairs as one map; a key given twice is a usage error, not a silent pick."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise click.UsageError(f"--attr {key} is given twice; give each key once")
        out[key] = value
    return out or None


def _printable(text: str) -> str:
    """Output of several lines with each line made ``render.visible``: an undecodable byte of
    a file name shows as \\xNN, a control character as an escape, and the lines stay the
    ones the renderer meant (JSON stays JSON: its escapes are JSON's)."""
    from handoff.render import lines

    return lines(text.split("\n"))


def _emit(doc: dict[str, Any], as_json: bool, text: str | None) -> None:
    if as_json:
        import json

        click.echo(_printable(json.dumps(doc, indent=2, ensure_ascii=False, default=str)))
    elif text is not None:
        click.echo(_printable(text))


def _report(out: Any, as_json: bool, did: str, **extra: Any) -> None:
    """Print what a write did: one line, or the write document."""
    from handoff import render as R

    doc = {**R.write_doc(out), **extra}
    r, cp = out.result, out.checkpoint
    if r.outcome == "duplicate":
        text = f"{r.run_id}: already recorded; nothing new written (state {cp.state})"
    elif r.outcome == "unchanged":
        text = f"{r.run_id}: nothing to add, it is already so; nothing written (at seq {r.last_seq}; state {cp.state})"
    else:
        seqs = f"seq {r.first_seq}" if r.first_seq == r.last_seq else f"seq {r.first_seq}-{r.last_seq}"
        text = f"{r.run_id}: {did} ({seqs}; state {cp.state})"
    _emit(doc, as_json, text)


def _exit_damage_found() -> None:
    """End a check that found damage with DamageFound's exit code (verify, check, doctor)."""
    from handoff.ledger.errors import DamageFound

    click.get_current_context().exit(DamageFound.exit_code)


# --- progress on long work: one bar for every long command -----------------------------

#: Work of fewer items than this shows no bar: it is over before a bar would help. Set
#: HANDOFF_PROGRESS_MIN to change it (0: a bar for any amount of work).
PROGRESS_MIN = 20_000


def _progress_min() -> int:
    text = os.environ.get("HANDOFF_PROGRESS_MIN", "")
    return int(text) if text.isdigit() else PROGRESS_MIN


class Progress:
    """The progress bar of every long command (copy, import, export, backup, verify,
    rebuild, check, report): a callable ``progress(done, total)`` handed to the library.

    click's own bar (a dependency already; rich would add a package for the same three
    numbers): items done of the total, the rate, the time left. It is drawn on stderr,
    and only when stderr is a terminal, so stdout (an export to -, a report to -) and
    anything piped or logged stay exactly the data. Off with --quiet and with --json,
    and for work smaller than ``PROGRESS_MIN``. A new total (the next stage of a copy:
    import, then verify) starts a new bar.
    """

    def __init__(self, label: str, *, quiet: bool = False) -> None:
        self.label, self.bar, self.done, self.total = label, None, 0, 0
        self.enabled = not quiet and sys.stderr.isatty()
        self.started = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < max(_progress_min(), 1):
            return
        import time

        if self.bar is not None and (total != self.total or done < self.done):
            self.close()
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True,
                                         show_eta=True, item_show_func=lambda rate: rate)
            self.bar.__enter__()
            self.done, self.total, self.started = 0, total, time.monotonic()
        elapsed = time.monotonic() - self.started
        rate = f"{done / elapsed:,.0f}/s" if elapsed > 0 else None
        self.bar.update(max(0, min(done, total) - self.done), rate)
        self.done = min(done, total)

    def close(self) -> None:
        """Finish the bar (the work is done, or failed: the error prints on a fresh line)."""
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def quiet_option(f: Any) -> Any:
    return click.option("-q", "--quiet", is_flag=True,
                        help="No progress bar (one is drawn on stderr, when it is a terminal, for long work).")(f)


# --- output that streams: memory flat however long the listing ------------------------

TABLE_WINDOW = 256  # a streamed table sizes its columns from this many rows at a time


def _stream_table(headers: list[str], rows: Any, *, window: int = TABLE_WINDOW) -> int:
    """Print an aligned table as its rows arrive; returns how many rows were printed.

    Columns are sized from the header and the first ``window`` rows, and only widen for
    later windows, so a long listing never has to be held whole to be printed.
    """
    import itertools

    from handoff.render import cells, table_lines

    widths = [len(h) for h in headers]
    it = iter(rows)
    printed = 0
    while chunk := [cells(row) for row in itertools.islice(it, window)]:
        for row in chunk:
            for i, c in enumerate(row):
                widths[i] = max(widths[i], len(c))
        click.echo("\n".join(table_lines([headers, *chunk] if not printed else chunk, widths)))
        printed += len(chunk)
    return printed


def _stream_json(head: dict[str, Any], key: str, items: Any, tail: Any = None) -> int:
    """Print ``{**head, key: [*items], **tail()}`` exactly as ``json.dumps(..., indent=2)``
    would, one item at a time; ``tail`` is called after the last item. Returns the count."""
    import json

    def dumps(value: Any, depth: int) -> str:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str).replace("\n", "\n" + "  " * depth)

    out = ["{"]
    for k, v in head.items():
        out.append(f"\n  {dumps(k, 1)}: {dumps(v, 1)},")
    out.append(f"\n  {dumps(key, 1)}: [")
    n = 0
    for item in items:
        out.append(("," if n else "") + "\n    " + dumps(item, 2))
        n += 1
        if len(out) >= TABLE_WINDOW:  # written in batches: one write per item is slow
            click.echo("".join(out), nl=False)
            out.clear()
    click.echo("".join(out), nl=False)
    end = ["\n  ]" if n else "]"]
    for k, v in (tail() if tail is not None else {}).items():
        end.append(f",\n  {dumps(k, 1)}: {dumps(v, 1)}")
    click.echo("".join(end) + "\n}")
    return n


def _stream_jsonl(items: Any, *, flush_each: bool = False) -> int:
    """One compact JSON document per line (each written at once with ``flush_each``, for --follow)."""
    import json

    n = 0
    out = []
    for item in items:
        out.append(json.dumps(item, ensure_ascii=False, default=str))
        n += 1
        if len(out) >= (1 if flush_each else TABLE_WINDOW):
            click.echo("\n".join(out))
            out.clear()
    if out:
        click.echo("\n".join(out))
    return n


#: Free-text CSV columns (what a worker or an operator wrote) and the first characters that
#: make a spreadsheet read a cell as a formula: such a cell gets a leading ' (the data
#: column keeps the event exactly).
CSV_FREE_TEXT = frozenset({"key", "summary"})
CSV_FORMULA_STARTS = frozenset("=+-@\t\r")


#: The columns of 'handoff log --csv'.
LOG_CSV_COLUMNS = ["position", "at", "run_id", "seq", "actor", "lease", "type", "key", "summary", "data", "db_role"]


def _stream_csv(items: Any, *, columns: list[str] | None = None, free_text: Any = CSV_FREE_TEXT,
                flush_each: bool = False) -> int:
    """CSV with a header line: ``columns`` of each row (a log row's by default), a map or a
    list in a cell (a log row's ``data``) as compact JSON, and a ``free_text`` cell that a
    spreadsheet would run as a formula shown as text."""
    import csv
    import io
    import json

    columns = LOG_CSV_COLUMNS if columns is None else columns
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    n = 0

    def cell(c: str, v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, bool):
            return "true" if v else "false"  # as in the JSON, not Python's True
        if c == "data" or isinstance(v, (dict, list, tuple)):
            return json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=str)
        if c in free_text and isinstance(v, str) and v[:1] in CSV_FORMULA_STARTS:
            return "'" + v  # a spreadsheet would run it as a formula; shown as text instead
        return v

    for item in items:
        writer.writerow([cell(c, item.get(c)) for c in columns])
        n += 1
        if flush_each or n % TABLE_WINDOW == 0:
            click.echo(buf.getvalue(), nl=False)
            sys.stdout.flush()
            buf.seek(0)
            buf.truncate()
    click.echo(buf.getvalue(), nl=False)
    return n


#: What --format offers; --json stays the short form of --format json.
FORMATS = ("table", "json", "jsonl", "csv")
FORMAT_HELP = ("table (the default), json (one document, as --json prints), jsonl (one JSON object per line) or "
               "csv (a header line; a cell that a spreadsheet would run as a formula, beginning with = + - or @, "
               "gets a leading ').")


def format_option(f: Any) -> Any:
    """--format table|json|jsonl|csv, with --json as its short form."""
    f = json_option(f)
    return click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help=FORMAT_HELP)(f)


def _format(fmt: str | None, as_json: bool) -> str:
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json is --format json; it cannot go with --format {fmt}: choose one")
    return "json" if as_json else fmt or "table"


class _AnyText:
    """Every column is free text (a listing's names, goals and reasons are all typed by someone)."""

    def __contains__(self, column: object) -> bool:
        return True


ALL_FREE_TEXT = _AnyText()


def _listing(fmt: str, head: dict[str, Any], key: str, rows: Any, tail: Any, columns: list[str],
             table: Any) -> int:
    """Print a listing's rows in ``fmt``: the JSON document (``head``, the rows under ``key``,
    then ``tail()``), one row per line, CSV, or the table ``table(rows)`` prints. For jsonl and
    csv, where stdout holds rows only, the next-page hint goes to stderr."""
    if fmt == "json":
        return _stream_json(head, key, rows, tail)
    if fmt == "table":
        return table(rows)
    n = _stream_jsonl(rows) if fmt == "jsonl" else _stream_csv(rows, columns=columns, free_text=ALL_FREE_TEXT)
    paging = tail()
    if paging.get("next"):
        click.echo(f"{paging['more']} more not shown; for the next page, repeat the command with "
                   f"--after {paging['next']} (or --limit 0 for all)", err=True)
    return n


def _one_document(doc: dict[str, Any], fmt: str, text: Any, pairs: Any) -> None:
    """Print one document (a packet, a comparison) in ``fmt``: the text ``text()``, JSON as
    --json prints it, one line of JSON, or CSV of the rows ``pairs(doc)`` gives."""
    if fmt == "table":
        click.echo(_printable(text()))
    elif fmt == "json":
        _emit(doc, True, None)
    elif fmt == "jsonl":
        _stream_jsonl([doc])
    else:
        header, rows = pairs(doc)
        _stream_csv(rows, columns=header, free_text=ALL_FREE_TEXT)


def _fields(doc: Any, prefix: str = "") -> Any:
    """A nested document as (field, value) rows, field being its dotted path: a packet in CSV."""
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            yield from _fields(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield {"field": prefix, "value": doc}


def _sides(doc: dict[str, Any]) -> Any:
    """A diff document as (what, a, b) rows, every {"a", "b"} pair in it under its dotted
    path (a difference in a field under the field's name): a comparison in CSV."""
    yield {"what": "run", "a": doc["run_a"], "b": doc["run_b"]}

    def pairs(part: Any, prefix: str) -> Any:
        if isinstance(part, dict):
            if "a" in part and "b" in part:
                name = f"{prefix}.{part['field']}" if "field" in part else prefix
                yield {"what": name, "a": part["a"], "b": part["b"]}
            for k, v in part.items():
                if k not in ("a", "b", "field"):
                    yield from pairs(v, f"{prefix}.{k}")
        elif isinstance(part, list):
            for v in part:
                yield from pairs(v, prefix)

    for key in ("compared", "heartbeats", "first_divergence", "after"):
        yield from pairs(doc[key], key)


def page_options(f: Any) -> Any:
    f = click.option("--after", "after", default=None, metavar="RUN",
                     help="Continue a listing after this run (the 'next' an earlier page printed).",
                     shell_complete=_complete_runs)(f)
    return click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True,
                        help="Print at most this many runs; 0 prints them all.")(f)


def _more_line(more: int, nxt: str | None, extra: str = "") -> None:
    if nxt:
        click.echo(f"... {more} more not shown; for the next page, repeat the command with "
                   f"--after {nxt}{extra} (or --limit 0 for all)")


# --- contract and lease --------------------------------------------------------------


@main.command()
@json_option
def init(as_json: bool) -> None:
    """Create an empty ledger file (or confirm an existing one).

    \b
    Example:
        handoff --db work.db init
    """
    from handoff.api import init_ledger

    st = _state()
    doc = init_ledger(st.db, busy_timeout_s=st.busy_timeout)
    text = (f"created ledger {st.db}" if doc["created"] else
            f"ledger {st.db} already exists ({doc['runs']} streams); nothing changed")
    _emit(doc, as_json, text)


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


def _open_kwargs(p: dict[str, Any]) -> dict[str, Any]:
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


@main.command("open")
@open_options(required=False)
@click.option("--contract", "contract_file", type=click.File("rb"), default=None,
              help="Read the whole contract from a JSON file ('-' for stdin) instead of options; "
              "see 'handoff contract-schema'.")
@key_option
@json_option
def open_(as_json: bool, key: str | None, contract_file: Any, **p: Any) -> None:
    """Write a run's contract before any worker starts; print the run id.

    The contract names the goal, where the request came from, the visible target the
    result is delivered to, the owner, the result file and the watchdog's timeouts.
    Give it as options (--goal, --target and --owner are then required) or as one JSON
    document with --contract, which is checked field by field. A result path is stored
    resolved to an absolute path. Without --run-id, each open makes a new run unless
    --key is given: the id then follows from the key and the owner, so a retry (even
    from another process at the same moment) prints the run the first attempt made.

    \b
    Example:
        RUN=$(handoff open --goal "Summarise the incident" --target chat:#ops \\
              --owner alice --result ./report.md --heartbeat-timeout 30)
        echo '{"goal": "Summarise", "target": "chat:#ops", "owner": "alice"}' \\
          | handoff open --contract -
    """
    if contract_file is not None:
        given = [name for name in ("goal", "target", "owner", "run_id", "result_path", "public") if p.get(name) is not None]
        given += [name for name in ("sanitize_patterns", "token_env", "progress_kinds") if p.get(name)]
        if given:
            raise click.UsageError(
                f"--contract holds the whole contract; drop --{given[0].replace('_', '-')} "
                "(or put it in the file)")
    else:
        missing = [name for name in ("goal", "target", "owner") if p.get(name) is None]
        if missing:
            raise click.UsageError(f"missing option --{missing[0]} (or give the whole contract with --contract FILE)")
    given_contract = None
    if contract_file is not None:  # read and checked before any ledger file is made
        from handoff import contract

        given_contract = contract.load(contract.read(contract_file))
    with _ledger(create=True) as lg:
        if given_contract is not None:
            run_id = lg.open_contract(given_contract, key=key)
        else:
            run_id = lg.open(**_open_kwargs(p), key=key)
        cp = lg.checkpoint(run_id)
    doc = {"run_id": run_id, "state": cp.state, "last_seq": cp.last_seq, "owner": cp.owner,
           "target": cp.target, "result_path": cp.result_path}
    _emit(doc, as_json, run_id)


@main.command()
@run_argument
@click.option("--worker", required=True, envvar="HANDOFF_WORKER", show_envvar=True, help="Your worker name.")
@key_option
@json_option
def claim(run: str, worker: str, key: str | None, as_json: bool) -> None:
    """Take the run's lease; print the lease token every later write must carry.

    The token (LEASE.SECRET) is printed this once and never stored: keep it, and pass
    it as --lease (or $HANDOFF_LEASE). The lease number that status shows is not a
    token. Refused (exit 1) while another worker holds the lease, or when the owner is
    at its cap of active runs. Retrying with the same --key after the claim went through
    is refused with the lease it got (its token cannot be shown again).

    \b
    Example:
        LEASE=$(handoff claim $RUN --worker worker-1)
    """
    from handoff import render as R

    with _ledger() as lg:
        got = lg.claim_outcome(run, worker, key=key)
    doc = {**R.write_doc(got.outcome), "token": str(got.token)}
    _emit(doc, as_json, str(got.token))


@main.command()
@worker_run_argument
@lease_option()
@attr_option
@json_option
def heartbeat(run: str, lease: str, attr_pairs: tuple[tuple[str, Any], ...], as_json: bool) -> None:
    """Say the lease holder is alive. Heartbeats are liveness, never progress.

    It takes no --key: a heartbeat changes no authority, and a repeated one only says
    again that the holder is alive, which is what a retry means.

    \b
    Example:
        handoff heartbeat $RUN --lease $LEASE
    """
    with _ledger() as lg:
        out = lg.heartbeat(run, lease, attrs=_attrs(attr_pairs))
    _report(out, as_json, "heartbeat recorded")


@main.command()
@worker_run_argument
@lease_option()
@click.option("--to", "to", required=True, metavar="STATE",
              help="planning, executing or verifying (see docs/lifecycle.md).", shell_complete=COMPLETE_STATE)
@click.option("--reason", default="", help="Why.")
@key_option
@json_option
def transition(run: str, lease: str, to: str, reason: str, key: str | None, as_json: bool) -> None:
    """Move the run through its lifecycle (queued -> planning -> executing -> verifying).

    \b
    Example:
        handoff transition $RUN --lease $LEASE --to executing
    """
    with _ledger() as lg:
        out = lg.transition(run, lease, to, reason=reason, key=key)
    _report(out, as_json, f"moved to {out.checkpoint.state}")


@main.command()
@worker_run_argument
@lease_option()
@click.option("--kind", required=True,
              help="plan_committed, tool_outcome, child_result, diff_validated, verifier_result, or a kind "
                   "the contract declared (--progress-kind at open); or a non-progress kind such as note, "
                   "tool_retry, waiting.", shell_complete=COMPLETE_KIND)
@click.option("--detail", default="", help="What happened.")
@attr_option
@key_option
@json_option
def progress(run: str, lease: str, kind: str, detail: str, attr_pairs: tuple[tuple[str, Any], ...], key: str | None,
             as_json: bool) -> None:
    """Record a step. Only the state's progress kinds advance progress_seq.

    With --key, a retried report writes nothing new.

    \b
    Example:
        handoff progress $RUN --lease $LEASE --kind tool_outcome --detail "tests pass" --key step-7
    """
    with _ledger() as lg:
        out = lg.progress(run, lease, kind, detail, key=key, attrs=_attrs(attr_pairs))
    _report(out, as_json, f"{kind} recorded, progress_seq {out.checkpoint.progress_seq}")


@main.command()
@click.argument("run", metavar="RUN")
@click.argument("path", metavar="PATH", required=False)
@lease_option()
@click.option("--kind", default="result", show_default=True, help="What the file is (result, log, diff...).")
@click.option("--root", default=None, type=click.Path(file_okay=False),
              help="Refuse a path that resolves outside this directory.")
@click.option("--max-bytes", "max_bytes", default=None, metavar="SIZE",
              help="Refuse a file larger than this, e.g. 64M or 2G (default: $HANDOFF_ARTIFACT_MAX_BYTES, "
                   "else 1G).")
@attr_option
@key_option
@json_option
def artifact(run: str, path: str | None, lease: str, kind: str, root: str | None, max_bytes: str | None,
             attr_pairs: tuple[tuple[str, Any], ...], key: str | None, as_json: bool) -> None:
    """Record a file the run produced; the ledger reads its size and sha256 itself.

    Inside 'handoff run', RUN may be left out (it is $HANDOFF_RUN).

    Only a finished regular file is read: a FIFO, device, socket, directory or /proc
    file is refused, and so is a file that changes while it is read (record it again
    once it is finished). A path that does not exist is recorded as MISSING.

    \b
    Example:
        handoff artifact $RUN --lease $LEASE --kind result ./report.md
    """
    if path is None:
        run, path = os.environ.get("HANDOFF_RUN") or "", run
        if not run:
            raise click.UsageError("give RUN and PATH (RUN may be left out only when HANDOFF_RUN is set)")
    with _ledger() as lg:
        out = lg.artifact(run, lease, path, kind=kind, root=root, key=key,
                          max_bytes=max_bytes, attrs=_attrs(attr_pairs))
    art = out.checkpoint.artifacts[-1] if out.checkpoint.artifacts else None
    extra = {} if art is None else {"artifact": {"path": art.path, "kind": art.kind, "bytes": art.bytes,
                                                 "sha256": art.sha256, "exists": art.exists}}
    did = "artifact recorded"
    if art is not None:
        did = (f"{art.kind} {art.path} recorded ({art.bytes} bytes, sha256 {art.sha256[:12]})" if art.exists
               else f"{art.kind} {art.path} recorded as MISSING (mistyped? 'handoff artifact-withdraw')")
    _report(out, as_json, did, **extra)


@main.command("artifact-withdraw")
@click.argument("run", metavar="RUN")
@click.argument("path", metavar="PATH")
@click.option("--reason", required=True, help="Why it no longer counts (mistyped path, replaced by another file...).")
@lease_option(required=False)
@click.option("--by", default=None, help="Operator name when acting without a lease.")
@key_option
@json_option
def artifact_withdraw(run: str, path: str, reason: str, lease: str | None, by: str | None, key: str | None,
                      as_json: bool) -> None:
    """Withdraw a recorded artifact: it no longer counts for 'submit'; the log keeps both.

    For a path recorded by mistake (MISSING, empty, or replaced by another file). PATH
    is the path as 'status' shows it, or as it was given to 'artifact'. The file is not
    touched. Refused once a result is submitted (ready_for_review, succeeded) and after
    the run ended.

    \b
    Example:
        handoff artifact-withdraw $RUN --lease $LEASE ./reprot.md --reason "typo: report.md"
    """
    with _ledger() as lg:
        out = lg.withdraw_artifact(run, path, reason, lease=lease, by=by, key=key)
        written = lg.written(out)
    # The path as recorded (resolved), read from the event itself (or the original, for a replayed key).
    if written and written[0].type == "artifact_withdrawn":
        path = written[0].event.path  # type: ignore[attr-defined]
    _report(out, as_json, f"artifact {path} withdrawn; it no longer counts for submit", path=path)


@main.command()
@worker_run_argument
@lease_option(required=False)
@click.option("--kind", required=True, help="What was checked (tests, lint, review...).")
@click.option("--outcome", required=True, type=click.Choice(["pass", "fail", "skipped"]))
@click.option("--detail", default="", help="What the check saw.")
@click.option("--by", default=None, help="Operator name when acting without a lease.")
@attr_option
@key_option
@json_option
def evidence(run: str, lease: str | None, kind: str, outcome: str, detail: str, by: str | None,
             attr_pairs: tuple[tuple[str, Any], ...], key: str | None, as_json: bool) -> None:
    """Record a check that was run and how it came out. Delivery needs a pass and no fail.

    \b
    Example:
        handoff evidence $RUN --lease $LEASE --kind tests --outcome pass --detail "42 passed"
    """
    with _ledger() as lg:
        out = lg.evidence(run, kind, outcome, detail, lease=lease, by=by, key=key, attrs=_attrs(attr_pairs))
    _report(out, as_json, f"evidence {kind}: {outcome}")


@main.command()
@worker_run_argument
@click.option("--reason", required=True, help="What the run cannot go on without.")
@click.option("--next-action", required=True, help="What must happen to unblock it, and by whom.")
@lease_option(required=False)
@click.option("--by", default=None, help="Operator name when acting without a lease.")
@key_option
@json_option
def block(run: str, reason: str, next_action: str, lease: str | None, by: str | None, key: str | None,
          as_json: bool) -> None:
    """Record a named blocker and the next action; the run waits in 'blocked'.

    A blocked run is not a stall: the watchdog leaves it alone.

    \b
    Example:
        handoff block $RUN --reason "needs prod credentials" --next-action "alice grants read access"
    """
    with _ledger() as lg:
        out = lg.block(run, reason, next_action, lease=lease, by=by, key=key)
    _report(out, as_json, f"blocker #{out.checkpoint.blockers_raised} raised")


@main.command()
@worker_run_argument
@click.option("--resolution", required=True, help="How the blocker went away.")
@click.option("--blocker", "blocker_id", type=int, default=None, help="Clear only this blocker id (default: all).")
@lease_option(required=False)
@click.option("--by", default=None, help="Operator name when acting without a lease.")
@key_option
@json_option
def unblock(run: str, resolution: str, blocker_id: int | None, lease: str | None, by: str | None,
            key: str | None, as_json: bool) -> None:
    """Clear blockers; the run returns to the state it was blocked from.

    \b
    Example:
        handoff unblock $RUN --resolution "read access granted"
    """
    with _ledger() as lg:
        out = lg.unblock(run, resolution, blocker_id=blocker_id, lease=lease, by=by, key=key)
    _report(out, as_json, "unblocked" if out.checkpoint.state != "blocked" else "blocker cleared")


@main.command("effect-start")
@worker_run_argument
@lease_option()
@click.option("--key", required=True, help="The side effect's own key (unique within the run).")
@click.option("--what", required=True, help="What is about to happen outside (e.g. 'POST /deploy v42').")
@attr_option
@json_option
def effect_start(run: str, lease: str, key: str, what: str, attr_pairs: tuple[tuple[str, Any], ...],
                 as_json: bool) -> None:
    """Record that an external side effect is about to start, before starting it.

    Until its outcome is confirmed, a lost worker leaves the run 'unknown' and the
    watchdog asks for reconciliation instead of a blind retry.

    \b
    Example:
        handoff effect-start $RUN --lease $LEASE --key deploy-v42 --what "deploy v42 to staging"
    """
    with _ledger() as lg:
        out = lg.effect_start(run, lease, key, what, attrs=_attrs(attr_pairs))
    _report(out, as_json, f"side effect {key} started")


@main.command("effect-confirm")
@worker_run_argument
@click.option("--key", required=True, help="The side effect's key.")
@click.option("--outcome", required=True, type=click.Choice(["done", "absent"]),
              help="done: it happened; absent: it did not.")
@click.option("--note", default="", help="How you know (for a reconciliation).")
@lease_option(required=False)
@click.option("--by", default=None, help="Operator name when acting without a lease.")
@attr_option
@json_option
def effect_confirm(run: str, key: str, outcome: str, note: str, lease: str | None, by: str | None,
                   attr_pairs: tuple[tuple[str, Any], ...], as_json: bool) -> None:
    """Record a side effect's outcome (a reconciliation when its worker was lost).

    \b
    Example:
        handoff effect-confirm $RUN --key deploy-v42 --outcome done --note "v42 is live on staging"
    """
    with _ledger() as lg:
        out = lg.effect_confirm(run, key, outcome, note=note, lease=lease, by=by, attrs=_attrs(attr_pairs))
    _report(out, as_json, f"side effect {key}: {outcome}")


@main.command()
@worker_run_argument
@lease_option()
@click.option("--summary", default="", help="One paragraph on what was done.")
@key_option
@json_option
def submit(run: str, lease: str, summary: str, key: str | None, as_json: bool) -> None:
    """Submit the result: needs a recorded, existing, non-empty artifact (and the contract's
    result file, if it names one). Goes to review when the contract requires it.

    \b
    Example:
        handoff submit $RUN --lease $LEASE --summary "report drafted and checked"
    """
    with _ledger() as lg:
        out = lg.submit(run, lease, summary, key=key)
    _report(out, as_json, f"result submitted; now {out.checkpoint.state}")


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner (or whoever the owner transferred review to).")
@click.option("--approve/--reject", "approve", default=None, help="The decision.")
@click.option("--notes", default="", help="What the reviewer saw.")
@key_option
@json_option
def review(run: str, by: str, approve: bool | None, notes: str, key: str | None, as_json: bool) -> None:
    """Approve or reject a submitted result. A rejection sends the run back to executing.

    \b
    Example:
        handoff review $RUN --by alice --approve --notes "numbers check out"
    """
    if approve is None:
        raise click.UsageError("say --approve or --reject")
    with _ledger() as lg:
        out = lg.review(run, by, approve, notes, key=key)
    _report(out, as_json, "approved" if approve else "rejected")


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner, or someone it transferred the action to.")
@click.option("--action", required=True, type=click.Choice(["review", "deliver", "delivered", "delivery_failed", "close"]),
              help="The owner-only action to hand over.")
@click.option("--to", "to", required=True, help="Who may perform it from now on.")
@key_option
@json_option
def transfer(run: str, by: str, action: str, to: str, key: str | None, as_json: bool) -> None:
    """Let a named actor perform one of the owner's actions on this run.

    Each transfer is recorded; retry one with the same --key to record it once.

    \b
    Example:
        handoff transfer $RUN --by alice --action deliver --to release-bot
    """
    with _ledger() as lg:
        out = lg.transfer(run, action, to, by=by, key=key)
    _report(out, as_json, f"{to} may now {action}")


# --- delivery -------------------------------------------------------------------------


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner, or someone it transferred 'deliver' to.")
@click.option("--key", required=True, help="The delivery's idempotency key; a retry with it is a no-op.")
@click.option("--send", "send_now", is_flag=True,
              help="Send it too, through the target's adapter (http(s)://, file://DIR, cmd:), and record "
              "the outcome: confirmed, failed, or unknown.")
@click.option("--timeout", type=float, default=None,
              help="With --send: seconds one send may take (default: the contract's send timeout).")
@click.option("--retries", type=int, default=None,
              help="With --send: further tries of a send of unknown outcome, only to a target that "
              "honours keys (default: the contract's).")
@json_option
def deliver(run: str, by: str, key: str, send_now: bool, timeout: float | None, retries: int | None,
            as_json: bool) -> None:
    """Record a delivery attempt to the contract's target, before sending; with --send, send it.

    Without --send, send only when this prints "send": a retried attempt with the same
    key, or one after the delivery was confirmed, writes nothing and says so ("send":
    false; outcome "unchanged", or "duplicate" for a replayed --key).
    A second delivery under another key is refused (exit 1).

    With --send the ledger records the attempt, sends through the adapter, then records
    the receipt, the failure, or that no answer came (status "unknown"; exit 1). A send
    of unknown outcome is repeated, under the same key, only to a target that honours
    keys (http(s) with Idempotency-Key, file://); a cmd: target is never run twice for a
    key: check it, then record 'handoff delivered' or 'handoff delivery-failed'. A
    public target (open --public) needs 'handoff sanitize' to have passed first.

    \b
    Example:
        handoff deliver $RUN --by alice --key report-v1
        # ... post the result to the target, then:
        handoff delivered $RUN --key report-v1 --receipt "msg 1712"
        handoff deliver $RUN --by alice --key report-v1 --send     # the ledger sends it
    """
    from handoff import render as R
    from handoff.reducers.delivery import honours_keys

    if not send_now and (timeout is not None or retries is not None):
        raise click.UsageError("--timeout and --retries apply to --send only")
    if send_now:
        with _ledger() as lg:
            sent = lg.deliver(run, by, key, send=True, timeout_s=timeout, retries=retries)
        doc = {"run_id": run, "status": sent.status, "sent": sent.sent, "receipt": sent.receipt,
               "error": sent.error, "tries": sent.tries, **R.delivery_doc(sent.checkpoint)}
        # The receipt and the error are the target's words: one line each, escaped.
        receipt, error = R.visible(sent.receipt or ""), R.visible(sent.error or "")
        text = (f"{run}: delivery {key} confirmed: {receipt}" if sent.status == "confirmed" and sent.sent else
                f"{run}: delivery {key} was already confirmed; nothing sent" if sent.status == "confirmed" else
                f"{run}: delivery {key} failed: {error}; a new attempt needs a new key" if sent.status == "failed"
                else f"{run}: delivery {key} has no known outcome: {error}. "
                + ("Send again with the same key." if honours_keys(sent.checkpoint.target) else
                   "Check the target, then record 'handoff delivered' or 'handoff delivery-failed'."))
        _emit(doc, as_json, text)
        if sent.status != "confirmed":  # not delivered: the same code as a refusal
            from handoff.ledger.errors import Refused

            click.get_current_context().exit(Refused.exit_code)
        return
    with _ledger() as lg:
        out = lg.deliver(run, by, key)
    cp, extra = out.checkpoint, R.delivery_doc(out.checkpoint)
    if out.duplicate:
        extra["send"] = False
        st = extra["delivery"]["status"]
        text = (f"{run}: delivery {key} is already {st}; do not send again" if st == "confirmed" else
                f"{run}: delivery {key} was already recorded ({st}); do not send again until it is confirmed or failed")
        _emit({**R.write_doc(out), **extra}, as_json, text)
        return
    extra["send"] = True
    _report(out, as_json, f"delivery {key} to {cp.target} recorded: send now, then 'handoff delivered'", **extra)


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner, or someone it transferred 'deliver' to.")
@json_option
def sanitize(run: str, by: str, as_json: bool) -> None:
    """Check what a delivery would send for secrets and local details, and record the check.

    Reads the submitted summary and every recorded artifact (each must still match its
    recorded sha256), runs the built-in detectors (secrets and keys in known formats,
    home directories, absolute local paths, private addresses, internal host names,
    e-mail addresses) and the contract's own --sanitize-pattern expressions, and records
    'sanitization_checked' with the digests it read. Findings name the detector, the part
    and the line, never the text. Exit 0 when it passed; 1 when something was found (the
    failed check is recorded; a public target then stays refused).

    \b
    Example:
        handoff sanitize $RUN --by alice && handoff deliver $RUN --by alice --key v1 --send
    """
    with _ledger() as lg:
        doc = lg.sanitize(run, by)
    from handoff.reducers.sanitize import describe
    from handoff.ledger.events import Finding

    findings = [Finding(**f) for f in doc["findings"]]
    text = (f"{run}: sanitization passed over {len(doc['items'])} parts (bundle sha256 {doc['bundle_sha256'][:16]})"
            if doc["passed"] else f"{run}: sanitization FAILED: {describe(findings, limit=20)}")
    _emit(doc, as_json, text)
    if not doc["passed"]:  # recorded, and a public target stays refused
        from handoff.ledger.errors import Refused

        click.get_current_context().exit(Refused.exit_code)


@main.command()
@run_argument
@click.option("--key", required=True, help="The delivery's key.")
@click.option("--receipt", required=True, help="The target's acknowledgement (message id, URL...).")
@click.option("--by", default=None, help="Who confirms (default: the owner).")
@json_option
def delivered(run: str, key: str, receipt: str, by: str | None, as_json: bool) -> None:
    """Record the target's receipt: the delivery is proven and the run ends 'delivered'.

    \b
    Example:
        handoff delivered $RUN --key report-v1 --receipt "https://chat.example/ops/p1712"
    """
    from handoff import render as R

    with _ledger() as lg:
        out = lg.delivered(run, key, receipt, by=by)
    _report(out, as_json, f"delivery {key} confirmed", **R.delivery_doc(out.checkpoint))


@main.command("delivery-failed")
@run_argument
@click.option("--key", required=True, help="The delivery's key.")
@click.option("--error", required=True, help="How you know it did not arrive.")
@click.option("--by", default=None, help="Who records it (default: the owner).")
@json_option
def delivery_failed(run: str, key: str, error: str, by: str | None, as_json: bool) -> None:
    """Record that a delivery attempt is known not to have arrived; a new key may follow.

    \b
    Example:
        handoff delivery-failed $RUN --key report-v1 --error "channel archived"
    """
    from handoff import render as R

    with _ledger() as lg:
        out = lg.delivery_failed(run, key, error, by=by)
    _report(out, as_json, f"delivery {key} marked failed", **R.delivery_doc(out.checkpoint))


# --- ending and forking ---------------------------------------------------------------


@main.command()
@worker_run_argument
@lease_option()
@click.option("--reason", default="", help="Why.")
@key_option
@json_option
def release(run: str, lease: str, reason: str, key: str | None, as_json: bool) -> None:
    """Give the lease back so another worker may claim the run.

    A retry without --key after the release went through is refused (the lease has
    ended); with the same --key it answers that the release is already recorded.

    \b
    Example:
        handoff release $RUN --lease $LEASE --reason "handing over to the night shift"
    """
    with _ledger() as lg:
        out = lg.release(run, lease, reason, key=key)
    _report(out, as_json, f"lease {str(lease).partition('.')[0]} released")


@main.command()
@run_argument
@click.option("--reason", required=True, help="Why the holder must stop.")
@click.option("--lease", type=click.IntRange(min=1), default=None,
              help="Revoke only if this is still the current lease.")
@click.option("--by", default=None,
              help="Who is acting (default: $HANDOFF_ACTOR, else your login name): logged as the run's owner "
                   "when it is the owner's name, else as an operator.")
@key_option
@json_option
def revoke(run: str, reason: str, lease: int | None, by: str | None, key: str | None, as_json: bool) -> None:
    """Take the lease away from its holder; its later writes are refused.

    \b
    Example:
        handoff revoke $RUN --reason "worker host is being drained"
    """
    with _ledger() as lg:
        before = lg.checkpoint(run).lease
        out = lg.revoke(run, reason, lease=lease, by=by, key=key)
    _report(out, as_json, f"lease {before} revoked")


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner (or, with --operator, an operator).")
@click.option("--disposition", "disposition", required=True,
              type=click.Choice([*(d.replace("_", "-") for d in CLOSE_DISPOSITIONS),
                                 *(d for d in CLOSE_DISPOSITIONS if "_" in d)]), help="How the run ends.")
@click.option("--reason", default="", help="Why.")
@click.option("--operator", is_flag=True, help="Close as an operator rather than as the owner.")
@key_option
@json_option
def close(run: str, by: str, disposition: str, reason: str, operator: bool, key: str | None,
          as_json: bool) -> None:
    """End a run without delivery: no-op, cancelled or failed. Terminal states absorb.

    A second close is refused (the run has ended); a retry with the same --key answers
    that the close is already recorded.

    \b
    Example:
        handoff close $RUN --by alice --disposition no-op --reason "already fixed upstream"
    """
    disposition = disposition.replace("-", "_")
    with _ledger() as lg:
        out = lg.close_run(run, by, disposition, reason, as_operator=operator, key=key)
    _report(out, as_json, f"closed as {disposition}")


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner (or, with --operator, an operator).")
@click.option("--reason", required=True, help="Why it goes back, for the worker who fixes it.")
@click.option("--operator", is_flag=True, help="Reopen as an operator rather than as the owner.")
@key_option
@json_option
def reopen(run: str, by: str, reason: str, operator: bool, key: str | None, as_json: bool) -> None:
    """Send a succeeded run whose sanitization check failed back to verifying.

    A public target's delivery is refused while the latest check finds something, and a
    submitted result cannot be changed. Reopening moves the run to verifying: the worker
    holding the lease (or, once none does, a worker that claims it) withdraws what the
    check found ('handoff artifact-withdraw'), records the result again and submits it;
    then check it again ('handoff sanitize'). Refused unless the run is succeeded, its
    latest check failed and no delivery attempt waits for its outcome.

    \b
    Example:
        handoff reopen $RUN --by alice --reason "the report quotes an API key; remove it"
    """
    with _ledger() as lg:
        out = lg.reopen(run, by=by, reason=reason, as_operator=operator, key=key)
    _report(out, as_json, "reopened; now verifying")


@main.command()
@run_argument
@click.option("--at", "at_seq", required=True, type=click.IntRange(min=1), help="The parent's seq to continue from.")
@click.option("--run-id", default=None, help="The new run's id.")
@click.option("--by", default=None, help="Operator name (default: $HANDOFF_ACTOR, else your login name).")
@key_option
@json_option
def fork(run: str, at_seq: int, run_id: str | None, by: str | None, key: str | None, as_json: bool) -> None:
    """Start a new run that continues RUN as it stood at --at; print the new id.

    The fork keeps the parent's history but not its lease, timers or watchers. Without
    --run-id each fork is a new child; with --key (and no --run-id) the child's id
    follows from the key, so a retried fork prints the child it made the first time.

    \b
    Example:
        NEW=$(handoff fork $RUN --at 12)
    """
    with _ledger() as lg:
        child = lg.fork(run, at_seq, new_run_id=run_id, by=by, key=key)
        cp = lg.checkpoint(child)
    _emit({"run_id": child, "parent": run, "parent_seq": at_seq, "state": cp.state}, as_json, child)


# --- reading ----------------------------------------------------------------------------


@main.command()
@click.argument("run", metavar="[RUN]", required=False, shell_complete=_complete_runs)
@click.option("--state", "states", multiple=True, help="Only runs in this state (repeatable).",
              shell_complete=COMPLETE_STATE)
@click.option("--owner", default=None, help="Only this owner's runs.")
@click.option("--all", "include_terminal", is_flag=True,
              help=f"Include {DELIVERED}, {', '.join(d.replace('_', '-') for d in CLOSE_DISPOSITIONS[:-1])} and "
                   f"{CLOSE_DISPOSITIONS[-1]} runs.")
@click.option("--now", type=ISO_TIME, default=None, help="Judge health as of this time (default: now).")
@page_options
@format_option
def status(run: str | None, states: tuple[str, ...], owner: str | None, include_terminal: bool,
           now: int | None, limit: int, after: str | None, fmt: str | None, as_json: bool) -> None:
    """Show one run's checkpoint packet, or a table of the runs that are not terminal.

    The table leaves out runs that ended (delivered, no-op, cancelled, failed) and its
    last line says how many it left out; --all (or --state naming an end state) lists them.

    The packet is everything the next actor needs: state, contract, lease, progress,
    blockers, artifacts, evidence, pending side effects, review, delivery, health and
    whether a live watcher really covers the run.

    The table lists runs oldest first (in the order the ledger first recorded them),
    100 at a time: the last line says how many more match and the --after RUN that
    shows the next page (in --json: "next" and "more").

    \b
    Example:
        handoff status $RUN
        handoff status --state executing --owner alice --json
        handoff status --all --limit 50 --after run-20260501-120000-a1b2c3
    """
    from handoff import render as R

    from handoff.reducers import stall

    fmt = _format(fmt, as_json)
    with _ledger() as lg:
        if run is not None:
            p = lg.status(run, now=now)
            _one_document(p, fmt, lambda: R.format_packet(p), lambda d: (["field", "value"], _fields(d)))
            return
        when = now if now is not None else lg.clock()
        filters = {"after": after, "include_terminal": include_terminal, "states": states, "owner": owner}
        if limit:
            page = lg.runs_page(limit=limit, **filters)
            items, nxt, more = page.items, page.next, page.more
        else:
            items, nxt, more = lg.iter_runs(**filters), None, 0
        rows = (R.run_row(cp, stall.classify(cp, now_us=when)) for cp in items)
        # What the listing leaves out, and how to see it: ended runs, unless asked for.
        hidden = 0 if include_terminal or states else lg.terminal_count(owner=owner)
        n = _listing(fmt, {"now": R.iso(when)}, "runs", rows,
                     lambda: {"next": nxt, "more": more, "hidden_terminal": hidden}, list(R.RUN_ROW_KEYS),
                     lambda rows: _stream_table(
                         ["RUN", "STATE", "OWNER", "WORKER", "LEASE", "PROGRESS", "HEALTH", "UPDATED"],
                         ([r["run_id"], r["state"], r["owner"], r["worker"], r["lease"], r["progress_seq"],
                           r["health"], R.iso_ms(r["updated_at"])] for r in rows)))
        if fmt != "table":
            return
    if not n:
        click.echo("no runs" + ("" if include_terminal else " that are not terminal")
                   + (f" after {after}" if after else "") + " match")
    _more_line(more, nxt)
    if hidden:
        ended = f"{DELIVERED}, {', '.join(d.replace('_', '-') for d in CLOSE_DISPOSITIONS)}"
        click.echo(f"({hidden} run{'s' if hidden != 1 else ''} that ended ({ended}) "
                   f"{'are' if hidden != 1 else 'is'} not shown; add --all to list them, or give a run: "
                   "handoff status RUN)")


@main.command()
@click.option("--state", "states", multiple=True, metavar="STATE", help="Only runs in this state (repeatable).",
              shell_complete=COMPLETE_STATE)
@click.option("--owner", default=None, help="Only this owner's runs.")
@click.option("--worker", default=None, help="Only runs whose current lease this worker holds.")
@click.option("--target", default=None, help="Only runs delivering to this target (as opened, e.g. chat:#ops).")
@click.option("--health", "health", multiple=True, metavar="HEALTH",
              help="Only runs judged so at --now (repeatable): stalled, unavailable, needs_reconciliation, "
                   "delivery_ambiguous, blocked, healthy... (the classifications of 'status').",
              shell_complete=COMPLETE_HEALTH)
@click.option("--opened-after", "opened_after", type=ISO_TIME, default=None,
              help="Only runs opened at or after this time (ISO 8601).")
@click.option("--opened-before", "opened_before", type=ISO_TIME, default=None,
              help="Only runs opened at or before this time (ISO 8601).")
@click.option("--live", is_flag=True, help="Leave out runs that ended (delivered, no-op, cancelled, failed).")
@click.option("--now", type=ISO_TIME, default=None, help="Judge health as of this time (default: now).")
@page_options
@format_option
def runs(states: tuple[str, ...], owner: str | None, worker: str | None, target: str | None,
         health: tuple[str, ...], opened_after: int | None, opened_before: int | None, live: bool,
         now: int | None, limit: int, after: str | None, fmt: str | None, as_json: bool) -> None:
    """List runs, ended ones included, narrowed by any of the filters (all must hold).

    State, owner, worker and target are answered by the ledger's indexed view; health
    (judged at --now) and the opening time are judged run by run as the listing streams,
    so a large ledger takes the same memory. Runs come oldest first (in the order the
    ledger first recorded them), 100 at a time: the last line says how many more match
    and the --after RUN (with the --now the page was judged at) that shows the next page.

    With --json: {"now", "runs": [{"run_id", "state", "owner", "target", "worker",
    "lease", "progress_seq", "health", "action", "updated_at", "goal", "opened_at"}],
    "next", "more"}; --format jsonl prints the rows one per line and csv with a header
    line, their next-page hint on stderr. The library call is Ledger.runs_page.

    \b
    Example:
        handoff runs --health stalled --owner alice
        handoff runs --state executing --worker w1 --format csv > executing.csv
        handoff runs --opened-after 2026-05-01T00:00:00Z --target chat:#ops --json
    """
    from handoff import render as R
    from handoff.reducers import stall

    fmt = _format(fmt, as_json)
    with _ledger() as lg:
        when = now if now is not None else lg.clock()
        filters = {"after": after, "include_terminal": not live, "states": states, "owner": owner,
                   "target": target, "worker": worker, "health": health, "opened_after": opened_after,
                   "opened_before": opened_before, "now": when}
        if limit:
            page = lg.runs_page(limit=limit, **filters)
            items, nxt, more = page.items, page.next, page.more
        else:
            items, nxt, more = lg.iter_runs(**filters), None, 0
        rows = ({**R.run_row(cp, stall.classify(cp, now_us=when)), "opened_at": R.iso(cp.opened_us)} for cp in items)
        n = _listing(fmt, {"now": R.iso(when)}, "runs", rows, lambda: {"next": nxt, "more": more},
                     [*R.RUN_ROW_KEYS, "opened_at"], lambda rows: _stream_table(
                         ["RUN", "STATE", "OWNER", "WORKER", "TARGET", "PROGRESS", "HEALTH", "OPENED", "UPDATED"],
                         ([r["run_id"], r["state"], r["owner"], r["worker"], r["target"], r["progress_seq"],
                           r["health"], R.iso_ms(r["opened_at"]), R.iso_ms(r["updated_at"])] for r in rows)))
    if fmt != "table":
        return
    if not n:
        click.echo("no runs match" + (f" after {after}" if after else ""))
    _more_line(more, nxt, "" if now is not None else f" --now {R.iso(when)}")


class PositionOrTime(click.ParamType):
    """A global position (a whole number) or an ISO 8601 time: ("position", n) or ("time", µs)."""

    name = "POSITION|TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        if text.isdigit():
            return ("position", int(text))
        return ("time", ISO_TIME.convert(text, param, ctx))


POSITION_OR_TIME = PositionOrTime()
#: Options of 'handoff log' that read across the ledger, refused with RUN.
_ACROSS = ("since", "until", "runs", "follow")


@main.command()
@click.argument("run", metavar="[RUN]", required=False, shell_complete=_complete_runs)
@click.option("--after", "after_seq", type=click.IntRange(min=0), default=None,
              help="With RUN: only events after this seq.")
@click.option("--since", type=POSITION_OR_TIME, default=None,
              help="Without RUN: from this position (a whole number) or time (ISO 8601) on, inclusive.")
@click.option("--until", type=POSITION_OR_TIME, default=None,
              help="Without RUN: up to this position or time, inclusive.")
@click.option("--type", "types", multiple=True, help="Only events of this type (repeatable), e.g. lease_revoked.")
@click.option("--actor", "actors", multiple=True,
              help="Only events written by this actor (repeatable): kind:name (worker:w1, watchdog:ops) or a "
                   "name alone.")
@click.option("--run", "runs", multiple=True, metavar="RUN",
              help="Without RUN: only this run's events (repeatable; a watcher's stream is watcher:NAME).",
              shell_complete=_complete_runs)
@click.option("--no-heartbeats", is_flag=True, help="Leave heartbeat_recorded events out.")
@click.option("--limit", type=click.IntRange(min=0), default=0, show_default=True,
              help="Print at most this many events (0: all); the last line (or 'next' in --json) says where the "
                   "next page starts (--after SEQ with RUN, --since POSITION without).")
@click.option("--follow", is_flag=True,
              help="Without RUN: after the last event, wait for new ones and print them as they are written, "
                   "until interrupted (Ctrl-C) or --limit is reached.")
@format_option
@click.option("--jsonl", "as_jsonl", is_flag=True, help="Print one JSON object per event, one per line (--format jsonl).")
@click.option("--csv", "as_csv", is_flag=True,
              help="Print CSV with a header line ('data' holds the event as JSON; a key or summary that "
                   "begins with = + - or @ gets a leading ' so a spreadsheet shows it as text) (--format csv).")
def log(run: str | None, after_seq: int | None, since: Any, until: Any, types: tuple[str, ...],
        actors: tuple[str, ...], runs: tuple[str, ...], no_heartbeats: bool, limit: int, follow: bool,
        fmt: str | None, as_json: bool, as_jsonl: bool, as_csv: bool) -> None:
    """Print a run's timeline, or (without RUN) events across the whole ledger.

    With RUN: seq, time, actor, lease, type and a one-line summary, oldest first (a
    fork's own events; 'replay' and 'report' fold its origin's too).

    Without RUN: every stream's events in position order (the order they were written),
    with the run and seq of each; narrow with --since/--until (a position or a time),
    --type, --actor and --run, or keep reading with --follow. An incident that spans
    several runs reads here in one listing.

    Events are printed as they are read, so a log of any length takes the same memory;
    table columns are sized from the first rows. --csv, --jsonl and --json suit
    spreadsheets and scripts (--json is one document, so it cannot --follow).

    \b
    Example:
        handoff log $RUN --no-heartbeats
        handoff log $RUN --type lease_granted --type lease_revoked --json
        handoff log --since 2026-05-01T12:00:00Z --until 2026-05-01T13:00:00Z --no-heartbeats
        handoff log --run $RUN --run $FORK --actor watchdog:ops --csv > watchdog.csv
        handoff log --follow --type recovery_decided --jsonl
    """
    from handoff import render as R

    if sum((as_json, as_jsonl, as_csv)) > 1:
        raise click.UsageError("choose one output: --json, --jsonl or --csv, not both (or all three)")
    given = "json" if as_json else "jsonl" if as_jsonl else "csv" if as_csv else None
    if fmt is not None and given is not None and fmt != given:
        raise click.UsageError(f"--{given} is --format {given}; it cannot go with --format {fmt}: choose one")
    fmt = fmt or given or "table"
    as_json, as_jsonl, as_csv = fmt == "json", fmt == "jsonl", fmt == "csv"
    if run is not None:
        given = [f"--{n}" for n, v in (("since", since), ("until", until), ("run", runs), ("follow", follow)) if v]
        if given:
            raise click.UsageError(f"{', '.join(given)} read across the ledger: leave out RUN (and use "
                                   f"--run {run} to keep to this run), or use --after SEQ with RUN")
    elif after_seq is not None:
        raise click.UsageError("--after is a seq within one run: give RUN, or use --since POSITION across the ledger")
    if follow and as_json:
        raise click.UsageError("--json prints one document, which a --follow never finishes; use --jsonl or --csv")
    last: list[int] = []  # the seq (or position) of the last event printed: where a next page starts
    nxt: list[int] = []
    stop = {"flag": False}

    def rows(records: Any, key: str, make: Any) -> Any:
        for i, rec in enumerate(records):
            if limit and i == limit:
                nxt.append(last[-1])
                return
            last[:] = [getattr(rec, key)]
            yield make(rec)
            if follow and limit and i + 1 == limit:
                return  # a follow would otherwise wait for one event more only to learn there is one

    with _ledger() as lg:
        role_of = lg.db_role_of()
        with_role = lg.store.records_roles

        def add_role(make: Any) -> Any:
            def made(rec: Any) -> dict[str, Any]:
                return {**make(rec), "db_role": role_of(rec.position)}
            return made

        if run is not None:
            from handoff.api import actor_filter

            by = actor_filter(actors)
            source = (r for r in lg.log(run, after_seq=after_seq or 0)
                      if (not types or r.type in types) and not (no_heartbeats and r.type == "heartbeat_recorded")
                      and by(r.actor))
            items = rows(source, "seq", add_role(R.log_row))
            head, headers, cells = {"run_id": run}, R.LOG_HEADERS, R.log_cells
        else:
            import signal

            if follow:
                def _stop(signum: int, frame: Any) -> None:
                    stop["flag"] = True

                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, _stop)
            bounds: dict[str, Any] = {}
            for name, value in (("since", since), ("until", until)):
                if value is not None:
                    bounds[f"{name}_{'position' if value[0] == 'position' else 'us'}"] = value[1]
            source = (r for r in lg.events(**bounds, types=types, actors=actors, runs=runs, follow=follow,
                                           should_stop=lambda: stop["flag"])
                      if not (no_heartbeats and r.type == "heartbeat_recorded"))
            items = rows(source, "position", add_role(R.log_row))
            head, headers, cells = {}, R.LEDGER_LOG_HEADERS, R.ledger_log_cells
        if with_role:  # the server's word on who inserted each event (PostgreSQL)
            headers = [*headers, "DB ROLE"]
            cells = (lambda c: lambda row: [*c(row), row["db_role"]])(cells)
        if as_csv:
            n = _stream_csv(items, flush_each=follow)
        elif as_jsonl:
            n = _stream_jsonl(items, flush_each=follow)
        elif as_json:
            n = _stream_json(head, "events", items, lambda: {"next": (nxt[0] + (0 if run else 1)) if nxt else None})
        else:
            n = _stream_table(headers, (cells(r) for r in items), window=1 if follow else TABLE_WINDOW)
            if not n and not follow:
                click.echo(f"{run}: no events match" if run else "no events match")
            if nxt:
                more = f"--after {nxt[0]}" if run else f"--since {nxt[0] + 1}"
                click.echo(f"... more events follow; for the next page, repeat the command with {more}")


@main.command()
@run_argument
@click.option("--at", "at_seq", type=click.IntRange(min=1), default=None, help="The run's seq to stop at.")
@click.option("--as-of", "as_of", type=ISO_TIME, default=None, help="The time to stop at (ISO 8601).")
@json_option
def replay(run: str, at_seq: int | None, as_of: int | None, as_json: bool) -> None:
    """Show the checkpoint packet exactly as it stood at a seq or a time.

    Health is judged at the moment of that last event (or at --as-of), so the packet
    says what a reader would have seen then.

    \b
    Example:
        handoff replay $RUN --at 7
        handoff replay $RUN --as-of 2026-05-01T12:00:00Z --json
    """
    from handoff import render as R

    if (at_seq is None) == (as_of is None):
        raise click.UsageError("give exactly one of --at SEQ or --as-of TIME")
    with _ledger() as lg:
        p = lg.status(run, at_seq=at_seq, as_of_us=as_of)
    if as_json:
        _emit(p, True, None)
    else:
        when = f"seq {at_seq}" if at_seq is not None else f"{R.iso(as_of)} (seq {p['last_seq']})"
        click.echo(f"{run} as it stood at {when}:\n" + R.format_packet(p))


@main.command()
@run_argument
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False, allow_dash=True),
              help="Where to write it (default: RUN-report.html, or RUN-report.md with --format md; - for "
                   "stdout). Written whole under a private name with the ledger file's permissions, then moved "
                   "into place; a symbolic link there is refused.")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default="html", show_default=True,
              help="html: the whole report, one self-contained file; md: the summary and a compact timeline.")
@click.option("--at", "at_seq", type=click.IntRange(min=1), default=None, help="Draw the run as it stood at this seq.")
@click.option("--as-of", "as_of", type=ISO_TIME, default=None, help="Draw the run as it stood at this time (ISO 8601).")
@quiet_option
@json_option
def report(run: str, output: str | None, fmt: str, at_seq: int | None, as_of: int | None, quiet: bool,
           as_json: bool) -> None:
    """Write an incident report of RUN: a summary and its timeline, as one HTML file.

    The summary answers where the run stands (state, owner and target), who holds the
    lease, when progress last moved and how long before the end of the log, whether and
    since when it is stalled, what the watchdog did, and whether the result was delivered
    (where, with what receipt, exactly once); each answer links to the events that prove it.

    The timeline draws lanes over wall-clock time: states, each worker's lease, heartbeats
    apart from progress, the watchdog's windows and actions, blockers, side effects,
    artifacts and evidence, review and delivery. Selecting any event shows its whole
    record and the checkpoint packet as it stood right after it.

    The file makes no network request when opened (styles, script and graphics are inline
    and its content policy forbids fetching), so it can be attached to a ticket and read
    offline or printed. A long run stays small: heartbeats are drawn in bins past 600,
    and past 3,000 events they are kept as seq and time only. --format md writes the
    summary and a compact timeline for a ticket or a chat thread. With --json, prints
    {"run_id", "path", "format", "bytes", "last_seq", "end", "as_of"}.

    \b
    Example:
        handoff report $RUN -o report.html
        handoff report $RUN --at 12 -o before-the-revocation.html
        handoff report $RUN --format md -o - | less
    """
    if at_seq is not None and as_of is not None:
        raise click.UsageError("give --at SEQ or --as-of TIME, not both")
    st = _state()
    to_stdout = output == "-"
    if as_json and to_stdout:
        raise click.UsageError("--json prints a summary of the file written; with -o - stdout carries the report itself")
    path = None if to_stdout else (output or f"{run}-report.{fmt}")
    with _ledger() as lg, Progress("reading the run", quiet=quiet or as_json) as bar:
        # The store names itself without any password its address may hold.
        hint = "" if st.db == "handoff.db" else f"--db {_quote_arg(lg.store.path)} "
        doc = lg.write_report(run, path, fmt=fmt, at_seq=at_seq, as_of_us=as_of, db_hint=hint, progress=bar)
    if to_stdout:
        click.echo(doc.pop("text"), nl=False)
        return
    _emit(doc, as_json, f"{run}: report of seq 1-{doc['last_seq']} written to {doc['path']} ({doc['bytes']} bytes)")


@main.command()
@click.argument("runs", metavar="[RUN]...", nargs=-1)
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Write the traces to this file as OTLP/JSON instead of sending them to a collector. Written "
                   "whole (with --follow: one line per export, appended).")
@click.option("--endpoint", default=None, metavar="URL",
              help="The collector's OTLP/HTTP address (default http://localhost:4318, the standard local port; "
                   "/v1/traces is added unless given).")
@click.option("--follow", is_flag=True,
              help="Keep running: export every run of the ledger each time it changes, until Ctrl-C.")
@click.option("--state", "state_path", default=None, type=click.Path(dir_okay=False),
              help="With --follow: the file where the follower records how far it got, so a restart resumes there.")
@click.option("--poll", type=click.FloatRange(min=0.05, max=3600), default=1.0, show_default=True,
              help="With --follow: the longest wait, in seconds, before looking for changes again.")
@json_option
def otel(runs: tuple[str, ...], output: str | None, endpoint: str | None, follow: bool, state_path: str | None,
         poll: float, as_json: bool) -> None:
    """Export runs as OpenTelemetry traces, to a collector or to a file.

    Each run becomes one trace in the GenAI agent conventions: a root span
    "invoke_workflow handoff" for the run, an "invoke_agent WORKER" span per lease (how
    it ended: released, revoked, lost, superseded or still held), an "execute_tool" span
    per side effect (confirmed, or unknown until reconciled), and the run's other events
    (state changes, heartbeats, progress, blockers, evidence, delivery) as span events.
    The ledger's own facts are attributes under handoff.* (run id, seqs, progress_seq,
    lease, state, health); the token counts and model a worker recorded in attrs are
    summed as gen_ai.usage.*. Idempotency keys, lease tokens and delivery addresses are
    never exported.

    The ids are derived from the run, so exporting a run twice sends the same trace (a
    collector keeps one copy). A worker that recorded its own trace_id (and span_id) in
    attrs finds the run's spans in its trace. Needs the otel extra: pip install
    '.[otel]' from the checkout.

    With --follow, runs are exported as they change, read from the ledger-wide log; the
    position is kept in the --state file, never in the ledger, and a follower restarted
    with the same file resumes after the last export the collector took. An export the
    collector does not take is retried every --poll seconds.

    With --json, prints {"runs": [{"run_id", "trace_id", "spans", "first_seq",
    "last_seq"}], "spans", "output", "endpoint"}; with --follow, one such document per
    export, one per line, with "position" added.

    \b
    Example:
        handoff otel $RUN -o trace.json
        handoff otel $RUN --endpoint http://localhost:4318
        handoff otel --follow --state otel.state
    """
    try:
        from handoff.integrations import otel as ot
    except ImportError as exc:
        from handoff.ledger.extras import install_hint

        raise click.UsageError(f"handoff otel needs the OpenTelemetry packages ({exc.name} is missing): "
                               f"{install_hint('otel')}") from exc
    if output is not None and endpoint is not None:
        raise click.UsageError("give -o FILE or --endpoint URL, not both")
    if follow and runs:
        raise click.UsageError("--follow exports every run as it changes; give no RUN with it")
    if not follow and not runs:
        raise click.UsageError("name at least one RUN to export, or use --follow to export every run as it changes")
    if follow and state_path is None:
        raise click.UsageError("--follow needs --state FILE: where it records how far it got, so a restart "
                               "resumes there (a new file starts from the beginning of the ledger)")
    if state_path is not None and not follow:
        raise click.UsageError("--state is for --follow")
    where = output if output is not None else ot.traces_url(endpoint or ot.DEFAULT_ENDPOINT)
    with _ledger() as lg:
        if not follow:
            if output is not None:
                doc = ot.write_json(lg, list(runs), output)
            else:
                doc = ot.export_runs(lg, list(runs), ot.otlp_exporter(where), where=where)
            doc.setdefault("output", None)
            doc["endpoint"] = None if output is not None else where
            _emit(doc, as_json, f"{doc['spans']} spans of {len(doc['runs'])} run(s) sent to {where}: " + ", ".join(
                f"{r['run_id']} trace {r['trace_id']}" for r in doc["runs"]))
            return
        import signal

        exporter = ot.JsonLinesExporter(output) if output is not None else ot.otlp_exporter(where)
        stop = {"flag": False}

        def _stop(signum: int, frame: Any) -> None:
            stop["flag"] = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop)

        def on_export(doc: dict[str, Any]) -> None:
            doc["output"], doc["endpoint"] = output, None if output is not None else where
            if as_json:
                import json

                click.echo(_printable(json.dumps(doc, ensure_ascii=False)))
            else:
                click.echo(_printable(f"position {doc['position']}: {doc['spans']} spans of "
                                      f"{', '.join(r['run_id'] for r in doc['runs'])} sent to {where}"))

        def on_error(exc: Any) -> None:
            click.echo(_printable(f"Error: {exc.message} (retrying in {poll:g}s)"), err=True)

        ot.follow(lg, exporter, state_path or "", where=where, poll_s=poll, should_stop=lambda: stop["flag"],
                  on_export=on_export, on_error=on_error)


def _quote_arg(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


@main.command()
@click.argument("run_a", metavar="RUN_A", shell_complete=_complete_runs)
@click.argument("run_b", metavar="RUN_B", shell_complete=_complete_runs)
@format_option
def diff(run_a: str, run_b: str, fmt: str | None, as_json: bool) -> None:
    """Compare two runs: where their histories part, and what differs after that.

    Meant for a fork and its origin, or two attempts at the same goal. The histories are
    aligned step by step (a fork's inherited events first; heartbeats left out, and a
    lease grant's token digest ignored). The first step that differs is named in each run
    (seq, event type, the fields that differ); then the runs' ends are compared: state
    reached, progress, artifacts by sha256, evidence and delivery.

    Exit codes follow diff(1): 0 the runs are the same, 1 they differ, and as on every
    verb, 1 with an error on stderr and nothing on stdout for a run that does not exist
    (UnknownRun), 2 a usage mistake, 3 a store problem. With --json:
    {"run_a", "run_b", "same", "compared", "heartbeats", "common_steps",
    "first_divergence", "after"} (docs/cli.md).

    \b
    Example:
        handoff diff $RUN $FORK
        handoff diff attempt-1 attempt-2 --json
    """
    from handoff import render as R

    with _ledger() as lg:
        doc = lg.diff(run_a, run_b)  # a missing run: UnknownRun, exit 1 as on every verb (stdout stays empty)
    _one_document(doc, _format(fmt, as_json), lambda: R.format_diff(doc), lambda d: (["what", "a", "b"], _sides(d)))
    click.get_current_context().exit(0 if doc["same"] else 1)


@main.command()
@click.option("--now", type=ISO_TIME, default=None, help="Judge as of this time (default: now).")
@page_options
@format_option
def stalls(now: int | None, limit: int, after: str | None, fmt: str | None, as_json: bool) -> None:
    """List every run whose health needs attention, with the evidence and the action.

    Evidence: last heartbeat, last progress (seq and kind), the lease and how many
    stalled windows the watchdog has seen at the same progress_seq (retries).

    Runs come oldest first (in the order the ledger first recorded them), 100 at a
    time: the last line says how many more need attention and the --after RUN (with
    the --now the page was judged at) that shows the next page; in --json, "next" and
    "more".

    \b
    Example:
        handoff stalls
        handoff stalls --now 2026-05-01T12:00:00Z --json
    """
    from handoff import render as R

    fmt = _format(fmt, as_json)
    with _ledger() as lg:
        when = now if now is not None else lg.clock()
        if limit:
            page = lg.stalls_page(limit=limit, after=after, now=when)
            found, nxt, more = page.items, page.next, page.more
        else:
            found, nxt, more = lg.iter_stalls(now=when, after=after), None, 0
        rows = (R.stall_row(cp, h) for cp, h in found)
        n = _listing(fmt, {"now": R.iso(when)}, "stalls", rows, lambda: {"next": nxt, "more": more},
                     list(R.STALL_ROW_KEYS), lambda rows: _stream_table(
                         ["RUN", "STATE", "HEALTH", "ACTION", "LEASE", "LAST BEAT", "PROGRESS", "RETRIES", "WHY"],
                         ([r["run_id"], r["state"], r["classification"], r["action"], r["lease"],
                           R.iso_ms(r["last_heartbeat_at"]),
                           f"{r['progress_seq']}" + (f" {r['last_progress']['kind']}" if r["last_progress"] else ""),
                           f"{r['retries']}/{r['retry_budget']}", R.one_line(r["reason"], 60)] for r in rows)))
        if fmt != "table":
            return
    if not n:
        click.echo(f"no run needs attention at {R.iso(when, ms=True)}" + (f" after {after}" if after else ""))
    _more_line(more, nxt, "" if now is not None else f" --now {R.iso(when)}")


# --- the watchdog -------------------------------------------------------------------------


#: How a dry run's outcomes read in text.
_DRY_OUTCOME = {"would_commit": "would record this", "duplicate": "already recorded", "skipped": "would do nothing",
                "failed": "would be refused: nothing would be recorded"}


@main.command()
@click.option("--once", is_flag=True, help="Make one pass and exit.")
@click.option("--interval", type=click.FloatRange(min=0.05, max=86_400), default=5.0, show_default=True,
              help="Seconds between passes.")
@click.option("--name", default=None, help="This watcher's name (default: watchdog-<host>).")
@click.option("--now", type=ISO_TIME, default=None,
              help="With --once: judge the runs as if it were this time. Needs --dry-run, or --commit "
                   "to record the decisions for real.")
@click.option("--dry-run", is_flag=True,
              help="With --once: record nothing (no decision, no beat) and print what a pass would do.")
@click.option("--commit", "commit_at_now", is_flag=True,
              help="With --now: record the decisions made at that time for real (tests, simulations).")
@json_option
def watch(once: bool, interval: float, name: str | None, now: int | None, dry_run: bool, commit_at_now: bool,
          as_json: bool) -> None:
    """The watchdog: classify every live run and act within bounds, one line per action.

    unavailable (no heartbeat): revoke the lease so another worker can claim.
    stalled (heartbeats, no progress): observe once per progress-timeout window and
    mark it; past the retry budget, pause it (a blocker a person clears).
    A side effect or delivery of unknown outcome: ask for reconciliation, never retry.
    Delivered, no-op and blocked runs: nothing. Every decision carries a deterministic
    idempotency key, so a watchdog killed mid-pass and restarted never acts twice. Each
    pass also records the watcher's own liveness, which 'status' reads to say whether a
    live watcher covers a run. With --json, one JSON document per pass.

    --once --dry-run shows what one pass would do and records nothing; add --now to ask
    about another time. --now alone is refused: judged at a time that is not the present,
    real decisions can revoke a live worker's lease, so recording them needs --commit.

    \b
    Example:
        handoff watch --interval 10 --name ops-watchdog
        handoff watch --once --json
        handoff watch --once --dry-run --now 2026-05-01T12:00:00Z
    """
    from handoff import render as R

    import signal

    from handoff import watchdog

    if now is not None and not once:
        raise click.UsageError("--now only goes with --once")
    if dry_run and not once:
        raise click.UsageError("--dry-run only goes with --once")
    if dry_run and commit_at_now:
        raise click.UsageError("--dry-run records nothing and --commit records for real; choose one")
    if commit_at_now and now is None:
        raise click.UsageError("--commit only goes with --now (without --now, a pass records its decisions anyway)")
    if now is not None and not (dry_run or commit_at_now):
        raise click.UsageError(
            "--now judges the runs at a time that is not the present, and the decisions would be recorded "
            "for real (a live worker's lease can be revoked). Add --dry-run to see what the watchdog would "
            "do and record nothing, or --commit to record the decisions anyway")
    from handoff.api import check_seconds

    check_seconds(interval, "interval", low=0.05, high=86_400)  # nan slips past FloatRange
    name = name if name is not None else watchdog.default_name()
    stop = {"flag": False}

    def _stop(signum: int, frame: Any) -> None:
        stop["flag"] = True

    def on_action(a: Any) -> None:
        # A refused action gets its line too: a watchdog that could not act must say so.
        if not as_json and dry_run:
            click.echo(f"dry run: {a.line()} [{_DRY_OUTCOME.get(a.outcome, a.outcome)}]")
        elif not as_json and a.outcome in ("committed", "failed"):
            click.echo(f"{R.iso(now_holder['now'], ms=True)} {a.line()}")
            sys.stdout.flush()

    def on_pass(when: int, actions: list[Any]) -> None:
        if as_json:
            import json

            doc = {"watcher": name, "at": R.iso(when), "interval_s": interval,
                   "actions": [R.action_doc(a) for a in actions]}
            if dry_run:
                doc["dry_run"] = True
            click.echo(json.dumps(doc, ensure_ascii=False))
            sys.stdout.flush()
        elif dry_run:
            would = sum(a.outcome == "would_commit" for a in actions)
            click.echo(f"dry run at {R.iso(when)}: nothing recorded; a pass would record {would} "
                       f"action{'' if would == 1 else 's'}")

    now_holder: dict[str, int] = {}
    with _ledger() as lg:
        if once:
            when = now if now is not None else lg.clock()
            now_holder["now"] = when
            actions = watchdog.watch_once(lg, name=name, now_us=when, interval_s=interval, on_action=on_action,
                                          dry_run=dry_run)
            on_pass(when, actions)
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop)

        clock = lg.clock

        def ticking_clock() -> int:
            now_holder["now"] = clock()
            return now_holder["now"]

        lg.clock = ticking_clock

        def on_error(exc: Any) -> None:
            click.echo(f"Error: {exc.message} (retrying next pass)", err=True)

        watchdog.watch_forever(lg, name=name, interval_s=interval, on_pass=on_pass, on_action=on_action,
                               on_error=on_error, should_stop=lambda: stop["flag"])


# --- audit ----------------------------------------------------------------------------------


@main.command()
@click.argument("run", metavar="[RUN]", required=False, shell_complete=_complete_runs)
@click.option("--expect-head", "expect_head", multiple=True, metavar="DIGEST",
              help="A head digest kept from 'handoff head': the ledger must still hold that "
                   "position with that hash (a cut tail or rewritten history fails). Repeatable.")
@quiet_option
@json_option
def verify(run: str | None, expect_head: tuple[str, ...], quiet: bool, as_json: bool) -> None:
    """Check the log: hash chains (each run's and the ledger-wide one), seq and position
    gaps, decodability, heads, the append-only triggers, and (for the whole ledger) every
    projection against a fresh fold. Exit 4 when anything is wrong.

    With RUN, that run's chain and heads plus the ledger-wide checks; what that skips is
    listed. A file alone cannot show that its newest events were cut off: keep the
    digest 'handoff head' prints somewhere else and pass it with --expect-head.

    \b
    Example:
        handoff verify
        handoff verify $RUN --json
        handoff verify --expect-head "$(cat /elsewhere/handoff.head)"
    """
    from handoff import render as R

    with _ledger() as lg, Progress("verifying", quiet=quiet or as_json) as bar:
        doc = lg.verify_report(run, progress=bar, expect_head=expect_head)
    ok, probs, diffs, skipped = doc["ok"], doc["problems"], doc["projections"], doc["skipped"]
    events, runs = doc["events"], doc["streams"]
    if as_json:
        _emit(doc, True, None)
    else:
        scope = f"run {run}" if run else f"{runs} streams"
        if ok:
            click.echo(f"ok: {events} events in {scope}; hash chains, seqs, payloads, heads and triggers check out"
                       + ("" if run else "; projections match a fresh fold")
                       + (f"; the ledger still holds {len(expect_head)} head digest(s)" if expect_head else ""))
            if skipped:
                click.echo("not checked: " + "; ".join(skipped))
            _echo_erased(doc["erased"])
            if doc["db_roles"]:  # the server's word on who inserted the events (PostgreSQL)
                click.echo("written by database roles: "
                           + ", ".join(f"{R.visible(role)} ({n} events)" for role, n in doc["db_roles"].items()))
        else:
            # Each table, then the summary, as paragraphs of their own: a blank line between
            # them, so the last row never reads as part of the next header or the summary.
            tables = []
            if probs:
                tables.append(R.table(["PROBLEM", "RUN", "SEQ", "POSITION", "DETAIL"],
                                      [[p["kind"], p["run_id"], p["seq"], p["position"], p["message"]] for p in probs]))
            if diffs:
                tables.append(R.table(["PROJECTION", "RUN", "COLUMN", "KEPT", "FOLDED"],
                                      [[d["projection"], d["run_id"], d["column"], d["kept"], d["folded"]]
                                       for d in diffs]))
            for text in tables:
                click.echo(text + "\n")
            _echo_erased(doc["erased"], err=True)
            click.echo(f"{len(probs)} problem(s) in the log, {len(diffs)} projection difference(s)", err=True)
            if skipped:
                click.echo("not checked: " + "; ".join(skipped), err=True)
    if not ok:
        _exit_damage_found()


def _echo_erased(erased: list[dict], *, err: bool = False) -> None:
    """Values deleted on purpose: each deletion event, which is not damage."""
    for e in erased:
        click.echo(f"erased: {e['erased']} value(s) of run {e['run_id']} deleted as recorded by values_erased at "
                   f"seq {e['seq']} ({e['reason']}); not damage", err=err)


@main.command()
@click.option("--write", "write", default=None, type=click.Path(dir_okay=False),
              help="Also record the digest in this file (replaced atomically). Refused, exit 4, "
                   "when the digest already there is no longer contained in the ledger.")
@json_option
def head(write: str | None, as_json: bool) -> None:
    """Print the ledger's head digest, POSITION:HASH: its last position and the ledger-wide
    hash there, which covers every event up to it.

    Keep it where the ledger's writers cannot change it (another machine, a ticket); later,
    'handoff verify --expect-head DIGEST' fails if the ledger no longer holds it, which is
    how a tail cut off behind the store shows. Growth since the digest is fine.

    \b
    Example:
        handoff head
        handoff head --write /mnt/audit/handoff.head     # e.g. from cron, every few minutes
    """
    with _ledger() as lg:
        doc = lg.write_head(write) if write else {**lg.head(), "path": None, "previous": None}
    _emit(doc, as_json, doc["digest"])


@main.command()
@click.option("--projection", "name", default=None, help="Only this projection (default: all).")
@quiet_option
@json_option
def check(name: str | None, quiet: bool, as_json: bool) -> None:
    """Compare the kept projections (views) with a fresh fold of the log. Exit 4 on a difference.

    \b
    Example:
        handoff check
        handoff check --projection checkpoints --json
    """
    from handoff import render as R

    with _ledger() as lg, Progress("checking", quiet=quiet or as_json) as bar:
        diffs = lg.check(name, progress=bar)
    if as_json:
        _emit({"ok": not diffs, "differences": diffs}, True, None)
    elif diffs:
        click.echo(R.table(["PROJECTION", "RUN", "COLUMN", "KEPT", "FOLDED"],
                          [[d["projection"], d["run_id"], d["column"], d["kept"], d["folded"]] for d in diffs]))
    else:
        click.echo("ok: the projections match a fresh fold of the log")
    if diffs:
        _exit_damage_found()


@main.command()
@click.option("--projection", "name", default=None, help="Only this projection (default: all).")
@quiet_option
@json_option
def rebuild(name: str | None, quiet: bool, as_json: bool) -> None:
    """Drop and refold the projections from the log (atomically; readers keep the old
    ones until the swap).

    \b
    Example:
        handoff rebuild
        handoff rebuild --projection stall_watch
    """
    from handoff import render as R

    with _ledger() as lg, Progress("rebuilding", quiet=quiet or as_json) as bar:
        counts = lg.rebuild(name, progress=bar)
    if as_json:
        _emit({"rebuilt": counts}, True, None)
    else:
        click.echo(R.table(["PROJECTION", "ROWS"], [[k, v] for k, v in counts.items()]))


@main.command()
@click.argument("dest", type=click.Path(dir_okay=False))
@click.option("--replace", is_flag=True,
              help="Overwrite DEST if it is an earlier backup (an existing file is refused otherwise; "
                   "a file that is not an SQLite database always).")
@json_option
def backup(dest: str, replace: bool, as_json: bool) -> None:
    """Copy the whole ledger to DEST as one consistent SQLite file, while writers go on.

    Copying the .db file yourself misses every commit still in its -wal file; this uses
    SQLite's online backup, which includes them. DEST gets the ledger file's permissions,
    is written under a private name and moved into place; a symbolic link at DEST, the
    ledger itself, and a name with a -wal or -shm file beside it are refused. Prints the
    copy's head digest: keep it to check the copy later ('handoff verify --expect-head').

    \b
    Example:
        handoff backup /backups/handoff-$(date +%F).db
        handoff --db /backups/handoff-2026-05-01.db verify
    """
    with _ledger() as lg:
        doc = lg.backup(dest, replace=replace)
    _emit(doc, as_json, f"backed up {doc['positions']} events of {doc['runs']} streams to {doc['path']} "
                        f"({doc['bytes']} bytes); head {doc['head']}")


@main.command()
@click.argument("runs", nargs=-1, metavar="[RUN]...", shell_complete=_complete_runs)
@click.option("--all", "all_runs", is_flag=True, help="Export every run.")
@click.option("-o", "--output", default="-", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write to this file instead of stdout: written whole under a private name, with "
                   "the ledger file's permissions, then moved into place. A symbolic link there is "
                   "refused.")
@click.option("--redact", is_flag=True,
              help="Write a sanitized derivative for sharing outside: only structure stays (types, seqs, "
              "times, states, outcomes, numbers, content digests); every other value, free text and "
              "names included, becomes a salted digest. It cannot be imported.")
@click.option("--salt-env", default=None, metavar="VAR",
              help="With --redact: read the salt from this environment variable, so the same salt gives "
              "the same digests in every export (default: a fresh random salt per file).")
@click.option("--redact-field", "redact_fields", multiple=True, metavar="FIELD",
              help="With --redact: a payload field to replace by its digest even where it would be "
              "kept, such as to_state (repeatable).")
@click.option("--sqlite", "sqlite_out", default=None, type=click.Path(dir_okay=False), metavar="OUT.db",
              help="Instead of JSON Lines, write the whole ledger as a readable SQLite file (tables runs, "
                   "events, leases, artifacts, deliveries; docs/readable-copy.md). Into an earlier copy, "
                   "adds only what is new.")
@quiet_option
@json_option
def export(runs: tuple[str, ...], all_runs: bool, output: str, redact: bool, salt_env: str | None,
           redact_fields: tuple[str, ...], sqlite_out: str | None, quiet: bool, as_json: bool) -> None:
    """Write runs as JSON Lines: one event per line with its whole envelope and hashes.

    A forked run brings its ancestors' events, without which it cannot be folded.
    With -o FILE and --json, a summary document is printed. With --redact, the first
    line says the file is redacted (format, salt id) and every line carries
    "redacted": true; 'handoff import' refuses such a file (exit 2).

    With --sqlite OUT.db, the whole ledger goes into a plain SQLite file any SQL tool or
    Datasette opens (payloads as JSON, full-text search over summaries and details); a
    second export into it adds only the events written since and refreshes the runs they
    touch and every live run's health. --redact applies as for JSON Lines (a copy stays
    redacted, with the same salt: use --salt-env to extend one). With --json:
    {"output", "events", "runs", "last_position", "redacted"}.

    \b
    Example:
        handoff export --all -o backup.jsonl
        handoff export $RUN > run.jsonl
        handoff export --sqlite readable.db && datasette readable.db
    """
    if sqlite_out is not None:
        if runs or output != "-":
            raise click.UsageError("--sqlite writes the whole ledger to its own file: leave out RUN and -o")
    elif bool(runs) == all_runs:
        raise click.UsageError("name the runs to export, or pass --all (not both)")
    if as_json and output == "-" and sqlite_out is None:
        raise click.UsageError("--json needs -o FILE: stdout carries the export itself")
    if not redact and (salt_env or redact_fields):
        raise click.UsageError("--salt-env and --redact-field apply to --redact only")
    salt = None
    if salt_env:
        value = os.environ.get(salt_env)
        if not value:
            raise click.UsageError(f"--salt-env {salt_env}: that environment variable is not set")
        salt = value.encode("utf-8", "surrogateescape")
    with _ledger() as lg, Progress("exporting", quiet=quiet or as_json) as bar:
        if sqlite_out is not None:
            doc = lg.export_sqlite(sqlite_out, redact=redact, salt=salt, fields=redact_fields, progress=bar)
            _emit(doc, as_json, f"exported {doc['events']} new events to {doc['output']} and wrote {doc['runs']} "
                                f"run rows; it now holds the ledger up to position {doc['last_position']}")
            return
        if redact:
            chosen = None if all_runs else list(runs)
            if output == "-":
                out = sys.stdout.buffer
                for line in lg.export_redacted(chosen, salt=salt, fields=redact_fields, progress=bar):
                    out.write(line + b"\n")
                out.flush()
                return
            doc = lg.export_to(output, chosen, redact=True, salt=salt, fields=redact_fields, progress=bar)
        elif output == "-":
            out = sys.stdout.buffer
            for line in lg.export(None if all_runs else list(runs), progress=bar):
                out.write(line + b"\n")
            out.flush()
            return
        else:
            doc = lg.export_to(output, None if all_runs else list(runs), progress=bar)
    _emit(doc, as_json, f"exported {doc['events']} events of {doc['runs']} runs to {output}")


@main.command("import")
@click.argument("file", type=click.File("rb"))
@quiet_option
@json_option
def import_(file: Any, quiet: bool, as_json: bool) -> None:
    """Import an export: every line's hash chain is verified and every new event must be
    one the lifecycle rules would have written; a tampered or forged file is refused
    whole (exit 2 or 1) and the ledger is left as it was. Into a path with no file, the
    new ledger appears only when the import succeeded. Importing the same file twice
    changes nothing. FILE may be - for stdin.

    \b
    Example:
        handoff --db restored.db import backup.jsonl
    """
    from handoff.api import import_into

    st = _state()
    with Progress("importing", quiet=quiet or as_json) as bar:
        counts = import_into(st.db, file, busy_timeout_s=st.busy_timeout, progress=bar)
    _emit(counts, as_json, f"imported {counts['imported']} events of {counts['runs']} runs; "
                           f"{counts['skipped']} were already here")


@main.command("copy")
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option("--run", "runs", multiple=True, metavar="RUN", help="Copy only this run (repeatable; a fork brings its parents).",
              shell_complete=_complete_runs)
@quiet_option
@json_option
def copy_(src: str, dst: str, runs: tuple[str, ...], quiet: bool, as_json: bool) -> None:
    """Copy a ledger (or some runs) from SRC to DST, then prove the copy.

    SRC and DST are ledger addresses, as --db takes them: a SQLite file (or sqlite:///PATH)
    or postgresql://USER@HOST:PORT/DB, either way round. The events go through the same
    checks as 'import' (all or nothing; into a file that does not exist yet, the ledger
    appears only when the copy succeeded); then DST must verify clean and fold every
    copied run to exactly what SRC folds it to, or the command exits 4 naming the run
    (what was imported stays: exit 4 says DST cannot be trusted as a copy).
    Copying twice changes nothing the second time. --db is not used.

    \b
    Example:
        handoff copy handoff.db postgresql://handoff@db.internal:5432/ledger
    """
    from handoff.api import copy_ledger

    with Progress("copying", quiet=quiet or as_json) as bar:
        doc = copy_ledger(src, dst, run_ids=list(runs) or None, busy_timeout_s=_state().busy_timeout, progress=bar)
    _emit(doc, as_json, f"copied {doc['imported']} events of {doc['runs']} runs from {doc['src']} to {doc['dst']} "
                        f"({doc['skipped']} were already there); {doc['checked']} runs fold the same on both")


@main.command("roles")
@click.option("--sql", "as_sql", is_flag=True, help="Print the SQL that creates the roles and grants (required).")
@click.option("--prefix", default="handoff", show_default=True, metavar="NAME",
              help="Role names are NAME_writer, NAME_watchdog and NAME_auditor.")
@json_option
def roles(as_sql: bool, prefix: str, as_json: bool) -> None:
    """Print the least-privilege roles of a PostgreSQL ledger as SQL, for its owner to run.

    Three group roles (NOLOGIN), for the schema the --db address opens: NAME_writer
    (workers, the CLI: open, claim, append) and NAME_watchdog (reads and appends) may
    INSERT into the log and keep the heads, tail and view tables, but never UPDATE,
    DELETE or TRUNCATE the log; NAME_auditor may only read (status, log, verify, export).
    None may create tables: 'rebuild' stays with the ledger's owner, and refuses any
    other role with exit 3. Run the SQL once as the owner, after 'init' (it is
    idempotent), then make login roles members: GRANT NAME_writer TO worker1.
    This command itself changes nothing. See docs/postgres.md, roles. With --json:
    {"schema": ..., "roles": {"writer": NAME_writer, ...}, "sql": ...}.

    \b
    Example:
        handoff --db postgresql://owner@db:5432/ledger roles --sql | psql postgresql://owner@db:5432/ledger
    """
    from handoff.ledger.backends import capabilities_of, open_store
    from handoff.ledger.errors import InvalidInput

    if not as_sql:
        raise click.UsageError("say what to print: handoff roles --sql")
    st = _state()
    if not capabilities_of(st.db).attested_roles:  # refused before a file is looked for
        raise InvalidInput(
            f"roles are for a PostgreSQL ledger, and {st.db} is an SQLite file: its access is "
            "the file's permissions", field="db")
    with open_store(st.db, readonly=True, create=False, busy_timeout_s=st.busy_timeout) as store:
        doc = store.access_roles(prefix)
    if as_json:
        _emit(doc, True, None)
    else:
        click.echo(doc["sql"], nl=False)


@main.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@json_option
def completion(shell: str, as_json: bool) -> None:
    """Print the shell completion script for SHELL: Tab then completes commands, options,
    state names, progress kinds, health names and run ids.

    Run ids are read from the ledger --db names on the command line being typed (else
    HANDOFF_DB, else ./handoff.db), read-only, at most 50 per Tab, from one indexed
    lookup; a ledger that cannot be read offers none. bash needs version 4.4 or later.
    With --json: {"shell", "variable", "script"}.

    \b
    Example:
        eval "$(handoff completion bash)"                            # in ~/.bashrc
        handoff completion zsh > "${fpath[1]}/_handoff"              # then restart zsh
        handoff completion fish > ~/.config/fish/completions/handoff.fish
    """
    cls = _completion_class(shell)
    assert cls is not None  # the Choice above names only shells click knows
    script = cls(main, {}, "handoff", COMPLETE_VAR).source()
    if as_json:
        _emit({"shell": shell, "variable": COMPLETE_VAR, "script": script}, True, None)
    else:
        click.echo(script, nl=False)


@main.command("contract-schema")
@json_option
def contract_schema(as_json: bool) -> None:
    """Print the JSON Schema of a contract file (for 'open --contract'), for other languages.

    The output is JSON with or without --json.

    \b
    Example:
        handoff contract-schema > handoff-contract.schema.json
    """
    import json

    from handoff import contract

    click.echo(json.dumps(contract.schema(), indent=2))


@main.command()
@json_option
def doctor(as_json: bool) -> None:
    """Print facts about the ledger and the backend under it, for support: where it is,
    the backend and its version, that backend's own settings, the counts and the
    projections.

    Exit 4 when the append-only triggers are missing or altered (the ledger was edited
    behind the store).

    \b
    Example:
        handoff doctor --json
    """
    with _ledger() as lg:
        facts = lg.doctor()
        is_file = lg.store.capabilities.is_file
    problems = facts.get("problems") or []
    if as_json:
        _emit(facts, True, None)
        if problems:
            _exit_damage_found()
        return
    rows = [("file" if is_file else "address", _fact(facts["path"])),
            ("backend", f"{facts['backend']} {facts['backend_version']}")]
    # The backend's own settings: whatever its diagnostics() returned, each under its name.
    rows += [(k.replace("_", " "), _fact(v)) for k, v in facts.items() if k not in _DOCTOR_OWN]
    projections = ", ".join(f"{k} at {v}" for k, v in (facts.get("projections") or {}).items())
    rows += [
        ("events", f"{facts['events']} in {facts['runs']} streams"),
        ("projections", projections or "none yet"),
        ("append-only", "ok: the three triggers are in place" if not problems else
         "PROBLEM: " + "; ".join(p["message"] for p in problems)),
    ]
    width = max(len(k) for k, _ in rows)
    click.echo("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    if problems:
        _exit_damage_found()


#: The keys of ``Ledger.doctor()`` that doctor's text prints in rows of its own.
_DOCTOR_OWN = frozenset({"path", "backend", "backend_version", "events", "runs", "projections", "problems"})


def _fact(value: Any) -> str:
    """One diagnostics value as text a newcomer reads: yes/no, "not known" for a missing
    value, a mapping as "name: value; ..."."""
    if value is None or value == "":
        return "not known"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return "; ".join(f"{k.replace('_', ' ')}: {_fact(v)}" for k, v in value.items()) or "none"
    return str(value)


# --- the worker wrapper and the demo ----------------------------------------------------------


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--run", "join", default=None, help="Join this existing run instead of opening one.",
              shell_complete=_complete_runs)
@click.option("--worker", required=True, envvar="HANDOFF_WORKER", show_envvar=True, help="The worker's name.")
@click.option("--heartbeat-every", type=Seconds(min=0.01, max=86_400), default=None,
              help="Seconds between heartbeats (default: a third of the heartbeat timeout).")
@click.option("--grace", type=Seconds(min=0, max=86_400), default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when the child must stop.")
@click.option("--fence-margin", type=Seconds(min=0, max=86_400), default=None,
              help="Stop the child when no heartbeat was recorded for the heartbeat timeout less "
                   "this many seconds (default: a quarter of the timeout).")
@open_options(required=False)
@json_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(join: str | None, worker: str, heartbeat_every: float | None, grace: float,
        fence_margin: float | None, as_json: bool, cmd: tuple[str, ...], **p: Any) -> None:
    """Run CMD as a worker: open (or --run join) a run, claim it, heartbeat while CMD lives.

    CMD gets HANDOFF_DB, HANDOFF_RUN, HANDOFF_LEASE and HANDOFF_WORKER in its
    environment and reports progress, artifacts and its result itself ('handoff
    progress --kind ...' needs no RUN or --lease there). SIGINT and SIGTERM are
    forwarded to it. Its stderr is passed through to yours. When it ends, how it ended
    (exit code or signal; after a failure also the last lines of its stderr, with
    anything that looks like a secret replaced) is recorded and the lease released; the
    report shows it on the lease's span. If the lease is lost (revoked by the watchdog, the run closed),
    CMD is stopped and the wrapper says so and exits 1; otherwise it exits with CMD's
    status (128+N for signal N).

    If no heartbeat can be recorded (the ledger is locked or out of reach) for the
    heartbeat timeout less --fence-margin, timed on this host's monotonic clock, the
    wrapper cannot know whether the watchdog gave the lease away: it stops CMD
    (SIGTERM, then SIGKILL after the grace, at most half the margin), records that once
    the ledger answers again if the lease is still its own, and exits 75.

    \b
    Example:
        handoff run --goal "Fix the flaky test" --target pr:512 --owner alice \\
            --worker w1 -- python agent.py
        handoff run --run $RUN --worker w2 -- ./continue.sh
    """
    from handoff.worker import run_wrapped

    if join is None and not (p["goal"] and p["target"] and p["owner"]):
        raise click.UsageError("give --run RUN to join a run, or --goal, --target and --owner to open one")
    st = _state()
    res = run_wrapped(st.db, list(cmd), worker=worker, run_id=join,
                      open_kwargs=None if join else _open_kwargs(p), heartbeat_s=heartbeat_every,
                      grace_s=grace, busy_timeout_s=st.busy_timeout, fence_margin_s=fence_margin)
    if as_json:
        import msgspec

        _emit(msgspec.to_builtins(res), True, None)
    click.get_current_context().exit(res.returncode)


@main.command()
@click.option("--as", "role", type=click.Choice(["auditor", "owner", "operator", "worker"]), default="auditor",
              show_default=True, help="What the server may do, fixed for its life: auditor reads only; owner adds "
                                      "open, review, sanitize, deliver and its outcome, reopen, revoke, "
                                      "transfer, unblock, effect_confirm, fork, close; operator adds revoke, "
                                      "unblock, effect_confirm, reopen, fork, close; worker adds claim and the "
                                      "lease holder's writes (docs/mcp.md).")
@click.option("--name", default=None, envvar="HANDOFF_WORKER", show_envvar=True,
              help="Who the server acts as: the owner's or the worker's name (default: your login name).")
@click.option("--root", default=None, type=click.Path(file_okay=False),
              help="The directory a worker's artifacts must lie under (required with --as worker).")
@click.option("--http", "address", default=None, metavar="HOST:PORT",
              help="Serve streamable HTTP here (e.g. 127.0.0.1:8765) instead of stdio.")
@click.option("--token-file", default=None, type=click.Path(dir_okay=False),
              help="A file holding the bearer token HTTP clients must send; required to serve beyond loopback.")
@click.option("--allow-target", "allow_target", multiple=True, metavar="TARGET",
              help="A delivery target with an adapter (cmd:, http(s)://, file://) the owner's open and deliver "
                   "may use, in full or as a prefix ending in '*' (repeatable; 'handoff targets' has the "
                   "rules). Without it every such target is refused: a model's words never run a command.")
def mcp(role: str, name: str | None, root: str | None, address: str | None, token_file: str | None,
        allow_target: tuple[str, ...]) -> None:
    """Serve the ledger to an MCP host (a coding agent, a desktop assistant), over stdio or HTTP.

    The host's model works through tools and never sees a lease token: claim returns the
    lease number and the run's packet, and the server keeps the token for that MCP
    session. Each call (or the host's ping) heartbeats the lease when due; a host that
    stays silent longer than the heartbeat timeout loses it to the watchdog. When the
    session ends the server releases what it still holds. docs/mcp.md shows how to
    register it with a host.

    Needs the mcp extra: pip install '.[mcp]' from the checkout. HTTP binds where --http says;
    beyond loopback it refuses to start without --token-file, and refuses requests from a
    web page (an Origin header); on loopback it refuses a request naming another host
    (421) or coming from another site's page (403), which is how a web page would reach it.
    The ledger file must exist ('handoff init' makes one).

    \b
    Example:
        handoff --db work.db mcp --as worker --name agent-1 --root .
        handoff --db work.db mcp --as owner --name alice --http 127.0.0.1:8765
    """
    try:
        from handoff.integrations import mcp_server as ms
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types", "uvicorn", "starlette", "anyio"):
            raise
        from handoff.ledger.extras import install_hint

        raise click.UsageError(f"the MCP server needs the mcp extra: {install_hint('mcp')}") from None
    import anyio

    from handoff.api import login_name

    st = _state()
    config = ms.Config(role=role, name=name or login_name(), root=root, allow_targets=allow_target)
    if address is None:
        anyio.run(lambda: ms.serve_stdio(st.db, config, busy_timeout_s=st.busy_timeout))
    else:
        anyio.run(lambda: ms.serve_http(st.db, config, address, token_file=token_file,
                                        busy_timeout_s=st.busy_timeout))


@main.command()
@click.option("--allow", "allow", multiple=True, metavar="TARGET",
              help="Add TARGET to the list (repeatable): a target in full, or a prefix ending in '*'.")
@click.option("--deny", "deny", multiple=True, metavar="TARGET",
              help="Remove TARGET from the list, exactly as listed (repeatable).")
@click.option("--unset", is_flag=True, help="Remove the list itself: every adapter target may be sent to again.")
@json_option
def targets(allow: tuple[str, ...], deny: tuple[str, ...], unset: bool, as_json: bool) -> None:
    """Show or change the ledger's list of delivery targets it may send to itself.

    A target with an adapter (cmd:, http://, https://, file://) makes the process that
    runs 'deliver --send' run a command, send a web request or write a file, and whoever
    wrote the contract chose it. Once a list is set, 'deliver --send' (and
    Ledger.deliver(send=True)) refuses such a target unless the list names it
    (TargetNotAllowed, exit 1; nothing sent, nothing written); targets a person delivers
    by hand (chat:#ops) need no listing. With no list set, every adapter target is sent to.

    A pattern is a target in full (matched exactly) or a prefix ending in '*':
    'https://hooks.example.com/services/*' (that host and port, a path under it),
    'file:///srv/outbox/*' (that directory and those below it), 'cmd:/usr/local/bin/notify *'
    (a command starting with exactly those words), or 'cmd:*' for every command. The
    list is kept in the ledger (every process and host using it follows it); on
    PostgreSQL only the role that owns the ledger may change it. With no option, shows
    it. With --json: {"restricted", "allowed"} ("allowed" is null when no list is set).

    \b
    Example:
        handoff targets --allow 'https://hooks.example.com/services/*' --allow 'file:///srv/outbox/*'
        handoff targets --deny 'file:///srv/outbox/*'
        handoff targets --json
    """
    if unset and (allow or deny):
        raise click.UsageError("--unset removes the whole list; give it alone")
    with _ledger() as lg:
        if unset:
            now = lg.set_allowed_targets(None)
        elif allow or deny:
            now = lg.allow_targets(*allow) if allow else lg.allowed_targets()
            if deny:
                now = lg.deny_targets(*deny)
        else:
            now = lg.allowed_targets()
    doc = {"restricted": now is not None, "allowed": None if now is None else list(now)}
    if now is None:
        text = "no list of allowed targets is set: 'deliver --send' sends to every adapter target"
    elif not now:
        text = "the list of allowed targets is empty: 'deliver --send' sends to no adapter target"
    else:
        text = "'deliver --send' sends only to adapter targets matching:\n" + "\n".join(f"  {p}" for p in now)
    _emit(doc, as_json, text)


@main.command()
@click.option("--db", "db", default=None, type=click.Path(dir_okay=False),
              help="Where to build the demo ledger (default ./handoff-demo.db; HANDOFF_DB is ignored).")
@click.option("--quiet", is_flag=True, help="Only the final packets, timeline and next commands.")
def demo(db: str | None, quiet: bool) -> None:
    """Play the whole story with real worker processes, in about 10 seconds.

    A contract is written before any worker starts; worker-a is killed with SIGKILL
    mid-run and the watchdog revokes its lease; worker-b claims and continues from the
    recorded progress; worker-a, paused and resumed, tries a late write and is refused;
    another run keeps heart-beating without progress and is flagged stalled; the
    result is verified, reviewed by its owner and delivered once, and a retried delivery
    is a no-op. The ledger is left behind for you to explore, and the main run's incident
    report (handoff report) is written into the demo's files folder.

    \b
    Example:
        handoff demo
        handoff --db /tmp/story.db demo
    """
    from handoff.demo import play

    ctx = click.get_current_context()
    parent = ctx.parent
    if db is None and parent is not None and parent.get_parameter_source("db") == click.core.ParameterSource.COMMANDLINE:
        db = _state().db
    ctx.exit(play(db or "handoff-demo.db", quiet=quiet))


# --- docs/cli.md is generated from the help above -----------------------------------------


DOCS_INTRO = """\
# The `handoff` command

Generated from `--help` by `python -m handoff.cli --write-docs`; do not edit by hand
(tests/cli/test_docs.py fails when this file is stale).

## Global behaviour

- `handoff [--db PATH] COMMAND ...`; the ledger is also taken from `HANDOFF_DB`, and
  defaults to `./handoff.db`. Only `init`, `open`, `import` and `run` (when it opens a
  run) create a missing ledger file; every other command refuses a missing file with
  exit 3, so a mistyped `--db` never silently starts an empty ledger. `demo` builds its
  own ledger (`./handoff-demo.db` unless `--db` is given on its command line; it ignores
  `HANDOFF_DB`, and refuses to overwrite a ledger holding runs it did not write).
- Inside `handoff run`, the child's environment holds `HANDOFF_DB`, `HANDOFF_RUN`,
  `HANDOFF_LEASE` (the lease token) and `HANDOFF_WORKER`; the worker verbs take `RUN` and
  `--lease` from there when they are not given.
- `--lease` is the token `claim` printed, `LEASE.SECRET`; the ledger keeps only its
  digest, so no other command shows it. The lease number that `status` and `log` show is
  not a token: given as `--lease` it is a usage error (exit 2), and a made-up or old
  token is refused (exit 1). See docs/reliability.md, "Lease tokens".
- Who acted is logged as `kind:name`. A person acting without a lease (an operator) is
  named by `--by`, else `$HANDOFF_ACTOR`, else the login name (`$USER`, `$LOGNAME`, or the
  name the system gives your uid); a worker by `$HANDOFF_WORKER`, else the holder of the
  lease it shows. An empty `--by` is refused (exit 2).
- Human output is aligned tables and short lines on stdout. `--json` prints exactly one
  JSON document on stdout instead (`watch --json` prints one per pass, one per line).
  `status`, `stalls`, `log`, `runs` and `diff` also take `--format table|json|jsonl|csv`
  (`--format json` prints exactly what `--json` prints; a CSV cell that begins with
  `= + - @` gets a leading `'` so a spreadsheet shows it as text).
- Long work (`copy`, `import`, `export`, `verify`, `check`, `rebuild`, `report` of a long
  run) draws a progress bar on stderr, only when stderr is a terminal and the work has at
  least `HANDOFF_PROGRESS_MIN` items (default 20000); never with `--json` or `--quiet`, and
  never on stdout.
- Times in and out are ISO 8601 UTC (`2026-05-01T12:00:00.123456Z`). A time given
  without an offset (`--now`, `--as-of`) is taken as UTC.

## Exit codes

@EXIT_CODES@

Errors go to stderr as one sentence that names what was wrong and what to do
(`Error: lease 1 of run r1 has ended (revoked, released, or replaced by a later claim); ...`).
With `--json` the error is one JSON document on stderr, stdout stays empty:

```json
{"error": {"type": "StaleLease", "message": "lease 1 of run r1 has ended (...)"}}
```

`type` is the ledger's error class (`StaleLease`, `IllegalTransition`, `DeliveryRefused`,
`TerminalRun`, `LeaseHeld`, `InvalidInput`, `StoreUnavailable`, `NotALedger`, ...) or
click's (`UsageError`, `BadParameter`, `MissingParameter`, `NoSuchOption`).

## JSON documents

**Write verbs** (`heartbeat`, `transition`, `progress`, `artifact`, `artifact-withdraw`, `evidence`, `block`,
`unblock`, `effect-start`, `effect-confirm`, `submit`, `review`, `transfer`, `deliver`,
`delivered`, `delivery-failed`, `release`, `revoke`, `close`, `claim`):

```json
{"run_id": "r1", "outcome": "committed", "first_seq": 7, "last_seq": 7,
 "state": "executing", "worker": "w1", "lease": 1, "progress_seq": 3}
```

`claim` adds `"token"`, the lease token (the only output that ever holds it); `lease` is
the number, everywhere.

`outcome` is one of:

- `committed`: events were written, seqs `first_seq`..`last_seq`;
- `duplicate`: the `--key` was already used for this same request; nothing written, and
  `first_seq`..`last_seq` are the seqs of that earlier write;
- `unchanged`: the command was accepted but had nothing to add (a retried delivery
  attempt, a delivery or side effect already confirmed the same way); nothing written,
  and `first_seq` = `last_seq` = the run's last seq as it stands.

Only `committed` wrote anything; a caller that acts on a write (sends, deploys) acts only
then. `artifact` adds
`"artifact": {path, kind, bytes, sha256, exists}`; `artifact-withdraw` adds `"path"` (as
recorded); `deliver`, `delivered` and
`delivery-failed` add `"target"` and `"delivery": {status, key, receipt, attempts}`, and
`deliver` adds `"send": true|false` (send the result only when true). There `status` is
what the log alone says (`not_ready`, `ready`, `attempted`, `failed` or `confirmed`, the
same rule as the packet's); only the packet, judged at a time, can also say `ambiguous`.

**open**: `{"run_id", "state", "last_seq", "owner", "target", "result_path"}`.
**fork**: `{"run_id", "parent", "parent_seq", "state"}`. **init**: `{"db", "created", "runs"}`.

**status RUN** and **replay**: the checkpoint packet:

```json
{"run_id": "r1", "state": "executing", "terminal": false, "disposition": null,
 "goal": "...", "origin": "...", "target": "chat:#ops", "owner": "alice",
 "result_path": "/abs/report.md", "require_review": true, "worker": "w1", "lease": 1,
 "progress_seq": 3,
 "last_progress": {"seq": 3, "kind": "tool_outcome", "at": "2026-...Z", "event_seq": 9},
 "last_heartbeat_at": "2026-...Z",
 "blockers": [{"id": 1, "reason": "...", "next_action": "...", "seq": 12}],
 "artifacts": [{"path": "...", "kind": "result", "bytes": 812, "sha256": "...", "exists": true, "seq": 14}],
 "evidence": [{"kind": "tests", "outcome": "pass", "detail": "...", "seq": 15}],
 "pending_effects": [{"key": "deploy-v42", "what": "...", "lease": 1, "seq": 10}],
 "result": {"summary": "...", "artifacts": ["..."], "seq": 16},
 "review": {"by": "alice", "approved": true, "notes": "", "seq": 18},
 "delivery": {"status": "confirmed", "detail": "...", "target": "chat:#ops",
              "key": "report-v1", "receipt": "msg 1712", "attempts": 1},
 "health": {"classification": "healthy", "reason": "...", "action": "none", "needs_attention": false},
 "monitored": {"covered": true, "watchers": ["ops-watchdog"],
               "last_observed_at": "2026-...Z", "last_observed_by": "ops-watchdog"},
 "fork_parent": null, "fork_seq": null, "last_seq": 21,
 "opened_at": "2026-...Z", "updated_at": "2026-...Z"}
```

`artifacts` holds the latest record of each path and `evidence` the latest record of each
kind (a later one replaces an earlier one and moves to the end); every record stays in the
log (`handoff log`). `delivery.status` is one of `not_ready`, `ready`, `attempted`,
`ambiguous`, `failed`, `confirmed`. `health.classification` is one of `healthy`, `unavailable`, `stalled`,
`blocked`, `unclaimed`, `needs_reconciliation`, `needs_worker`, `delivery_ambiguous`,
`awaiting_owner`, `delivering`, `silent`, `unopened`; `health.action` one of `none`,
`revoke_lease`, `mark_stalled`, `pause`, `reconcile`, `reconcile_delivery`, `claim`,
`transition`, `open`. `monitored.covered` is true only when a watcher beat within three of its
intervals.

**status** (no RUN): `{"now", "runs": [{"run_id", "state", "owner", "target", "worker",
"lease", "progress_seq", "health", "action", "updated_at", "goal"}], "next", "more",
"hidden_terminal"}`; `hidden_terminal` counts the runs that ended and were left out (0
with `--all` or `--state`).

**log**: `{"run_id", "events": [{"run_id", "seq", "position", "at", "actor", "lease",
"type", "key", "summary", "data", "db_role"}]}`; `data` is the event's own fields (with its `type`);
`actor` is `kind:name` (`worker:w1`, `owner:alice`, `watchdog:ops`, `operator:bob`), as
the writer declared it; `db_role` is the database role the PostgreSQL server recorded
inserting the event (null on SQLite, which has no server to say it; the table then has
no DB ROLE column).
**log** without RUN: `{"events": [{"run_id", "seq", "position", ...}], "next"}`, the same
rows, in position order; `next` is the `--since POSITION` of the next page (null when
none). With or without RUN, `--jsonl` prints the rows one per line; `--csv` prints a header
line `position,at,run_id,seq,actor,lease,type,key,summary,data,db_role` (`data` as compact
JSON).

**report**: `{"run_id", "path", "format", "bytes", "last_seq", "end", "as_of"}`: the file
written, its size, the last seq drawn, the time the story ends at, and `--at`/`--as-of`
in words (null for the whole log). docs/incident-report.md shows the report itself.

**diff**: `{"run_a", "run_b", "same", "compared": {"a", "b"}, "heartbeats": {"a", "b"},
"common_steps", "first_divergence", "after"}`. `first_divergence` is null when the runs
are the same, else `{"step", "a", "b", "what", "differs": [{"field", "a", "b"}]}`, `a`
and `b` being `{"run_id", "seq", "type", "at"}` (null for a run that ended before that
step); `after` is `{"state": {"a", "b"}, "progress_seq": {"a", "b"}, "artifacts":
{"only_a", "only_b", "changed", "same"} (paths, compared by sha256), "evidence": {kind:
{"a", "b"}} (kinds whose latest outcome differs), "delivery": {"a", "b"} ({"status",
"key", "receipt", "attempts"}), "events_after": {"a", "b"} (counts by type)}`.

**stalls**: `{"now", "stalls": [{"run_id", "state", "classification", "action",
"reason", "worker", "lease", "last_heartbeat_at", "progress_seq", "last_progress":
{"seq", "kind", "at"}, "retries", "retry_budget"}]}`.

**watch**: per pass `{"watcher", "at", "interval_s", "actions": [{"run_id",
"classification", "action", "outcome", "key", "progress_seq", "lease", "reason",
"seq"}]}`; `outcome` is `committed`, `duplicate` (an earlier pass already did it),
`skipped` (the run moved on between classification and action) or `failed` (the ledger
refused it; nothing was written and `reason` says why; the text output prints these
lines too, with `FAILED` before the action). With `--dry-run` the document adds
`"dry_run": true`, nothing is recorded, `seq` is null unless already recorded, and
`outcome` says what a real pass would do now: `would_commit` (it would record the
action), `duplicate` (already recorded), `failed` (it would be refused, a key taken by
another request included; `reason` says why) or `skipped` (the run moved on).

**verify**: `{"ok", "run_id", "events", "streams", "problems": [{"kind", "run_id",
"seq", "position", "message"}], "projections": [difference, ...], "anchors", "erased",
"skipped", "db_roles"}`.
Ledger-wide problems (`global_chain`, `position_gap`, `head_anchor`, `trigger_missing`,
`trigger_altered`) are reported with or without RUN; `run_id` is null for the last three.
`anchors` counts the `--expect-head` digests checked; `skipped` lists, in words, what a
`verify RUN` did not look at (empty for the whole ledger). `db_roles`: how many events
each database role inserted, as the PostgreSQL server recorded it (`{}` on SQLite, where
the actor is self-declared).
`erased`: per `values_erased` event (a LangGraph thread deleted, docs/langgraph.md)
`{"run_id", "seq", "position", "reason", "erased", "listed"}`: values deleted on purpose,
which are not damage; a value missing without such an event is (`value_missing`,
`value_altered`), and so is a graph checkpoint that continues a value that is gone
(`checkpoint_values_missing`).
**head**: `{"digest", "position", "global_hash", "path", "previous"}`: `digest` is
`POSITION:HASH`; with `--write`, `path` is the file written and `previous` the digest it
held before (null when new).
**check**: `{"ok", "differences": [{"projection", "run_id", "column", "kept",
"folded"}]}`. **rebuild**: `{"rebuilt": {projection: rows}}`. **doctor**: `Ledger.doctor()`
as is (`path`, `backend`, `backend_version`, then the backend's own settings (SQLite's
`journal_mode` and `synchronous`, PostgreSQL's `database` and `role`, ...), `events`,
`runs`, `projections`, `problems`); `problems` (same shape as verify's) names a missing or
altered append-only trigger, and makes doctor exit 4.

**export** writes JSON Lines, one event per line: `{"run_id", "seq", "type", "actor",
"lease", "idempotency_key", "recorded_us", "schema_version", "payload", "prev_hash",
"hash", "position", "idempotency_digest", "batch_size"}`, `payload` being the event
itself and the hashes hex, plus `"db_role"` on PostgreSQL (the role the server recorded
inserting the event; an import reads it and ignores it: the importing role is recorded);
with `-o FILE --json` it prints `{"output", "events", "runs"}`.
With `--redact`, the first line is `{"redacted": true, "format", "salt_id", "detectors",
"runs", "note"}` and each event line `{"redacted": true, "run_id", "seq", "type", "actor",
"lease", "idempotency_key", "recorded_us", "schema_version", "position", "payload"}`,
every value outside the structure as a salted digest (docs/delivery.md); `-o FILE --json` adds
`"redacted": true`. Such a file is refused by import (`RedactedExportRefused`, exit 2).
**deliver --send**: `{"run_id", "status", "sent", "receipt", "error", "tries", "target",
"delivery"}`: `status` is `confirmed`, `failed` or `unknown` (exit 1 unless confirmed);
`sent` is false when the key was already confirmed and nothing went out; `tries` counts
the sends of this call; `delivery` as for `deliver`.
**sanitize**: `{"run_id", "passed", "bundle_sha256", "items": [{"name", "sha256",
"bytes"}], "findings": [{"detector", "item", "line", "count"}], "seq"}`; exit 1 when
`passed` is false (the check is recorded either way).
**backup**: `{"path", "positions", "head", "bytes", "runs"}`: the copy's absolute path, its
last position, its head digest, its size and its number of streams.
**copy**: `{"imported", "skipped", "runs", "src", "dst", "checked"}`: the import's counts,
both addresses as the stores name them (no password), and how many runs were folded on
both sides and found identical. A copy that does not verify or fold the same exits 4.
**import**: `{"imported", "skipped", "runs"}` (events written, events already present,
runs in the file). A line that does not decode, breaks its run's chain, does not match
its hash or is malformed (actor, time, size, a repeated key) refuses the whole import with
exit 2, naming the line; an event the lifecycle rules would not have written refuses it
with exit 1 and the rule's own error (`StaleLease`, `IllegalTransition`,
`DeliveryRefused`, `HistoryRefused`...). Into a path with no file, the ledger is built
under a private name and appears only when the import succeeded; if a file appeared there
meanwhile, the import is refused (`TargetAppeared`, exit 1) and that file is left alone.

**run**: `{"run_id", "worker", "lease", "exit_code", "signal", "lease_lost",
"lost_reason", "released", "fenced", "silent_s", "recorded", "forwarded", "returncode"}`,
after the child's own output. `fenced` is true when the wrapper stopped the child because
no heartbeat could be recorded in time (`silent_s` says for how long); it then exits 75.

## Commands
"""


#: What each exit code means at the shell, keyed by the error class that carries the code;
#: the codes themselves, and the error types under each, are read from ledger.errors.
EXIT_MEANINGS = {
    "Refused": "refused by the ledger's rules: conflict, stale lease, lease held, illegal transition, double "
               "delivery, terminal run, not authorized, unknown run; `run`: the lease was lost",
    "InvalidInput": "usage: a missing or malformed option or argument (click's `UsageError`, `BadParameter`, ...), "
                    "or malformed input the ledger rejected",
    "StoreError": "store problem: not a ledger, locked past the busy timeout, read-only, disk full, corrupt",
    "DamageFound": "`verify`, `check` or `doctor` found damage; `head --write` found its file's digest no longer "
                   "in the ledger",
}


def exit_code_table() -> str:
    """docs/cli.md's exit-code table, generated from ledger.errors: every error type is
    listed under its own exit_code."""
    from handoff.ledger.errors import by_exit_code

    lines = ["| code | meaning | error types |", "|---|---|---|",
             f"| {EXIT_OK} | ok (a retried write that changed nothing is ok too: its outcome is `duplicate` or "
             "`unchanged`) | |"]
    for code, types in by_exit_code().items():
        meaning = next(EXIT_MEANINGS[t.__name__] for t in types if t.__name__ in EXIT_MEANINGS)
        names = ", ".join(f"`{t.__name__}`" for t in types if t.__name__ != "LedgerError")
        lines.append(f"| {code} | {meaning} | {names} |")
    lines += ["", "A run that does not exist (`UnknownRun`) exits 1 on every verb that names one. `diff` "
              "follows diff(1) besides: 0 the two runs are the same, 1 they differ (with the comparison on "
              "stdout; a missing run leaves stdout empty and says so on stderr), 2 and up trouble."]
    from handoff.worker import FENCED_EXIT

    lines.append(f"| {FENCED_EXIT} | `run` only: no heartbeat could be recorded for the heartbeat timeout less "
                 "the fence margin, so the wrapper stopped its child before the watchdog could give the lease "
                 "away (the ledger was locked or out of reach) | |")
    return "\n".join(lines)


def render_docs() -> str:
    """docs/cli.md: the intro above, then every command's --help, in definition order."""
    parts = [DOCS_INTRO.replace("@EXIT_CODES@", exit_code_table())]
    root = click.Context(main, info_name="handoff", terminal_width=WIDTH, max_content_width=WIDTH,
                         help_option_names=["-h", "--help"])
    parts.append("\n### handoff\n\n```text\n" + main.get_help(root).rstrip() + "\n```\n")
    for name in main.list_commands(root):
        cmd = main.commands[name]
        if cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=root, terminal_width=WIDTH, max_content_width=WIDTH)
        parts.append(f"\n### handoff {name}\n\n```text\n" + cmd.get_help(sub).rstrip() + "\n```\n")
    return "".join(parts)


def write_docs(path: str | None = None) -> str:
    path = path or os.path.join(os.path.dirname(os.path.realpath(__file__)), "docs", "cli.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_docs())
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-docs"]:
        print(write_docs(sys.argv[2] if len(sys.argv) > 2 else None))
    else:
        main()
