"""Decide: turn a command into events, or refuse it with a typed error and write nothing.

``decide(state, command, context)`` reads the checkpoint fold and the tables in
transitions.py and nothing else: no I/O, no clock. The store calls it inside the write
transaction that appends its events, so a check and the write it guards cannot be split
by another writer.

This module holds the checks every command shares (the run exists and has not ended, the
actor may issue it: authority.py) and the dispatch to one handler per command (the
handle_*.py modules); the argument checks the handlers use are handoff/ledger/inputs.py's.
"""

from __future__ import annotations

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput, RunExists, TerminalRun, UnknownRun

from . import authority
from . import commands as C
from . import handle_graph as graph
from . import handle_leases as leases
from . import handle_result as result
from . import handle_work as work
from . import transitions as T
from .checkpoint import Checkpoint
from .handler import Context, Handler

__all__ = ["HANDLERS", "Context", "decide"]

#: The handler of each command.
HANDLERS: dict[type[C.Command], Handler] = {
    C.Open: work.open_run, C.Claim: leases.claim, C.Heartbeat: work.heartbeat, C.Transition: work.transition,
    C.Progress: work.progress, C.RecordArtifact: work.artifact, C.RecordEvidence: work.evidence,
    C.Block: work.block, C.Unblock: work.unblock, C.StartEffect: work.effect_start,
    C.ConfirmEffect: work.effect_confirm, C.Submit: work.submit, C.ReviewResult: result.review,
    C.TransferAuthority: result.transfer, C.Deliver: result.deliver, C.ConfirmDelivery: result.delivered,
    C.FailDelivery: result.delivery_failed, C.RecordUnanswered: result.unanswered, C.Sanitize: result.sanitize,
    C.Release: leases.release, C.Revoke: leases.revoke, C.Close: result.close,
    C.Fork: work.fork, C.Observe: leases.observe, C.Recover: leases.recover,
    C.WithdrawArtifact: work.withdraw_artifact, C.Reopen: result.reopen,
    C.SaveGraphCheckpoint: graph.save_graph_checkpoint, C.SaveGraphWrites: graph.save_graph_writes,
    C.EraseValues: graph.erase_values,
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
    authority.check(guard, name, cmd, ctx.actor)
    return handler(cp, cmd, ctx)
