"""What every command's handler is given, and the one way a handler moves a run.

A handler is ``(checkpoint, command, context) -> events``: it checks its command's
arguments and the run's state, and returns the events to append or raises a typed error.
decide.py picks the handler after the checks every command shares (the run exists, is not
over, the actor may issue it); the handlers live in the handle_*.py modules by what they
handle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import IllegalTransition
from handoff.ledger.store import Actor

from . import transitions as T
from .checkpoint import Checkpoint


class Context(msgspec.Struct, frozen=True):
    """Everything decide needs beyond the run's own fold, passed in by the caller.

    ``owner_load`` is how many runs the owner already has under an active lease (the
    concurrency cap); ``parent`` is the parent's checkpoint at the fork point.
    """

    actor: Actor
    owner_load: int | None = None
    parent: Checkpoint | None = None


#: A command's handler (its command's type is the second argument's).
Handler = Callable[[Checkpoint, Any, Context], list[ev.Event]]


def state_change(cp: Checkpoint, to: str, via: str, reason: str = "") -> ev.StateChanged:
    """The state change ``via`` makes to ``to``, if transitions.MOVES allows it."""
    if not T.can_move(cp.state, to, via):
        allowed = T.allowed_targets(cp.state, via)
        hint = f"from {cp.state}, {via} may move it to {', '.join(allowed)}" if allowed else f"{via} cannot move a run that is {cp.state}"
        raise IllegalTransition(
            f"run {cp.run_id} is {cp.state}; moving it to {to} by {via} is not allowed ({hint})",
            state=cp.state, to=to,
        )
    return ev.StateChanged(from_state=cp.state, to_state=to, reason=reason)
