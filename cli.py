"""The ``handoff`` command: a thin click shell over ``handoff.Ledger``.

Every command opens the ledger, makes one library call and prints a table, a short line
or (``--json``) one JSON document. The commands of the table's verbs (handoff/operations.py)
are built from their rows (handoff/clitable.py) and added here, in the order docs/cli.md
shows; the rest are written out below. Nothing heavy is imported at module level: a shell
agent pays for ``handoff progress`` on every event, so each command imports what it uses.
"""

from __future__ import annotations

import os
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
from handoff.operations import help_of, operation  # noqa: E402  (data only: the table of verbs)
# The CLI's own parts: click and the standard library only at module level, the library on use.
from handoff.clioptions import (attr_option, format_option, json_option, key_option,  # noqa: E402
                                lease_option, open_kwargs, open_options, page_options, quiet_option,
                                run_argument)
from handoff.clitable import build  # noqa: E402
from handoff.hookcli import hook as hook_command, hooks as hooks_group  # noqa: E402
from handoff.servecli import serve as serve_command  # noqa: E402
from handoff.clitypes import ISO_TIME, POSITION_OR_TIME, Seconds, attr_map  # noqa: E402
from handoff.completion import (COMPLETE_HEALTH, COMPLETE_STATE, COMPLETE_VAR,  # noqa: E402
                                complete_runs, completion_class)
from handoff.output import (TABLE_WINDOW, chosen_format, echo_write, emit, field_rows, listing,  # noqa: E402
                            more_line, one_document, printable, side_rows, stream_csv, stream_json,
                            stream_jsonl, stream_table)
from handoff.progressbar import ProgressBar  # noqa: E402

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

            add_completion_class(completion_class("bash"), "bash")  # the line as bash has it
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
    from handoff.facade import Ledger

    st = _state()
    return Ledger(st.db, create=create, busy_timeout_s=st.busy_timeout)


def _exit_damage_found() -> None:
    """End a check that found damage with DamageFound's exit code (verify, check, doctor)."""
    from handoff.ledger.errors import DamageFound

    click.get_current_context().exit(DamageFound.exit_code)


def _built(*verbs: str) -> None:
    """Add the commands built from these verbs' rows of the table (handoff/clitable.py), here,
    in the order of the commands around them."""
    for verb in verbs:
        main.add_command(build(operation(verb), ledger=_ledger, cls=HandoffCommand))


# --- contract and lease --------------------------------------------------------------


@main.command()
@json_option
def init(as_json: bool) -> None:
    """Create an empty ledger file (or confirm an existing one).

    \b
    Example:
        handoff --db work.db init
    """
    from handoff.facade import init_ledger

    st = _state()
    doc = init_ledger(st.db, busy_timeout_s=st.busy_timeout)
    text = (f"created ledger {st.db}" if doc["created"] else
            f"ledger {st.db} already exists ({doc['runs']} streams); nothing changed")
    emit(doc, as_json, text)


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
            run_id = lg.open(**open_kwargs(p), key=key)
        cp = lg.checkpoint(run_id)
    doc = {"run_id": run_id, "state": cp.state, "last_seq": cp.last_seq, "owner": cp.owner,
           "target": cp.target, "result_path": cp.result_path}
    emit(doc, as_json, run_id)


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
    emit(doc, as_json, str(got.token))


_built("heartbeat", "transition", "progress")


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
                          max_bytes=max_bytes, attrs=attr_map(attr_pairs))
    art = out.checkpoint.artifacts[-1] if out.checkpoint.artifacts else None
    extra = {} if art is None else {"artifact": {"path": art.path, "kind": art.kind, "bytes": art.bytes,
                                                 "sha256": art.sha256, "exists": art.exists}}
    did = "artifact recorded"
    if art is not None:
        did = (f"{art.kind} {art.path} recorded ({art.bytes} bytes, sha256 {art.sha256[:12]})" if art.exists
               else f"{art.kind} {art.path} recorded as MISSING (mistyped? 'handoff artifact-withdraw')")
    echo_write(out, as_json, did, **extra)


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
    echo_write(out, as_json, f"artifact {path} withdrawn; it no longer counts for submit", path=path)


_built("evidence", "block", "unblock", "effect_start", "effect_confirm", "submit", "review", "transfer")


# --- delivery -------------------------------------------------------------------------


