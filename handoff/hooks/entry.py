"""The hook process: read one payload, journal it, hand the writing to a replay, exit 0.

A hook runs twice per tool call, so it does as little as it can and imports only the
standard library (payloads, spool): it reads the payload, appends it to the journal (one
fsynced line) and starts a replay in the background (a process of its own, in a session of
its own, its output on /dev/null) unless one is already running, which then picks the new
record up. The agent never waits for the ledger, a lock or the network.

Two exceptions write the journal to the ledger in the hook process itself. Under ``handoff
run``, Stop and SessionEnd do, since the agent exits soon after them and the wrapper then
gives its lease back. And the deny switch (``--deny-revoked``): a PreToolUse hook with it
replays the journal itself and then asks whether the session's lease still holds; when it was revoked
or taken over, it prints the harness's "deny" with the reason, so the agent stops acting on
a run it no longer holds. That is the one thing a hook ever prints.

Whatever goes wrong (a payload that is not one, a full disk, a bug), the hook exits 0: an
agent is never broken by its record keeping. What went wrong goes to stderr, which the
harnesses show only in their debug output.
"""

from __future__ import annotations

import json
import os
import sys
import time

TYPE_CHECKING = False  # not typing's: a hook does not pay for importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import IO, Any

from . import payloads, spool

USAGE = ("usage: python -m handoff.hooks HARNESS [--db LEDGER] [--deny-revoked] [--owner NAME] [--target TARGET] "
         "[--heartbeat-timeout S] [--progress-timeout S]\n"
         "       python -m handoff.hooks --replay [--db LEDGER]\n")
_OPTIONS = {"--db": "db", "--owner": "owner", "--target": "target", "--heartbeat-timeout": "heartbeat_timeout",
            "--progress-timeout": "progress_timeout"}


def parse(argv: Sequence[str]) -> dict[str, Any]:
    """The hook's arguments (a hand-written parser: click costs more than the hook does)."""
    out: dict[str, Any] = {"harness": None, "deny": False, "replay": False}
    args = list(argv)
    while args:
        a = args.pop(0)
        name, eq, value = a.partition("=")
        if name in _OPTIONS:
            if not eq:
                if not args:
                    raise ValueError(f"{name} needs a value")
                value = args.pop(0)
            out[_OPTIONS[name]] = value
        elif a == "--deny-revoked":
            out["deny"] = True
        elif a == "--replay":
            out["replay"] = True
        elif a in ("-h", "--help"):
            raise ValueError("")
        elif out["harness"] is None and not a.startswith("-"):
            out["harness"] = a
        else:
            raise ValueError(f"unexpected argument {a!r}")
    return out


def ledger_of(opts: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """Under ``handoff run`` the wrapper's ledger (its lease lives there); else ``--db``,
    else ``$HANDOFF_DB``, else ``handoff.db`` in the working directory."""
    if env.get("HANDOFF_RUN") and env.get("HANDOFF_LEASE") and env.get("HANDOFF_DB"):
        return env["HANDOFF_DB"]
    return opts.get("db") or env.get("HANDOFF_DB") or "handoff.db"


def record(hook: payloads.Hook, opts: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The journal's line for ``hook``: an id for its idempotency keys, and under ``handoff
    run`` the wrapper's run and lease *number* (the token stays in the environment)."""
    rec: dict[str, Any] = {"id": os.urandom(9).hex(), "t": time.time(), "hook": hook.doc()}
    run, lease = env.get("HANDOFF_RUN"), env.get("HANDOFF_LEASE", "")
    if run and lease.partition(".")[0].isdigit():
        rec["wrapped"] = {"run": run, "lease": int(lease.partition(".")[0])}
    opened = {k: opts[k] for k in ("owner", "target", "heartbeat_timeout", "progress_timeout") if opts.get(k)}
    if opened:
        rec["open"] = opened
    return rec


def start_replay(db: str, directory: str) -> None:
    """A replay in the background, unless one holds the lock (it will see the new record)."""
    with spool.locked(directory, "replay.lock", wait_s=0) as free:
        if not free:
            return
    null = os.devnull
    # -P: not the hook's working directory (the agent's project) before the package.
    os.posix_spawn(sys.executable, [sys.executable, "-P", "-m", "handoff.hooks", "--replay", "--db", db], os.environ,
                   file_actions=[(os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
                                 (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                                 (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0)],
                   setsid=True)


def hook(opts: Mapping[str, Any], data: bytes, out: IO[str], env: Mapping[str, str]) -> None:
    try:
        doc = json.loads(data)
    except ValueError:
        raise payloads.NotAHook("the payload on stdin is not JSON") from None
    h = payloads.read(opts["harness"], doc)
    db = ledger_of(opts, env)
    directory = spool.ensure_dir(spool.state_dir(db))
    rec = record(h, opts, env)
    spool.append(directory, rec)
    if rec.get("wrapped") and h.event in ("stop", "session_end"):
        # Under 'handoff run' the agent exits soon after these, and the wrapper then gives
        # its lease back: write them now, while the lease they are written under holds.
        from .replay import flush

        flush(db, wait_s=10.0, env=env)
        return
    if opts.get("deny") and h.event == "pre_tool":
        from .replay import flush, lease_revoked

        flush(db, wait_s=5.0, env=env)
        why = lease_revoked(db, h.harness, h.session)
        if why:
            out.write(payloads.deny(h.harness, f"handoff: {why}. Stop working on this task: the run is no longer "
                                                 "this session's. Ask its owner ('handoff status')."))
            out.flush()
        return
    start_replay(db, directory)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts = parse(argv)
    except ValueError as exc:
        sys.stderr.write((f"handoff hook: {exc}\n" if str(exc) else "") + USAGE)
        return 0 if not str(exc) else 2
    env = os.environ
    if opts["replay"]:
        from .replay import flush

        try:
            flush(ledger_of(opts, env), env=env)
        except Exception as exc:  # a background process: nobody to tell but the log
            try:
                spool.log(spool.state_dir(ledger_of(opts, env)), f"replay failed: {type(exc).__name__}: {exc}")
            except OSError:
                pass
        return 0
    if opts["harness"] is None:
        sys.stderr.write("handoff hook: name the harness\n" + USAGE)
        return 0
    try:
        hook(opts, sys.stdin.buffer.read(), sys.stdout, env)
    except payloads.NotAHook:
        pass  # an event this hook does not record
    except Exception as exc:  # never break the agent
        sys.stderr.write(f"handoff hook: nothing recorded ({type(exc).__name__}: {exc})\n")
    return 0
