"""Hypothesis strategies for the ledger: actors, commands, events, and store envelopes.

Values come from small pools (two owners, three workers, three keys, four leases) so that
leases and idempotency keys collide often: most random commands must be refused, and a
refusal must write nothing. Nothing here touches a file or the clock.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import strategies as st

from handoff.ledger import events as ev
from handoff.ledger.store import GENESIS_HASH, Actor, Recorded, chain_hash, lease_digest
from handoff.reducers import commands as C
from handoff.reducers import transitions as T

__all__ = [
    "OWNERS", "WORKERS", "WATCHDOG", "OPERATOR", "STRANGER", "TRANSFEREES", "CLAIM_DIGEST",
    "KEYS", "PROGRESS_KINDS",
    "machine_secret", "actors", "commands", "issued", "events", "as_records",
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
#: Idempotency and side-effect keys: three, so that they repeat.
KEYS = st.sampled_from(["k1", "k2", "k3"])
_LEASES = st.integers(min_value=1, max_value=4)
#: A well-formed claim digest: pure decide tests need one for a claim to be grantable.
CLAIM_DIGEST = lease_digest("machine-secret-0000000000")


def machine_secret(n: int) -> str:
    """The n-th lease secret the machine uses: deterministic, so a failing example replays."""
    return base64.urlsafe_b64encode(hashlib.sha256(f"lease-secret-{n}".encode()).digest()).decode().rstrip("=")


#: Every progress and activity kind the rules know, and one they do not.
PROGRESS_KINDS = st.sampled_from(sorted(T.ALL_PROGRESS_KINDS | T.NOT_PROGRESS) + ["bogus_kind"])


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
    keys: st.SearchStrategy[str] = KEYS,
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
        st.builds(C.Progress, lease=leases, kind=PROGRESS_KINDS, detail=_TEXT),
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
        st.builds(C.Close, disposition=st.sampled_from(T.CLOSE_DISPOSITIONS)),
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
        st.builds(ev.ProgressRecorded, kind=PROGRESS_KINDS, advances=st.booleans()),
        st.builds(ev.ArtifactRecorded, path=st.sampled_from(["/a", "/b"]), kind=st.just("result"),
                  bytes=st.integers(0, 10), sha256=st.just("0" * 64), exists=st.booleans()),
        st.builds(ev.EvidenceRecorded, kind=_WORD, outcome=st.sampled_from(["pass", "fail", "skipped"])),
        st.builds(ev.BlockerRaised, blocker_id=st.integers(1, 4), reason=st.just("r"), next_action=st.just("n")),
        st.builds(ev.BlockerCleared, blocker_id=st.integers(1, 4), resolution=st.just("done")),
        st.builds(ev.SideEffectStarted, key=KEYS, what=st.just("send")),
        st.builds(ev.SideEffectConfirmed, key=KEYS, outcome=st.sampled_from(["done", "absent"])),
        st.builds(ev.ReconciliationRecorded, key=KEYS, outcome=st.sampled_from(["done", "absent"])),
        st.builds(ev.ResultSubmitted, artifacts=st.just(("/a",))),
        st.builds(ev.ReviewDecided, by=st.sampled_from(OWNERS), approved=st.booleans()),
        st.builds(ev.DeliveryAttempted, key=KEYS, target=st.just("chat:#ops"), by=st.sampled_from(OWNERS)),
        st.builds(ev.DeliveryConfirmed, key=KEYS, receipt=st.just("msg-1")),
        st.builds(ev.DeliveryFailed, key=KEYS, error=st.just("503")),
        st.builds(ev.RunClosed, disposition=st.sampled_from(T.CLOSE_DISPOSITIONS), by=st.sampled_from(OWNERS)),
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

