"""The commands a run takes, one method each: the contract, the lease and its writes,
review, ending and forking a run, and the watchdog's records.

Each verb builds its command (``reducers.commands``) and hands it to ``execute``, the one
write path (handoff/facade.py), which folds, decides and appends in one transaction; a verb
only checks what it must check before that (a token's shape, a file to measure) and
names the actor the write is logged as.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from msgspec import UNSET

from handoff.ledger import events as ev
from handoff.ledger.errors import ClaimAlreadyMade, InvalidInput, LedgerError
from handoff.ledger.inputs import check_attrs, check_idempotency_key, check_run_id, check_seconds, check_seq
from handoff.ledger.store import (WATCHER_PREFIX, Actor, AppendResult, EventStore, LeaseToken, Liveness,
                                  encode_beat_attrs, new_lease_secret)
from handoff.reducers import commands as C
from handoff.reducers import liveness
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint
from handoff.projections import queries
from handoff.reducers.transitions import check_progress_kinds

from .artifacts import measure
from .names import keyed_id, lease_token, login_name, new_run_id, operator_name
from .results import Claimed, Outcome

#: The policy defaults; their one home is ``ledger.events.Policy`` (a contract that omits a
#: field is stored, and decoded, with these).
POLICY = ev.Policy()
#: A watcher beats at most this often (seconds); coverage allows three missed beats.
WATCHER_BEAT_PERIOD_S = 10.0


class Verbs:
    """The verbs of ``Ledger``; ``execute``, ``checkpoint`` and the store are the Ledger's."""

    store: EventStore
    clock: Callable[[], int]
    _holders: dict[tuple[str, int], str]

    def open(
        self, *, goal: str, target: str, owner: str, origin: str = "", run_id: str | None = None,
        result_path: str | None = None, stop_rules: tuple[str, ...] = (), require_review: bool = False,
        heartbeat_timeout_s: float = POLICY.heartbeat_timeout_s, progress_timeout_s: float = POLICY.progress_timeout_s,
        retry_budget: int = POLICY.retry_budget, delivery_timeout_s: float = POLICY.delivery_timeout_s,
        owner_cap: int = POLICY.owner_cap, key: str | None = None,
        actor: Actor | None = None, public: bool = False, sanitize_patterns: tuple[str, ...] = (),
        send: ev.SendPolicy | None = None, progress_kinds: Mapping[str, Any] | None = None,
    ) -> str:
        """Write a run's contract. ``public``: the target is visible to others, so delivery
        needs a passing sanitization check (``sanitize``); ``sanitize_patterns`` add the
        owner's own regular expressions to the built-in detectors; ``send`` sets how the
        ledger sends to an adapter target (``deliver(send=True)``, docs/delivery.md);
        ``progress_kinds`` declares kinds of the run's own that count as progress in a
        working state (``{"executing": ["llm_step"]}``), fixed from now on."""
        if run_id is None and key is not None:
            # The id follows from the key and the owner, so a retry cannot open a second run.
            check_idempotency_key(key)
            run_id = keyed_id("run-k", "open", owner, key)
        run_id = new_run_id() if run_id is None else run_id  # '' is refused, not replaced
        if isinstance(result_path, str) and result_path and "\x00" not in result_path:
            # Artifacts are recorded at their resolved path; submit compares the two.
            result_path = os.path.realpath(result_path)
        policy = ev.Policy(heartbeat_timeout_s, progress_timeout_s, retry_budget, delivery_timeout_s, owner_cap)
        cmd = C.Open(goal=goal, target=target, owner=owner, origin=origin, result_path=result_path,
                     stop_rules=tuple(stop_rules), require_review=require_review, policy=policy,
                     public=public, sanitize_patterns=tuple(sanitize_patterns), send=send or ev.SendPolicy(),
                     progress_kinds=check_progress_kinds(progress_kinds))
        self.execute(run_id, cmd, actor=actor or Actor("owner", owner if isinstance(owner, str) and owner else "?"), key=key)
        return run_id

    def open_contract(self, contract: Any, *, key: str | None = None) -> str:
        """Open a run from a contract given as JSON text, bytes, a dict or a HandoffContract.

        Every field is checked first (handoff.contract); the errors name each bad field.
        """
        from . import contract as hc

        c = contract if isinstance(contract, hc.HandoffContract) else hc.load(contract)
        p = c.policy
        return self.open(
            goal=c.goal, target=c.target, owner=c.owner, origin=c.origin, run_id=c.run_id,
            result_path=c.result_path, stop_rules=tuple(c.stop_rules), require_review=c.require_review,
            heartbeat_timeout_s=p.heartbeat_timeout_s, progress_timeout_s=p.progress_timeout_s,
            retry_budget=p.retry_budget, delivery_timeout_s=p.delivery_timeout_s, owner_cap=p.owner_cap,
            key=key, public=c.public, sanitize_patterns=tuple(c.sanitize_patterns),
            send=ev.SendPolicy(**c.send.model_dump()), progress_kinds=c.progress_kinds,
        )

    def claim(self, run_id: str, worker: str, *, key: str | None = None) -> LeaseToken:
        """Take the run's lease and return its token: ``"<lease>.<secret>"``, a ``str``.

        Every later write under the lease passes it (``lg.progress(run, token, ...)``);
        ``token.lease`` is the number status shows. Only a digest is stored, so this is the
        one time the token can be seen: a retried keyed claim cannot show it again and
        raises ClaimAlreadyMade instead (see ``claim_outcome``).
        """
        return self.claim_outcome(run_id, worker, key=key).token

    def lease(self, run_id: str, *, worker: str, token: str | None = None, heartbeat_s: float | None = None,
              fence_margin_s: float | None = None, on_lost: Callable[[Any], None] | None = None,
              key: str | None = None) -> Any:
        """A lease held in a block: ``with lg.lease(run, worker="agent-1") as lease:``
        claims (or adopts ``token``), heartbeats while the block runs, fences itself when
        no heartbeat can be recorded, and releases (or records why the work stopped) at
        its end. The block's verbs need no token (``handoff.lease.Lease``)."""
        from handoff.lease import Lease

        return Lease(self, run_id, worker=worker, token=token, heartbeat_s=heartbeat_s,
                     fence_margin_s=fence_margin_s, on_lost=on_lost, key=key)

    def claim_outcome(self, run_id: str, worker: str, *, key: str | None = None) -> Claimed:
        """``claim`` with the write it made (for the CLI's --json)."""
        secret, digest = new_lease_secret()
        cmd = C.Claim(worker=worker, token_digest=digest)
        out = self.execute(run_id, cmd, actor=Actor("worker", worker), key=key)
        if out.duplicate:
            raise self._claim_already_made(run_id, key, out)
        lease = out.checkpoint.lease
        assert lease is not None  # a committed claim ends with its own lease current
        token = LeaseToken(f"{lease}.{secret}")
        self._kept_beside(run_id, out.checkpoint, token)  # the grant is the lease's first sign of life
        return Claimed(token, out)

    def _claim_already_made(self, run_id: str, key: str | None, out: Outcome) -> ClaimAlreadyMade:
        """The refusal for a keyed claim that already happened: which lease it got, and what
        a caller without that lease's token can do now."""
        seq = out.result.first_seq
        first = next(iter(self.store.read_run(run_id, after_seq=seq - 1, until_seq=seq)))
        granted = first.event
        assert isinstance(granted, ev.LeaseGranted)
        n, cp = granted.lease, out.checkpoint
        said = (f"claim key {key!r} on run {run_id} was already used: that claim got lease {n} for "
                f"worker {granted.worker} (seq {seq}). Its token was printed once, to that claim, "
                "and is not stored, so it cannot be shown again. ")
        if cp.lease == n:
            state = "held"
            said += (f"Lease {n} is still held: if this worker kept the token, keep using it. "
                     "Without the token the lease can be neither used nor released: wait for the "
                     "watchdog to revoke it after its heartbeat timeout, or ask the owner to run "
                     f"'handoff revoke {run_id} --lease-number {n}', then claim with a new key")
        elif cp.lease is not None:
            state = "moved_on"
            said += (f"Lease {n} has ended and another claim holds the run now; this worker does "
                     "not hold it and must not write to it")
        else:
            state = "ended"
            said += (f"Lease {n} has ended and no lease is held now: claim again with a new key "
                     "to take the run")
        return ClaimAlreadyMade(said, run_id=run_id, lease=n, seq=seq, state=state)

    def worker_actor(self, run_id: str, lease: object = None, worker: str | None = None) -> Actor:
        """Who a worker's write is logged as; the one rule for the API and the CLI alike.

        ``worker`` when given, else $HANDOFF_WORKER, else the worker the lease was granted
        to (the current holder, or for an ended lease the name its grant recorded, so a
        keyed retry is the same request as the first attempt), else ``login_name()``. Only
        a name for the envelope: the write itself is proven by the token, not by this."""
        name = worker or os.environ.get("HANDOFF_WORKER") or self._lease_holder(run_id, lease)
        return Actor("worker", name or login_name())  # never "worker", which would log worker:worker

    def _lease_holder(self, run_id: str, lease: object) -> str | None:
        text = str(lease.lease if isinstance(lease, LeaseToken) else lease or "").partition(".")[0]
        if not text.isdigit():
            return None
        number = int(text)
        # A lease number names one grant of one run for good: its holder is looked up once
        # per process (a read before the write: a round trip on a server).
        known = self._holders.get((run_id, number))
        if known is not None:
            return known
        try:
            head = self.store.head(run_id)
        except LedgerError:  # a malformed run id: the write itself will say so
            return None
        if head is None:
            return None
        holder = None
        if head.lease_holder and head.lease == number:
            holder = head.lease_holder
        else:
            for rec in self.store.read_run(run_id):
                if rec.type == "lease_granted" and rec.event.lease == number:  # type: ignore[attr-defined]
                    holder = rec.event.worker  # type: ignore[attr-defined]
                    break
        if holder is not None:
            if len(self._holders) > 4096:
                self._holders.clear()
            self._holders[(run_id, number)] = holder
        return holder

    def _actor(self, run_id: str, token: LeaseToken | None, actor: Actor | None, by: str | None,
               worker: str | None = None) -> Actor:
        """A write that a worker (with its token) or a person (without) may make: an explicit
        ``actor``, else the lease's worker, else the operator ``by`` names."""
        if actor is not None:
            return actor
        if token is not None:
            return self.worker_actor(run_id, token, worker)
        return Actor("operator", operator_name(by))

    def _person_actor(self, run_id: str, by: str | None) -> Actor:
        """Who a person's write is logged as when the rule admits the owner and an operator
        alike (revoke): the run's owner when ``by`` (``operator_name``) names it, else an
        operator."""
        name = operator_name(by)
        return Actor("owner" if name == self.checkpoint(run_id).owner else "operator", name)

    # A worker's ``lease`` below is the token claim returned; a bare number is refused.

    # ``attrs``, where a record takes them: a few facts about the step (model, tokens in and
    # out, cost, tool, trace and span ids) as {name: text, number or bool}; the bounds are
    # handoff.ledger.inputs.check_attrs'. They show in the log, the report and the export.

    def heartbeat(self, run_id: str, lease: str, *, attrs: Mapping[str, Any] | None = None,
                  worker: str | None = None) -> Outcome:
        """Say the lease holder is alive. Heartbeats are liveness, never progress.

        It takes no key: a heartbeat changes no authority, and a repeated one
        only says again that the holder is alive, which is what a retry means.

        Most beats write no event: the run's liveness, kept beside the log, moves (fenced by
        the token like any write; the outcome is ``unchanged``). The log records the beat
        (``committed``) when it ends a silence longer than half the heartbeat timeout,
        carries other attrs than the last, or is the first in ``beat_mark_s``
        (reducers/liveness.py); the claim's grant counts as the lease's first beat. A
        refused beat raises as any write does.
        """
        t = lease_token(lease)
        checked = check_attrs(attrs) or None
        check_run_id(run_id)
        encoded = encode_beat_attrs(checked)
        beat = self.store.beat(run_id, t, encoded, mark_us=liveness.mark_us(self.beat_mark_s))
        if beat is not None:
            live, seq, h = beat
            cp = liveness.overlay(self._run_at(run_id, seq, h), live)
            return Outcome(AppendResult(run_id, "unchanged", cp.last_seq, cp.last_seq, ()), cp)
        cmd = C.Heartbeat(lease=t.lease, attrs=checked if checked is not None else UNSET)
        out = self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), token=t)
        self._kept_beside(run_id, out.checkpoint, t, encoded, logged=True)
        return out

    def _run_at(self, run_id: str, seq: int, h: bytes) -> Checkpoint:
        """The run's checkpoint at this head: the fold this process holds for it, else the
        view's row (one read), else a fold (a store without current views)."""
        cp = self.store.state_at(run_id, AGGREGATE, seq, h)
        if cp is None and self.projector.current:
            cp = queries.packet_of(self.store, run_id)
        if cp is None or cp.last_seq != seq:
            with self.store.read_transaction() as txn:
                cp = txn.state(run_id, AGGREGATE)
        return cp

    def _kept_beside(self, run_id: str, cp: Checkpoint, token: LeaseToken, attrs: bytes = b"", *,
                     logged: bool = False) -> None:
        """After a beat the log recorded (``logged``) or a claim: the liveness row starts
        again from it, so the next beats need no event. (A crash before this only makes the
        next beat logged too.)"""
        since = cp.watch.last_heartbeat_us
        if cp.lease is None or since is None:
            return
        self.store.put_liveness(Liveness(run_id, cp.lease, since, 1 if logged else 0, since, attrs,
                                         liveness.quiet_us(cp.policy)), token, one_more=logged)

    # --- generated from handoff/operations.py (Ledger verbs): python -m handoff.codegen --write ---
    def transition(self, run_id: str, lease: str, to: str, *, reason: str = "", key: str | None = None,
                   worker: str | None = None) -> Outcome:
        """Move the run through its lifecycle (queued -> planning -> executing ->
        verifying)."""
        t = lease_token(lease)
        cmd = C.Transition(lease=t.lease, to=to, reason=reason)
        return self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), key=key, token=t)

    def progress(self, run_id: str, lease: str, kind: str, detail: str = "", *,
                 attrs: Mapping[str, Any] | None = None, key: str | None = None,
                 worker: str | None = None) -> Outcome:
        """Record a step. Only the state's progress kinds advance progress_seq.

        With a key, a retried report writes nothing new.
        """
        t = lease_token(lease)
        cmd = C.Progress(lease=t.lease, kind=kind, detail=detail, attrs=check_attrs(attrs))
        return self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), key=key, token=t)

    def evidence(self, run_id: str, kind: str, outcome: str, detail: str = "", *,
                 attrs: Mapping[str, Any] | None = None, lease: str | None = None, by: str | None = None,
                 actor: Actor | None = None, key: str | None = None) -> Outcome:
        """Record a check that was run and how it came out. Delivery needs a pass and no
        fail."""
        t = None if lease is None else lease_token(lease)
        cmd = C.RecordEvidence(kind=kind, outcome=outcome, detail=detail, attrs=check_attrs(attrs),
                               lease=t and t.lease)  # type: ignore[arg-type]
        return self.execute(run_id, cmd, actor=self._actor(run_id, t, actor, by), key=key, token=t)

    def block(self, run_id: str, reason: str, next_action: str, *, lease: str | None = None,
              by: str | None = None, actor: Actor | None = None, key: str | None = None) -> Outcome:
        """Record a named blocker and the next action; the run waits in 'blocked'.

        A blocked run is not a stall: the watchdog leaves it alone.
        """
        t = None if lease is None else lease_token(lease)
        cmd = C.Block(reason=reason, next_action=next_action, lease=t and t.lease)
        return self.execute(run_id, cmd, actor=self._actor(run_id, t, actor, by), key=key, token=t)

    def unblock(self, run_id: str, resolution: str, *, blocker_id: int | None = None,
                lease: str | None = None, by: str | None = None, actor: Actor | None = None,
                key: str | None = None) -> Outcome:
        """Clear blockers; the run returns to the state it was blocked from."""
        t = None if lease is None else lease_token(lease)
        cmd = C.Unblock(resolution=resolution, blocker_id=blocker_id, lease=t and t.lease)
        return self.execute(run_id, cmd, actor=self._actor(run_id, t, actor, by), key=key, token=t)

    def effect_start(self, run_id: str, lease: str, effect_key: str, what: str, *,
                     attrs: Mapping[str, Any] | None = None, worker: str | None = None) -> Outcome:
        """Record that an external side effect is about to start, before starting it.

        Until its outcome is confirmed, a lost worker leaves the run 'unknown'
        and the watchdog asks for reconciliation instead of a blind retry.
        """
        t = lease_token(lease)
        cmd = C.StartEffect(lease=t.lease, key=effect_key, what=what, attrs=check_attrs(attrs))
        return self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), token=t)

    def effect_confirm(self, run_id: str, effect_key: str, outcome: str, *, note: str = "",
                       attrs: Mapping[str, Any] | None = None, lease: str | None = None,
                       by: str | None = None, actor: Actor | None = None) -> Outcome:
        """Record a side effect's outcome: done, or absent (it did not happen).

        A reconciliation after a lost worker: look at the world, then say what
        happened.
        """
        t = None if lease is None else lease_token(lease)
        cmd = C.ConfirmEffect(key=effect_key, outcome=outcome, note=note, attrs=check_attrs(attrs),
                              lease=t and t.lease)  # type: ignore[arg-type]
        return self.execute(run_id, cmd, actor=self._actor(run_id, t, actor, by), token=t)

    def submit(self, run_id: str, lease: str, summary: str = "", *, key: str | None = None,
               worker: str | None = None) -> Outcome:
        """Submit the result: the run moves to review (or succeeds when the contract needs
        none)."""
        t = lease_token(lease)
        cmd = C.Submit(lease=t.lease, summary=summary)
        return self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), key=key, token=t)

    def release(self, run_id: str, lease: str, reason: str = "", *, key: str | None = None,
                worker: str | None = None) -> Outcome:
        """Give the lease back: the run stays where it is, claimable by the next worker."""
        t = lease_token(lease)
        cmd = C.Release(lease=t.lease, reason=reason)
        return self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), key=key, token=t)

    def review(self, run_id: str, approve: bool, notes: str = "", *, by: str,
               key: str | None = None) -> Outcome:
        """Approve or reject a submitted result."""
        cmd = C.ReviewResult(approve=approve, notes=notes)
        return self.execute(run_id, cmd, actor=Actor("owner", by), key=key)

    def transfer(self, run_id: str, action: str, to: str, *, by: str, key: str | None = None) -> Outcome:
        """Hand one of the owner's actions (review, deliver, delivered, delivery_failed,
        close) to another name."""
        cmd = C.TransferAuthority(action=action, to=to)
        return self.execute(run_id, cmd, actor=Actor("owner", by), key=key)

    def revoke(self, run_id: str, reason: str, *, lease_number: int | None = None, by: str | None = None,
               actor: Actor | None = None, key: str | None = None) -> Outcome:
        """Take the lease away; the holder's next write is refused.

        Logged as the run's owner when by names it, else as an operator.
        """
        actor = actor or self._person_actor(run_id, by)
        cmd = C.Revoke(reason=reason, lease=lease_number)
        return self.execute(run_id, cmd, actor=actor, key=key)

    def close_run(self, run_id: str, disposition: str, reason: str = "", *, by: str,
                  as_operator: bool = False, key: str | None = None) -> Outcome:
        """End a run that will not succeed: no_op, cancelled or failed."""
        cmd = C.Close(disposition=disposition, reason=reason)  # type: ignore[arg-type]
        return self.execute(run_id, cmd, actor=Actor("operator" if as_operator else "owner", by), key=key)

    def reopen(self, run_id: str, reason: str, *, by: str, as_operator: bool = False,
               key: str | None = None) -> Outcome:
        """Send a succeeded run whose latest sanitization check failed back to verifying.

        The gate refuses such a result for delivery, and after submit nobody
        else can change it; this is the owner's way forward: a worker then
        withdraws what the check found, records the result again and submits it,
        and the new result is checked again.
        """
        cmd = C.Reopen(reason=reason)
        return self.execute(run_id, cmd, actor=Actor("operator" if as_operator else "owner", by), key=key)

    def delivered(self, run_id: str, delivery_key: str, receipt: str, *, by: str | None = None) -> Outcome:
        """Record that a delivery arrived, with its receipt."""
        cmd = C.ConfirmDelivery(key=delivery_key, receipt=receipt)
        return self.execute(run_id, cmd, actor=Actor("owner", by or self.checkpoint(run_id).owner))

    def delivery_failed(self, run_id: str, delivery_key: str, error: str, *,
                        by: str | None = None) -> Outcome:
        """Record that a delivery failed; a new attempt takes a new key."""
        cmd = C.FailDelivery(key=delivery_key, error=error)
        return self.execute(run_id, cmd, actor=Actor("owner", by or self.checkpoint(run_id).owner))

    def observe(self, run_id: str, classification: str, progress_seq: int, *, watcher: str, reason: str = "",
                interval_s: float = 0.0, key: str | None = None) -> Outcome:
        """Record a watchdog's observation of a run (its classification and the progress it
        saw)."""
        cmd = C.Observe(classification=classification, progress_seq=progress_seq, reason=reason,
                        interval_s=interval_s)
        return self.execute(run_id, cmd, actor=Actor("watchdog", watcher), key=key)

    def recover(self, run_id: str, action: str, classification: str, progress_seq: int, *, watcher: str,
                reason: str = "", lease_number: int | None = None, key: str | None = None) -> Outcome:
        """Record a watchdog's recovery action on a run, with the judgement behind it."""
        cmd = C.Recover(action=action, classification=classification, progress_seq=progress_seq,
                        reason=reason, lease=lease_number)
        return self.execute(run_id, cmd, actor=Actor("watchdog", watcher), key=key)

    def effect_outcome(self, run_id: str, effect_key: str) -> dict[str, Any]:
        """What the ledger knows of a side effect's key: settled (and how), pending, or
        none.

        A resumed step asks before it starts a side effect again: settled means
        skip it, pending means look at the world and confirm first, none means
        start it.
        """
        from handoff.reducers import effects
        return effects.effect_outcome(self.checkpoint(run_id), effect_key)
    # --- end of generated code (Ledger verbs) ---

    def artifact(self, run_id: str, lease: str, path: str, *, kind: str = "result", root: str | None = None,
                 key: str | None = None, worker: str | None = None, max_bytes: int | str | None = None,
                 attrs: Mapping[str, Any] | None = None) -> Outcome:
        """Measure a file (``measure``: regular files only, at most ``max_bytes``) and record it."""
        t = lease_token(lease)
        checked = check_attrs(attrs)  # before the file is read: a refusal costs nothing
        real, size, sha, exists = measure(path, root=root, max_bytes=max_bytes)
        cmd = C.RecordArtifact(lease=t.lease, path=real, kind=kind, bytes=size, sha256=sha, exists=exists,
                               attrs=checked)
        return self.execute(run_id, cmd, actor=self.worker_actor(run_id, t, worker), key=key, token=t)

    def withdraw_artifact(self, run_id: str, path: str, reason: str, *, lease: str | None = None,
                          actor: Actor | None = None, key: str | None = None, worker: str | None = None,
                          by: str | None = None) -> Outcome:
        """Take back a recorded artifact (a mistyped path, a superseded file) so it no longer
        counts for submit; the log keeps both records. ``path`` is matched as recorded, else
        resolved the way ``artifact`` resolved it. The file itself is not touched. With
        ``lease`` it acts as that lease's worker (``worker_actor``), else as ``actor`` or the
        operator ``by`` names (``operator_name``)."""
        check_run_id(run_id)
        cp = self.checkpoint(run_id) if self.store.head(run_id) is not None else None
        if cp is not None and isinstance(path, str) and path and "\x00" not in path:
            if path not in {a.path for a in cp.artifacts}:
                path = os.path.realpath(path)
        t = None if lease is None else lease_token(lease)
        actor = self._actor(run_id, t, actor, by, worker)
        cmd = C.WithdrawArtifact(path=path, reason=reason, lease=t and t.lease)
        return self.execute(run_id, cmd, actor=actor, key=key, token=t)

    def fork(self, run_id: str, at_seq: int, *, new_run_id: str | None = None, by: str | None = None,
             key: str | None = None, actor: Actor | None = None) -> str:
        """A child run continuing ``run_id`` at ``at_seq``; with ``key`` and no id, the
        child's id follows from the key, so a retried keyed fork makes one child. Logged as
        ``actor`` (the parent's owner may fork its own run), else the operator ``by`` names."""
        check_run_id(run_id)
        check_seq(at_seq, "at_seq", low=1)
        if new_run_id is not None:
            check_run_id(new_run_id, "new_run_id")
        import secrets

        if new_run_id is None and key is not None:
            check_idempotency_key(key)
            new_run_id = keyed_id(f"{run_id[:80]}.fork{at_seq}-k", "fork", run_id, at_seq, key)
        child = f"{run_id}.fork{at_seq}-{secrets.token_hex(2)}" if new_run_id is None else new_run_id
        actor = actor or Actor("operator", operator_name(by))
        self.execute(child, C.Fork(parent=run_id, at_seq=at_seq), actor=actor, key=key)
        return child

    def watcher_beat(self, watcher: str, interval_s: float) -> AppendResult | None:
        """Record that a watcher is alive and how often it beats, in its own stream.

        ``status`` reads these beats to say truthfully whether any watcher covers a run. A
        beat is written at most every ``WATCHER_BEAT_PERIOD_S`` (or every interval, if
        longer), so a watchdog polling every few seconds adds a few thousand small events a
        day, not tens of thousands; the recorded period is what coverage is judged by.
        Returns None when no beat was due.
        """
        if not isinstance(watcher, str):
            raise InvalidInput(f"watcher must be text, got {type(watcher).__name__}", field="watcher")
        run_id = WATCHER_PREFIX + watcher
        check_run_id(run_id, "watcher")
        period = max(check_seconds(interval_s, "interval", high=1e7, low_open=True), WATCHER_BEAT_PERIOD_S)
        head = self.store.head(run_id)
        if head is not None:
            last = next(iter(self.store.read_run(run_id, after_seq=head.last_seq - 1)))
            prev = last.event
            fresh = (self.clock() - last.recorded_us) / 1e6 < period / 2
            if fresh and isinstance(prev, ev.WatchdogObserved) and prev.interval_s == period:
                return None
        beat = ev.WatchdogObserved(watcher=watcher, classification="alive", progress_seq=0, interval_s=period)
        return self.append_stream(run_id, [beat], actor=Actor("watchdog", watcher))
