"""A fold the checkpoint keeps inside it (the delivery, the watch), run on its own.

``delivery`` and ``stall`` each state their rules once, as ``rule_for(event type)``; the
checkpoint's fold runs those rules inside its own loop, and this runs them alone, for a
caller that wants only the delivery or only the watch. One lookup per event: an event
no rule concerns returns the state itself. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded

S = TypeVar("S")
Rule = Callable[[S, Recorded, Any], S]


class SubFold(Generic[S]):
    """``evolve`` and ``fold`` of one sub-state, from its start and its rules by type."""

    def __init__(self, initial: Callable[[], S], rule_for: Callable[[type[ev.Event]], Rule | None]) -> None:
        self._initial = initial
        # Decided once per type, as the checkpoint's plans are, not once per event.
        self._by_type = {cls: rule_for(cls) for cls in ev.EVENT_TYPES.values()}

    def evolve(self, state: S, rec: Recorded, event: ev.Event) -> S:
        """Apply one event; returns ``state`` itself when the event does not concern it."""
        rule = self._by_type.get(type(event))
        return state if rule is None else rule(state, rec, event)

    def fold(self, records: Iterable[Recorded]) -> S:
        state = self._initial()
        for rec in records:
            state = self.evolve(state, rec, rec.event)
        return state
