"""The handlers of a graph framework's checkpoints (handoff.integrations.langgraph): a
saved checkpoint, a task's pending writes, and the erasure of stored values.

While a worker holds the run's lease its graph is the one whose state the run keeps, so
a writer without that lease is refused, and an erasure by the owner ends the lease in the
same write.
"""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from handoff.ledger import events as ev
from handoff.ledger import inputs
from handoff.ledger.errors import InvalidInput, LeaseHeld, StaleLease

from . import commands as C
from . import handle_leases as leases
from . import transitions as T
from .checkpoint import Checkpoint
from .handler import Context


MAX_GRAPH_TEXT = 1_000


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


def _graph_ids(c: C.SaveGraphCheckpoint | C.SaveGraphWrites) -> tuple[str, str, str]:
    return (inputs.text("thread_id", c.thread_id, max_len=MAX_GRAPH_TEXT, empty=False),
            inputs.line("namespace", c.namespace, MAX_GRAPH_TEXT),
            inputs.name("checkpoint_id", c.checkpoint_id))


def save_graph_checkpoint(cp: Checkpoint, c: C.SaveGraphCheckpoint, ctx: Context) -> list[ev.Event]:
    _graph_writer(cp, ctx, "saving a graph checkpoint")
    thread, ns, cid = _graph_ids(c)
    parent = inputs.line("parent_id", c.parent_id, inputs.MAX_NAME)
    values = {inputs.name("values channel", k): inputs.digest(f"values[{k[:60]}]", v) for k, v in inputs.text_map("values", c.values).items()}
    metadata = inputs.text_map("metadata", c.metadata)
    inputs.plain("metadata", metadata)
    extends: dict[str, str] | UnsetType = UNSET
    if c.extends is not UNSET and c.extends:
        extends = {}
        for k, v in inputs.text_map("extends", c.extends).items():
            if k not in values:
                raise InvalidInput(f"extends names channel {k[:60]!r}, which values does not: a value can only "
                                   "continue its parent's when the checkpoint stores it", field="extends")
            if not parent:
                raise InvalidInput("extends needs parent_id: a value continues its parent checkpoint's",
                                   field="extends")
            extends[k] = inputs.name(f"extends[{k[:60]}]", v)
    out: list[ev.Event] = [ev.GraphCheckpointSaved(
        thread_id=thread, checkpoint_id=cid, checkpoint=inputs.text_map("checkpoint", c.checkpoint), metadata=metadata,
        values=values, namespace=ns, parent_id=parent, extends=extends,
    )]
    # A checkpoint that ends a step of the graph is progress, where the contract declares it.
    if metadata.get("source") == "loop" and T.GRAPH_STEP in T.progress_kinds_in(cp.state, cp.progress_kinds):
        step = metadata.get("step")
        detail = f"step {step}" if isinstance(step, int) and not isinstance(step, bool) else "a step"
        out.append(ev.ProgressRecorded(kind=T.GRAPH_STEP, detail=f"{detail} of thread {thread[:80]}"
                                       + (f" ({ns[:80]})" if ns else ""), advances=True))
    return out


def save_graph_writes(cp: Checkpoint, c: C.SaveGraphWrites, ctx: Context) -> list[ev.Event]:
    _graph_writer(cp, ctx, "saving a graph task's writes")
    thread, ns, cid = _graph_ids(c)
    task = inputs.text("task_id", c.task_id, max_len=MAX_GRAPH_TEXT, empty=False)
    if not isinstance(c.writes, (tuple, list)) or not c.writes:
        raise InvalidInput("writes must be a non-empty list of (idx, channel, sha256)", field="writes")
    writes = []
    for i, w in enumerate(c.writes):
        if not isinstance(w, ev.GraphWrite):
            raise InvalidInput(f"writes[{i}] must be a GraphWrite", field="writes")
        writes.append(ev.GraphWrite(idx=inputs.count(f"writes[{i}].idx", w.idx, low=-(2**31), high=2**31),
                                    channel=inputs.text(f"writes[{i}].channel", w.channel, max_len=inputs.MAX_NAME, empty=False),
                                    sha256=inputs.digest(f"writes[{i}].sha256", w.sha256)))
    return [ev.GraphWritesSaved(thread_id=thread, checkpoint_id=cid, task_id=task, writes=tuple(writes),
                                namespace=ns, task_path=inputs.text("task_path", c.task_path, max_len=MAX_GRAPH_TEXT))]


def erase_values(cp: Checkpoint, c: C.EraseValues, ctx: Context) -> list[ev.Event]:
    reason = inputs.name("reason", c.reason)
    values = tuple(inputs.digest(f"values[{i}]", v) for i, v in enumerate(c.values))
    refs = []
    for i, r in enumerate(c.checkpoints):
        if not isinstance(r, ev.GraphRef):
            raise InvalidInput(f"checkpoints[{i}] must be a GraphRef", field="checkpoints")
        refs.append(ev.GraphRef(namespace=inputs.text(f"checkpoints[{i}].namespace", r.namespace, max_len=MAX_GRAPH_TEXT),
                                checkpoint_id=inputs.name(f"checkpoints[{i}].checkpoint_id", r.checkpoint_id)))
    ending = _erase_ends_lease(cp, c, ctx)
    if not (values or refs or c.everything):
        return []  # nothing to erase: nothing recorded (and no lease ended)
    erased = ev.ValuesErased(reason=reason, values=values, checkpoints=tuple(refs), everything=bool(c.everything))
    if not ending:
        return [erased]
    return [*leases.lost_lease_events(cp, f"{ctx.actor} erased the run's graph values ({reason})", "revoke"), erased]


def _erase_ends_lease(cp: Checkpoint, c: C.EraseValues, ctx: Context) -> bool:
    """Whether an erasure also ends the run's lease; refuses one that may not erase now.

    While a worker holds the lease its graph is the one whose values the run keeps: only
    that worker (its write under the lease) erases them, or the owner or an operator who
    names the lease (``c.lease``) and so ends it in the same write. The holder's next
    write is then refused as stale instead of continuing values that are gone."""
    if ctx.actor.kind == T.WORKER:
        return False  # authority.check made sure the worker's lease is the current one
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
