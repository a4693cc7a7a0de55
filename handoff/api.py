"""The Python API: every operation the CLI offers, as plain calls on one ``Ledger``.

This is the only place that joins the store, the reducers and the outside world (files
to measure, the clock for "now", environment defaults). The CLI is a thin shell over it.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from ledger import events as ev
from ledger import portable
from ledger.errors import ClaimAlreadyMade, InvalidInput, StaleLease, UnknownRun
from ledger.sqlite import SqliteStore, Sync
from ledger.store import (
    Actor,
    AppendResult,
    Decision,
    Head,
    LeaseToken,
    Recorded,
    check_run_id,
    check_idempotency_key,
    check_seq,
    check_utf8,
    new_lease_secret,
)
from reducers import commands as C
from reducers import stall
from reducers.checkpoint import AGGREGATE, Checkpoint, packet
from reducers.decide import Context, decide
from projections import Projector, queries

WATCHER_PREFIX = "watcher:"
#: A watcher beats at most this often (seconds); coverage allows three missed beats.
WATCHER_BEAT_PERIOD_S = 10.0
#: The times the API accepts (UTC µs since 1970): years 1 to 9999, what can be printed.
MIN_TIME_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_TIME_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
#: The longest lock wait the API accepts (seconds): a day.
MAX_BUSY_TIMEOUT_S = 86_400.0


# --- argument checks: every refusal an InvalidInput naming the field ------------------


def check_time_us(value: object, field: str) -> int:
    """A moment as whole UTC microseconds (not a bool) within years 1..9999."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_TIME_US <= value <= MAX_TIME_US:
        shown = repr(value)[:60]
        raise InvalidInput(
            f"{field} must be whole microseconds since 1970 (UTC) within years 1 to 9999, got {shown}",
            field=field,
        )
    return value


def check_seconds(value: object, field: str, *, low: float = 0.0, high: float = MAX_BUSY_TIMEOUT_S,
                  low_open: bool = False) -> float:
    """A finite number of seconds (not a bool) within bounds."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (low < value if low_open else low <= value) and value <= high)
    if not ok:
        shown = repr(value)[:60]
        above = "above" if low_open else "at least"
        raise InvalidInput(f"{field} must be a finite number of seconds {above} {low:g} and at most {high:g}, "
                           f"got {shown}", field=field)
    return float(value)  # type: ignore[arg-type]


def check_text(value: object, field: str, _depth: int = 0) -> None:
    """Every string in a command (its fields, their tuples, nested structs) must encode as
    UTF-8: a lone surrogate (invalid UTF-8 from argv, say) would otherwise pass decide and
    fail while the event is encoded. Types themselves are decide's business."""
    if isinstance(value, str):
        check_utf8(value, field)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            if isinstance(item, str):
                check_utf8(item, f"{field}[{i}]")
    elif isinstance(value, msgspec.Struct) and _depth < 3:
        for name in value.__struct_fields__:
            check_text(getattr(value, name), f"{field}.{name}" if field else name, _depth + 1)


def check_filter(value: object, field: str) -> str | None:
    """An optional text filter of a query (owner, state, ...): None, or UTF-8 text."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, got {type(value).__name__}", field=field)
    return check_utf8(value, field)


def check_path(path: object, field: str = "path") -> str:
    """A ledger file name: text or a path object, not empty, without NUL bytes."""
    try:
        p = os.fspath(path)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidInput(f"{field} must be a file path, got {type(path).__name__}", field=field) from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or "\x00" in p:
        raise InvalidInput(f"{field} must be a non-empty file path without NUL bytes", field=field)
    return p


class Outcome(msgspec.Struct, frozen=True):
    """What a command did: the append result and the run's checkpoint right after it."""

    result: AppendResult
    checkpoint: Checkpoint

    @property
    def duplicate(self) -> bool:
        return self.result.outcome == "duplicate"


class Claimed(msgspec.Struct, frozen=True):
    """What a claim got: the lease token (shown this once, never stored) and the write."""

    token: LeaseToken
    outcome: Outcome


def lease_token(value: object, field: str = "lease") -> LeaseToken:
    """The lease token a worker passed, or InvalidInput (a bare lease number is not one)."""
    return LeaseToken.parse(value, field)


def now_us() -> int:
    return time.time_ns() // 1000


