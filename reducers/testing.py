"""Property-test workflows against the real ledger: strategies, a model and a state machine.

The one module in ``reducers/`` that does I/O, on purpose: ``LedgerMachine`` drives a real
SQLite file and writes small artifact files in a temporary directory, so the purity test
(tests/reducers/test_purity.py) excludes it by name. It imports hypothesis, which is a
test dependency (``pip install handoff-ledger[test]``); nothing else in the library
imports this module, so people who only use the ledger never need hypothesis.

    from reducers.testing import LedgerMachine, commands

    TestLedger = LedgerMachine.TestCase          # a unittest/pytest test case

``Model`` is a plain-Python restatement of the rules, written apart from ``decide`` and
the folds: for every command it predicts the typed refusal, or the exact event types the
ledger appends and the run's state afterwards. The machine issues each command to the
ledger and to the model and fails on the first disagreement. Subclasses add rules for
their own workflows and route every command through ``issue`` (see docs/testing.md).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import itertools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, precondition, rule,
)

from ledger import errors as E
from ledger import events as ev
from ledger.store import GENESIS_HASH, Actor, Recorded, chain_hash, lease_digest

from . import commands as C
from . import transitions as T
from .checkpoint import Checkpoint, evolve, fold

__all__ = [
    "OWNERS", "WORKERS", "WATCHDOG", "OPERATOR", "STRANGER",
    "actors", "commands", "issued", "events", "as_records",
    "Model", "RunModel", "Expect", "LedgerMachine", "FakeClock",
]

OWNERS = ("alice", "bob")
WORKERS = ("w1", "w2", "w3")
WATCHDOG = Actor("watchdog", "dog")
OPERATOR = Actor("operator", "op")
#: An owner-kind actor who owns nothing: every owner-only action it tries must be refused.
STRANGER = Actor("owner", "mallory")
#: Names an owner may transfer an action to (a worker, and another person).
TRANSFEREES = ("w3", "carol")

_TEXT = st.sampled_from(["", "ok", "see log", "retrying after 429", "naïve — ünïcode", "a\nb"])
_WORD = st.sampled_from(["ok", "tests", "lint", "manual", "send", "publish"])
_KEYS = st.sampled_from(["k1", "k2", "k3"])
_LEASES = st.integers(min_value=1, max_value=4)
#: A well-formed claim digest: pure decide tests need one for a claim to be grantable.
CLAIM_DIGEST = lease_digest("machine-secret-0000000000")


def test_secret(n: int) -> str:
    """The n-th lease secret the machine uses: deterministic, so a failing example replays."""
    return base64.urlsafe_b64encode(hashlib.sha256(f"lease-secret-{n}".encode()).digest()).decode().rstrip("=")
_PROGRESS = st.sampled_from(sorted(T.ALL_PROGRESS_KINDS | T.NOT_PROGRESS) + ["bogus_kind"])


# --- strategies ----------------------------------------------------------------------


def actors() -> st.SearchStrategy[Actor]:
    """Actors of every kind, drawn from small name pools so that they collide."""
    return st.one_of(
        st.builds(Actor, st.just("worker"), st.sampled_from(WORKERS + TRANSFEREES[:1])),
        st.builds(Actor, st.just("owner"), st.sampled_from(OWNERS + TRANSFEREES[1:] + ("mallory",))),
        st.just(WATCHDOG),
        st.just(OPERATOR),
    )


def commands(
    *,
    run_ids: Sequence[str] = ("r1", "r2"),
    leases: st.SearchStrategy[int] = _LEASES,
    keys: st.SearchStrategy[str] = _KEYS,
) -> st.SearchStrategy[C.Command]:
    """Every command type, with fields from small pools so that leases and keys repeat.

    Values are well-formed text; whether a command is *allowed* is left to chance, which
    is the point: most random commands must be refused, and a refusal writes nothing.
    """
    owner = st.sampled_from(OWNERS)
    return st.one_of(
        st.builds(C.Open, goal=st.just("write the report"), target=st.sampled_from(["chat:#ops", "mail:a@b"]),
                  owner=owner, require_review=st.booleans()),
        st.builds(C.Claim, worker=st.sampled_from(WORKERS), token_digest=st.just(CLAIM_DIGEST)),
        st.builds(C.Heartbeat, lease=leases),
        st.builds(C.Transition, lease=leases, to=st.sampled_from(T.STATES)),
        st.builds(C.Progress, lease=leases, kind=_PROGRESS, detail=_TEXT),
        st.builds(C.RecordEvidence, kind=_WORD, outcome=st.sampled_from(["pass", "fail", "skipped"]),
                  lease=st.none() | leases),
        st.builds(C.Block, reason=st.just("needs a credential"), next_action=st.just("ask alice"),
                  lease=st.none() | leases),
        st.builds(C.Unblock, resolution=st.just("credential provided"), lease=st.none() | leases),
        st.builds(C.StartEffect, lease=leases, key=keys, what=st.sampled_from(["send mail", "open PR"])),
        st.builds(C.ConfirmEffect, key=keys, outcome=st.sampled_from(["done", "absent"]), lease=st.none() | leases),
        st.builds(C.Submit, lease=leases, summary=_TEXT),
        st.builds(C.ReviewResult, approve=st.booleans()),
        st.builds(C.TransferAuthority, action=st.sampled_from(sorted(T.TRANSFERABLE)), to=st.sampled_from(TRANSFEREES)),
        st.builds(C.Deliver, key=keys),
        st.builds(C.ConfirmDelivery, key=keys, receipt=st.sampled_from(["msg-1", "msg-2"])),
        st.builds(C.FailDelivery, key=keys, error=st.just("target returned 503")),
        st.builds(C.Release, lease=leases),
        st.builds(C.Revoke, reason=st.just("heartbeat timeout"), lease=st.none() | leases),
        st.builds(C.Close, disposition=st.sampled_from(["no_op", "cancelled", "failed"])),
        st.builds(C.Fork, parent=st.sampled_from(list(run_ids)), at_seq=st.integers(1, 12)),
        st.builds(C.Observe, classification=st.sampled_from(["healthy", "stalled"]), progress_seq=st.integers(0, 9)),
        st.builds(C.Recover, action=st.sampled_from(sorted(T.RECOVERY_ACTIONS)),
                  classification=st.just("stalled"), progress_seq=st.integers(0, 9)),
        st.builds(C.WithdrawArtifact, path=st.sampled_from(["/a", "/b"]), reason=st.sampled_from(["typo", ""]),
                  lease=st.none() | leases),
    )


def issued(*, run_ids: Sequence[str] = ("r1", "r2")) -> st.SearchStrategy[tuple[str, Actor, C.Command]]:
    """(run id, actor, command) triples; the actor is usually one that may plausibly issue it."""

    @st.composite
    def _one(draw: Any) -> tuple[str, Actor, C.Command]:
        cmd = draw(commands(run_ids=run_ids))
        name = C.name_of(cmd)
        if isinstance(cmd, C.Claim) and draw(st.booleans()):
            actor = Actor("worker", cmd.worker)
        elif isinstance(cmd, C.Open):
            actor = Actor("owner", cmd.owner)
        elif "lease" in T.PERMISSIONS[name] and getattr(cmd, "lease", None) is not None and draw(st.booleans()):
            actor = Actor("worker", draw(st.sampled_from(WORKERS)))
        else:
            actor = draw(actors())
        return draw(st.sampled_from(list(run_ids))), actor, cmd

    return _one()


def events() -> st.SearchStrategy[ev.Event]:
    """Arbitrary events of every type, legal or not: the folds must be total over them."""
    small = st.integers(0, 5)
    return st.one_of(
        st.builds(ev.HandoffOpened, goal=st.just("g"), target=st.just("chat:#ops"), owner=st.sampled_from(OWNERS),
                  require_review=st.booleans()),
        st.builds(ev.LeaseGranted, worker=st.sampled_from(WORKERS), lease=st.integers(1, 5)),
        st.builds(ev.LeaseReleased, lease=small),
        st.builds(ev.LeaseRevoked, lease=small, reason=st.just("timeout")),
        st.builds(ev.AuthorityTransferred, action=st.sampled_from(sorted(T.TRANSFERABLE)), to=st.sampled_from(TRANSFEREES)),
        st.builds(ev.HeartbeatRecorded),
        st.builds(ev.StateChanged, from_state=st.sampled_from(T.STATES), to_state=st.sampled_from(T.STATES)),
        st.builds(ev.ProgressRecorded, kind=_PROGRESS, advances=st.booleans()),
        st.builds(ev.ArtifactRecorded, path=st.sampled_from(["/a", "/b"]), kind=st.just("result"),
                  bytes=st.integers(0, 10), sha256=st.just("0" * 64), exists=st.booleans()),
        st.builds(ev.EvidenceRecorded, kind=_WORD, outcome=st.sampled_from(["pass", "fail", "skipped"])),
        st.builds(ev.BlockerRaised, blocker_id=st.integers(1, 4), reason=st.just("r"), next_action=st.just("n")),
        st.builds(ev.BlockerCleared, blocker_id=st.integers(1, 4), resolution=st.just("done")),
        st.builds(ev.SideEffectStarted, key=_KEYS, what=st.just("send")),
        st.builds(ev.SideEffectConfirmed, key=_KEYS, outcome=st.sampled_from(["done", "absent"])),
        st.builds(ev.ReconciliationRecorded, key=_KEYS, outcome=st.sampled_from(["done", "absent"])),
        st.builds(ev.ResultSubmitted, artifacts=st.just(("/a",))),
        st.builds(ev.ReviewDecided, by=st.sampled_from(OWNERS), approved=st.booleans()),
        st.builds(ev.DeliveryAttempted, key=_KEYS, target=st.just("chat:#ops"), by=st.sampled_from(OWNERS)),
        st.builds(ev.DeliveryConfirmed, key=_KEYS, receipt=st.just("msg-1")),
        st.builds(ev.DeliveryFailed, key=_KEYS, error=st.just("503")),
        st.builds(ev.RunClosed, disposition=st.sampled_from(["no_op", "cancelled", "failed"]), by=st.sampled_from(OWNERS)),
        st.builds(ev.WatchdogObserved, watcher=st.just("dog"), classification=st.sampled_from(["healthy", "stalled"]),
                  progress_seq=small),
        st.builds(ev.RecoveryDecided, watcher=st.just("dog"), action=st.sampled_from(sorted(T.RECOVERY_ACTIONS)),
                  classification=st.just("stalled"), progress_seq=small),
        st.builds(ev.ArtifactWithdrawn, path=st.sampled_from(["/a", "/b", "/c"]), reason=st.just("typo")),
    )


def as_records(
    evs: Iterable[ev.Event], run_id: str = "r1", *, start_us: int = 1_700_000_000_000_000,
    step_us: int = 1_000_000, actor: str = "operator:op",
) -> list[Recorded]:
    """Wrap events in the envelopes a store would give them (seq, clock, hash chain)."""
    out: list[Recorded] = []
    prev = GENESIS_HASH
    for i, e in enumerate(evs):
        seq, us, payload, tag = i + 1, start_us + i * step_us, ev.encode(e), ev.tag_of(e)
        h = chain_hash(prev, run_id, seq, tag, actor, None, None, us, ev.SCHEMA_VERSION, payload)
        out.append(Recorded(run_id, seq, seq, tag, actor, None, None, us, ev.SCHEMA_VERSION, payload, prev, h))
        prev = h
    return out


# --- the model -----------------------------------------------------------------------


@dataclass
class RunModel:
    """What the rules say one run looks like, kept by hand, apart from the reducers."""

    run_id: str
    owner: str = ""
    target: str = ""
    require_review: bool = False
    result_path: str | None = None
    owner_cap: int = 10
    state: str = T.QUEUED
    lease: int | None = None
    worker: str | None = None
    max_lease: int = 0
    progress_seq: int = 0
    last_seq: int = 0
    #: Open blockers as (id, the state ``unblock`` returns to).
    blockers: list[tuple[int, str]] = field(default_factory=list)
    blockers_raised: int = 0
    #: path -> whether the ledger measured it as existing and non-empty
    artifacts: dict[str, bool] = field(default_factory=dict)
    #: check kind -> its latest outcome
    evidence: dict[str, str] = field(default_factory=dict)
    #: key -> (what, lease it was started under)
    pending: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    settled: dict[str, str] = field(default_factory=dict)
    submitted: bool = False
    review: bool | None = None
    authority: set[tuple[str, str]] = field(default_factory=set)
    #: delivery key -> None (no outcome yet), "confirmed" or "failed"
    attempts: dict[str, str | None] = field(default_factory=dict)
    receipts: dict[str, str] = field(default_factory=dict)
    confirmed_key: str | None = None
    confirmations: int = 0
    #: idempotency key -> (actor, encoded command) of the request that used it
    idem: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    fork_parent: str | None = None
    #: The first terminal state the run reached; terminal states absorb.
    ended_as: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in T.TERMINAL

    @property
    def evidence_ok(self) -> bool:
        return "pass" in self.evidence.values() and "fail" not in self.evidence.values()

    @property
    def ready(self) -> bool:
        reviewed = not self.require_review or self.review is True
        return self.state == T.SUCCEEDED and self.submitted and self.evidence_ok and reviewed

    @property
    def pending_delivery(self) -> str | None:
        return next((k for k, o in self.attempts.items() if o is None), None)


@dataclass
class Expect:
    """The model's prediction: a refusal type, or the event types the command appends."""

    error: type[E.LedgerError] | None = None
    why: str = ""
    tags: list[str] = field(default_factory=list)
    #: A replayed idempotency key: nothing written, the earlier write's seqs answered.
    duplicate: bool = False
    #: Accepted with nothing to add (decide returned no events): nothing written.
    unchanged: bool = False
    after: RunModel | None = None

    @property
    def outcome(self) -> str:
        return "duplicate" if self.duplicate else "unchanged" if self.unchanged else "committed"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _bad_text(value: str, *, max_len: int = 16_384, empty: bool = True) -> bool:
    """Text the ledger refuses: control characters (NUL included), too long, or blank."""
    return bool(_CONTROL.search(value)) or len(value) > max_len or (not empty and not value.strip())


