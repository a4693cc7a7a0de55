"""The journal written to the ledger: what each hook means for the session's run.

``flush(db)`` takes ``replay.lock``, reads the journal from where the last replay stopped
and applies each record in order (``apply``), then empties the journal once all of it is
written. It is what a hook starts in the background, what a PreToolUse hook with the deny
switch runs itself, and what ``handoff hooks flush`` runs. Every write carries an
idempotency key made from the record's id (or the harness's tool_use_id, for a side
effect), so a replay cut short and run again writes nothing twice.

The ledger is waited for briefly (``BUSY_S``); a store that does not answer stops the
replay with the record still in the journal, for the next hook or ``handoff hooks flush``.
A record the ledger refuses (a revoked lease, a file that is gone) is skipped with a line
in ``hooks.log``: one bad record never holds up the ones behind it.

The mapping (docs/coding-agents.md has it as a table):

- session_start: the session is noted; under ``handoff run`` it is bound to the wrapper's
  run and lease. ``resume`` continues the same run (claimed again if the lease was given
  back). The run itself opens with the first prompt, whose text is its goal.
- prompt: open and claim on the first one; later ones are a note. A prompt after the
  result was submitted starts a follow-up run, ``<run>.2`` and so on.
- pre_tool: the run moves to executing (the first tool call commits the plan); a side
  effect tool (a shell, a request) records its start, keyed by the tool_use_id; any other
  tool heartbeats. A blocker the session raised is cleared.
- post_tool / tool_failed: the side effect's outcome; a file tool's file as an artifact;
  a ``tool_outcome`` step (a ``note`` for a failure) with the tool and its input, scrubbed.
- notification (permission_prompt, idle_prompt): the run is blocked on its owner.
- stop: a side effect still open is confirmed ``absent`` (every call that ran had its
  PostToolUse before the turn ended: this one was refused permission or denied); the
  turn's answer (scrubbed) as ``turn_result`` evidence, the run in verifying; with
  artifacts recorded, the result is submitted with the answer as its summary.
- session_end: the lease is given back with the reason.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from typing import Any

from handoff.facade import Ledger
from handoff.names import login_name
from handoff.lease import NOTE_STATES, bounded_text
from handoff.ledger.errors import (ClaimAlreadyMade, InvalidInput, LeaseLost, LedgerError, RunExists, StaleLease,
                                   StoreError)
from handoff.ledger.store import LeaseToken
from handoff.reducers import transitions as T

from . import spool
from .payloads import SIDE_EFFECT_TOOLS, Hook

#: How long a replay waits for another writer's lock before leaving the rest for later.
BUSY_S = 2.0
#: A hook run's policy unless the install says otherwise: a session's only beats are its
#: hooks, so a long command is silence; ten minutes of it and the session counts as gone.
HEARTBEAT_TIMEOUT_S = 600.0
PROGRESS_TIMEOUT_S = 1800.0
#: How much of a tool call and of a message is recorded, after the scrub.
MAX_SUMMARY = 200
MAX_MESSAGE = 500

_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def safe(text: str, limit: int = 100) -> str:
    """``text`` as the ledger takes it in a run id or a key."""
    return _UNSAFE.sub("-", text)[:limit] or "-"


def _distinct(text: str, limit: int) -> str:
    """``safe(text)``, with a digest of ``text`` when making it safe changed it, so two ids
    that differ only in characters a run id cannot hold (or past the limit) stay apart."""
    plain = safe(text, limit)
    if plain == text:
        return plain
    import hashlib

    return f"{safe(text, limit - 11)}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def run_id_for(harness: str, session: str) -> str:
    return f"{harness}-{_distinct(session, 100)}"


def worker_for(harness: str, session: str) -> str:
    return f"{harness}:{safe(session, 8)}"


def default_target() -> str:
    return f"terminal:{login_name()}@{socket.gethostname()}"


def _sid(rec: dict[str, Any]) -> str:
    return f"{rec['hook'].get('harness')}:{rec['hook'].get('session')}"


def _snapshot(state: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any] | None:
    s = state["sessions"].get(_sid(rec))
    return None if s is None else json.loads(json.dumps(s))


def _restore(state: dict[str, Any], rec: dict[str, Any], before: dict[str, Any] | None) -> None:
    """Undo what a record that will be applied again did to its session, except a lease it
    claimed: that lease exists in the ledger now, and its token is nowhere else."""
    now = state["sessions"].get(_sid(rec)) or {}
    kept = {k: now[k] for k in ("run", "token", "claims", "n", "wrapped", "worker")
            if k in now and now.get("token") and now.get("token") != (before or {}).get("token")}
    if before is None:
        state["sessions"].pop(_sid(rec), None)
        if kept:
            state["sessions"][_sid(rec)] = kept
    else:
        state["sessions"][_sid(rec)] = {**before, **kept}


def flush(db: str, *, wait_s: float = 0.0, env: Mapping[str, str] | None = None) -> dict[str, int]:
    """Write what the journal holds to the ledger at ``db``. ``wait_s``: how long to wait for
    another replay that holds the lock (which then writes these records itself). Returns
    counts: ``written`` records, ``refused`` ones, ``left`` bytes still in the journal."""
    env = os.environ if env is None else env
    directory = spool.state_dir(db)
    done = {"written": 0, "refused": 0, "left": 0}
    if not os.path.isdir(directory):
        return done
    while True:
        with spool.locked(directory, "replay.lock", wait_s=wait_s) as got:
            if not got:
                return done
            state = spool.load_state(directory)
            records = spool.read_from(directory, state["offset"])
            stopped = False
            if records:
                stopped = _replay(db, directory, state, records, env, done)
                spool.save_state(directory, state)
            if stopped:
                done["left"] = max(0, spool.journal_size(directory) - state["offset"])
                return done
            spool.truncate_if_done(directory, state)
        # A hook that appended while the lock was held saw it held and started nobody:
        # look again now that it is released.
        if spool.journal_size(directory) <= state["offset"]:
            return done
        wait_s = 0.0


def _replay(db: str, directory: str, state: dict[str, Any], records: list[tuple[dict[str, Any], int]],
            env: Mapping[str, str], done: dict[str, int]) -> bool:
    lg: Ledger | None = None
    try:
        for i, (rec, end) in enumerate(records):
            if rec.get("hook"):
                before = _snapshot(state, rec)
                try:
                    if lg is None:
                        lg = Ledger(db, busy_timeout_s=BUSY_S)
                    Session(lg, directory, state, rec, env).apply()
                    done["written"] += 1
                except StoreError as exc:
                    _restore(state, rec, before)
                    spool.log(directory, f"the ledger did not answer ({exc.type}); {len(records) - i} record(s) wait "
                                         "in the journal for the next hook or 'handoff hooks flush'")
                    return True
                except LedgerError as exc:
                    done["refused"] += 1
                    spool.log(directory, f"record {rec.get('id')} ({rec['hook'].get('event')}) refused: "
                                         f"{exc.type}: {exc.message}")
                except Exception as exc:  # a driver's own error is the store not answering
                    from handoff.ledger.backends import is_driver_error

                    if is_driver_error(exc):
                        _restore(state, rec, before)
                        spool.log(directory, f"the ledger did not answer ({type(exc).__name__})")
                        return True
                    done["refused"] += 1
                    spool.log(directory, f"record {rec.get('id')} could not be applied: {type(exc).__name__}: {exc}")
            state["offset"] = end
        return False
    finally:
        if lg is not None:
            lg.close()


class Session:
    """One record applied to its session's run."""

    def __init__(self, lg: Ledger, directory: str, state: dict[str, Any], rec: dict[str, Any],
                 env: Mapping[str, str]) -> None:
        self.lg = lg
        self.directory = directory
        self.state = state
        self.rec = rec
        self.env = env
        self.hook = Hook.from_doc(rec["hook"])
        self.sid = f"{self.hook.harness}:{self.hook.session}"
        self.s: dict[str, Any] = state["sessions"].setdefault(self.sid, {})
        self.worker = self.s.get("worker") or worker_for(self.hook.harness, self.hook.session)

    # --- helpers ---------------------------------------------------------------------

    def key(self, step: str) -> str:
        return f"hook:{safe(str(self.rec.get('id')), 40)}:{step}"

    @property
    def run(self) -> str:
        return self.s["run"]

    @property
    def token(self) -> LeaseToken:
        return LeaseToken(self.s["token"])

    def scrub(self, text: str, limit: int = MAX_SUMMARY) -> str:
        return bounded_text(text, self.lg, self.run, limit)

    def summary(self) -> str:
        """The tool and its input in one line, scrubbed and bounded; a file tool by the
        files it writes, relative to the session's directory (the artifact has the path)."""
        h = self.hook
        if h.files:
            shown = [os.path.relpath(f, h.cwd) if h.cwd and f.startswith(h.cwd.rstrip("/") + "/") else f
                     for f in h.files]
            return self.scrub(f"{h.tool} {', '.join(shown)}")
        return self.scrub(f"{h.tool} {h.input}".strip() if h.input not in ("", "{}") else h.tool)

    def attrs(self) -> dict[str, Any]:
        a = {"gen_ai.tool.name": self.hook.tool[:200] or "-"}
        if self.hook.call_id:
            a["gen_ai.tool.call.id"] = self.hook.call_id[:200]
        return a

    def save(self) -> None:
        spool.save_state(self.directory, self.state)

    # --- the mapping -----------------------------------------------------------------

    def apply(self) -> None:
        h = self.hook
        self.s["seen"] = int(time.time())
        self._bind_wrapper()
        if self.s.get("revoked"):
            return  # its lease was taken away: the session has no say in the run any more
        try:
            if h.event == "session_start":
                self._session_start()
            elif h.event == "session_end":
                self._session_end()
            else:
                self._ensure_run()
                getattr(self, "_" + h.event)()
        except (StaleLease, LeaseLost) as exc:
            self.s["revoked"] = exc.message
            raise

    def _bind_wrapper(self) -> None:
        """Under ``handoff run``: the session writes under the wrapper's run and lease."""
        wrapped = self.rec.get("wrapped")
        if not wrapped or self.s.get("wrapped") == wrapped.get("run"):
            return
        token = self.env.get("HANDOFF_LEASE", "")
        if self.env.get("HANDOFF_RUN") != wrapped.get("run") or not token.startswith(f"{wrapped.get('lease')}."):
            raise InvalidInput(f"the session ran under 'handoff run' for run {wrapped.get('run')}, and this replay "
                               "does not hold that lease; run 'handoff hooks flush' inside the same 'handoff run'")
        self.s.update(run=wrapped["run"], token=str(LeaseToken.parse(token)), wrapped=wrapped["run"],
                      worker=self.env.get("HANDOFF_WORKER") or self.worker)
        self.save()

    def _claim(self) -> None:
        n = self.s.get("n", 1)
        try:
            token = self.lg.claim(self.run, self.worker, key=f"hook-claim:{safe(self.run, 128)}:{n}:{self.s.get('claims', 0)}")
        except ClaimAlreadyMade:
            raise
        self.s["token"] = str(token)
        self.s["claims"] = self.s.get("claims", 0) + 1
        self.save()  # at once: a token not kept is a lease no one can use

    def _open(self, goal: str) -> None:
        h = self.hook
        n = self.s.get("n", 1)
        base = run_id_for(h.harness, h.session)
        run = base if n == 1 else f"{base}.{n}"
        opts = self.rec.get("open") or {}
        text = goal or f"a {h.harness} session in {h.cwd or 'an unknown directory'}"
        try:
            self.lg.open(run_id=run, goal=bounded_text(text, self.lg, run, MAX_MESSAGE),
                         target=opts.get("target") or default_target(),
                         owner=opts.get("owner") or login_name(), require_review=True,
                         heartbeat_timeout_s=float(opts.get("heartbeat_timeout") or HEARTBEAT_TIMEOUT_S),
                         progress_timeout_s=float(opts.get("progress_timeout") or PROGRESS_TIMEOUT_S),
                         key=f"hook-open:{safe(run, 128)}")
        except RunExists:
            pass  # opened before (a state file lost, a replay cut short): claim it
        self.s["run"] = run
        self.s.pop("token", None)
        self.s["prompts"] = 0
        self._claim()

    def _ensure_run(self) -> None:
        h = self.hook
        if not self.s.get("run"):
            self._open(h.prompt if h.event == "prompt" else "")
            return
        if self.s.get("wrapped"):
            return
        if not self.s.get("token"):
            self._claim()  # the session came back after its lease was given back
            return
        if h.event in ("prompt", "pre_tool"):
            state = self.lg.checkpoint(self.run).state
            if state in (T.READY_FOR_REVIEW, T.SUCCEEDED) or state in T.TERMINAL:
                # The result is with the owner; the session goes on as a follow-up run.
                try:
                    self.lg.release(self.run, self.token, "the session went on in a follow-up run",
                                    key=self.key("release"))
                except LedgerError:
                    pass  # already ended
                self.s["n"] = self.s.get("n", 1) + 1
                self._open(h.prompt if h.event == "prompt" else "")

    def _to_work(self, *, tool: bool) -> str:
        """The run moved to where the event's work is recorded; returns its state."""
        lg, run, tok = self.lg, self.run, self.token
        cp = lg.checkpoint(run)
        if cp.state == T.BLOCKED and self.s.get("blocked"):
            lg.unblock(run, f"the session went on ({self.hook.event})", lease=tok, key=self.key("unblock"))
            self.s.pop("blocked", None)
            cp = lg.checkpoint(run)
        if cp.state == T.QUEUED:
            lg.transition(run, tok, T.PLANNING, key=self.key("planning"))
            cp = lg.checkpoint(run)
        if tool and cp.state == T.PLANNING:
            lg.progress(run, tok, "plan_committed", self.scrub(f"the first tool call: {self.hook.tool}"),
                        key=self.key("plan"))
            lg.transition(run, tok, T.EXECUTING, key=self.key("executing"))
            cp = lg.checkpoint(run)
        if tool and cp.state == T.VERIFYING:
            lg.transition(run, tok, T.EXECUTING, key=self.key("executing"))
            cp = lg.checkpoint(run)
        return cp.state

    def _effect_key(self) -> str:
        calls = self.s.setdefault("calls", {})
        ident = self.hook.call_id or self.hook.tool
        if self.hook.event == "pre_tool":
            calls[ident] = f"tool:{_distinct(self.hook.call_id or str(self.rec.get('id')), 120)}"
        return calls.get(ident) or f"tool:{_distinct(self.hook.call_id or str(self.rec.get('id')), 120)}"

    def _session_start(self) -> None:
        if self.hook.source == "resume" and self.s.get("run") and not self.s.get("token") and not self.s.get("wrapped"):
            self._claim()  # a resumed session continues its run

    def _session_end(self) -> None:
        if self.s.get("token") and not self.s.get("wrapped") and self.s.get("run"):
            reason = self.hook.reason or "ended"
            try:
                self.lg.release(self.run, self.token, self.scrub(f"the {self.hook.harness} session ended ({reason})"),
                                key=self.key("release"))
            finally:
                self.s.pop("token", None)
                self.s.pop("calls", None)

    def _prompt(self) -> None:
        state = self._to_work(tool=False)
        if self.s.get("prompts", 0) and state in NOTE_STATES:
            self.lg.progress(self.run, self.token, "note", self.scrub(f"the user asked: {self.hook.prompt}"),
                             key=self.key("prompt"))
        self.s["prompts"] = self.s.get("prompts", 0) + 1

    def _pre_tool(self) -> None:
        self._to_work(tool=True)
        self.s["tool"] = self.hook.tool
        if self._side_effect():
            key = self._effect_key()
            cp = self.lg.checkpoint(self.run)
            if any(e.key == key for e in cp.pending_effects) or any(k == key for k, _ in cp.settled_effects):
                return  # started before (a replay)
            self.lg.effect_start(self.run, self.token, key, self.summary(), attrs=self.attrs())
        else:
            self.lg.heartbeat(self.run, self.token, attrs=self.attrs())

    def _side_effect(self) -> bool:
        return self.hook.tool in SIDE_EFFECT_TOOLS or self.hook.tool.startswith("mcp__")

    def _after_tool(self, failed: bool) -> None:
        h = self.hook
        state = self._to_work(tool=True)
        if self._side_effect():
            key = self._effect_key()
            cp = self.lg.checkpoint(self.run)
            if any(e.key == key for e in cp.pending_effects):
                note = self.scrub(f"the tool failed: {h.error}", MAX_MESSAGE) if failed else ""
                self.lg.effect_confirm(self.run, key, "done", note=note, lease=self.token)
            self.s.get("calls", {}).pop(h.call_id or h.tool, None)
        if not failed:
            for i, path in enumerate(h.files):
                try:
                    self.lg.artifact(self.run, self.token, path, key=self.key(f"artifact:{i}"), attrs=self.attrs())
                except InvalidInput as exc:  # gone, a directory, too large: say so, go on
                    spool.log(self.directory, f"{self.run}: {path} not recorded as an artifact: {exc.message}")
        if state not in T.WORKING:
            return
        if failed:
            self.lg.progress(self.run, self.token, "note", self.scrub(f"{self.summary()} failed: {h.error}", MAX_MESSAGE),
                             key=self.key("step"), attrs=self.attrs())
        else:
            self.lg.progress(self.run, self.token, "tool_outcome", self.summary(), key=self.key("step"),
                             attrs=self.attrs())

    def _post_tool(self) -> None:
        self._after_tool(failed=False)

    def _tool_failed(self) -> None:
        self._after_tool(failed=True)

    def _permission_request(self) -> None:
        self.s["tool"] = self.hook.tool
        self.lg.heartbeat(self.run, self.token, attrs=self.attrs())

    def _notification(self) -> None:
        h = self.hook
        cp = self.lg.checkpoint(self.run)
        waiting = {"permission_prompt": f"permission for {self.s.get('tool') or 'a tool'}",
                   "idle_prompt": "your next prompt"}.get(h.kind)
        if waiting is None or cp.state not in T.BLOCKABLE:
            self.lg.heartbeat(self.run, self.token)
            return
        if cp.state == T.BLOCKED:
            return
        self.lg.block(self.run, f"waiting on you: {waiting}",
                      f"answer {h.harness} in its terminal ({self.scrub(h.message or h.kind, MAX_SUMMARY)})",
                      lease=self.token, key=self.key("block"))
        self.s["blocked"] = True

    def _stop(self) -> None:
        lg, run, tok = self.lg, self.run, self.token
        cp = lg.checkpoint(run)
        if cp.state == T.BLOCKED and self.s.get("blocked"):
            lg.unblock(run, "the turn ended", lease=tok, key=self.key("unblock"))
            self.s.pop("blocked", None)
            cp = lg.checkpoint(run)
        if cp.state == T.QUEUED:
            lg.transition(run, tok, T.PLANNING, key=self.key("planning"))
            cp = lg.checkpoint(run)
        if cp.state == T.PLANNING:
            lg.progress(run, tok, "plan_committed", "the turn ended without a tool call", key=self.key("plan"))
            lg.transition(run, tok, T.EXECUTING, key=self.key("executing"))
            cp = lg.checkpoint(run)
        for e in cp.pending_effects:
            if e.lease == cp.lease:
                # Every call that ran had its PostToolUse before the turn ended: this one
                # never ran (its permission was refused, another hook denied it).
                lg.effect_confirm(run, e.key, "absent", note="no outcome came back before the turn ended",
                                  lease=tok)
        if cp.pending_effects:
            cp = lg.checkpoint(run)
        if cp.state == T.EXECUTING:
            lg.transition(run, tok, T.VERIFYING, key=self.key("verifying"))
            cp = lg.checkpoint(run)
        if cp.state != T.VERIFYING:
            return
        answer = self.scrub(self.hook.message, MAX_MESSAGE) or "the turn ended with no text"
        lg.evidence(run, "turn_result", "pass", answer, lease=tok, key=self.key("evidence"))
        cp = lg.checkpoint(run)
        if cp.artifacts and all(a.substantive for a in cp.artifacts) and not cp.pending_effects:
            lg.submit(run, tok, answer, key=self.key("submit"))


def lease_revoked(db: str, harness: str, session: str) -> str | None:
    """Why the session's lease no longer holds (revoked, taken over, the run ended), or
    None while it does, or when the session holds none or the ledger cannot say."""
    directory = spool.state_dir(db)
    s = spool.load_state(directory)["sessions"].get(f"{harness}:{session}") or {}
    if s.get("revoked"):
        return s["revoked"]
    if not s.get("run") or not s.get("token"):
        return None
    try:
        with Ledger(db, busy_timeout_s=BUSY_S, create=False, readonly=True) as lg:
            cp = lg.checkpoint(s["run"])
    except LedgerError:
        return None
    if cp.lease != LeaseToken(s["token"]).lease:
        return (f"lease {LeaseToken(s['token']).lease} of run {s['run']} is no longer this session's "
                "(revoked or taken over)")
    if cp.state in T.TERMINAL:
        return f"run {s['run']} has ended ({cp.state})"
    return None
