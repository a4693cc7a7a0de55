"""Decide: turn a command into events, or refuse it with a typed error and write nothing.

``decide(state, command, context)`` reads the checkpoint fold and the tables in
transitions.py and nothing else: no I/O, no clock. The store calls it inside the write
transaction that appends its events, so a check and the write it guards cannot be split
by another writer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import msgspec
from msgspec import UNSET, UnsetType

from handoff.ledger import events as ev
from handoff.ledger.errors import (
    CapacityExceeded,
    DeliveryRefused,
    EvidenceMissing,
    IdempotencyConflict,
    IllegalProgress,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LedgerError,
    NotAuthorized,
    RunExists,
    SanitizationRequired,
    StaleLease,
    TerminalRun,
    UnknownArtifact,
    UnknownEffect,
    UnknownRun,
)
from handoff.ledger.store import Actor, check_chars, check_seq, check_utf8

from . import commands as C
from . import sanitize as sz
from . import targets
from . import transitions as T
from .checkpoint import Checkpoint
from .stall import CLASSIFICATIONS

MAX_TEXT = 16_384
MAX_NAME = 200
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


class Context(msgspec.Struct, frozen=True):
    """Everything decide needs beyond the run's own fold, passed in by the caller.

    ``owner_load`` is how many runs the owner already has under an active lease (the
    concurrency cap); ``parent`` is the parent's checkpoint at the fork point.
    """

    actor: Actor
    owner_load: int | None = None
    parent: Checkpoint | None = None


def _text(field: str, value: object, *, max_len: int = MAX_TEXT, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, got {type(value).__name__}", field=field)
    if not empty and not value.strip():
        raise InvalidInput(f"{field} must not be empty", field=field)
    if len(value) > max_len:
        raise InvalidInput(f"{field} is {len(value)} characters, over the limit of {max_len}", field=field)
    return check_chars(value, field)  # the one rule for control characters, names and keys use it too


def _name(field: str, value: object) -> str:
    v = _text(field, value, max_len=MAX_NAME, empty=False)
    if "\n" in v or "\t" in v:
        raise InvalidInput(f"{field} must be a single line", field=field)
    return v


#: The bounds of a record's ``attrs``: a few facts about one step (model, tokens, cost,
#: tool, trace and span ids), not a place to store output. Keys may be dotted, as
#: OpenTelemetry names are (``gen_ai.usage.input_tokens``).
MAX_ATTRS = 32
MAX_ATTR_KEY = 64
MAX_ATTR_TEXT = 1_000
ATTR_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,%d}" % MAX_ATTR_KEY)
#: Whole numbers must fit a signed 64-bit integer, what every reader of JSON can hold.
ATTR_INT_RANGE = (-(2**63), 2**63 - 1)


def check_attrs(value: object, field: str = "attrs") -> ev.Attrs | UnsetType:
    """A record's attributes, refused (InvalidInput naming the key) past their bounds.

    Called by the API before a command is built and again by every handler, so a map
    inside an imported event meets the same rule. An empty map is ``UNSET``: the event
    then encodes as it did before attributes existed."""
    if value is UNSET or value is None:
        return UNSET
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must be a map of names to text, numbers or true/false, got "
                           f"{type(value).__name__}", field=field)
    if len(value) > MAX_ATTRS:
        raise InvalidInput(f"{field} has {len(value)} entries, over the limit of {MAX_ATTRS}; keep the few "
                           "facts about this step (model, tokens, cost, tool, trace id)", field=field)
    out: dict[str, str | int | float | bool] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not ATTR_KEY.fullmatch(key):
            shown = repr(key)[:80]
            raise InvalidInput(f"{field} key {shown} must be 1 to {MAX_ATTR_KEY} characters from letters, digits "
                               "and . _ : -", field=field)
        where = f"{field}[{key}]"
        if isinstance(v, bool):
            out[key] = bool(v)
        elif isinstance(v, int):
            low, high = ATTR_INT_RANGE
            if not low <= v <= high:
                raise InvalidInput(f"{where} is a whole number outside the 64-bit range ({low} to {high}); "
                                   "pass it as text", field=f"{field}.{key}")
            out[key] = int(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInput(f"{where} is {v!r}; a number must be finite", field=f"{field}.{key}")
            out[key] = float(v)
        elif isinstance(v, str):
            check_utf8(v, where)
            out[key] = str(_text(where, v, max_len=MAX_ATTR_TEXT))
        else:
            raise InvalidInput(f"{where} must be text, a number or true/false, got {type(v).__name__}",
                               field=f"{field}.{key}")
    return out or UNSET


#: The bounds of a contract's own progress kinds (``progress_kinds``).
MAX_DECLARED_KINDS = 32
KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_progress_kinds(value: object, field: str = "progress_kinds") -> ev.DeclaredKinds | UnsetType:
    """A contract's own progress kinds by working state, checked when the run opens.

    Only new names: a built-in kind keeps the state the table gives it, and activity that
    never counts (``note``, ``waiting``, ...) cannot be declared progress, so noise stays
    noise. The result lists states in lifecycle order, each state's kinds in the order
    given and once; none at all is ``UNSET``."""
    if value is UNSET or value is None:
        return UNSET
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field} must map working states to lists of kind names", field=field)
    declarable = ", ".join(s for s in T.STATES if s in T.DECLARABLE)
    out: dict[str, list[str]] = {}
    for state, kinds in value.items():
        if state not in T.DECLARABLE:
            raise InvalidInput(f"{field}: {str(state)[:60]!r} is not a working state; kinds may be declared "
                               f"for {declarable}", field=field)
        if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)):
            raise InvalidInput(f"{field}.{state} must be a list of kind names", field=field)
        own = out.setdefault(state, [])
        for kind in kinds:
            if not isinstance(kind, str) or not KIND_NAME.fullmatch(kind):
                raise InvalidInput(f"{field}.{state}: {repr(kind)[:80]} is not a kind name (a lowercase letter, "
                                   "then up to 63 lowercase letters, digits or _)", field=field)
            if kind in T.NOT_PROGRESS:
                raise InvalidInput(f"{field}.{state}: {kind} is activity that never counts as progress; it "
                                   "cannot be declared progress", field=field)
            if kind in T.ALL_PROGRESS_KINDS:
                where = ", ".join(s for s, ks in T.PROGRESS_KINDS.items() if kind in ks)
                raise InvalidInput(f"{field}.{state}: {kind} is a built-in progress kind (of {where}); declare "
                                   "a name of your own", field=field)
            if kind not in own:
                own.append(kind)
    total = sum(len(k) for k in out.values())
    if total > MAX_DECLARED_KINDS:
        raise InvalidInput(f"{field} declares {total} kinds, over the limit of {MAX_DECLARED_KINDS}", field=field)
    ordered = {s: tuple(out[s]) for s in T.STATES if out.get(s)}
    return ordered or UNSET


def _count(field: str, value: object, *, low: int = 0, high: int = 2**53) -> int:
    return check_seq(value, field, low=low, high=high)  # one rule for whole numbers, everywhere


def _seconds(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= 10**7:
        raise InvalidInput(f"{field} must be a number of seconds above 0 and at most 10^7, got {value!r}", field=field)
    return float(value)


def _choice(field: str, value: object, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput(f"{field} must be one of {', '.join(sorted(allowed))}, got {value!r:.80}", field=field)
    return value  # type: ignore[return-value]


# --- authorization -----------------------------------------------------------------


def _authorize(cp: Checkpoint, name: str, cmd: C.Command, actor: Actor) -> None:
    perms = T.PERMISSIONS[name]
    granted = T.COMES_WITH.get(name, name)  # the transferred action that carries this one
    lease = getattr(cmd, "lease", None)
    if lease is not None:
        _count("lease", lease, low=1)
    if actor.kind == T.WORKER and "lease" in perms:
        if lease is None:
            raise NotAuthorized(f"a worker must pass its lease to {name} run {cp.run_id}", field="lease")
        if cp.lease != lease:
            raise StaleLease.superseded(cp.run_id, lease, cp.lease, cp.worker, cp.max_lease)
        return
    if actor.kind in perms and actor.kind != T.OWNER:
        return
    if actor.kind == T.OWNER and T.OWNER in perms:
        if name == "open" or actor.name == cp.owner:
            return
        if granted in T.TRANSFERABLE and cp.may(granted, actor.name):
            return
        raise NotAuthorized(
            f"{actor.name} is not the owner of run {cp.run_id} (the owner is {cp.owner}); "
            f"only the owner, an operator, or someone the owner transferred '{name}' to may do it"
        )
    if granted in T.TRANSFERABLE and cp.may(granted, actor.name):
        return
    who = " or ".join(sorted("a worker holding the lease" if p == "lease" else f"the {p}" for p in perms))
    extra = (" Review, delivery and closing belong to the owner unless it transfers them "
             "('handoff transfer')." if granted in T.TRANSFERABLE else "")
    raise NotAuthorized(f"a {actor.kind} ({actor.name}) may not {name} run {cp.run_id}; only {who} may.{extra}")


def authorize(cp: Checkpoint, cmd: C.Command, actor: Actor) -> None:
    """Refuse (NotAuthorized, StaleLease) if ``actor`` may not issue ``cmd`` on ``cp``'s run:
    the same check decide makes, for a caller that must know before it acts outside (a
    send whose outcome it will have to record)."""
    _authorize(cp, C.name_of(cmd), cmd, actor)


def _move(cp: Checkpoint, to: str, via: str, reason: str = "") -> ev.StateChanged:
    if not T.can_move(cp.state, to, via):
        allowed = T.allowed_targets(cp.state, via)
        hint = f"from {cp.state}, {via} may move it to {', '.join(allowed)}" if allowed else f"{via} cannot move a run that is {cp.state}"
        raise IllegalTransition(
            f"run {cp.run_id} is {cp.state}; moving it to {to} by {via} is not allowed ({hint})",
            state=cp.state, to=to,
        )
    return ev.StateChanged(from_state=cp.state, to_state=to, reason=reason)


# --- the handlers, one per command -------------------------------------------------


def _open(cp: Checkpoint, c: C.Open, ctx: Context) -> list[ev.Event]:
    p = c.policy
    policy = ev.Policy(
        heartbeat_timeout_s=_seconds("heartbeat_timeout", p.heartbeat_timeout_s),
        progress_timeout_s=_seconds("progress_timeout", p.progress_timeout_s),
        retry_budget=_count("retry_budget", p.retry_budget, high=1000),
        delivery_timeout_s=_seconds("delivery_timeout", p.delivery_timeout_s),
        owner_cap=_count("owner_cap", p.owner_cap, low=1, high=100_000),
    )
    if not isinstance(c.stop_rules, (tuple, list)):
        raise InvalidInput("stop_rules must be a list of text", field="stop_rules")
    target = _name("target", c.target)
    send = _send_policy(c.send, target)
    return [
        ev.HandoffOpened(
            goal=_text("goal", c.goal, empty=False),
            target=target,
            owner=_name("owner", c.owner),
            origin=_text("origin", c.origin, max_len=MAX_NAME),
            result_path=None if c.result_path is None else _text("result_path", c.result_path, max_len=4096, empty=False),
            stop_rules=tuple(_text(f"stop_rules[{i}]", r, empty=False) for i, r in enumerate(c.stop_rules)),
            require_review=bool(c.require_review),
            policy=policy,
            public=bool(c.public),
            sanitize_patterns=sz.check_patterns(c.sanitize_patterns),
            send=send,
            progress_kinds=check_progress_kinds(c.progress_kinds),
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
        timeout_s=_seconds("send.timeout_s", p.timeout_s),
        retries=_count("send.retries", p.retries, high=20),
        backoff_s=_backoff(p.backoff_s),
        max_bytes=_count("send.max_bytes", p.max_bytes, low=1, high=2**40),
        inline=p.inline,
        token_env=p.token_env,
    )


def _backoff(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 3600:
        raise InvalidInput(f"send.backoff_s must be seconds from 0 to 3600, got {value!r}", field="backoff_s")
    return float(value)


def _claim(cp: Checkpoint, c: C.Claim, ctx: Context) -> list[ev.Event]:
    worker = _name("worker", c.worker)
    if ctx.actor.name != worker:
        raise NotAuthorized(f"worker {ctx.actor.name} cannot claim run {cp.run_id} on behalf of {worker}")
    if cp.lease is not None and cp.worker == worker:
        raise LeaseHeld(
            f"run {cp.run_id} is already held by worker {worker} under lease {cp.lease}. If "
            "that is this worker, keep using the token its claim printed, or release with it "
            "before claiming again; if the token is lost, wait for the watchdog to revoke "
            f"lease {cp.lease} once it stops beating, or ask the run's owner or an operator",
            lease=cp.lease, same_worker=True,
        )
    if cp.lease is not None:
        raise LeaseHeld(
            f"run {cp.run_id} is held by {cp.worker} under lease {cp.lease}; wait for it to "
            "release, or for the watchdog to revoke it if it stops beating. A worker does not "
            "revoke another worker's lease; that is for the run's owner or an operator",
            lease=cp.lease,
        )
    if not isinstance(c.token_digest, str) or not _HEX_DIGEST.fullmatch(c.token_digest):
        raise InvalidInput(
            "a claim must carry token_digest, the hex sha256 of a fresh secret "
            "(ledger.store.new_lease_secret); Ledger.claim draws one for you",
            field="token_digest",
        )
    if ctx.owner_load is not None and ctx.owner_load >= cp.policy.owner_cap:
        raise CapacityExceeded(
            f"owner {cp.owner} already has {ctx.owner_load} active runs, its cap of "
            f"{cp.policy.owner_cap}; wait for one to finish or close one",
        )
    return [ev.LeaseGranted(worker=worker, lease=cp.max_lease + 1, token_digest=c.token_digest)]


def _heartbeat(cp: Checkpoint, c: C.Heartbeat, ctx: Context) -> list[ev.Event]:
    return [ev.HeartbeatRecorded(attrs=check_attrs(c.attrs))]


def _transition(cp: Checkpoint, c: C.Transition, ctx: Context) -> list[ev.Event]:
    to = _choice("to", c.to, T.STATES)
    if cp.state == T.UNKNOWN and cp.pending_effects:
        keys = ", ".join(e.key for e in cp.pending_effects)
        raise IllegalTransition(
            f"run {cp.run_id} has side effects of unknown outcome ({keys}); record what happened "
            "with 'handoff effect-confirm' before moving on, never retry blindly"
        )
    return [_move(cp, to, "transition", _text("reason", c.reason))]


def _progress(cp: Checkpoint, c: C.Progress, ctx: Context) -> list[ev.Event]:
    kind = _name("kind", c.kind)
    detail = _text("detail", c.detail)
    attrs = check_attrs(c.attrs)
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


def _artifact(cp: Checkpoint, c: C.RecordArtifact, ctx: Context) -> list[ev.Event]:
    sha = _text("sha256", c.sha256, max_len=64)
    if c.exists and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise InvalidInput("sha256 must be 64 lowercase hex digits", field="sha256")
    return [ev.ArtifactRecorded(
        path=_text("path", c.path, max_len=4096, empty=False), kind=_name("kind", c.kind),
        bytes=_count("bytes", c.bytes), sha256=sha, exists=bool(c.exists), attrs=check_attrs(c.attrs),
    )]


def _evidence(cp: Checkpoint, c: C.RecordEvidence, ctx: Context) -> list[ev.Event]:
    return [ev.EvidenceRecorded(
        kind=_name("kind", c.kind), outcome=_choice("outcome", c.outcome, {"pass", "fail", "skipped"}),  # type: ignore[arg-type]
        detail=_text("detail", c.detail), attrs=check_attrs(c.attrs),
    )]


def _block(cp: Checkpoint, c: C.Block, ctx: Context, *, via: str = "block") -> list[ev.Event]:
    reason = _text("reason", c.reason, empty=False)
    nxt = _text("next_action", c.next_action, empty=False)
    out: list[ev.Event] = [ev.BlockerRaised(blocker_id=cp.blockers_raised + 1, reason=reason, next_action=nxt)]
    if cp.state != T.BLOCKED:
        out.append(_move(cp, T.BLOCKED, via, reason))
    return out


def _unblock(cp: Checkpoint, c: C.Unblock, ctx: Context) -> list[ev.Event]:
    resolution = _text("resolution", c.resolution, empty=False)
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
        out.append(_move(cp, cp.blockers[0].prior_state, "unblock", resolution))
    return out


def _effect_start(cp: Checkpoint, c: C.StartEffect, ctx: Context) -> list[ev.Event]:
    key = _name("key", c.key)
    what = _text("what", c.what, empty=False)
    attrs = check_attrs(c.attrs)
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


def _effect_confirm(cp: Checkpoint, c: C.ConfirmEffect, ctx: Context) -> list[ev.Event]:
    key = _name("key", c.key)
    outcome = _choice("outcome", c.outcome, {"done", "absent"})
    attrs = check_attrs(c.attrs)
    pending = next((e for e in cp.pending_effects if e.key == key), None)
    if pending is None:
        if (key, outcome) in cp.settled_effects:
            return []
        if any(k == key for k, _ in cp.settled_effects):
            raise IdempotencyConflict(f"side effect {key!r} on run {cp.run_id} was already settled with another outcome")
        raise UnknownEffect(f"no side effect with key {key!r} was started on run {cp.run_id}; check 'handoff status {cp.run_id}'")
    note = _text("note", c.note)  # checked whoever confirms, though a worker's own confirm keeps no note
    if ctx.actor.kind == T.WORKER and pending.lease == cp.lease:
        return [ev.SideEffectConfirmed(key=key, outcome=outcome, attrs=attrs)]  # type: ignore[arg-type]
    return [ev.ReconciliationRecorded(key=key, outcome=outcome, note=note, attrs=attrs)]  # type: ignore[arg-type]


def _submit(cp: Checkpoint, c: C.Submit, ctx: Context) -> list[ev.Event]:
    to = T.READY_FOR_REVIEW if cp.require_review else T.SUCCEEDED
    move = _move(cp, to, "submit")
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
    return [ev.ResultSubmitted(summary=_text("summary", c.summary), artifacts=tuple(a.path for a in cp.artifacts)), move]


def _review(cp: Checkpoint, c: C.ReviewResult, ctx: Context) -> list[ev.Event]:
    to = T.SUCCEEDED if c.approve else T.EXECUTING
    move = _move(cp, to, "review", "approved" if c.approve else "rejected")
    return [ev.ReviewDecided(by=ctx.actor.name, approved=bool(c.approve), notes=_text("notes", c.notes)), move]


def _transfer(cp: Checkpoint, c: C.TransferAuthority, ctx: Context) -> list[ev.Event]:
    action = _choice("action", c.action, T.TRANSFERABLE)
    return [ev.AuthorityTransferred(action=action, to=_name("to", c.to))]


def _deliver(cp: Checkpoint, c: C.Deliver, ctx: Context) -> list[ev.Event]:
    key = _name("key", c.key)
    d = cp.delivery
    if d.confirmed_key is not None:
        if d.confirmed_key == key:
            return []  # a retried attempt of a confirmed delivery: nothing to send again
        raise DeliveryRefused(
            f"run {cp.run_id} was already delivered to {d.target} under key {d.confirmed_key}; a "
            "second delivery would be a double send"
        )
    bundle = c.bundle_sha256
    if not isinstance(bundle, str) or (bundle and not _HEX_DIGEST.fullmatch(bundle)):
        raise InvalidInput("bundle_sha256 must be a hex sha256 or empty", field="bundle_sha256")
    # A public target's gate applies to every send, a repeat under an open key included.
    try:
        sz.gate(d, run_id=cp.run_id, key=key, bundle_sha256=bundle,
                artifacts=[(a.path, a.sha256) for a in cp.artifacts if a.exists])
    except LedgerError:
        raise
    except Exception as exc:  # a detector that fails must not read as a pass, nor escape untyped
        raise SanitizationRequired(
            f"a sanitization detector failed while checking the delivery key of run {cp.run_id} "
            f"({type(exc).__name__}); nothing was recorded and delivery to its public target stays refused. "
            "Try another key; if it keeps failing, check the contract's sanitize patterns") from None
    same = d.attempt(key)
    if same is not None:
        if same.open:
            if bundle and same.bundle_sha256 and bundle != same.bundle_sha256:
                raise DeliveryRefused(
                    f"delivery {key!r} of run {cp.run_id} was attempted with other content (sha256 "
                    f"{same.bundle_sha256[:12]}, now {bundle[:12]}); a key stands for one content. Settle "
                    "it ('handoff delivered' or 'handoff delivery-failed') first")
            return []
        raise DeliveryRefused(f"delivery key {key!r} already failed on run {cp.run_id}; a new attempt needs a new key")
    pending = d.pending
    if pending is not None:
        raise DeliveryRefused(
            f"delivery {pending.key!r} of run {cp.run_id} has no outcome yet; confirm it ('handoff "
            "delivered') or mark it failed ('handoff delivery-failed') before another attempt"
        )
    if not cp.delivery_ready:
        why = ("it is " + cp.state) if cp.state != T.SUCCEEDED else (
            "no passing evidence is recorded" if not cp.evidence_ok else "the review has not approved it")
        raise DeliveryRefused(f"run {cp.run_id} is not ready to deliver: {why}")
    return [ev.DeliveryAttempted(key=key, target=cp.target, by=ctx.actor.name, bundle_sha256=bundle)]


def _delivered(cp: Checkpoint, c: C.ConfirmDelivery, ctx: Context) -> list[ev.Event]:
    key = _name("key", c.key)
    receipt = _text("receipt", c.receipt, empty=False)
    d = cp.delivery
    attempt = d.attempt(key)
    if attempt is None:
        raise DeliveryRefused(f"no delivery with key {key!r} was attempted on run {cp.run_id}; record the attempt with 'handoff deliver' first")
    if attempt.outcome == "confirmed":
        if attempt.receipt == receipt:
            return []
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} was already confirmed with another receipt")
    if d.confirmed_key is not None:
        raise DeliveryRefused(f"run {cp.run_id} was already delivered under key {d.confirmed_key}; this would be a double send")
    if attempt.outcome == "failed":
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} was marked failed; it cannot be confirmed now")
    out: list[ev.Event] = [ev.DeliveryConfirmed(key=key, receipt=receipt), _move(cp, T.DELIVERED, "delivered")]
    if cp.lease is not None:
        out.append(ev.LeaseReleased(lease=cp.lease, reason="delivered"))
    return out


def _delivery_failed(cp: Checkpoint, c: C.FailDelivery, ctx: Context) -> list[ev.Event]:
    key = _name("key", c.key)
    attempt = cp.delivery.attempt(key)
    if attempt is None or not attempt.open:
        state = "was never attempted" if attempt is None else f"is already {attempt.outcome}"
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} {state}; nothing to mark failed")
    return [ev.DeliveryFailed(key=key, error=_text("error", c.error, empty=False))]


def _unanswered(cp: Checkpoint, c: C.RecordUnanswered, ctx: Context) -> list[ev.Event]:
    key = _name("key", c.key)
    reason = _text("reason", c.reason, empty=False)
    attempt = cp.delivery.attempt(key)
    if attempt is None or not attempt.open:
        state = "was never attempted" if attempt is None else f"is already {attempt.outcome}"
        raise DeliveryRefused(f"delivery {key!r} of run {cp.run_id} {state}; it cannot be left unanswered")
    if attempt.outcome == "unknown" and attempt.error == reason:
        return []  # the same send, unanswered the same way: nothing new to record
    return [ev.DeliveryUnanswered(key=key, reason=reason)]


def _sanitize(cp: Checkpoint, c: C.Sanitize, ctx: Context) -> list[ev.Event]:
    if cp.state != T.SUCCEEDED and cp.state != T.READY_FOR_REVIEW:
        raise IllegalTransition(
            f"run {cp.run_id} is {cp.state}; a sanitization check reads a submitted result, so it is "
            "recorded once the run is ready_for_review or succeeded", state=cp.state)
    if not isinstance(c.bundle_sha256, str) or not _HEX_DIGEST.fullmatch(c.bundle_sha256):
        raise InvalidInput("bundle_sha256 must be the hex sha256 of what was scanned", field="bundle_sha256")
    if not isinstance(c.items, (tuple, list)) or not isinstance(c.findings, (tuple, list)):
        raise InvalidInput("items and findings must be lists", field="items")
    for i, item in enumerate(c.items):
        if not isinstance(item, ev.ScannedItem) or not _HEX_DIGEST.fullmatch(item.sha256):
            raise InvalidInput(f"items[{i}] must name a part with its hex sha256", field="items")
        _text(f"items[{i}].name", item.name, max_len=4096, empty=False)
    for i, f in enumerate(c.findings):
        if not isinstance(f, ev.Finding):
            raise InvalidInput(f"findings[{i}] must be a Finding", field="findings")
        _name(f"findings[{i}].detector", f.detector)
    if bool(c.passed) != (not c.findings):
        raise InvalidInput("a check passes exactly when it has no findings", field="passed")
    rules = sz.rules_digest(cp.delivery.patterns)
    if c.rules_sha256 != rules:
        raise InvalidInput(
            "rules_sha256 is not the digest of this version's detectors and the contract's patterns "
            "(reducers.sanitize.rules_digest); the check ran other rules", field="rules_sha256")
    return [ev.SanitizationChecked(passed=bool(c.passed), bundle_sha256=c.bundle_sha256, items=tuple(c.items),
                                   findings=tuple(c.findings), rules_sha256=rules, by=ctx.actor.name)]


def _release(cp: Checkpoint, c: C.Release, ctx: Context) -> list[ev.Event]:
    released = ev.LeaseReleased(lease=c.lease, reason=_text("reason", c.reason))
    return [released, *_orphaned_effects(cp, "released the lease", "release")]


def _orphaned_effects(cp: Checkpoint, how: str, via: str) -> list[ev.Event]:
    """A worker leaving with a side effect of unknown outcome sends the run to unknown."""
    lost = [e for e in cp.pending_effects if e.lease == cp.lease]
    if not lost or cp.state not in T.WORKING:
        return []
    keys = ", ".join(e.key for e in lost)
    return [_move(cp, T.UNKNOWN, via, f"side effect {keys} has no recorded outcome and its worker {how}")]


def _lost_lease_events(cp: Checkpoint, reason: str, via: str) -> list[ev.Event]:
    revoked = ev.LeaseRevoked(lease=cp.lease, reason=reason)  # type: ignore[arg-type]
    return [revoked, *_orphaned_effects(cp, "lost the lease", via)]


def _revoke(cp: Checkpoint, c: C.Revoke, ctx: Context) -> list[ev.Event]:
    reason = _text("reason", c.reason, empty=False)
    if cp.lease is None:
        raise StaleLease(f"run {cp.run_id} has no lease to revoke")
    if c.lease is not None and c.lease != cp.lease:
        raise StaleLease(f"lease {c.lease} is not run {cp.run_id}'s current lease ({cp.lease}); nothing revoked")
    return _lost_lease_events(cp, reason, "revoke")


def _close(cp: Checkpoint, c: C.Close, ctx: Context) -> list[ev.Event]:
    disposition = _choice("disposition", c.disposition, set(T.CLOSE_DISPOSITIONS))
    pending = cp.delivery.pending
    if pending is not None:
        raise DeliveryRefused(
            f"delivery {pending.key!r} of run {cp.run_id} has no outcome; confirm or fail it before "
            "closing, or the run could end with a send nobody accounted for"
        )
    move = _move(cp, disposition, "close", c.reason)
    out: list[ev.Event] = [ev.RunClosed(disposition=disposition, by=ctx.actor.name, reason=_text("reason", c.reason)), move]  # type: ignore[arg-type]
    if cp.lease is not None:
        out.append(ev.LeaseReleased(lease=cp.lease, reason=f"closed as {disposition}"))
    return out


def _fork(cp: Checkpoint, c: C.Fork, ctx: Context) -> list[ev.Event]:
    parent = ctx.parent
    at = _count("at_seq", c.at_seq, low=1)
    if parent is None or not parent.opened:
        raise UnknownRun(f"cannot fork: run {c.parent} does not exist")
    if at > parent.last_seq:
        raise InvalidInput(f"run {c.parent} has only {parent.last_seq} events; fork at a seq from 1 to {parent.last_seq}", field="at_seq")
    if parent.terminal:
        raise TerminalRun(f"run {c.parent} had already ended ({parent.state}) at seq {at}; fork at an earlier seq")
    return [ev.RunForked(parent=c.parent, parent_seq=at)]


def _observe(cp: Checkpoint, c: C.Observe, ctx: Context) -> list[ev.Event]:
    return [ev.WatchdogObserved(
        watcher=ctx.actor.name, classification=_choice("classification", c.classification, CLASSIFICATIONS),
        progress_seq=_count("progress_seq", c.progress_seq), reason=_text("reason", c.reason),
        interval_s=float(c.interval_s),
    )]


def _recover(cp: Checkpoint, c: C.Recover, ctx: Context) -> list[ev.Event]:
    action = _choice("action", c.action, T.RECOVERY_ACTIONS)
    reason = _text("reason", c.reason)
    decided = ev.RecoveryDecided(
        watcher=ctx.actor.name, action=action, classification=_choice("classification", c.classification, CLASSIFICATIONS),
        progress_seq=_count("progress_seq", c.progress_seq), reason=reason,
    )
    if action == "revoke_lease":
        if cp.lease is None:
            raise StaleLease(f"run {cp.run_id} has no lease to revoke")
        if c.lease is not None and c.lease != cp.lease:
            raise StaleLease(
                f"the watchdog judged lease {c.lease}, but run {cp.run_id} is now under lease "
                f"{cp.lease}; nothing revoked (observe the run again)"
            )
        return [decided, *_lost_lease_events(cp, reason or "heartbeat timeout", "recover")]
    if action == "pause":
        block = C.Block(
            reason=f"paused by watchdog {ctx.actor.name}: {reason or 'progress repeated past the retry budget'}",
            next_action="a person reviews the run, then 'handoff unblock' (or close it)",
        )
        return [decided, *_block(cp, block, ctx, via="recover")]
    return [decided]


def _withdraw_artifact(cp: Checkpoint, c: C.WithdrawArtifact, ctx: Context) -> list[ev.Event]:
    path = _text("path", c.path, max_len=4096, empty=False)
    reason = _text("reason", c.reason, empty=False)
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


def _reopen(cp: Checkpoint, c: C.Reopen, ctx: Context) -> list[ev.Event]:
    """Back to verifying, only for a result that cannot leave as it is: succeeded, its
    latest sanitization check failed, and no send of it is under way."""
    reason = _text("reason", c.reason, empty=False)
    if cp.state == T.READY_FOR_REVIEW:
        raise IllegalTransition(
            f"run {cp.run_id} is ready_for_review: it waits for its review, and reopen is for a succeeded result. Reject the review "
            f"instead ('handoff review {cp.run_id} --by OWNER --reject --notes ...'): that sends it back "
            "to executing", state=cp.state, to=T.VERIFYING)
    move = _move(cp, T.VERIFYING, "reopen", reason)
    pending = cp.delivery.pending
    if pending is not None:
        raise DeliveryRefused(
            f"delivery {pending.key!r} of run {cp.run_id} has no outcome yet; reopening now could leave a "
            "send nobody accounted for. Record what happened first ('handoff delivered' or 'handoff "
            "delivery-failed')")
    check = cp.delivery.check
    if check is None or check.passed:
        what = "no sanitization check is recorded" if check is None else f"its latest sanitization check (seq {check.seq}) passed"
        raise IllegalTransition(
            f"run {cp.run_id} is succeeded and {what}: nothing stops its delivery, so it is not reopened. "
            "Reopen sends back a result whose sanitization check failed; to stop the run instead, close it",
            state=cp.state, to=T.VERIFYING)
    return [ev.RunReopened(by=ctx.actor.name, reason=reason, check_seq=check.seq), move]


# --- a graph framework's checkpoints (handoff.integrations.langgraph) -------------------

MAX_GRAPH_TEXT = 1_000


def _digest(field: str, value: object) -> str:
    if not isinstance(value, str) or not _HEX_DIGEST.fullmatch(value):
        raise InvalidInput(f"{field} must be a sha256 as 64 lowercase hex digits, got {str(value)[:80]!r}", field=field)
    return value


def _map(field: str, value: object) -> dict:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidInput(f"{field} must be a map with text keys", field=field)
    return dict(value)


def _graph_writer(cp: Checkpoint, ctx: Context, what: str) -> None:
    """A saver without the run's lease may not write while a worker holds it: the lease
    holder's graph is the one whose state the run keeps."""
    if cp.lease is not None and ctx.actor.kind != T.WORKER:
        raise LeaseHeld(
            f"run {cp.run_id} is held by {cp.worker} under lease {cp.lease}; {what} by {ctx.actor} is "
            "refused, so two writers cannot both extend the graph's history. Write under that lease "
            "(LedgerSaver(lg, lease=...)), or wait for it to be released or revoked",
            lease=cp.lease, same_worker=False,
        )


