"""The handlers of the work itself: opening a run (or forking one), and what its worker
records on the way to a result: moves, progress, artifacts, evidence, blockers and side
effects, then the submitted result.

Each takes (checkpoint, command, context) and returns events or raises a typed error
(reducers/handler.py); decide.py has already checked the run and the actor.
"""

from __future__ import annotations

import math
import re
from typing import Any

from msgspec import UNSET

from handoff.ledger import events as ev
from handoff.ledger import inputs
from handoff.ledger.errors import (
    EvidenceMissing,
    IdempotencyConflict,
    IllegalProgress,
    IllegalTransition,
    InvalidInput,
    TerminalRun,
    UnknownArtifact,
    UnknownEffect,
    UnknownRun,
)

from . import commands as C
from . import sanitize as sz
from . import targets
from . import transitions as T
from .checkpoint import Checkpoint
from .handler import Context, state_change


def open_run(cp: Checkpoint, c: C.Open, ctx: Context) -> list[ev.Event]:
    p = c.policy
    policy = ev.Policy(
        heartbeat_timeout_s=inputs.seconds("heartbeat_timeout", p.heartbeat_timeout_s),
        progress_timeout_s=inputs.seconds("progress_timeout", p.progress_timeout_s),
        retry_budget=inputs.count("retry_budget", p.retry_budget, high=1000),
        delivery_timeout_s=inputs.seconds("delivery_timeout", p.delivery_timeout_s),
        owner_cap=inputs.count("owner_cap", p.owner_cap, low=1, high=100_000),
    )
    if not isinstance(c.stop_rules, (tuple, list)):
        raise InvalidInput("stop_rules must be a list of text", field="stop_rules")
    target = inputs.name("target", c.target)
    send = _send_policy(c.send, target)
    return [
        ev.HandoffOpened(
            goal=inputs.text("goal", c.goal, empty=False),
            target=target,
            owner=inputs.name("owner", c.owner),
            origin=inputs.text("origin", c.origin, max_len=inputs.MAX_NAME),
            result_path=None if c.result_path is None else inputs.text("result_path", c.result_path, max_len=4096, empty=False),
            stop_rules=tuple(inputs.text(f"stop_rules[{i}]", r, empty=False) for i, r in enumerate(c.stop_rules)),
            require_review=bool(c.require_review),
            policy=policy,
            public=bool(c.public),
            sanitize_patterns=sz.check_patterns(c.sanitize_patterns),
            send=send,
            progress_kinds=T.check_progress_kinds(c.progress_kinds),
        )
    ]


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _send_policy(p: object, target: str) -> ev.SendPolicy:
    """The limits of a send by the ledger itself. The target is checked here too: one that
    carries a credential is refused (it is written to the log in clear), and an adapter
    target must parse (targets.parse), so one the ledger could never send to is refused
    now rather than at every send."""
    if targets.carries_credential(target):
        raise InvalidInput(targets.CREDENTIAL_REFUSED, field="target")
    targets.parse(target)
    if not isinstance(p, ev.SendPolicy):
        raise InvalidInput("send must be a SendPolicy", field="send")
    if p.token_env and not _ENV_NAME.fullmatch(p.token_env):
        raise InvalidInput(f"send.token_env must be an environment variable's name (letters, digits, _), "
                           f"got {p.token_env[:60]!r}", field="token_env")
    if (refusal := targets.token_env_refusal(p.token_env)) is not None:
        raise InvalidInput(refusal, field="send.token_env")
    if not isinstance(p.inline, bool):
        raise InvalidInput("send.inline must be true or false", field="inline")
    return ev.SendPolicy(
        timeout_s=inputs.seconds("send.timeout_s", p.timeout_s),
        retries=inputs.count("send.retries", p.retries, high=20),
        backoff_s=_backoff(p.backoff_s),
        max_bytes=inputs.count("send.max_bytes", p.max_bytes, low=1, high=2**40),
        inline=p.inline,
        token_env=p.token_env,
    )