def new_run_id() -> str:
    import secrets  # imported when needed: CLI start-up time is what a shell agent pays per event

    return "run-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def keyed_id(prefix: str, *parts: object) -> str:
    """A run id derived from an idempotency key and what it is scoped to: the same key
    always names the same run, so a retried keyed ``open`` or ``fork`` finds its first
    attempt (and answers ``duplicate``) instead of creating a second run."""
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}{digest[:24]}"


def measure(path: str, *, root: str | None = None) -> tuple[str, int, str, bool]:
    """(resolved path, size, sha256, exists) of an artifact, read by the ledger itself.

    Refuses directories, FIFOs and devices (reading them could hang or mean nothing),
    and, when ``root`` is given, any path that resolves outside it (``..``, symlinks).
    """
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidInput("artifact path must be a non-empty path without NUL bytes", field="path")
    real = os.path.realpath(path)
    if root is not None:
        base = os.path.realpath(root)
        if os.path.commonpath([base, real]) != base:
            raise InvalidInput(
                f"artifact {path} resolves to {real}, outside the declared root {base}", field="path"
            )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, 0, "", False
    except OSError as exc:
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InvalidInput(f"artifact {path} is {kind}; record a regular file", field="path")
    h = hashlib.sha256()
    size = 0
    with open(real, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return real, size, h.hexdigest(), True


class Ledger:
    """A handoff ledger in one SQLite file. Open it, issue commands, read packets.

    >>> lg = Ledger("handoff.db")                                   # doctest: +SKIP
    >>> run = lg.open(goal="Draft the report", target="chat:#ops", owner="alice")
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = "handoff.db",
        *,
        synchronous: Sync = "FULL",
        busy_timeout_s: float = 5.0,
        readonly: bool = False,
        create: bool = True,
        clock: Any = None,
    ) -> None:
        path = check_path(path)
        busy_timeout_s = check_seconds(busy_timeout_s, "busy_timeout")
        self.clock = clock or now_us
        self.store = SqliteStore(
            path, synchronous=synchronous, busy_timeout_s=busy_timeout_s,
            readonly=readonly, create=create, clock=self.clock,
        )
        try:
            self.projector = Projector(self.store)
        except BaseException:
            self.store.close()
            raise

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the one write path ----------------------------------------------------------

    def execute(
        self, run_id: str, cmd: C.Command, *, actor: Actor, key: str | None = None,
        token: str | None = None,
    ) -> Outcome:
        """Fold, decide and append in one write transaction; refusals write nothing.

        A worker's command that names a lease needs ``token``, that lease's token from
        ``claim``: the store checks it before anything else is decided.
        """
        check_run_id(run_id)
        check_text(cmd, "")
        number = getattr(cmd, "lease", None)
        if token is not None:
            token = lease_token(token, "token")
            if number is not None and number != token.lease:
                raise InvalidInput(
                    f"the command names lease {number} but the token is for lease {token.lease}; "
                    "pass the token's own lease", field="lease",
                )
        elif actor.kind == "worker" and number is not None:
            raise StaleLease(
                f"a worker's write under lease {number} of run {run_id} must carry that lease's "
                "token (token=, what claim returned); a lease number alone proves nothing",
                run_id=run_id, lease=number, why="no_token",
            )

        def _decide(cp: Checkpoint, head: Head | None) -> Decision:
            load = None
            parent = None
            if isinstance(cmd, C.Claim) and cp.opened:
                load = self._owner_load_locked(cp.owner, exclude=run_id)
            if isinstance(cmd, C.Fork):
                check_run_id(cmd.parent, "parent")
                if self.store.head(cmd.parent) is not None:
                    parent = self.store.fold(cmd.parent, AGGREGATE, until_seq=cmd.at_seq)
            events = decide(cp, cmd, Context(actor=actor, owner_load=load, parent=parent))
            lease = getattr(cmd, "lease", None) if actor.kind == "worker" else None
            return Decision(tuple(events), lease=lease)

        result, state = self.store.execute(
            run_id, AGGREGATE, _decide, actor=actor, idempotency_key=key,
            digest_of=C.request_bytes(cmd) if key else None, lease=token,
        )
        return Outcome(result, state)

    def _owner_load_locked(self, owner: str, *, exclude: str) -> int:
        # Read inside the claim's own write transaction, so two racing claims see each other.
        return queries.owner_load(self.store, owner, exclude=exclude)

    # --- verbs -------------------------------------------------------------------------

    def open(
        self, *, goal: str, target: str, owner: str, origin: str = "", run_id: str | None = None,
        result_path: str | None = None, stop_rules: tuple[str, ...] = (), require_review: bool = False,
        heartbeat_timeout_s: float = 60.0, progress_timeout_s: float = 300.0, retry_budget: int = 3,
        delivery_timeout_s: float = 600.0, owner_cap: int = 10, key: str | None = None,
        actor: Actor | None = None,
    ) -> str:
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
                     stop_rules=tuple(stop_rules), require_review=require_review, policy=policy)
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
            key=key,
        )

    def claim(self, run_id: str, worker: str, *, key: str | None = None) -> LeaseToken:
        """Take the run's lease and return its token: ``"<lease>.<secret>"``, a ``str``.

        Every later write under the lease passes it (``lg.progress(run, token, ...)``);
        ``token.lease`` is the number status shows. Only a digest is stored, so this is the
        one time the token can be seen: a retried keyed claim cannot show it again and
        raises ClaimAlreadyMade instead (see ``claim_outcome``).
        """
        return self.claim_outcome(run_id, worker, key=key).token

    def claim_outcome(self, run_id: str, worker: str, *, key: str | None = None) -> Claimed:
        """``claim`` with the write it made (for the CLI's --json)."""
        secret, digest = new_lease_secret()
        cmd = C.Claim(worker=worker, token_digest=digest)
        out = self.execute(run_id, cmd, actor=Actor("worker", worker), key=key)
        if out.duplicate:
            raise self._claim_already_made(run_id, key, out)
        lease = out.checkpoint.lease
        assert lease is not None  # a committed claim ends with its own lease current
        return Claimed(LeaseToken(f"{lease}.{secret}"), out)

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
                     f"'handoff revoke {run_id} --lease {n}', then claim with a new key")
        elif cp.lease is not None:
            state = "moved_on"
            said += (f"Lease {n} has ended and another claim holds the run now; this worker does "
                     "not hold it and must not write to it")
        else:
            state = "ended"
            said += (f"Lease {n} has ended and no lease is held now: claim again with a new key "
                     "to take the run")
        return ClaimAlreadyMade(said, run_id=run_id, lease=n, seq=seq, state=state)

    def _worker(self, worker: str | None) -> Actor:
        return Actor("worker", worker or os.environ.get("HANDOFF_WORKER") or "worker")

    # A worker's ``lease`` below is the token claim returned; a bare number is refused.

    def heartbeat(self, run_id: str, lease: str, *, worker: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Heartbeat(lease=t.lease), actor=self._worker(worker), token=t)

    def transition(self, run_id: str, lease: str, to: str, *, reason: str = "", worker: str | None = None, key: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Transition(lease=t.lease, to=to, reason=reason), actor=self._worker(worker),
                            key=key, token=t)

    def progress(self, run_id: str, lease: str, kind: str, detail: str = "", *, key: str | None = None, worker: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Progress(lease=t.lease, kind=kind, detail=detail), actor=self._worker(worker),
                            key=key, token=t)

    def artifact(self, run_id: str, lease: str, path: str, *, kind: str = "result", root: str | None = None,
                 key: str | None = None, worker: str | None = None) -> Outcome:
        t = lease_token(lease)
        real, size, sha, exists = measure(path, root=root)
        cmd = C.RecordArtifact(lease=t.lease, path=real, kind=kind, bytes=size, sha256=sha, exists=exists)
        return self.execute(run_id, cmd, actor=self._worker(worker), key=key, token=t)

    def evidence(self, run_id: str, kind: str, outcome: str, detail: str = "", *, lease: str | None = None,
                 actor: Actor | None = None, key: str | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = actor or (self._worker(None) if t is not None else Actor("operator", _user()))
        cmd = C.RecordEvidence(kind=kind, outcome=outcome, detail=detail, lease=t and t.lease)  # type: ignore[arg-type]
        return self.execute(run_id, cmd, actor=actor, key=key, token=t)

    def block(self, run_id: str, reason: str, next_action: str, *, lease: str | None = None,
              actor: Actor | None = None, key: str | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = actor or (self._worker(None) if t is not None else Actor("operator", _user()))
        return self.execute(run_id, C.Block(reason=reason, next_action=next_action, lease=t and t.lease),
                            actor=actor, key=key, token=t)

    def unblock(self, run_id: str, resolution: str, *, blocker_id: int | None = None, lease: str | None = None,
                actor: Actor | None = None, key: str | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = actor or (self._worker(None) if t is not None else Actor("operator", _user()))
        return self.execute(run_id, C.Unblock(resolution=resolution, blocker_id=blocker_id, lease=t and t.lease),
                            actor=actor, key=key, token=t)

    def effect_start(self, run_id: str, lease: str, key: str, what: str, *, worker: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.StartEffect(lease=t.lease, key=key, what=what), actor=self._worker(worker), token=t)

    def effect_confirm(self, run_id: str, key: str, outcome: str, *, note: str = "", lease: str | None = None,
                       actor: Actor | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = actor or (self._worker(None) if t is not None else Actor("operator", _user()))
        cmd = C.ConfirmEffect(key=key, outcome=outcome, note=note, lease=t and t.lease)  # type: ignore[arg-type]
        return self.execute(run_id, cmd, actor=actor, token=t)

    def submit(self, run_id: str, lease: str, summary: str = "", *, worker: str | None = None, key: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Submit(lease=t.lease, summary=summary), actor=self._worker(worker), key=key, token=t)

    def review(self, run_id: str, by: str, approve: bool, notes: str = "", *, key: str | None = None) -> Outcome:
        return self.execute(run_id, C.ReviewResult(approve=approve, notes=notes), actor=Actor("owner", by), key=key)

    def transfer(self, run_id: str, action: str, to: str, *, by: str, key: str | None = None) -> Outcome:
        return self.execute(run_id, C.TransferAuthority(action=action, to=to), actor=Actor("owner", by), key=key)

    def deliver(self, run_id: str, by: str, key: str) -> Outcome:
        """Record a delivery attempt under ``key``; retrying the same key sends nothing twice."""
        # No idempotency key on purpose: decide itself treats a retry of a pending or
        # confirmed attempt as a no-op and refuses a key that already failed.
        return self.execute(run_id, C.Deliver(key=key), actor=Actor("owner", by))

    def delivered(self, run_id: str, key: str, receipt: str, *, by: str | None = None) -> Outcome:
        cp = self.checkpoint(run_id)
        return self.execute(run_id, C.ConfirmDelivery(key=key, receipt=receipt), actor=Actor("owner", by or cp.owner))

    def delivery_failed(self, run_id: str, key: str, error: str, *, by: str | None = None) -> Outcome:
        cp = self.checkpoint(run_id)
        return self.execute(run_id, C.FailDelivery(key=key, error=error), actor=Actor("owner", by or cp.owner))

    def release(self, run_id: str, lease: str, reason: str = "", *, worker: str | None = None,
                key: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Release(lease=t.lease, reason=reason), actor=self._worker(worker), token=t,
                            key=key)

    def revoke(self, run_id: str, reason: str, *, lease: int | None = None, actor: Actor | None = None,
               key: str | None = None) -> Outcome:
        return self.execute(run_id, C.Revoke(reason=reason, lease=lease), actor=actor or Actor("operator", _user()), key=key)

    def close_run(self, run_id: str, by: str, disposition: str, reason: str = "", *, as_operator: bool = False,
                  key: str | None = None) -> Outcome:
        actor = Actor("operator" if as_operator else "owner", by)
        return self.execute(run_id, C.Close(disposition=disposition, reason=reason), actor=actor, key=key)  # type: ignore[arg-type]

    def fork(self, run_id: str, at_seq: int, *, new_run_id: str | None = None, by: str | None = None,
             key: str | None = None) -> str:
        """A child run continuing ``run_id`` at ``at_seq``; with ``key`` and no id, the
        child's id follows from the key, so a retried keyed fork makes one child."""
        check_run_id(run_id)
        check_seq(at_seq, "at_seq", low=1)
        import secrets

        if new_run_id is None and key is not None:
            check_idempotency_key(key)
            new_run_id = keyed_id(f"{run_id[:80]}.fork{at_seq}-k", "fork", run_id, at_seq, key)
        child = f"{run_id}.fork{at_seq}-{secrets.token_hex(2)}" if new_run_id is None else new_run_id
        actor = Actor("operator", by or _user())
        self.execute(child, C.Fork(parent=run_id, at_seq=at_seq), actor=actor, key=key)
        return child

    def observe(self, run_id: str, watcher: str, classification: str, progress_seq: int, *, reason: str = "",
                interval_s: float = 0.0, key: str | None = None) -> Outcome:
        cmd = C.Observe(classification=classification, progress_seq=progress_seq, reason=reason, interval_s=interval_s)
        return self.execute(run_id, cmd, actor=Actor("watchdog", watcher), key=key)

    def recover(self, run_id: str, watcher: str, action: str, classification: str, progress_seq: int, *,
                reason: str = "", key: str | None = None, lease: int | None = None) -> Outcome:
        cmd = C.Recover(action=action, classification=classification, progress_seq=progress_seq,
                        reason=reason, lease=lease)
        return self.execute(run_id, cmd, actor=Actor("watchdog", watcher), key=key)

    # --- reading -----------------------------------------------------------------------

    def checkpoint(self, run_id: str, *, at_seq: int | None = None, as_of_us: int | None = None) -> Checkpoint:
        check_run_id(run_id)
        if at_seq is not None:
            check_seq(at_seq, "at", low=1)
        if as_of_us is not None:
            check_time_us(as_of_us, "as_of")
        if self.store.head(run_id) is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}; list runs with 'handoff status'")
        if as_of_us is not None:
            at_seq = 0
            for rec in self.store.read_run(run_id):
                if rec.recorded_us > as_of_us:
                    break
                at_seq = rec.seq
            if at_seq == 0:
                raise InvalidInput(f"run {run_id} did not exist yet at that time", field="as_of")
        if at_seq is not None and at_seq < 1:
            raise InvalidInput("--at must be a seq of 1 or more", field="at")
        if at_seq is None:
            cp = queries.checkpoint(self.store, run_id)
            if cp is not None:
                return cp
        return self.store.fold(run_id, AGGREGATE, until_seq=at_seq)

    def watchers(self, *, until_us: int | None = None) -> dict[str, tuple[int, float]]:
        """Each watcher's last beat (µs) and beat period, from its own stream in the log.

        With ``until_us`` (replay), only beats recorded at or before that moment count, so
        a replayed packet never claims coverage by a watcher that started later.
        """
        out: dict[str, tuple[int, float]] = {}
        for head in self.store.list_runs(prefix=WATCHER_PREFIX):
            start = 0 if until_us is not None else head.last_seq - 1
            for rec in self.store.read_run(head.run_id, after_seq=start):
                if until_us is not None and rec.recorded_us > until_us:
                    break
                e = rec.event
                if isinstance(e, ev.WatchdogObserved):
                    out[e.watcher] = (rec.recorded_us, e.interval_s)
        return out

    def status(self, run_id: str, *, now: int | None = None, at_seq: int | None = None,
               as_of_us: int | None = None) -> dict[str, Any]:
        """The checkpoint packet (docs/cli.md documents its keys)."""
        if now is not None:
            check_time_us(now, "now")
        cp = self.checkpoint(run_id, at_seq=at_seq, as_of_us=as_of_us)
        when = now if now is not None else (as_of_us if as_of_us is not None else self.clock())
        if at_seq is not None and as_of_us is None and now is None:
            when = cp.last_event_us or when
        replaying = at_seq is not None or as_of_us is not None
        return packet(cp, now_us=when, watchers=self.watchers(until_us=when if replaying else None))

    def runs(self, *, include_terminal: bool = False, state: str | None = None,
             owner: str | None = None, target: str | None = None) -> Iterator[Checkpoint]:
        """Runs from the checkpoints view, oldest first (not terminal unless asked)."""
        for field, value in (("state", state), ("owner", owner), ("target", target)):
            check_filter(value, field)
        return queries.runs(self.store, state=state, owner=owner, target=target,
                            include_terminal=include_terminal)

    def stalls(self, *, now: int | None = None) -> list[tuple[Checkpoint, stall.Health]]:
        """Every run that needs attention at ``now``: an index scan, then classify each candidate."""
        when = check_time_us(now, "now") if now is not None else self.clock()
        out = []
        for cp in queries.stall_candidates(self.store, when):
            h = stall.classify(cp, now_us=when)
            if h.needs_attention:
                out.append((cp, h))
        return out

    def owner_load(self, owner: str) -> int:
        check_filter(owner, "owner")
        return queries.owner_load(self.store, owner)

    def deliveries(self, *, status: str | None = None, now: int | None = None) -> list[dict[str, Any]]:
        check_filter(status, "status")
        when = check_time_us(now, "now") if now is not None else self.clock()
        return queries.deliveries(self.store, now_us=when, status=status)

    def rebuild(self, name: str | None = None, *, progress: Any = None) -> dict[str, int]:
        """Drop and refold one projection (or all) from the log; atomic, memory flat."""
        return self.projector.rebuild(None if name is None else [name], progress=progress)

    def check(self, name: str | None = None, *, progress: Any = None) -> list[dict[str, Any]]:
        """Differences between the kept projections and a fresh fold of the log."""
        return self.projector.check(None if name is None else [name], progress=progress)

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
        return self.store.append(run_id, [beat], actor=Actor("watchdog", watcher))

    def verify(self, run_id: str | None = None, *, progress: Any = None) -> list[Any]:
        """Hash chain, seq gaps, decodability and heads; an empty list means all is well."""
        if run_id is not None:
            check_run_id(run_id)
            # Unknown means no head and no events: a run whose head row alone is gone is
            # damage for verify to report, not an unknown run.
            if self.store.head(run_id) is None and next(iter(self.store.read_run(run_id)), None) is None:
                raise UnknownRun(f"no run {run_id} in {self.store.path}; nothing to verify "
                                 "(list runs with 'handoff status --all')")
        return self.store.verify(run_id, progress=progress)

    def export(self, run_ids: list[str] | None = None) -> Iterator[bytes]:
        """Each event as one JSON line (docs/cli.md), in global order; forks bring their parents.

        A forked run cannot be imported without the parent history it folds, so asking
        for a child exports its ancestors' events too.
        """
        wanted: list[str] | None = None
        if run_ids is not None:
            wanted = []
            for rid in run_ids:
                check_run_id(rid)
                if self.store.head(rid) is None:
                    raise UnknownRun(f"no run {rid} in {self.store.path}; nothing exported")
                while rid is not None and rid not in wanted:
                    wanted.append(rid)
                    first = next(iter(self.store.read_run(rid, until_seq=1)), None)
                    fork = first.event if first is not None else None
                    rid = fork.parent if isinstance(fork, ev.RunForked) else None
        for rec, digest, size in self.store.read_for_export(wanted):
            yield portable.to_line(rec, digest, size)

    def import_lines(self, lines: Any) -> dict[str, int]:
        """Verify every line's hash chain, then insert all of it or none of it.

        Importing the same export twice changes nothing the second time.
        """
        parsed = [(rec, digest, size) for _, rec, digest, size in portable.parse_lines(lines)]
        return self.store.import_records(parsed)

    def doctor(self) -> dict[str, Any]:
        """Facts about the file and the SQLite library underneath, for support and audits."""
        import sqlite3

        conn = self.store._conn
        version = sqlite3.sqlite_version
        affected = tuple(int(x) for x in version.split(".")[:3]) < (3, 51, 3)
        pragma = lambda name: conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
        return {
            "path": os.path.abspath(self.store.path),
            "sqlite_version": version,
            "wal_reset_bug": {
                "affected_version": affected,
                "mitigation": "automatic checkpoints off; checkpoints run only in RESTART mode, "
                "which holds the writer lock (docs/architecture.md)",
            },
            "journal_mode": pragma("journal_mode"),
            "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(pragma("synchronous")),
            "wal_autocheckpoint": pragma("wal_autocheckpoint"),
            "events": self.store.last_position(),
            "runs": self.store.count_runs(),
            "projections": self.projector.positions(),
        }

    def log(self, run_id: str) -> Iterator[Recorded]:
        check_run_id(run_id)
        if self.store.head(run_id) is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}")
        return self.store.read_run(run_id)


def _user() -> str:
    return os.environ.get("HANDOFF_ACTOR") or os.environ.get("USER") or "operator"
