"""Head digests: where the ledger ends, in a form to keep somewhere the file's writers cannot reach.

A digest is ``POSITION:GLOBAL_HASH``: the last global position and the hex of the
ledger-wide chain hash stored there. That hash covers every event up to the position, in
order, so a later ledger "contains" the digest exactly when the event at that position
still carries that hash and the chain up to it is intact (``verify`` walks the chain).
Events cut from the tail, or history rewritten and re-hashed, cannot pass both; growth
after the digest can. The format is plain text so a shell can keep and compare it.
"""

from __future__ import annotations

import re

from .errors import InvalidInput
from .store import GENESIS_HASH, EventStore, Problem

_DIGEST = re.compile(r"([0-9]{1,19}):([0-9a-f]{64})")


def format_digest(position: int, global_hash: bytes) -> str:
    return f"{position}:{global_hash.hex()}"


def is_digest(text: str) -> bool:
    """Whether ``text`` (stripped) is a head digest ``parse_digest`` accepts."""
    try:
        parse_digest(text)
    except InvalidInput:
        return False
    return True


def parse_digest(text: object, field: str = "expect_head") -> tuple[int, bytes]:
    """(position, global hash) from a digest string; InvalidInput naming ``field`` otherwise."""
    if not isinstance(text, str):
        raise InvalidInput(f"{field} must be a head digest string, got {type(text).__name__}", field=field)
    m = _DIGEST.fullmatch(text.strip().lower())
    if m is None:
        # What was given is described, never shown: it is often a file's contents
        # (--expect-head "$(cat FILE)"), and a wrong file may hold anything.
        raise InvalidInput(
            f"{field}: the value given ({len(text.strip())} characters) is not a head digest: "
            f"{_what_is_wrong(text.strip())}. One looks like 1234:<64 hex digits>, as printed by "
            "'handoff head'",
            field=field,
        )
    position = int(m.group(1))
    if position >= 2**63:
        raise InvalidInput(f"{field}: position {position} is out of range", field=field)
    return position, bytes.fromhex(m.group(2))


def _what_is_wrong(text: str) -> str:
    if not text:
        return "it is empty"
    position, colon, digest = text.partition(":")
    if not colon:
        return "it has no ':' between a position and a hash"
    if not (position.isascii() and position.isdigit()) or len(position) > 19:
        return "the part before ':' is not a position (a whole number)"
    if len(digest) != 64:
        return f"the hash after ':' has {len(digest)} characters, not 64"
    return "the hash after ':' is not hexadecimal"


def anchor_problem(store: EventStore, position: int, global_hash: bytes) -> Problem | None:
    """What is wrong between a kept digest and the ledger now, or None when it still holds."""
    digest = format_digest(position, global_hash)
    last, _ = store.ledger_head()
    if position > last:
        return Problem(
            "head_anchor", None, None, position,
            f"the ledger ends at position {last} but the head digest {digest} says {position}: "
            "events were cut from its tail (or this is another ledger, or an older copy). "
            "Restore from a backup taken after the digest",
        )
    stored = GENESIS_HASH if position == 0 else store.global_hash_at(position)
    if stored != global_hash:
        return Problem(
            "head_anchor", None, None, position,
            f"position {position} no longer carries the hash of the head digest {digest}: history "
            "up to it was rewritten or removed (or this is another ledger). Restore from a backup "
            "taken after the digest",
        )
    return None