def _line(field: str, value: object, max_len: int) -> str:
    """A text of one line that may be empty (a namespace, a parent id)."""
    v = _text(field, value, max_len=max_len)
    if "\n" in v or "\t" in v:
        raise InvalidInput(f"{field} must be a single line", field=field)
    return v


def _plain(field: str, value: object) -> None:
    """Every text inside a graph's map (keys and values, at any depth) holds to the rule of
    every other text of the ledger: no control or bidirectional character."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            check_chars(v, field)
        elif isinstance(v, Mapping):
            for k, item in v.items():
                if isinstance(k, str):
                    check_chars(k, field)
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _graph_ids(c: C.SaveGraphCheckpoint | C.SaveGraphWrites) -> tuple[str, str, str]:
    return (_text("thread_id", c.thread_id, max_len=MAX_GRAPH_TEXT, empty=False),
            _line("namespace", c.namespace, MAX_GRAPH_TEXT),
            _name("checkpoint_id", c.checkpoint_id))


def _save_graph_checkpoint(cp: Checkpoint, c: C.SaveGraphCheckpoint, ctx: Context) -> list[ev.Event]:
    _graph_writer(cp, ctx, "saving a graph checkpoint")
    thread, ns, cid = _graph_ids(c)
    parent = _line("parent_id", c.parent_id, MAX_NAME)
    values = {_name("values channel", k): _digest(f"values[{k[:60]}]", v) for k, v in _map("values", c.values).items()}
    metadata = _map("metadata", c.metadata)
    _plain("metadata", metadata)
    extends: dict[str, str] | UnsetType = UNSET
    if c.extends is not UNSET and c.extends:
        extends = {}
        for k, v in _map("extends", c.extends).items():
            if k not in values:
                raise InvalidInput(f"extends names channel {k[:60]!r}, which values does not: a value can only "
                                   "continue its parent's when the checkpoint stores it", field="extends")
            if not parent:
                raise InvalidInput("extends needs parent_id: a value continues its parent checkpoint's",
                                   field="extends")
            extends[k] = _name(f"extends[{k[:60]}]", v)
    out: list[ev.Event] = [ev.GraphCheckpointSaved(
        thread_id=thread, checkpoint_id=cid, checkpoint=_map("checkpoint", c.checkpoint), metadata=metadata,
        values=values, namespace=ns, parent_id=parent, extends=extends,
    )]
    # A checkpoint that ends a step of the graph is progress, where the contract declares it.
    if metadata.get("source") == "loop" and T.GRAPH_STEP in T.progress_kinds_in(cp.state, cp.progress_kinds):
        step = metadata.get("step")
        detail = f"step {step}" if isinstance(step, int) and not isinstance(step, bool) else "a step"
        out.append(ev.ProgressRecorded(kind=T.GRAPH_STEP, detail=f"{detail} of thread {thread[:80]}"
                                       + (f" ({ns[:80]})" if ns else ""), advances=True))
    return out


def _save_graph_writes(cp: Checkpoint, c: C.SaveGraphWrites, ctx: Context) -> list[ev.Event]:
    _graph_writer(cp, ctx, "saving a graph task's writes")
    thread, ns, cid = _graph_ids(c)
    task = _text("task_id", c.task_id, max_len=MAX_GRAPH_TEXT, empty=False)
    if not isinstance(c.writes, (tuple, list)) or not c.writes:
        raise InvalidInput("writes must be a non-empty list of (idx, channel, sha256)", field="writes")
    writes = []
    for i, w in enumerate(c.writes):
        if not isinstance(w, ev.GraphWrite):
            raise InvalidInput(f"writes[{i}] must be a GraphWrite", field="writes")
        writes.append(ev.GraphWrite(idx=_count(f"writes[{i}].idx", w.idx, low=-(2**31), high=2**31),
                                    channel=_text(f"writes[{i}].channel", w.channel, max_len=MAX_NAME, empty=False),
                                    sha256=_digest(f"writes[{i}].sha256", w.sha256)))
    return [ev.GraphWritesSaved(thread_id=thread, checkpoint_id=cid, task_id=task, writes=tuple(writes),
                                namespace=ns, task_path=_text("task_path", c.task_path, max_len=MAX_GRAPH_TEXT))]


def _erase_values(cp: Checkpoint, c: C.EraseValues, ctx: Context) -> list[ev.Event]:
    reason = _name("reason", c.reason)
    values = tuple(_digest(f"values[{i}]", v) for i, v in enumerate(c.values))
    refs = []
    for i, r in enumerate(c.checkpoints):
        if not isinstance(r, ev.GraphRef):
            raise InvalidInput(f"checkpoints[{i}] must be a GraphRef", field="checkpoints")
        refs.append(ev.GraphRef(namespace=_text(f"checkpoints[{i}].namespace", r.namespace, max_len=MAX_GRAPH_TEXT),
                                checkpoint_id=_name(f"checkpoints[{i}].checkpoint_id", r.checkpoint_id)))
    ending = _erase_ends_lease(cp, c, ctx)
    if not (values or refs or c.everything):
        return []  # nothing to erase: nothing recorded (and no lease ended)
    erased = ev.ValuesErased(reason=reason, values=values, checkpoints=tuple(refs), everything=bool(c.everything))
    if not ending:
        return [erased]
    return [*_lost_lease_events(cp, f"{ctx.actor} erased the run's graph values ({reason})", "revoke"), erased]


def _erase_ends_lease(cp: Checkpoint, c: C.EraseValues, ctx: Context) -> bool:
    """Whether an erasure also ends the run's lease; refuses one that may not erase now.

    While a worker holds the lease its graph is the one whose values the run keeps: only
    that worker (its write under the lease) erases them, or the owner or an operator who
    names the lease (``c.lease``) and so ends it in the same write. The holder's next
    write is then refused as stale instead of continuing values that are gone."""
    if ctx.actor.kind == T.WORKER:
        return False  # _authorize checked that the worker's lease is the current one
    if cp.lease is None:
        if c.lease is not None:
            raise StaleLease(f"lease {c.lease} is not run {cp.run_id}'s current lease (it has none); nothing "
                             "was erased. Erase again without naming a lease", run_id=cp.run_id, lease=c.lease,
                             why="ended")
        return False
    if c.lease is None:
        raise LeaseHeld(
            f"run {cp.run_id} is held by {cp.worker} under lease {cp.lease}; erasing its graph values by "
            f"{ctx.actor} is refused, so the holder's graph does not go on from values that are gone. Erase "
            "under that lease (LedgerSaver(lg, lease=...)), or, as the run's owner, end the lease in the "
            f"same write by naming it (LedgerSaver.delete_thread(thread_id, end_lease={cp.lease}), "
            f"Ledger.erase_values(..., end_lease={cp.lease})), or wait for it to be released or revoked",
            lease=cp.lease, same_worker=False,
        )
    if c.lease != cp.lease:
        raise StaleLease(f"lease {c.lease} is not run {cp.run_id}'s current lease; nothing was erased and no "
                         "lease ended. Read the run's lease again ('handoff status') and name that one",
                         run_id=cp.run_id, lease=c.lease, why="ended")
    return True


HANDLERS = {
    C.Open: _open, C.Claim: _claim, C.Heartbeat: _heartbeat, C.Transition: _transition,
    C.Progress: _progress, C.RecordArtifact: _artifact, C.RecordEvidence: _evidence,
    C.Block: _block, C.Unblock: _unblock, C.StartEffect: _effect_start,
    C.ConfirmEffect: _effect_confirm, C.Submit: _submit, C.ReviewResult: _review,
    C.TransferAuthority: _transfer, C.Deliver: _deliver, C.ConfirmDelivery: _delivered,
    C.FailDelivery: _delivery_failed, C.RecordUnanswered: _unanswered, C.Sanitize: _sanitize,
    C.Release: _release, C.Revoke: _revoke, C.Close: _close,
    C.Fork: _fork, C.Observe: _observe, C.Recover: _recover,
    C.WithdrawArtifact: _withdraw_artifact, C.Reopen: _reopen,
    C.SaveGraphCheckpoint: _save_graph_checkpoint, C.SaveGraphWrites: _save_graph_writes,
    C.EraseValues: _erase_values,
}
#: Commands that may answer on a terminal run: observation, and the idempotent
#: retries of the delivery that ended it (which either do nothing or refuse clearly).
_ON_TERMINAL = T.READ_ONLY | T.AFTER_END | {"deliver", "delivered"}


def decide(cp: Checkpoint, cmd: C.Command, ctx: Context) -> list[ev.Event]:
    """The events ``cmd`` produces against ``cp``, or a LedgerError that names why not."""
    handler = HANDLERS.get(type(cmd))
    if handler is None:
        raise InvalidInput(f"unknown command {type(cmd).__name__}", field="command")
    name = C.name_of(cmd)
    if name in ("open", "fork"):
        if cp.opened:
            raise RunExists(f"run {cp.run_id} already exists; choose another run id")
    elif not cp.opened:
        raise UnknownRun(f"no run {cp.run_id} exists; open it first ('handoff open')")
    elif cp.terminal and name not in _ON_TERMINAL:
        raise TerminalRun(
            f"run {cp.run_id} has ended ({cp.state}); it accepts only read-only observations. "
            "Fork it ('handoff fork') to continue the work in a new run",
            state=cp.state,
        )
    if cp.terminal and name in ("deliver", "delivered") and cp.state != T.DELIVERED:
        raise TerminalRun(f"run {cp.run_id} ended as {cp.state}; it will not be delivered", state=cp.state)
    # A fork's child has no contract yet (its owner is empty), so the parent's owner is
    # the one PERMISSIONS means by "owner" here.
    guard = ctx.parent if name == "fork" and ctx.parent is not None and ctx.parent.opened else cp
    _authorize(guard, name, cmd, ctx.actor)
    return handler(cp, cmd, ctx)