def _backoff(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 3600:
        raise InvalidInput(f"send.backoff_s must be seconds from 0 to 3600, got {value!r}", field="backoff_s")
    return float(value)


def fork(cp: Checkpoint, c: C.Fork, ctx: Context) -> list[ev.Event]:
    parent = ctx.parent
    at = inputs.count("at_seq", c.at_seq, low=1)
    if parent is None or not parent.opened:
        raise UnknownRun(f"cannot fork: run {c.parent} does not exist")
    if at > parent.last_seq:
        raise InvalidInput(f"run {c.parent} has only {parent.last_seq} events; fork at a seq from 1 to {parent.last_seq}", field="at_seq")
    if parent.terminal:
        raise TerminalRun(f"run {c.parent} had already ended ({parent.state}) at seq {at}; fork at an earlier seq")
    return [ev.RunForked(parent=c.parent, parent_seq=at)]


def heartbeat(cp: Checkpoint, c: C.Heartbeat, ctx: Context) -> list[ev.Event]:
    return [ev.HeartbeatRecorded(attrs=inputs.check_attrs(c.attrs), beats=liveness_figure("beats", c.beats),
                                 previous_us=liveness_figure("previous_us", c.previous_us))]


def liveness_figure(field: str, value: Any) -> Any:
    """A liveness figure a logged beat or a watchdog's decision carries (UNSET: none known)."""
    return value if value is UNSET else inputs.count(field, value)


def transition(cp: Checkpoint, c: C.Transition, ctx: Context) -> list[ev.Event]:
    to = inputs.choice("to", c.to, T.STATES)
    if cp.state == T.UNKNOWN and cp.pending_effects:
        keys = ", ".join(e.key for e in cp.pending_effects)
        raise IllegalTransition(
            f"run {cp.run_id} has side effects of unknown outcome ({keys}); record what happened "
            "with 'handoff effect-confirm' before moving on, never retry blindly"
        )
    return [state_change(cp, to, "transition", inputs.text("reason", c.reason))]


def progress(cp: Checkpoint, c: C.Progress, ctx: Context) -> list[ev.Event]:
    kind = inputs.name("kind", c.kind)
    detail = inputs.text("detail", c.detail)
    attrs = inputs.check_attrs(c.attrs)
    declared = cp.progress_kinds
    if kind in T.NOT_PROGRESS:
        if cp.state not in T.WORKING | {T.BLOCKED, T.UNKNOWN}:
            raise IllegalProgress(f"run {cp.run_id} is {cp.state}; no worker activity is expected now")
        return [ev.ProgressRecorded(kind=kind, detail=detail, advances=False, attrs=attrs)]
    own = T.progress_kinds_in(cp.state, declared) if cp.state in T.WORKING else frozenset()
    if kind in own:
        return [ev.ProgressRecorded(kind=kind, detail=detail, advances=True, attrs=attrs)]
    where = T.states_of_kind(kind, declared)
    if where:
        how = (f"in {cp.state} progress is {', '.join(sorted(own))}" if own
               else "record it with 'handoff block' or 'handoff effect-confirm'" if where[0] in (T.BLOCKED, T.UNKNOWN)
               else f"move the run to {where[0]} first")
        raise IllegalProgress(f"'{kind}' is progress in {', '.join(where)}, not while run {cp.run_id} is {cp.state}; {how}")
    counts = (f"progress in {cp.state} is {', '.join(sorted(own))}" if own
              else f"nothing counts as progress while it is {cp.state}")
    raise InvalidInput(
        f"unknown progress kind {kind!r} for run {cp.run_id}: {counts}; activity that never counts is "
        f"{', '.join(sorted(T.NOT_PROGRESS))}. A kind of your own must be declared in the contract when the "
        "run is opened (progress_kinds; 'handoff open --progress-kind STATE:KIND')",
        field="kind",
    )


def artifact(cp: Checkpoint, c: C.RecordArtifact, ctx: Context) -> list[ev.Event]:
    sha = inputs.text("sha256", c.sha256, max_len=64)
    if c.exists and not inputs.HEX_DIGEST.fullmatch(sha):
        raise InvalidInput("sha256 must be 64 lowercase hex digits", field="sha256")
    return [ev.ArtifactRecorded(
        path=inputs.text("path", c.path, max_len=4096, empty=False), kind=inputs.name("kind", c.kind),
        bytes=inputs.count("bytes", c.bytes), sha256=sha, exists=bool(c.exists), attrs=inputs.check_attrs(c.attrs),
    )]


def evidence(cp: Checkpoint, c: C.RecordEvidence, ctx: Context) -> list[ev.Event]:
    return [ev.EvidenceRecorded(
        kind=inputs.name("kind", c.kind), outcome=inputs.choice("outcome", c.outcome, {"pass", "fail", "skipped"}),  # type: ignore[arg-type]
        detail=inputs.text("detail", c.detail), attrs=inputs.check_attrs(c.attrs),
    )]


def block(cp: Checkpoint, c: C.Block, ctx: Context, *, via: str = "block") -> list[ev.Event]:
    reason = inputs.text("reason", c.reason, empty=False)
    nxt = inputs.text("next_action", c.next_action, empty=False)
    out: list[ev.Event] = [ev.BlockerRaised(blocker_id=cp.blockers_raised + 1, reason=reason, next_action=nxt)]
    if cp.state != T.BLOCKED:
        out.append(state_change(cp, T.BLOCKED, via, reason))
    return out


def unblock(cp: Checkpoint, c: C.Unblock, ctx: Context) -> list[ev.Event]:
    resolution = inputs.text("resolution", c.resolution, empty=False)
    if cp.state != T.BLOCKED or not cp.blockers:
        raise IllegalTransition(f"run {cp.run_id} is {cp.state}, not blocked; nothing to unblock")
    if c.blocker_id is None:
        clearing = list(cp.blockers)
    else:
        clearing = [b for b in cp.blockers if b.id == c.blocker_id]
        if not clearing:
            ids = ", ".join(str(b.id) for b in cp.blockers)
            raise InvalidInput(f"run {cp.run_id} has no open blocker {c.blocker_id} (open: {ids})", field="blocker_id")
    out: list[ev.Event] = [ev.BlockerCleared(blocker_id=b.id, resolution=resolution) for b in clearing]
    if len(clearing) == len(cp.blockers):
        out.append(state_change(cp, cp.blockers[0].prior_state, "unblock", resolution))
    return out


def effect_start(cp: Checkpoint, c: C.StartEffect, ctx: Context) -> list[ev.Event]:
    key = inputs.name("effect_key", c.key)
    what = inputs.text("what", c.what, empty=False)
    attrs = inputs.check_attrs(c.attrs)
    if cp.state not in T.WORKING:
        raise IllegalTransition(f"run {cp.run_id} is {cp.state}; side effects start only while planning, executing or verifying")
    for e in cp.pending_effects:
        if e.key == key:
            if e.what == what:
                return []
            raise IdempotencyConflict(f"side effect key {key!r} is already in use on run {cp.run_id} for {e.what!r}")
    if any(k == key for k, _ in cp.settled_effects):
        raise IdempotencyConflict(f"side effect key {key!r} was already used and settled on run {cp.run_id}; use a new key")
    return [ev.SideEffectStarted(key=key, what=what, attrs=attrs)]


def effect_confirm(cp: Checkpoint, c: C.ConfirmEffect, ctx: Context) -> list[ev.Event]:
    key = inputs.name("effect_key", c.key)
    outcome = inputs.choice("outcome", c.outcome, {"done", "absent"})
    attrs = inputs.check_attrs(c.attrs)
    pending = next((e for e in cp.pending_effects if e.key == key), None)
    if pending is None:
        if (key, outcome) in cp.settled_effects:
            return []
        if any(k == key for k, _ in cp.settled_effects):
            raise IdempotencyConflict(f"side effect {key!r} on run {cp.run_id} was already settled with another outcome")
        raise UnknownEffect(f"no side effect with key {key!r} was started on run {cp.run_id}; check 'handoff status {cp.run_id}'")
    note = inputs.text("note", c.note)  # checked whoever confirms, though a worker's own confirm keeps no note
    if ctx.actor.kind == T.WORKER and pending.lease == cp.lease:
        return [ev.SideEffectConfirmed(key=key, outcome=outcome, attrs=attrs)]  # type: ignore[arg-type]
    return [ev.ReconciliationRecorded(key=key, outcome=outcome, note=note, attrs=attrs)]  # type: ignore[arg-type]


def submit(cp: Checkpoint, c: C.Submit, ctx: Context) -> list[ev.Event]:
    to = T.READY_FOR_REVIEW if cp.require_review else T.SUCCEEDED
    move = state_change(cp, to, "submit")
    if cp.pending_effects:
        keys = ", ".join(e.key for e in cp.pending_effects)
        raise IllegalTransition(
            f"run {cp.run_id} has side effects with no recorded outcome ({keys}); confirm them "
            "with 'handoff effect-confirm' before submitting a result"
        )
    if not cp.artifacts:
        raise EvidenceMissing(
            f"run {cp.run_id} has no recorded artifact; record the result file with 'handoff "
            "artifact' (the ledger measures it) before submitting"
        )
    bad = [a for a in cp.artifacts if not a.substantive]
    if bad:
        a = bad[0]
        what = "missing" if not a.exists else "empty"
        raise EvidenceMissing(
            f"artifact {a.path} was recorded as {what}; a result must point at files that exist and have "
            f"content. Record it again once the file is right, or withdraw it ('handoff artifact-withdraw "
            f"{cp.run_id} {a.path} --reason ...') if it was recorded by mistake"
        )
    if cp.result_path is not None and not any(a.path == cp.result_path for a in cp.artifacts):
        raise EvidenceMissing(f"the contract names the result file {cp.result_path}, but no artifact was recorded at that path")
    return [ev.ResultSubmitted(summary=inputs.text("summary", c.summary), artifacts=tuple(a.path for a in cp.artifacts)), move]


def withdraw_artifact(cp: Checkpoint, c: C.WithdrawArtifact, ctx: Context) -> list[ev.Event]:
    path = inputs.text("path", c.path, max_len=4096, empty=False)
    reason = inputs.text("reason", c.reason, empty=False)
    if cp.state not in T.WITHDRAWABLE:
        raise IllegalTransition(
            f"run {cp.run_id} is {cp.state}: its submitted result names its artifacts, so none can be "
            "withdrawn now. A rejected review sends it back to executing, where it can",
            state=cp.state,
        )
    if not any(a.path == path for a in cp.artifacts):
        recorded = [a.path for a in cp.artifacts]
        shown = ", ".join(recorded[:5]) + (f" and {len(recorded) - 5} more" if len(recorded) > 5 else "")
        raise UnknownArtifact(
            f"run {cp.run_id} has no artifact recorded at {path} (it was never recorded, or was "
            f"withdrawn already); recorded now: {shown or 'none'}. See 'handoff status {cp.run_id}'",
            path=path,
        )
    return [ev.ArtifactWithdrawn(path=path, reason=reason)]
