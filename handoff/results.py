"""What the Ledger's calls return: frozen structs a caller can keep, compare and print.

Kept apart from the methods that build them, so the async face, the CLI and the
integrations name a result without loading the parts of ``Ledger`` that make it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.store import AppendResult, LeaseToken
from handoff.reducers.checkpoint import Checkpoint

class Preview(msgspec.Struct, frozen=True):
    """What a command would do (``Ledger.preview``): ``would_commit`` these events,
    ``unchanged`` (nothing to add), or ``duplicate`` (its key was already used for it)."""

    outcome: str
    events: tuple[ev.Event, ...]
    #: For ``duplicate``: what the earlier write under the key recorded.
    result: AppendResult | None = None


class Outcome(msgspec.Struct, frozen=True):
    """What a command did: the append result and the run's checkpoint right after it."""

    result: AppendResult
    checkpoint: Checkpoint

    @property
    def duplicate(self) -> bool:
        """True when nothing new was written: a replayed idempotency key (outcome
        ``duplicate``) or a command with nothing to add (outcome ``unchanged``).

        Kept this broad on purpose, so code written as ``if not out.duplicate: send()``
        never acts twice; ``result.outcome`` tells the two cases apart."""
        return self.result.outcome != "committed"

    @property
    def unchanged(self) -> bool:
        """The command was accepted but had nothing to add (no idempotency key replayed)."""
        return self.result.outcome == "unchanged"


class Sent(msgspec.Struct, frozen=True):
    """What ``send_delivery`` came to: ``status`` confirmed, failed or unknown; ``sent``
    whether anything was sent by this call (false for a key already confirmed)."""

    status: str
    sent: bool
    receipt: str
    error: str
    tries: int
    checkpoint: Checkpoint


class Page(msgspec.Struct, frozen=True):
    """One page of a listing: its entries in listing order, the cursor to pass as
    ``after=`` for the next page (None when nothing follows) and how many entries follow."""

    items: tuple[Any, ...]
    next: str | None
    more: int


#: How many entries a listing page holds unless the caller says otherwise.
DEFAULT_PAGE = 100

class Claimed(msgspec.Struct, frozen=True):
    """What a claim got: the lease token (shown this once, never stored) and the write."""

    token: LeaseToken
    outcome: Outcome
