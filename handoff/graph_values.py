"""A graph framework's state, with its values kept beside the run's log.

handoff.integrations.langgraph writes through these. A value is stored once per run
under its sha256 (``EventStore.put_values``) and the event names the digest, so the log
stays small while the state grows, and verify proves each value (handoff/verify_values.py). The
event and its values are written together by ``Ledger._with_values`` (handoff/facade.py,
beside the one write path).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput
from handoff.ledger.inputs import check_run_id
from handoff.ledger.store import Actor, EventStore, LeaseToken, value_digest
from handoff.reducers import commands as C

from .names import lease_token
from .results import Outcome


class GraphValues:
    """The graph checkpoint verbs of ``Ledger`` and the reads of its stored values."""

    store: EventStore

    def save_graph_checkpoint(
        self, run_id: str, *, thread_id: str, checkpoint_id: str, checkpoint: Mapping[str, Any],
        metadata: Mapping[str, Any], values: Mapping[str, str], new_values: Iterable[bytes] = (),
        namespace: str = "", parent_id: str = "", lease: str | None = None, actor: Actor | None = None,
        extends: Mapping[str, str] | None = None, bases: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Record a graph checkpoint (``graph_checkpoint_saved``): ``values`` maps each channel
        to the sha256 of its value; ``new_values`` are the values not stored yet (a channel
        whose version did not change names the value an earlier checkpoint stored).
        ``extends`` maps a channel whose stored value holds only the items appended since
        the parent checkpoint to the parent's version of that channel, and ``bases`` that
        channel to the sha256 of the stored value it continues. In the write's own
        transaction every value the checkpoint names without storing it, and every base,
        must be stored and not erased, or the write is refused (SeqConflict: re-read the
        run and store the value whole) and nothing is written. With
        ``lease`` (a token) it is that lease's worker's write, fenced; else ``actor`` (the
        run's owner when not given). Where the contract declares ``graph_step`` as progress,
        a checkpoint whose metadata says ``source: loop`` also records that progress."""
        t = None if lease is None else lease_token(lease)
        named = set(values.values()) if isinstance(values, Mapping) else set()
        blobs = self._new_values(new_values, named)
        cmd = C.SaveGraphCheckpoint(thread_id=thread_id, checkpoint_id=checkpoint_id, checkpoint=dict(checkpoint),
                                    metadata=dict(metadata), values=dict(values), namespace=namespace,
                                    parent_id=parent_id, lease=t and t.lease,
                                    extends=dict(extends) if extends else msgspec.UNSET)
        given = dict(bases) if isinstance(bases, Mapping) else {}

        def needed() -> set[str]:  # after decide has checked values and extends
            for channel in extends or {}:
                base = given.get(channel)
                if not isinstance(base, str) or len(base) != 64 or base.strip("0123456789abcdef"):
                    raise InvalidInput(f"extends names channel {str(channel)[:60]!r} but bases gives no sha256 of "
                                       "the stored value it continues; pass bases={channel: sha256}",
                                       field="bases")
            return {d for d in named if d not in blobs} | {given[ch] for ch in extends or {}}

        return self._with_values(run_id, cmd, blobs, t, actor, needed)

    def save_graph_writes(
        self, run_id: str, *, thread_id: str, checkpoint_id: str, task_id: str,
        writes: Iterable[tuple[int, str, bytes]], namespace: str = "", task_path: str = "",
        lease: str | None = None, actor: Actor | None = None,
    ) -> Outcome:
        """Record a graph task's writes against a saved checkpoint (``graph_writes_saved``):
        ``writes`` are (index, channel, value bytes); each value is stored under its sha256."""
        t = None if lease is None else lease_token(lease)
        blobs: dict[str, bytes] = {}
        items = []
        for i, w in enumerate(writes):
            if not (isinstance(w, tuple) and len(w) == 3 and isinstance(w[2], bytes)):
                raise InvalidInput(f"writes[{i}] must be (idx, channel, value bytes)", field="writes")
            digest = value_digest(w[2])
            blobs[digest] = w[2]
            items.append(ev.GraphWrite(idx=w[0], channel=w[1], sha256=digest))
        cmd = C.SaveGraphWrites(thread_id=thread_id, checkpoint_id=checkpoint_id, task_id=task_id,
                                writes=tuple(items), namespace=namespace, task_path=task_path, lease=t and t.lease)
        return self._with_values(run_id, cmd, blobs, t, actor)

    def erase_values(
        self, run_id: str, *, reason: str, values: Iterable[str] = (), checkpoints: Iterable[tuple[str, str]] = (),
        everything: bool = False, lease: str | None = None, actor: Actor | None = None,
        end_lease: int | None = None,
    ) -> Outcome:
        """Delete values kept beside the run's log, recording it first (``values_erased``):
        the digests, and the saved graph checkpoints (namespace, id) that go with them, or
        ``everything`` saved so far. The events that named the values stay; ``verify`` then
        reports the values as erased, naming this event. Accepted on an ended run too.

        While a worker holds the run's lease only a write under it (``lease``, its token)
        erases; the owner or an operator names the lease instead (``end_lease``, its
        number) to end it in the same write (``lease_revoked``), so the holder's next
        write is refused as stale. Anyone else gets LeaseHeld and nothing is erased."""
        t = None if lease is None else lease_token(lease)
        if end_lease is not None and t is not None:
            raise InvalidInput("pass lease (the holder's token, erasing under it) or end_lease (the owner ending "
                               "that lease), not both", field="end_lease")
        number = t.lease if t is not None else end_lease
        digests = tuple(dict.fromkeys(values))
        refs = tuple(ev.GraphRef(namespace=ns, checkpoint_id=cid) for ns, cid in checkpoints)
        cmd = C.EraseValues(reason=reason, values=digests, checkpoints=refs, everything=everything, lease=number)
        out = self.execute(run_id, cmd, actor=self._saver_actor(run_id, t, actor), token=t)
        if out.result.outcome == "committed" and digests:
            self.store.delete_values(run_id, digests)
        return out

    def values(self, run_id: str, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored bytes of each digest the run keeps beside its log (missing ones left out)."""
        check_run_id(run_id)
        return self.store.get_values(run_id, digests)

    def _new_values(self, new_values: Iterable[bytes], named: set[str]) -> dict[str, bytes]:
        blobs: dict[str, bytes] = {}
        for i, v in enumerate(new_values):
            if not isinstance(v, bytes):
                raise InvalidInput(f"new_values[{i}] must be bytes, got {type(v).__name__}", field="new_values")
            digest = value_digest(v)
            if digest not in named:
                raise InvalidInput(f"new_values[{i}] (sha256 {digest[:16]}...) is named by no channel in values; "
                                   "store only the values the checkpoint names", field="new_values")
            blobs[digest] = v
        return blobs

    def _saver_actor(self, run_id: str, t: LeaseToken | None, actor: Actor | None) -> Actor:
        if t is not None:
            return self.worker_actor(run_id, t)
        if actor is not None:
            return actor
        return Actor("owner", self.checkpoint(run_id).owner or "?")
