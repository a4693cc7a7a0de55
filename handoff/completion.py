"""Shell completion for ``handoff`` ('handoff completion'): what a Tab offers.

Run ids come from the ledger --db names, read only and bounded (a Tab never creates or
changes a ledger, and never prints a traceback into the line being typed); states,
progress kinds and health names from the reducers' tables, read when first asked. bash
gets a script of its own that hands over the whole line, so a run id holding ':' stays
one word. Apart from cli.py so the commands read as commands; nothing heavy is imported
at module level, since every ``handoff`` process builds the options that name these.
"""

from __future__ import annotations

import os
from typing import Any

import click

#: At most this many run ids are offered per Tab: one bounded range scan of an index.
COMPLETE_RUNS = 50
#: The environment variable the scripts set when they ask for completions (click's machinery).
COMPLETE_VAR = "_HANDOFF_COMPLETE"


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
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


def completion_class(shell: str) -> Any:
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
