"""Sending a result to its target: the bundle that is sent, the adapters that send it.

``bundle`` reads the recorded artifacts (checked against the digests the log holds) into
the exact bytes a delivery sends; ``adapters`` sends them to a webhook, a directory or a
command and says what came back: confirmed, failed, or unknown. The ledger's side (record
the attempt, send, record the outcome) is ``Ledger.deliver(send=True)`` in handoff/delivering.py.
See docs/delivery.md.
"""

from .adapters import SendResult, adapter_for
from .bundle import Bundle, build

__all__ = ["Bundle", "SendResult", "adapter_for", "build"]