@main.command()
@run_argument
@click.option("--by", required=True, help="The owner, or someone it transferred 'deliver' to.")
@click.option("--delivery-key", "key", required=True, help=help_of("deliver", "delivery_key"))
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
    false; outcome "unchanged", or "duplicate" for a replayed key).
    A second delivery under another key is refused (exit 1).

    With --send the ledger records the attempt, sends through the adapter, then records
    the receipt, the failure, or that no answer came (status "unknown"; exit 1). A send
    of unknown outcome is repeated, under the same key, only to a target that honours
    keys (http(s) with Idempotency-Key, file://); a cmd: target is never run twice for a
    key: check it, then record 'handoff delivered' or 'handoff delivery-failed'. A
    public target (open --public) needs 'handoff sanitize' to have passed first.

    \b
    Example:
        handoff deliver $RUN --by alice --delivery-key report-v1
        # ... post the result to the target, then:
        handoff delivered $RUN --delivery-key report-v1 --receipt "msg 1712"
        handoff deliver $RUN --by alice --delivery-key report-v1 --send     # the ledger sends it
    """
    from handoff import render as R
    from handoff.reducers.delivery import honours_keys

    if not send_now and (timeout is not None or retries is not None):
        raise click.UsageError("--timeout and --retries apply to --send only")
    if send_now:
        with _ledger() as lg:
            sent = lg.deliver(run, key, send=True, timeout_s=timeout, retries=retries, by=by)
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
        emit(doc, as_json, text)
        if sent.status != "confirmed":  # not delivered: the same code as a refusal
            from handoff.ledger.errors import Refused

            click.get_current_context().exit(Refused.exit_code)
        return
    with _ledger() as lg:
        out = lg.deliver(run, key, by=by)
    cp, extra = out.checkpoint, R.delivery_doc(out.checkpoint)
    if out.duplicate:
        extra["send"] = False
        st = extra["delivery"]["status"]
        text = (f"{run}: delivery {key} is already {st}; do not send again" if st == "confirmed" else
                f"{run}: delivery {key} was already recorded ({st}); do not send again until it is confirmed or failed")
        emit({**R.write_doc(out), **extra}, as_json, text)
        return
    extra["send"] = True
    echo_write(out, as_json, f"delivery {key} to {cp.target} recorded: send now, then 'handoff delivered'", **extra)


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
        handoff sanitize $RUN --by alice && handoff deliver $RUN --by alice --delivery-key v1 --send
    """
    with _ledger() as lg:
        doc = lg.sanitize(run, by=by)
    from handoff.reducers.sanitize import describe
    from handoff.ledger.events import Finding

    findings = [Finding(**f) for f in doc["findings"]]
    text = (f"{run}: sanitization passed over {len(doc['items'])} parts (bundle sha256 {doc['bundle_sha256'][:16]})"
            if doc["passed"] else f"{run}: sanitization FAILED: {describe(findings, limit=20)}")
    emit(doc, as_json, text)
    if not doc["passed"]:  # recorded, and a public target stays refused
        from handoff.ledger.errors import Refused

        click.get_current_context().exit(Refused.exit_code)


_built("delivered", "delivery_failed")


# --- ending and forking ---------------------------------------------------------------


_built("release", "revoke", "close_run", "reopen")


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
    emit({"run_id": child, "parent": run, "parent_seq": at_seq, "state": cp.state}, as_json, child)


# --- reading ----------------------------------------------------------------------------


@main.command()
@click.argument("run", metavar="[RUN]", required=False, shell_complete=complete_runs)
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

    fmt = chosen_format(fmt, as_json)
    with _ledger() as lg:
        if run is not None:
            p = lg.status(run, now=now)
            one_document(p, fmt, lambda: R.format_packet(p), lambda d: (["field", "value"], field_rows(d)))
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
        n = listing(fmt, {"now": R.iso(when)}, "runs", rows,
                     lambda: {"next": nxt, "more": more, "hidden_terminal": hidden}, list(R.RUN_ROW_KEYS),
                     lambda rows: stream_table(
                         ["RUN", "STATE", "OWNER", "WORKER", "LEASE", "PROGRESS", "HEALTH", "UPDATED"],
                         ([r["run_id"], r["state"], r["owner"], r["worker"], r["lease"], r["progress_seq"],
                           r["health"], R.iso_ms(r["updated_at"])] for r in rows)))
        if fmt != "table":
            return
    if not n:
        click.echo("no runs" + ("" if include_terminal else " that are not terminal")
                   + (f" after {after}" if after else "") + " match")
    more_line(more, nxt)
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

    fmt = chosen_format(fmt, as_json)
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
        n = listing(fmt, {"now": R.iso(when)}, "runs", rows, lambda: {"next": nxt, "more": more},
                     [*R.RUN_ROW_KEYS, "opened_at"], lambda rows: stream_table(
                         ["RUN", "STATE", "OWNER", "WORKER", "TARGET", "PROGRESS", "HEALTH", "OPENED", "UPDATED"],
                         ([r["run_id"], r["state"], r["owner"], r["worker"], r["target"], r["progress_seq"],
                           r["health"], R.iso_ms(r["opened_at"]), R.iso_ms(r["updated_at"])] for r in rows)))
    if fmt != "table":
        return
    if not n:
        click.echo("no runs match" + (f" after {after}" if after else ""))
    more_line(more, nxt, "" if now is not None else f" --now {R.iso(when)}")


#: Options of 'handoff log' that read across the ledger, refused with RUN.
_ACROSS = ("since", "until", "runs", "follow")


@main.command()
@click.argument("run", metavar="[RUN]", required=False, shell_complete=complete_runs)
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
              shell_complete=complete_runs)
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
            from handoff.names import actor_filter

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
            n = stream_csv(items, flush_each=follow)
        elif as_jsonl:
            n = stream_jsonl(items, flush_each=follow)
        elif as_json:
            n = stream_json(head, "events", items, lambda: {"next": (nxt[0] + (0 if run else 1)) if nxt else None})
        else:
            n = stream_table(headers, (cells(r) for r in items), window=1 if follow else TABLE_WINDOW)
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
        emit(p, True, None)
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
    with _ledger() as lg, ProgressBar("reading the run", quiet=quiet or as_json) as bar:
        # The store names itself without any password its address may hold.
        hint = "" if st.db == "handoff.db" else f"--db {_quote_arg(lg.store.path)} "
        doc = lg.write_report(run, path, fmt=fmt, at_seq=at_seq, as_of_us=as_of, db_hint=hint, progress=bar)
    if to_stdout:
        click.echo(doc.pop("text"), nl=False)
        return
    emit(doc, as_json, f"{run}: report of seq 1-{doc['last_seq']} written to {doc['path']} ({doc['bytes']} bytes)")


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
            emit(doc, as_json, f"{doc['spans']} spans of {len(doc['runs'])} run(s) sent to {where}: " + ", ".join(
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

                click.echo(printable(json.dumps(doc, ensure_ascii=False)))
            else:
                click.echo(printable(f"position {doc['position']}: {doc['spans']} spans of "
                                      f"{', '.join(r['run_id'] for r in doc['runs'])} sent to {where}"))

        def on_error(exc: Any) -> None:
            click.echo(printable(f"Error: {exc.message} (retrying in {poll:g}s)"), err=True)

        ot.follow(lg, exporter, state_path or "", where=where, poll_s=poll, should_stop=lambda: stop["flag"],
                  on_export=on_export, on_error=on_error)


def _quote_arg(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


@main.command()
@click.argument("run_a", metavar="RUN_A", shell_complete=complete_runs)
@click.argument("run_b", metavar="RUN_B", shell_complete=complete_runs)
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
    one_document(doc, chosen_format(fmt, as_json), lambda: R.format_diff(doc), lambda d: (["what", "a", "b"], side_rows(d)))
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

    fmt = chosen_format(fmt, as_json)
    with _ledger() as lg:
        when = now if now is not None else lg.clock()
        if limit:
            page = lg.stalls_page(limit=limit, after=after, now=when)
            found, nxt, more = page.items, page.next, page.more
        else:
            found, nxt, more = lg.iter_stalls(now=when, after=after), None, 0
        rows = (R.stall_row(cp, h) for cp, h in found)
        n = listing(fmt, {"now": R.iso(when)}, "stalls", rows, lambda: {"next": nxt, "more": more},
                     list(R.STALL_ROW_KEYS), lambda rows: stream_table(
                         ["RUN", "STATE", "HEALTH", "ACTION", "LEASE", "LAST BEAT", "PROGRESS", "RETRIES", "WHY"],
                         ([r["run_id"], r["state"], r["classification"], r["action"], r["lease"],
                           R.iso_ms(r["last_heartbeat_at"]),
                           f"{r['progress_seq']}" + (f" {r['last_progress']['kind']}" if r["last_progress"] else ""),
                           f"{r['retries']}/{r['retry_budget']}", R.one_line(r["reason"], 60)] for r in rows)))
        if fmt != "table":
            return
    if not n:
        click.echo(f"no run needs attention at {R.iso(when, ms=True)}" + (f" after {after}" if after else ""))
    more_line(more, nxt, "" if now is not None else f" --now {R.iso(when)}")


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
    from handoff.ledger.inputs import check_seconds

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
@click.argument("run", metavar="[RUN]", required=False, shell_complete=complete_runs)
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

    with _ledger() as lg, ProgressBar("verifying", quiet=quiet or as_json) as bar:
        doc = lg.verify_report(run, progress=bar, expect_head=expect_head)
    ok, probs, diffs, skipped = doc["ok"], doc["problems"], doc["projections"], doc["skipped"]
    events, runs = doc["events"], doc["streams"]
    if as_json:
        emit(doc, True, None)
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
        doc = lg.write_head(write) if write else {**lg.ledger_head(), "path": None, "previous": None}
    emit(doc, as_json, doc["digest"])


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

    with _ledger() as lg, ProgressBar("checking", quiet=quiet or as_json) as bar:
        diffs = lg.check(name, progress=bar)
    if as_json:
        emit({"ok": not diffs, "differences": diffs}, True, None)
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

    with _ledger() as lg, ProgressBar("rebuilding", quiet=quiet or as_json) as bar:
        counts = lg.rebuild(name, progress=bar)
    if as_json:
        emit({"rebuilt": counts}, True, None)
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
    emit(doc, as_json, f"backed up {doc['positions']} events of {doc['runs']} streams to {doc['path']} "
                        f"({doc['bytes']} bytes); head {doc['head']}")


@main.command()
@click.argument("runs", nargs=-1, metavar="[RUN]...", shell_complete=complete_runs)
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
    with _ledger() as lg, ProgressBar("exporting", quiet=quiet or as_json) as bar:
        if sqlite_out is not None:
            doc = lg.export_sqlite(sqlite_out, redact=redact, salt=salt, fields=redact_fields, progress=bar)
            emit(doc, as_json, f"exported {doc['events']} new events to {doc['output']} and wrote {doc['runs']} "
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
    emit(doc, as_json, f"exported {doc['events']} events of {doc['runs']} runs to {output}")


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
    from handoff.facade import import_into

    st = _state()
    with ProgressBar("importing", quiet=quiet or as_json) as bar:
        counts = import_into(st.db, file, busy_timeout_s=st.busy_timeout, progress=bar)
    emit(counts, as_json, f"imported {counts['imported']} events of {counts['runs']} runs; "
                           f"{counts['skipped']} were already here")


@main.command("copy")
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST")
@click.option("--run", "runs", multiple=True, metavar="RUN", help="Copy only this run (repeatable; a fork brings its parents).",
              shell_complete=complete_runs)
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
    from handoff.facade import copy_ledger

    with ProgressBar("copying", quiet=quiet or as_json) as bar:
        doc = copy_ledger(src, dst, run_ids=list(runs) or None, busy_timeout_s=_state().busy_timeout, progress=bar)
    emit(doc, as_json, f"copied {doc['imported']} events of {doc['runs']} runs from {doc['src']} to {doc['dst']} "
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
        emit(doc, True, None)
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
    cls = completion_class(shell)
    assert cls is not None  # the Choice above names only shells click knows
    script = cls(main, {}, "handoff", COMPLETE_VAR).source()
    if as_json:
        emit({"shell": shell, "variable": COMPLETE_VAR, "script": script}, True, None)
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
        emit(facts, True, None)
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
              shell_complete=complete_runs)
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
                      open_kwargs=None if join else open_kwargs(p), heartbeat_s=heartbeat_every,
                      grace_s=grace, busy_timeout_s=st.busy_timeout, fence_margin_s=fence_margin)
    if as_json:
        import msgspec

        emit(msgspec.to_builtins(res), True, None)
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

    from handoff.names import login_name

    st = _state()
    config = ms.Config(role=role, name=name or login_name(), root=root, allow_targets=allow_target)
    if address is None:
        anyio.run(lambda: ms.serve_stdio(st.db, config, busy_timeout_s=st.busy_timeout))
    else:
        anyio.run(lambda: ms.serve_http(st.db, config, address, token_file=token_file,
                                        busy_timeout_s=st.busy_timeout))


# The coding agents' hooks: a hook's stdout belongs to its harness (handoff/hookcli.py).
main.add_command(hook_command)
main.add_command(hooks_group)
# The fleet in a browser (handoff/servecli.py, handoff/serve/).
main.add_command(serve_command)


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
    emit(doc, as_json, text)


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


#: docs/cli.md's hand-written part, with ``@EXIT_CODES@`` where the table goes. It is a
#: file of the checkout, not of the package: --write-docs regenerates the checkout's page.
DOCS_TEMPLATE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "docs", "cli.md.in")


def render_docs() -> str:
    """docs/cli.md: docs/cli.md.in with the exit-code table, then every command's --help, in
    definition order. Run from a checkout: an installed package has no docs/ to read."""
    try:
        with open(DOCS_TEMPLATE, encoding="utf-8") as f:
            intro = f.read()
    except FileNotFoundError:
        raise click.ClickException(f"{DOCS_TEMPLATE} is missing: docs/cli.md is generated in a checkout "
                                   "of handoff-ledger, not from an installed package") from None
    parts = [intro.replace("@EXIT_CODES@", exit_code_table())]
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
        try:
            print(write_docs(sys.argv[2] if len(sys.argv) > 2 else None))
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
    else:
        main()
