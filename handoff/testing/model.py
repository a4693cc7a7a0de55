"""The model: what each command should do, restated in plain Python apart from the reducers.

For every command ``Model.predict`` gives the typed refusal, or the exact event types the
ledger appends and the run's state afterwards; ``Model.commit`` applies a prediction the
ledger agreed with. It is written without ``reducers.decide`` or the folds, so that a
mistake in either shows as a disagreement rather than being copied.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger.inputs import CONTROL_RE
from handoff.ledger.store import Actor
from handoff.reducers import commands as C
from handoff.reducers import transitions as T
from handoff.reducers.checkpoint import Checkpoint
from handoff.reducers.stall import CLASSIFICATIONS

__all__ = ["RunModel", "Expect", "Model", "COMPARED", "model_value"]



@dataclass
class RunModel:
    """What the rules say one run looks like, kept by hand, apart from the reducers."""

    run_id: str
    owner: str = ""
    target: str = ""
    require_review: bool = False
    result_path: str | None = None
    owner_cap: int = ev.Policy().owner_cap
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
    #: Whether the latest sanitization check passed; None before any (and in a fork's child).
    check_passed: bool | None = None
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


def _bad_text(value: str, *, max_len: int = 16_384, empty: bool = True) -> bool:
    """Text the ledger refuses: control characters (NUL included), too long, or blank."""
    return bool(CONTROL_RE.search(value)) or len(value) > max_len or (not empty and not value.strip())


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
        if actor.kind == T.WATCHDOG and run is not None:
            new.progress_seq = run.progress_seq  # it judges progress: nothing it records is progress
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

    def _sanitize(self, r: RunModel, c: C.Sanitize, a: Actor) -> list[str]:
        if r.state not in (T.SUCCEEDED, T.READY_FOR_REVIEW):
            _refuse(E.IllegalTransition, f"no result to check in {r.state}")
        r.check_passed = bool(c.passed)
        return ["sanitization_checked"]

    def _reopen(self, r: RunModel, c: C.Reopen, a: Actor) -> list[str]:
        if _bad_text(c.reason, empty=False):
            _refuse(E.InvalidInput, "a reopen needs a reason")
        if r.state != T.SUCCEEDED:
            _refuse(E.IllegalTransition, f"only a succeeded result is reopened, not one {r.state}")
        if r.pending_delivery is not None:
            _refuse(E.DeliveryRefused, f"delivery {r.pending_delivery} has no outcome")
        if r.check_passed is not False:
            _refuse(E.IllegalTransition, "no failed sanitization check stops the delivery")
        return ["run_reopened", *self._move(r, T.VERIFYING, "reopen")]

    def _release(self, r: RunModel, c: C.Release, a: Actor) -> list[str]:
        return self._lose_lease(r, "lease_released")

    def _lose_lease(self, r: RunModel, tag: str = "lease_revoked") -> list[str]:
        lost = any(lease == r.lease for _, lease in r.pending.values())
        r.lease = r.worker = None
        if lost and r.state in T.WORKING:
            r.state = T.UNKNOWN  # a worker gone, not the work moved: progress_seq stays
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
        child.check_passed = None
        r.__dict__.update(child.__dict__)
        return ["run_forked"]

    def _observe(self, r: RunModel, c: C.Observe, a: Actor) -> list[str]:
        if c.classification not in CLASSIFICATIONS or _bad_text(c.reason):
            _refuse(E.InvalidInput, "bad classification or reason")
        return ["watchdog_observed"]

    def _recover(self, r: RunModel, c: C.Recover, a: Actor) -> list[str]:
        if c.action not in T.RECOVERY_ACTIONS:
            _refuse(E.InvalidInput, f"no recovery action {c.action}")
        if c.classification not in CLASSIFICATIONS:
            _refuse(E.InvalidInput, f"no classification {c.classification}")
        if c.action == "revoke_lease":
            if r.lease is None:
                _refuse(E.StaleLease, "no lease to revoke")
            return ["recovery_decided", *self._lose_lease(r)]
        if c.action == "pause":
            return ["recovery_decided", *self._raise_blocker(r, "recover")]
        return ["recovery_decided"]


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


def model_value(m: RunModel, name: str) -> Any:
    if name == "pending":
        return sorted(m.pending)
    if name == "artifacts":
        return sorted(m.artifacts.items())
    return getattr(m, name)

