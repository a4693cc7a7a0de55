"""What an action says after it ran, carried in the address only as this server signed it.

After a confirmed action the browser is sent back to the run's page (post, redirect, get),
and the page says what happened: recorded at which seq, or the ledger's refusal. Free text
in the address (``?done=...``) would let any link make the page say anything under this
server's name, so the message travels as ``?flash=PAYLOAD.MAC``: the payload names the run,
the kind (one of ``KINDS``) and the text; the MAC is an HMAC-SHA256 under a key drawn when
the process started. A value this server did not sign, or signed for another run, shows
nothing; a restart forgets every old one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

#: The kinds of message, each shown in its own style: the action was recorded, or refused.
KINDS = ("done", "refused")
#: Longest text carried (a refusal's message is a sentence or two): keeps the address short.
MAX_TEXT = 600


class Signer:
    """Signs and reads this server's flash values; one per process."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode("utf-8"), hashlib.sha256).hexdigest()

    def sign(self, run_id: str, kind: str, text: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"a flash is one of {KINDS}, not {kind!r}")
        raw = json.dumps([run_id, kind, text[:MAX_TEXT]], ensure_ascii=True, separators=(",", ":"))
        payload = base64.urlsafe_b64encode(raw.encode("ascii")).decode("ascii").rstrip("=")
        return f"{payload}.{self._mac(payload)}"

    def read(self, run_id: str, value: str) -> tuple[str, str] | None:
        """(kind, text) of a value this server signed for ``run_id``; None for anything else."""
        payload, sep, mac = value.partition(".")
        if not sep or len(value) > 4 * MAX_TEXT + 200:
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        try:
            run, kind, text = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (ValueError, TypeError):
            return None
        if run != run_id or kind not in KINDS or not isinstance(text, str):
            return None
        return kind, text