class _No(Exception):
    def __init__(self, error: type[E.LedgerError], why: str) -> None:
        super().__init__(why)
        self.error, self.why = error, why


def _refuse(error: type[E.LedgerError], why: str) -> None:
    raise _No(error, why)


class Model:
    """Every run the machine opened, with its snapshot after each accepted command.

    ``predict`` never changes the model; ``commit`` applies a prediction the ledger
    agreed with. Snapshots (keyed by the run's seq after the command) are what the
    as-of checks and forks compare against.
    """

    def __init__(self) -> None:
        self.runs: dict[str, RunModel] = {}
        self.snapshots: dict[str, dict[int, RunModel]] = {}

    # --- public --------------------------------------------------------------------

    def predict(self, run_id: str, actor: Actor, cmd: C.Command, key: str | None = None,
                token_ok: bool | None = None) -> Expect:
        """``token_ok``: None when no lease token goes with the command, else whether it is
        the real token of the run's current lease (a forged or stale one is refused before
        anything else is decided)."""
        try:
            return self._predict(run_id, actor, cmd, key, token_ok)
        except _No as no:
            return Expect(error=no.error, why=no.why)

    def commit(self, run_id: str, expect: Expect) -> None:
        assert expect.error is None and expect.after is not None
        if expect.duplicate or expect.unchanged:
            return
        run = expect.after
        if run.terminal and run.ended_as is None:
            run.ended_as = run.state
        self.runs[run_id] = run
        self.snapshots.setdefault(run_id, {})[run.last_seq] = copy.deepcopy(run)

    def owner_load(self, owner: str, *, exclude: str) -> int:
        return sum(
            1 for r in self.runs.values()
            if r.run_id != exclude and r.owner == owner and r.lease is not None and not r.terminal
        )

    # --- the rules, restated ---------------------------------------------------------

    def _predict(self, run_id: str, actor: Actor, cmd: C.Command, key: str | None,
                 token_ok: bool | None = None) -> Expect:
        name = C.name_of(cmd)
        run = self.runs.get(run_id)
        if key is not None and key.startswith("watch:") and actor.kind != T.WATCHDOG:
            _refuse(E.ReservedKey, "watch: keys are the watchdog's")
        if key is not None and run is not None and key in run.idem:
            if run.idem[key] == (str(actor), C.request_bytes(cmd)):
                return Expect(duplicate=True, after=run)
            _refuse(E.IdempotencyConflict, f"key {key} was used for another request")
        if token_ok is False:
            _refuse(E.StaleLease, "the token does not prove the run's current lease")
        if name in ("open", "fork"):
            if run is not None:
                _refuse(E.RunExists, f"{run_id} exists")
        elif run is None:
            _refuse(E.UnknownRun, f"{run_id} was never opened")
        elif run.terminal and name != "observe":
            if name not in ("deliver", "delivered") or run.state != T.DELIVERED:
                _refuse(E.TerminalRun, f"{run_id} ended as {run.state}")
        # A fork's child has no contract yet: the parent's owner is the one who may fork it.
        guard = self.runs.get(getattr(cmd, "parent", "")) if name == "fork" else run
        self._authorize(guard, name, cmd, actor)
        new = copy.deepcopy(run) if run is not None else RunModel(run_id)
        tags = getattr(self, "_" + name)(new, cmd, actor)
        if not tags:
            return Expect(unchanged=True, after=run)
        new.last_seq += len(tags)
        if key is not None:
            new.idem[key] = (str(actor), C.request_bytes(cmd))
        return Expect(tags=tags, after=new)

    @staticmethod
    def _authorize(run: RunModel | None, name: str, cmd: C.Command, actor: Actor) -> None:
        """Workers act under their lease; owner actions need the owner, an operator or a transfer."""
        perms = T.PERMISSIONS[name]
        granted = run is not None and name in T.TRANSFERABLE and (name, actor.name) in run.authority
        if actor.kind == T.WORKER and "lease" in perms:
            lease = getattr(cmd, "lease", None)
            if lease is None:
                _refuse(E.NotAuthorized, "a worker must show its lease")
            if run is None or lease != run.lease:
                _refuse(E.StaleLease, f"lease {lease} is not the current one")
            return
        if actor.kind == T.OWNER and T.OWNER in perms:
            owner = run.owner if run is not None else ""
            if name == "open" or actor.name == owner or granted:
                return
            _refuse(E.NotAuthorized, f"{actor.name} does not own the run")
        if actor.kind in perms and actor.kind != T.OWNER:
            return
        if not granted:
            _refuse(E.NotAuthorized, f"a {actor.kind} may not {name}")

    def _open(self, r: RunModel, c: C.Open, a: Actor) -> list[str]:
        if _bad_text(c.goal, empty=False):
            _refuse(E.InvalidInput, "bad goal")
        r.owner, r.target, r.require_review = c.owner, c.target, c.require_review
        r.result_path, r.owner_cap = c.result_path, c.policy.owner_cap
        return ["handoff_opened"]

    def _claim(self, r: RunModel, c: C.Claim, a: Actor) -> list[str]:
        if a.name != c.worker:
            _refuse(E.NotAuthorized, "claiming for someone else")
        if r.lease is not None:
            _refuse(E.LeaseHeld, f"{r.worker} holds lease {r.lease}")
        if self.owner_load(r.owner, exclude=r.run_id) >= r.owner_cap:
            _refuse(E.CapacityExceeded, f"{r.owner} is at its cap of {r.owner_cap}")
        r.max_lease += 1
        r.lease, r.worker = r.max_lease, c.worker
        return ["lease_granted"]

    def _heartbeat(self, r: RunModel, c: C.Heartbeat, a: Actor) -> list[str]:
        return ["heartbeat_recorded"]

    def _move(self, r: RunModel, to: str, via: str) -> list[str]:
        if via not in T.MOVES.get((r.state, to), ()):
            _refuse(E.IllegalTransition, f"{r.state} -> {to} by {via}")
        r.state = to
        r.progress_seq += 1
        return ["state_changed"]

    def _transition(self, r: RunModel, c: C.Transition, a: Actor) -> list[str]:
        if c.to not in T.STATES:
            _refuse(E.InvalidInput, f"no state {c.to}")
        if r.state == T.UNKNOWN and r.pending:
            _refuse(E.IllegalTransition, "unreconciled side effects")
        return self._move(r, c.to, "transition")

    def _progress(self, r: RunModel, c: C.Progress, a: Actor) -> list[str]:
        if c.kind in T.NOT_PROGRESS:
            if r.state not in T.WORKING | {T.BLOCKED, T.UNKNOWN}:
                _refuse(E.IllegalProgress, f"no activity expected in {r.state}")
            return ["progress_recorded"]
        if r.state in T.WORKING and c.kind in T.PROGRESS_KINDS[r.state]:
            r.progress_seq += 1
            return ["progress_recorded"]
        if c.kind in T.ALL_PROGRESS_KINDS:
            _refuse(E.IllegalProgress, f"{c.kind} is not progress in {r.state}")
        _refuse(E.InvalidInput, f"unknown kind {c.kind}")
        return []

    def _artifact(self, r: RunModel, c: C.RecordArtifact, a: Actor) -> list[str]:
        r.artifacts[c.path] = c.exists and c.bytes > 0
        r.progress_seq += 1
        return ["artifact_recorded"]

    def _withdraw_artifact(self, r: RunModel, c: C.WithdrawArtifact, a: Actor) -> list[str]:
        if _bad_text(c.path, max_len=4096, empty=False) or _bad_text(c.reason, empty=False):
            _refuse(E.InvalidInput, "bad path or reason")
        if r.state not in T.WITHDRAWABLE:
            _refuse(E.IllegalTransition, f"no withdrawal in {r.state}")
        if c.path not in r.artifacts:
            _refuse(E.UnknownArtifact, f"{c.path} is not recorded")
        del r.artifacts[c.path]  # a correction: progress_seq does not move
        return ["artifact_withdrawn"]

    def _evidence(self, r: RunModel, c: C.RecordEvidence, a: Actor) -> list[str]:
        r.evidence[c.kind] = c.outcome
        r.progress_seq += 1
        return ["evidence_recorded"]

    def _raise_blocker(self, r: RunModel, via: str) -> list[str]:
        back_to = r.blockers[0][1] if r.blockers else r.state
        r.blockers_raised += 1
        r.blockers.append((r.blockers_raised, back_to))
        r.progress_seq += 1
        if r.state == T.BLOCKED:
            return ["blocker_raised"]
        return ["blocker_raised", *self._move(r, T.BLOCKED, via)]

    def _block(self, r: RunModel, c: C.Block, a: Actor) -> list[str]:
        return self._raise_blocker(r, "block")

    def _unblock(self, r: RunModel, c: C.Unblock, a: Actor) -> list[str]:
        if r.state != T.BLOCKED or not r.blockers:
            _refuse(E.IllegalTransition, "nothing to unblock")
        ids = [b for b, _ in r.blockers]
        if c.blocker_id is not None and c.blocker_id not in ids:
            _refuse(E.InvalidInput, f"no open blocker {c.blocker_id}")
        clearing = ids if c.blocker_id is None else [c.blocker_id]
        back_to = r.blockers[0][1]
        r.blockers = [(b, s) for b, s in r.blockers if b not in clearing]
        r.progress_seq += len(clearing)
        tags = ["blocker_cleared"] * len(clearing)
        if not r.blockers:
            tags += self._move(r, back_to, "unblock")
        return tags

    def _effect_start(self, r: RunModel, c: C.StartEffect, a: Actor) -> list[str]:
        if r.state not in T.WORKING:
            _refuse(E.IllegalTransition, f"no side effects in {r.state}")
        if c.key in r.pending:
            if r.pending[c.key][0] == c.what:
                return []
            _refuse(E.IdempotencyConflict, f"{c.key} is in use")
        if c.key in r.settled:
            _refuse(E.IdempotencyConflict, f"{c.key} was settled")
        r.pending[c.key] = (c.what, r.lease)
        return ["side_effect_started"]

    def _effect_confirm(self, r: RunModel, c: C.ConfirmEffect, a: Actor) -> list[str]:
        if c.key not in r.pending:
            if r.settled.get(c.key) == c.outcome:
                return []
            if c.key in r.settled:
                _refuse(E.IdempotencyConflict, f"{c.key} settled otherwise")
            _refuse(E.UnknownEffect, f"no effect {c.key}")
        _, lease = r.pending.pop(c.key)
        r.settled[c.key] = c.outcome
        r.progress_seq += 1
        own = a.kind == T.WORKER and lease == r.lease
        return ["side_effect_confirmed" if own else "reconciliation_recorded"]

    def _submit(self, r: RunModel, c: C.Submit, a: Actor) -> list[str]:
        to = T.READY_FOR_REVIEW if r.require_review else T.SUCCEEDED
        if "submit" not in T.MOVES.get((r.state, to), ()):
            _refuse(E.IllegalTransition, f"cannot submit from {r.state}")
        if r.pending:
            _refuse(E.IllegalTransition, "side effects have no recorded outcome")
        if not r.artifacts:
            _refuse(E.EvidenceMissing, "no artifact")
        if not all(r.artifacts.values()):
            _refuse(E.EvidenceMissing, "a missing or empty artifact")
        if r.result_path is not None and r.result_path not in r.artifacts:
            _refuse(E.EvidenceMissing, "the contract's result file was not recorded")
        r.submitted, r.review = True, None
        r.progress_seq += 1
        return ["result_submitted", *self._move(r, to, "submit")]

    def _review(self, r: RunModel, c: C.ReviewResult, a: Actor) -> list[str]:
        to = T.SUCCEEDED if c.approve else T.EXECUTING
        if "review" not in T.MOVES.get((r.state, to), ()):
            _refuse(E.IllegalTransition, f"nothing to review in {r.state}")
        r.review = bool(c.approve)
        r.progress_seq += 1
        return ["review_decided", *self._move(r, to, "review")]

    def _transfer(self, r: RunModel, c: C.TransferAuthority, a: Actor) -> list[str]:
        if c.action not in T.TRANSFERABLE:
            _refuse(E.InvalidInput, f"{c.action} is not transferable")
        r.authority.add((c.action, c.to))
        return ["authority_transferred"]

    def _deliver(self, r: RunModel, c: C.Deliver, a: Actor) -> list[str]:
        if r.confirmed_key is not None:
            if r.confirmed_key == c.key:
                return []
            _refuse(E.DeliveryRefused, "already delivered: a second send")
        if c.key in r.attempts:
            if r.attempts[c.key] is None:
                return []
            _refuse(E.DeliveryRefused, f"{c.key} failed; use a new key")
        if r.pending_delivery is not None:
            _refuse(E.DeliveryRefused, f"{r.pending_delivery} has no outcome yet")
        if not r.ready:
            _refuse(E.DeliveryRefused, "not ready")
        r.attempts[c.key] = None
        return ["delivery_attempted"]

    def _release_lease(self, r: RunModel) -> list[str]:
        if r.lease is None:
            return []
        r.lease = r.worker = None
        return ["lease_released"]

    def _delivered(self, r: RunModel, c: C.ConfirmDelivery, a: Actor) -> list[str]:
        if c.key not in r.attempts:
            _refuse(E.DeliveryRefused, f"{c.key} was never attempted")
        if r.attempts[c.key] == "confirmed":
            if r.receipts[c.key] == c.receipt:
                return []
            _refuse(E.DeliveryRefused, "confirmed with another receipt")
        if r.confirmed_key is not None:
            _refuse(E.DeliveryRefused, "already delivered under another key")
        if r.attempts[c.key] == "failed":
            _refuse(E.DeliveryRefused, f"{c.key} failed")
        r.progress_seq += 1
        tags = ["delivery_confirmed", *self._move(r, T.DELIVERED, "delivered")]
        r.attempts[c.key], r.receipts[c.key] = "confirmed", c.receipt
        r.confirmed_key = c.key
        r.confirmations += 1
        return tags + self._release_lease(r)

    def _delivery_failed(self, r: RunModel, c: C.FailDelivery, a: Actor) -> list[str]:
        if r.attempts.get(c.key, "never") is not None:
            _refuse(E.DeliveryRefused, f"{c.key} has no open attempt")
        r.attempts[c.key] = "failed"
        r.progress_seq += 1
        return ["delivery_failed"]

    def _release(self, r: RunModel, c: C.Release, a: Actor) -> list[str]:
        return self._lose_lease(r, "lease_released")

    def _lose_lease(self, r: RunModel, tag: str = "lease_revoked") -> list[str]:
        lost = any(lease == r.lease for _, lease in r.pending.values())
        r.lease = r.worker = None
        if lost and r.state in T.WORKING:
            r.state = T.UNKNOWN
            r.progress_seq += 1
            return [tag, "state_changed"]
        return [tag]

    def _revoke(self, r: RunModel, c: C.Revoke, a: Actor) -> list[str]:
        if r.lease is None or (c.lease is not None and c.lease != r.lease):
            _refuse(E.StaleLease, "no such lease to revoke")
        return self._lose_lease(r)

    def _close(self, r: RunModel, c: C.Close, a: Actor) -> list[str]:
        if r.pending_delivery is not None:
            _refuse(E.DeliveryRefused, f"delivery {r.pending_delivery} has no outcome")
        return ["run_closed", *self._move(r, c.disposition, "close"), *self._release_lease(r)]

    def _fork(self, r: RunModel, c: C.Fork, a: Actor) -> list[str]:
        parent = self.runs.get(c.parent)
        if parent is None:
            _refuse(E.UnknownRun, f"no parent {c.parent}")
        assert parent is not None
        if c.at_seq > parent.last_seq:
            _refuse(E.InvalidInput, f"{c.parent} has only {parent.last_seq} events")
        snap = self.snapshots[c.parent].get(c.at_seq)
        if snap is None:
            raise AssertionError("the machine forks only at seqs that end a command")
        if snap.terminal:
            _refuse(E.TerminalRun, f"{c.parent} had ended at {c.at_seq}")
        child = copy.deepcopy(snap)
        child.run_id, child.fork_parent, child.last_seq = r.run_id, c.parent, 0
        child.lease = child.worker = None
        child.authority, child.idem = set(), {}
        child.attempts, child.receipts, child.confirmed_key, child.confirmations = {}, {}, None, 0
        r.__dict__.update(child.__dict__)
        return ["run_forked"]

    def _observe(self, r: RunModel, c: C.Observe, a: Actor) -> list[str]:
        if _bad_text(c.classification, max_len=200, empty=False) or _bad_text(c.reason):
            _refuse(E.InvalidInput, "bad classification or reason")
        return ["watchdog_observed"]

    def _recover(self, r: RunModel, c: C.Recover, a: Actor) -> list[str]:
        if c.action not in T.RECOVERY_ACTIONS:
            _refuse(E.InvalidInput, f"no recovery action {c.action}")
        if c.action == "revoke_lease":
            if r.lease is None:
                _refuse(E.StaleLease, "no lease to revoke")
            return ["recovery_decided", *self._lose_lease(r)]
        if c.action == "pause":
            return ["recovery_decided", *self._raise_blocker(r, "recover")]
        return ["recovery_decided"]


# --- the machine ---------------------------------------------------------------------


class FakeClock:
    """A clock the ledger can call from several threads: one second later on every call."""

    def __init__(self, start_us: int = 1_700_000_000_000_000, step_us: int = 1_000_000) -> None:
        self._next = itertools.count(start_us, step_us)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return next(self._next)


#: Which of the model's fields are compared with the folded checkpoint, and how to read them.
COMPARED: dict[str, Callable[[Checkpoint], Any]] = {
    "state": lambda cp: cp.state,
    "terminal": lambda cp: cp.terminal,
    "lease": lambda cp: cp.lease,
    "worker": lambda cp: cp.worker,
    "progress_seq": lambda cp: cp.progress_seq,
    "last_seq": lambda cp: cp.last_seq,
    "blockers": lambda cp: [(b.id, b.prior_state) for b in cp.blockers],
    "pending": lambda cp: sorted(e.key for e in cp.pending_effects),
    "confirmed_key": lambda cp: cp.delivery.confirmed_key,
    "artifacts": lambda cp: sorted((a.path, a.substantive) for a in cp.artifacts),
    "ready": lambda cp: cp.delivery_ready,
}


def _model_value(m: RunModel, name: str) -> Any:
    if name == "pending":
        return sorted(m.pending)
    if name == "artifacts":
        return sorted(m.artifacts.items())
    return getattr(m, name)


class LedgerMachine(RuleBasedStateMachine):
    """Random commands against a real ledger file and the plain-Python ``Model``.

    Every command goes through ``issue``: the model predicts it, the ledger runs it, and
    they must agree on the refusal type or on the exact events appended; a refusal must
    leave the log byte-for-byte unchanged. Invariants after every step compare the folds
    with the model and with each other. Subclass it to add your own rules.
    """

    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.workdir = tempfile.mkdtemp(prefix="handoff-machine-")
        self.files = os.path.join(os.path.realpath(self.workdir), "files")
        os.makedirs(self.files)
        self.clock = FakeClock()
        self.ledger = self.make_ledger(os.path.join(self.workdir, "ledger.db"))
        self._other: Any = None
        self.model = Model()
        #: What this run of the machine saw: accepted commands and refusals, by name.
        self.accepted: dict[str, int] = {}
        self.refusals: dict[str, int] = {}
        self._opened = 0
        self._crowded = False
        #: (run, lease) -> the secret of the token its claim got; the ledger keeps a digest only.
        self.secrets: dict[tuple[str, int], str] = {}
        self._drawn = 0
        #: Set by ``worker_for(..., "forged")``: the next worker write shows a wrong secret.
        self._forge = False

    # --- hooks ---------------------------------------------------------------------

    def make_ledger(self, path: str) -> Any:
        """The ledger under test (override to test another configuration)."""
        from handoff.api import Ledger  # the API layer imports this package: import late

        return Ledger(path, synchronous="NORMAL", clock=self.clock)

    @property
    def other(self) -> Any:
        """A second Ledger on the same file, for racing writers."""
        if self._other is None:
            self._other = self.make_ledger(self.ledger.store.path)
        return self._other

    def teardown(self) -> None:
        for lg in (self.ledger, self._other):
            if lg is not None:
                lg.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- the one way commands are issued ---------------------------------------------

    def log(self) -> list[Recorded]:
        return list(self.ledger.store.read_all())

    def token_for(self, run_id: str, actor: Actor, cmd: C.Command) -> tuple[str | None, bool | None]:
        """The lease token a worker shows with ``cmd``, and whether it proves the current
        lease: the real one its claim got, a forged one (after ``worker_for(..., "forged")``),
        or, for a lease the machine never saw granted, one with a made-up secret."""
        lease = getattr(cmd, "lease", None)
        forge, self._forge = self._forge, False
        if actor.kind != T.WORKER or lease is None:
            return None, None
        real = self.secrets.get((run_id, lease))
        if forge or real is None:
            # A replaced worker's own old secret is as good a forgery as a made-up one.
            olds = [v for (r, n), v in self.secrets.items() if r == run_id and n != lease]
            secret = olds[-1] if forge and olds else test_secret(-1 - lease)
            return f"{lease}.{secret}", False
        m = self.model.runs.get(run_id)
        return f"{lease}.{real}", m is not None and m.lease == lease

    def issue(
        self, run_id: str, actor: Actor, cmd: C.Command, *, key: str | None = None,
        via: Callable[[], Any] | None = None, token: Any = None,
    ) -> Any:
        """Run one command on the model and the ledger and require them to agree.

        ``via`` calls a Ledger verb instead of ``Ledger.execute`` (for example
        ``artifact``, which measures the file itself); ``cmd`` must be what it sends.
        ``token`` is ``token_for``'s answer when the caller needed the token first (for
        ``via``); otherwise a worker's command gets its token here. A claim without a
        digest gets a fresh secret's, and the machine keeps the secret if it is granted.
        Returns the ledger's Outcome, or the LedgerError it raised.
        """
        secret = None
        if isinstance(cmd, C.Claim) and not cmd.token_digest:
            self._drawn += 1
            secret = test_secret(self._drawn)
            cmd = C.Claim(worker=cmd.worker, token_digest=lease_digest(secret))
        shown, token_ok = token if token is not None else self.token_for(run_id, actor, cmd)
        expect = self.model.predict(run_id, actor, cmd, key, token_ok)
        before = self.log()
        was_terminal = run_id in self.model.runs and self.model.runs[run_id].terminal
        try:
            out = via() if via is not None else self.ledger.execute(run_id, cmd, actor=actor, key=key, token=shown)
        except E.LedgerError as exc:
            assert self.log() == before, f"refused {C.name_of(cmd)} ({exc.type}) changed the log"
            assert expect.error is not None, (
                f"{actor} {cmd!r} on {run_id}: ledger refused with {exc.type}: {exc.message}; "
                f"the model expected {expect.tags or 'a no-op'}"
            )
            assert type(exc) is expect.error, (
                f"{actor} {cmd!r} on {run_id}: ledger refused with {exc.type} ({exc.message}); "
                f"the model expected {expect.error.__name__} ({expect.why})"
            )
            assert exc.message.strip(), "a refusal must say why"
            tally = f"{C.name_of(cmd)}:{exc.type}"
            self.refusals[tally] = self.refusals.get(tally, 0) + 1
            return exc
        assert expect.error is None, (
            f"{actor} {cmd!r} on {run_id}: ledger accepted it ({out.result.outcome}); the model "
            f"expected {expect.error.__name__}: {expect.why}"
        )
        added = self.log()[len(before):]
        got = [r.type for r in added]
        want = [] if expect.duplicate or expect.unchanged else expect.tags
        assert got == want, f"{actor} {cmd!r} on {run_id}: appended {got}, the model expected {want}"
        assert out.result.outcome == expect.outcome, (
            f"{actor} {cmd!r} on {run_id}: outcome {out.result.outcome}, the model expected {expect.outcome}")
        # The store answers with its warm (cached, incrementally evolved) state: it must
        # equal a fresh fold from the log.
        assert out.checkpoint == self.ledger.checkpoint(run_id), f"{run_id}: warm state != fresh fold"
        if was_terminal:
            assert set(got) <= {"watchdog_observed"}, f"terminal run {run_id} accepted {got}"
        self.model.commit(run_id, expect)
        if secret is not None and got == ["lease_granted"]:
            self.secrets[(run_id, self.model.runs[run_id].lease)] = secret  # type: ignore[index]
        self.accepted[C.name_of(cmd)] = self.accepted.get(C.name_of(cmd), 0) + 1
        return out

    # --- choosing actors and leases relative to the model ------------------------------

    def worker_for(self, run_id: str, lease_pick: str) -> tuple[Actor, int | None]:
        """A worker actor and the lease it shows: the current one, an old one, or none;
        ``forged`` is the current number with a wrong secret (see ``token_for``)."""
        m = self.model.runs[run_id]
        name = m.worker or WORKERS[0]
        if lease_pick == "forged":
            self._forge = True
            lease_pick = "current"
        if lease_pick == "current":
            return Actor("worker", name), m.lease if m.lease is not None else max(m.max_lease, 1)
        if lease_pick == "stale":
            old = [x for x in range(1, m.max_lease + 1) if x != m.lease]
            return Actor("worker", name), (old[-1] if old else m.max_lease + 1)
        return Actor("worker", name), None

    def actor_for(self, run_id: str, whom: str, lease_pick: str = "current") -> tuple[Actor, int | None]:
        m = self.model.runs[run_id]
        if whom == "worker":
            return self.worker_for(run_id, lease_pick)
        return {
            "owner": Actor("owner", m.owner),
            "operator": OPERATOR,
            "watchdog": WATCHDOG,
            "stranger": STRANGER,
            "transferee_worker": Actor("worker", TRANSFEREES[0]),
            "transferee_person": Actor("owner", TRANSFEREES[1]),
        }[whom], None

    # --- rules -------------------------------------------------------------------------

    @initialize(target=runs)
    def first_run(self) -> Any:
        return self._open("alice", require_review=False, with_result_path=True, cap=2)

    @initialize(target=runs)
    def reviewed_run(self) -> Any:
        return self._open("alice", require_review=True, with_result_path=False, cap=2)

    @rule(target=runs, owner=st.sampled_from(OWNERS), require_review=st.booleans(),
          with_result_path=st.booleans(), cap=st.sampled_from([1, 2, 10]))
    def open_run(self, owner: str, require_review: bool, with_result_path: bool, cap: int) -> Any:
        return self._open(owner, require_review=require_review, with_result_path=with_result_path, cap=cap)

    def _open(self, owner: str, *, require_review: bool, with_result_path: bool, cap: int) -> Any:
        self._opened += 1
        run_id = f"r{self._opened}"
        result = os.path.join(self.files, f"{run_id}-result.txt") if with_result_path else None
        cmd = C.Open(goal="produce the report", target="chat:#ops", owner=owner, result_path=result,
                     require_review=require_review, policy=ev.Policy(owner_cap=cap))
        out = self.issue(run_id, Actor("owner", owner), cmd)
        return multiple() if isinstance(out, E.LedgerError) else run_id

    @rule(run=runs, what=st.sampled_from(["goal\x00", "x" * 20_000]))
    def bad_opens_and_texts(self, run: str, what: str) -> None:
        """Reopening a run, and text with a NUL or over the size limit: refused, nothing written."""
        m = self.model.runs[run]
        self.issue(run, Actor("owner", m.owner or "alice"), C.Open(goal="again", target="chat:#ops", owner="alice"))
        self.issue(run, WATCHDOG, C.Observe(classification="healthy", progress_seq=0, reason=what))
        self.issue("never-opened", Actor("owner", "alice"), C.Open(goal=what, target="chat:#ops", owner="alice"))
        self.issue("never-opened", WATCHDOG, C.Observe(classification="healthy", progress_seq=0))

    @precondition(lambda self: not self._crowded)
    @rule(target=runs, cap=st.sampled_from([1, 2]))
    def crowd_the_owner(self, cap: int) -> Any:
        """Seed 004's cap: an owner's runs under lease may not exceed its cap (counted by the ledger)."""
        self._crowded = True
        opened = []
        for _ in range(cap + 1):
            run = self._open("bob", require_review=False, with_result_path=False, cap=cap)
            if not isinstance(run, str):
                break
            opened.append(run)
            self.issue(run, Actor("worker", WORKERS[len(opened) % len(WORKERS)]),
                       C.Claim(worker=WORKERS[len(opened) % len(WORKERS)]))
        return multiple(*opened)

    @rule(run=runs, worker=st.sampled_from(WORKERS), honest=st.booleans())
    def claim(self, run: str, worker: str, honest: bool) -> None:
        actor = Actor("worker", worker if honest else "w-other")
        self.issue(run, actor, C.Claim(worker=worker))

    @rule(run=runs, lease_pick=st.sampled_from(["current", "current", "stale", "forged", "none"]))
    def heartbeat(self, run: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Heartbeat(lease=lease))  # type: ignore[arg-type]

    @rule(run=runs, to=st.sampled_from(T.STATES), lease_pick=st.sampled_from(["current", "current", "stale"]))
    def transition(self, run: str, to: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Transition(lease=lease, to=to))  # type: ignore[arg-type]

    @rule(run=runs, kind=_PROGRESS, lease_pick=st.sampled_from(["current", "current", "stale", "forged"]))
    def progress(self, run: str, kind: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Progress(lease=lease, kind=kind))  # type: ignore[arg-type]

    @rule(run=runs, which=st.sampled_from(["result", "result", "notes", "empty", "missing"]),
          lease_pick=st.sampled_from(["current", "current", "stale"]))
    def artifact(self, run: str, which: str, lease_pick: str) -> None:
        self._artifact(run, which, lease_pick)

    def _artifact(self, run: str, which: str, lease_pick: str = "current", path: str | None = None) -> Any:
        """Write a real file (or leave it missing) and let the ledger measure it."""
        from handoff.api import measure

        m = self.model.runs[run]
        if path is None:
            path = m.result_path if which == "result" and m.result_path else os.path.join(self.files, f"{run}-{which}.txt")
        if which == "missing":
            if os.path.exists(path):
                os.unlink(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write("" if which == "empty" else f"{which} of {run}\n")
        actor, lease = self.worker_for(run, lease_pick)
        real, size, sha, exists = measure(path)
        cmd = C.RecordArtifact(lease=lease, path=real, kind=which, bytes=size, sha256=sha, exists=exists)  # type: ignore[arg-type]
        shown = self.token_for(run, actor, cmd)
        return self.issue(run, actor, cmd, token=shown,
                          via=lambda: self.ledger.artifact(run, shown[0], path, kind=which, worker=actor.name))

    @rule(run=runs, which=st.sampled_from(["recorded", "recorded", "never"]),
          whom=st.sampled_from(["worker", "worker", "owner", "operator", "stranger", "watchdog"]),
          lease_pick=st.sampled_from(["current", "current", "stale", "none"]), reason=st.sampled_from(["typo", " "]))
    def withdraw_artifact(self, run: str, which: str, whom: str, lease_pick: str, reason: str) -> None:
        """Take back a recorded artifact (or one never recorded): only where and by whom the rules allow."""
        m = self.model.runs[run]
        paths = sorted(m.artifacts) if which == "recorded" else []
        path = paths[0] if paths else os.path.join(self.files, f"{run}-never.txt")
        actor, lease = self.worker_for(run, lease_pick) if whom == "worker" else self.actor_for(run, whom)
        self.issue(run, actor, C.WithdrawArtifact(path=path, reason=reason, lease=lease))

    @rule(run=runs, kind=st.sampled_from(["tests", "lint"]), outcome=st.sampled_from(["pass", "pass", "fail", "skipped"]),
          whom=st.sampled_from(["worker", "owner", "operator", "stranger"]))
    def evidence(self, run: str, kind: str, outcome: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.RecordEvidence(kind=kind, outcome=outcome, lease=lease))  # type: ignore[arg-type]

    @rule(run=runs, whom=st.sampled_from(["worker", "owner", "operator", "watchdog"]))
    def block(self, run: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.Block(reason="needs a credential", next_action="ask the owner", lease=lease))

    @rule(run=runs, which=st.sampled_from([None, 1, 2, 3]), whom=st.sampled_from(["worker", "owner", "operator"]))
    def unblock(self, run: str, which: int | None, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.Unblock(resolution="credential provided", blocker_id=which, lease=lease))

    @rule(run=runs, key=_KEYS, what=st.sampled_from(["send mail", "open PR"]),
          lease_pick=st.sampled_from(["current", "current", "stale"]))
    def effect_start(self, run: str, key: str, what: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.StartEffect(lease=lease, key=key, what=what))  # type: ignore[arg-type]

    @rule(run=runs, key=_KEYS, outcome=st.sampled_from(["done", "absent"]),
          whom=st.sampled_from(["worker", "owner", "operator", "watchdog"]))
    def effect_confirm(self, run: str, key: str, outcome: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.ConfirmEffect(key=key, outcome=outcome, lease=lease))  # type: ignore[arg-type]

    @rule(run=runs, lease_pick=st.sampled_from(["current", "current", "stale"]))
    def submit(self, run: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Submit(lease=lease, summary="done"))  # type: ignore[arg-type]

    @rule(run=runs, approve=st.booleans(),
          whom=st.sampled_from(["owner", "owner", "operator", "worker", "stranger", "transferee_worker", "transferee_person"]))
    def review(self, run: str, approve: bool, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.ReviewResult(approve=approve))

    @rule(run=runs, action=st.sampled_from(sorted(T.TRANSFERABLE) + ["publish"]), to=st.sampled_from(TRANSFEREES),
          whom=st.sampled_from(["owner", "operator", "worker"]))
    def transfer(self, run: str, action: str, to: str, whom: str) -> None:
        actor, lease = self.actor_for(run, whom)
        self.issue(run, actor, C.TransferAuthority(action=action, to=to))

    @rule(run=runs, key=_KEYS, whom=st.sampled_from(["owner", "owner", "operator", "worker", "transferee_worker"]))
    def deliver(self, run: str, key: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        # The same idempotency key Ledger.deliver uses, so a retried attempt is a no-op.
        self.issue(run, actor, C.Deliver(key=key), key=f"deliver:{key}")

    @rule(run=runs, key=_KEYS, receipt=st.sampled_from(["msg-1", "msg-2"]),
          whom=st.sampled_from(["owner", "owner", "operator", "worker", "transferee_person"]))
    def delivered(self, run: str, key: str, receipt: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.ConfirmDelivery(key=key, receipt=receipt))

    @rule(run=runs, key=_KEYS)
    def delivery_failed(self, run: str, key: str) -> None:
        m = self.model.runs[run]
        self.issue(run, Actor("owner", m.owner), C.FailDelivery(key=key, error="target returned 503"))

    @rule(run=runs, lease_pick=st.sampled_from(["current", "stale", "forged"]))
    def release(self, run: str, lease_pick: str) -> None:
        actor, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Release(lease=lease, reason="done for now"))  # type: ignore[arg-type]

    @rule(run=runs, whom=st.sampled_from(["owner", "watchdog", "operator", "worker"]),
          lease_pick=st.sampled_from(["current", "none", "stale"]))
    def revoke(self, run: str, whom: str, lease_pick: str) -> None:
        """A lost lease: the watchdog, owner or an operator takes the run away."""
        actor, _ = self.actor_for(run, whom)
        _, lease = self.worker_for(run, lease_pick)
        self.issue(run, actor, C.Revoke(reason="heartbeat timeout", lease=lease))

    @rule(target=runs, run=consumes(runs), disposition=st.sampled_from(["no_op", "cancelled", "failed"]),
          whom=st.sampled_from(["owner", "operator", "worker", "stranger", "transferee_person"]),
          keep=st.booleans())
    def close(self, run: str, disposition: str, whom: str, keep: bool) -> Any:
        """Close a run; an ended run stays in play only sometimes, so most steps go to live runs."""
        actor, _ = self.actor_for(run, whom)
        self.issue(run, actor, C.Close(disposition=disposition, reason="no longer needed"))  # type: ignore[arg-type]
        return run if keep or not self.model.runs[run].terminal else multiple()

    @rule(target=runs, parent=runs, pick=st.integers(0, 50), beyond=st.booleans(),
          whom=st.sampled_from(["operator", "owner"]))
    def fork(self, parent: str, pick: int, beyond: bool, whom: str) -> Any:
        bounds = sorted(self.model.snapshots[parent])
        at = bounds[-1] + 3 if beyond else bounds[pick % len(bounds)]
        self._opened += 1
        child = f"{parent}.f{self._opened}"
        actor, _ = self.actor_for(parent, whom)
        out = self.issue(child, actor, C.Fork(parent=parent, at_seq=at))
        return multiple() if isinstance(out, E.LedgerError) else child

    @rule(run=runs, classification=st.sampled_from(["healthy", "stalled", "unavailable"]),
          whom=st.sampled_from(["watchdog", "operator", "owner"]))
    def observe(self, run: str, classification: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        seq = self.model.runs[run].progress_seq
        self.issue(run, actor, C.Observe(classification=classification, progress_seq=seq, interval_s=30.0))

    @rule(run=runs, action=st.sampled_from(sorted(T.RECOVERY_ACTIONS)), whom=st.sampled_from(["watchdog", "worker"]))
    def recover(self, run: str, action: str, whom: str) -> None:
        actor, _ = self.actor_for(run, whom)
        seq = self.model.runs[run].progress_seq
        self.issue(run, actor, C.Recover(action=action, classification="stalled", progress_seq=seq))

    @rule(run=runs, pair=st.sampled_from(["close/close", "delivered/close", "deliver/deliver", "delivered/delivered"]))
    def race(self, run: str, pair: str) -> None:
        """Two writers on two connections at once: of two rival commands at most one wins."""
        # First bring the run to where both rivals stand a chance: an attempt waiting for
        # its outcome, or a result ready to send.
        if pair.startswith("delivered"):
            self.drive_until(run, lambda m: m.pending_delivery is not None)
        elif pair == "deliver/deliver":
            self.drive_until(run, lambda m: m.ready and m.pending_delivery is None and m.confirmed_key is None)
        m = self.model.runs[run]
        owner, pending = Actor("owner", m.owner), m.pending_delivery or "k1"
        rivals: list[tuple[Actor, C.Command, str | None]] = {
            "close/close": [(owner, C.Close(disposition="no_op"), None), (OPERATOR, C.Close(disposition="cancelled"), None)],
            "delivered/close": [(owner, C.ConfirmDelivery(key=pending, receipt="msg-1"), None),
                                (owner, C.Close(disposition="failed"), None)],
            "deliver/deliver": [(owner, C.Deliver(key="k2"), "deliver:k2"), (OPERATOR, C.Deliver(key="k3"), "deliver:k3")],
            "delivered/delivered": [(owner, C.ConfirmDelivery(key=pending, receipt="msg-1"), None),
                                    (OPERATOR, C.ConfirmDelivery(key=pending, receipt="msg-2"), None)],
        }[pair]
        (a1, c1, k1), (a2, c2, k2) = rivals
        before = len(self.log())
        results: list[Any] = [None, None]
        gate = threading.Barrier(2)

        def go(i: int, lg: Any, actor: Actor, cmd: C.Command, key: str | None) -> None:
            gate.wait()
            try:
                results[i] = lg.execute(run, cmd, actor=actor, key=key)
            except E.LedgerError as exc:
                results[i] = exc

        threads = [threading.Thread(target=go, args=(0, self.ledger, a1, c1, k1)),
                   threading.Thread(target=go, args=(1, self.other, a2, c2, k2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        added = self.log()[before:]

        def outcome(x: Any) -> Any:
            return type(x) if isinstance(x, E.LedgerError) else x.result.outcome

        observed = [outcome(x) for x in results]
        tally = f"race {pair}: " + " / ".join(o if isinstance(o, str) else o.__name__ for o in observed)
        self.accepted[tally] = self.accepted.get(tally, 0) + 1
        for order in ((0, 1), (1, 0)):
            trial = copy.deepcopy(self.model)
            predicted: list[Any] = [None, None]
            tags: list[str] = []
            for i in order:
                actor, cmd, key = rivals[i]
                exp = trial.predict(run, actor, cmd, key)
                if exp.error is not None:
                    predicted[i] = exp.error
                else:
                    predicted[i] = exp.outcome
                    tags += [] if exp.duplicate or exp.unchanged else exp.tags
                    trial.commit(run, exp)
            if predicted == observed and [r.type for r in added] == tags:
                self.model = trial
                break
        else:
            raise AssertionError(f"race {pair} on {run}: observed {observed} and {[r.type for r in added]}, "
                                 "which no serial order of the two commands explains")
        assert sum(o == "committed" for o in observed) <= 1, f"race {pair}: both rivals were accepted"

    @rule(run=runs, steps=st.integers(1, 20), choice=st.integers(0, 5))
    def drive(self, run: str, steps: int, choice: int) -> None:
        """Take up to ``steps`` sensible steps, the way a well-behaved agent and owner would."""
        for i in range(steps):
            if isinstance(self.sensible_step(run, choice + i), E.LedgerError):
                break

    @rule(run=runs, steps=st.integers(1, 20), choice=st.integers(0, 5))
    def drive_more(self, run: str, steps: int, choice: int) -> None:
        """The same as ``drive``: a second rule so that whole lifecycles are common."""
        self.drive(run, steps, choice)

    @rule(run=runs, outcome=st.sampled_from(["done", "absent"]), by_watchdog=st.booleans())
    def lose_lease_mid_effect(self, run: str, outcome: str, by_watchdog: bool) -> None:
        """Seed 003's injection: the worker dispatched a side effect, then lost its lease.

        The run must go to unknown, refuse to move on until someone records what really
        happened, and take that reconciliation as progress.
        """
        if not self.bring_to_work(run):
            return
        m = self.model.runs[run]
        w = Actor("worker", m.worker or WORKERS[0])
        key = next(k for k in (f"e{i}" for i in itertools.count(1)) if k not in m.pending and k not in m.settled)
        self.issue(run, w, C.StartEffect(lease=m.lease, key=key, what="send the report by mail"))
        seq = self.model.runs[run].progress_seq
        if by_watchdog:
            self.issue(run, WATCHDOG, C.Recover(action="revoke_lease", classification="unavailable", progress_seq=seq))
        else:
            self.issue(run, OPERATOR, C.Revoke(reason="worker stopped answering"))
        self.issue(run, w, C.Heartbeat(lease=m.lease))  # the old worker wakes up: fenced off
        self.issue(run, OPERATOR, C.ConfirmEffect(key=key, outcome=outcome, note="checked the mailbox"))

    @rule(run=runs, which=st.sampled_from(["empty", "missing", "elsewhere"]))
    def submit_without_substance(self, run: str, which: str) -> None:
        """Seed 001's evidence rule: a result must point at files that exist and have content."""
        if not self.drive_until(run, lambda m: m.state == T.VERIFYING and m.lease is not None):
            return
        m = self.model.runs[run]
        w = Actor("worker", m.worker or WORKERS[0])
        if which == "elsewhere":
            if m.result_path is None:
                return
            for path in list(m.artifacts):  # only a file other than the contract's result
                if path == m.result_path:
                    return
            self._artifact(run, "notes")
        else:
            self._artifact(run, which)
        self.issue(run, w, C.Submit(lease=m.lease, summary="done, trust me"))

    @rule(run=runs, worker=st.sampled_from(WORKERS))
    def stale_worker_returns(self, run: str, worker: str) -> None:
        """A replaced worker resumes and writes under its old lease: nothing it sends lands."""
        if not self.bring_to_work(run):
            return
        m = self.model.runs[run]
        old = m.lease
        self.issue(run, OPERATOR, C.Revoke(reason="replaced", lease=old))
        self.issue(run, Actor("worker", worker), C.Claim(worker=worker))
        w = Actor("worker", m.worker or WORKERS[0])
        self.issue(run, w, C.Progress(lease=old, kind="tool_outcome"))
        self.issue(run, w, C.Transition(lease=old, to=T.VERIFYING))

    def drive_until(self, run: str, done: Callable[[RunModel], bool], steps: int = 25) -> bool:
        for i in range(steps):
            m = self.model.runs[run]
            if done(m):
                return True
            if m.terminal or isinstance(self.sensible_step(run, i), E.LedgerError):
                return False
        return done(self.model.runs[run])

    def bring_to_work(self, run: str) -> bool:
        """A few sensible steps until a worker holds the run in a working state, if it can."""
        for i in range(6):
            m = self.model.runs[run]
            if m.lease is not None and m.state in T.WORKING:
                return True
            if m.terminal or m.state not in (T.QUEUED, T.UNKNOWN, T.BLOCKED, T.PLANNING):
                return False
            if isinstance(self.sensible_step(run, i), E.LedgerError):
                return False
        return False

    def sensible_step(self, run: str, choice: int) -> Any:
        """One command that an honest worker, owner or watchdog would issue next."""
        m = self.model.runs[run]
        owner = Actor("owner", m.owner)
        w = Actor("worker", m.worker or WORKERS[choice % len(WORKERS)])
        lease = m.lease
        if m.terminal:
            return self.issue(run, WATCHDOG, C.Observe(classification="silent", progress_seq=m.progress_seq))
        if m.state == T.BLOCKED:
            return self.issue(run, owner, C.Unblock(resolution="resolved"))
        if m.state == T.UNKNOWN and m.pending:
            return self.issue(run, OPERATOR, C.ConfirmEffect(key=sorted(m.pending)[0], outcome="done", note="checked"))
        if m.state == T.READY_FOR_REVIEW:
            return self.issue(run, owner, C.ReviewResult(approve=choice % 4 != 0))
        if m.state == T.SUCCEEDED:
            if not m.evidence_ok:
                return self.issue(run, owner, C.RecordEvidence(kind="tests", outcome="pass"))
            if m.pending_delivery is not None:
                key = m.pending_delivery
                if choice % 5 == 0:
                    return self.issue(run, owner, C.FailDelivery(key=key, error="503"))
                return self.issue(run, owner, C.ConfirmDelivery(key=key, receipt=f"receipt-{key}"))
            key = next(k for k in ("k1", "k2", "k3", "k4", "k5", "k6") if k not in m.attempts)
            return self.issue(run, owner, C.Deliver(key=key), key=f"deliver:{key}")
        if lease is None:
            return self.issue(run, w, C.Claim(worker=w.name))
        if m.state == T.QUEUED:
            return self.issue(run, w, C.Transition(lease=lease, to=T.PLANNING))
        if m.state == T.UNKNOWN:
            return self.issue(run, w, C.Transition(lease=lease, to=T.EXECUTING))
        if m.state == T.PLANNING:
            if choice % 2:
                return self.issue(run, w, C.Progress(lease=lease, kind="plan_committed"))
            return self.issue(run, w, C.Transition(lease=lease, to=T.EXECUTING))
        if m.state == T.EXECUTING:
            if m.pending and choice % 3 != 2:
                return self.issue(run, w, C.ConfirmEffect(key=sorted(m.pending)[0], outcome="done", lease=lease))
            bad = sorted(p for p, ok in m.artifacts.items() if not ok)
            if bad and choice % 2 and bad[0] != m.result_path:
                # Recorded by mistake: take it back rather than make the file.
                return self.issue(run, w, C.WithdrawArtifact(path=bad[0], reason="recorded by mistake", lease=lease))
            if bad:
                return self._artifact(run, "fixed", path=bad[0])
            if not m.artifacts or (m.result_path and m.result_path not in m.artifacts):
                return self._artifact(run, "result")
            if choice % 3 == 1 and len(m.settled) + len(m.pending) < 3:
                key = f"k{len(m.settled) + len(m.pending) + 1}"
                return self.issue(run, w, C.StartEffect(lease=lease, key=key, what="send mail"))
            if not m.evidence_ok:
                return self.issue(run, w, C.RecordEvidence(kind="tests", outcome="pass", lease=lease))
            return self.issue(run, w, C.Transition(lease=lease, to=T.VERIFYING))
        if m.state == T.VERIFYING:
            if choice % 3 == 0:
                return self.issue(run, w, C.Progress(lease=lease, kind="verifier_result"))
            return self.issue(run, w, C.Submit(lease=lease, summary="report written"))
        return self.issue(run, w, C.Heartbeat(lease=lease))

    # --- invariants ----------------------------------------------------------------------

    def history(self, run_id: str) -> list[Recorded]:
        return list(self.ledger.store.history(run_id))

    @invariant()
    def store_equals_model(self) -> None:
        for run_id, m in self.model.runs.items():
            cp = self.ledger.checkpoint(run_id)
            for name, read in COMPARED.items():
                assert read(cp) == _model_value(m, name), (
                    f"{run_id}.{name}: the fold says {read(cp)!r}, the model {_model_value(m, name)!r}"
                )
            own = [r for r in self.ledger.store.read_run(run_id) if r.type == "delivery_confirmed"]
            assert len(own) == m.confirmations <= 1, f"{run_id} has {len(own)} confirmed deliveries"

    @invariant()
    def terminal_states_absorb(self) -> None:
        for run_id, m in self.model.runs.items():
            if m.ended_as is not None:
                assert self.ledger.checkpoint(run_id).state == m.ended_as

    @invariant()
    def prefixes_equal_as_of(self) -> None:
        """Fold of a prefix == the checkpoint as of that seq == the model's snapshot there."""
        for run_id, snaps in self.model.snapshots.items():
            hist = self.history(run_id)
            bounds = sorted(snaps)
            for k in {bounds[0], bounds[len(bounds) // 2], bounds[-1]}:
                as_of = self.ledger.checkpoint(run_id, at_seq=k)
                prefix = [r for r in hist if r.run_id != run_id or r.seq <= k]
                assert fold(prefix, run_id) == as_of == fold(hist, run_id, until_seq=k)
                for name, read in COMPARED.items():
                    assert read(as_of) == _model_value(snaps[k], name), f"{run_id}@{k}.{name}"

    @invariant()
    def fold_composes(self) -> None:
        """fold(a + b) == evolve from fold(a) over b, at a few split points."""
        for run_id in self.model.runs:
            hist = self.history(run_id)
            whole = fold(hist, run_id)
            for cut in {0, len(hist) // 3, (2 * len(hist)) // 3, len(hist)}:
                cp = fold(hist[:cut], run_id)
                for rec in hist[cut:]:
                    cp = evolve(cp, rec)
                assert cp == whole, f"{run_id}: folding in two parts at {cut} differs"

    @invariant()
    def log_verifies(self) -> None:
        assert self.ledger.verify() == []


