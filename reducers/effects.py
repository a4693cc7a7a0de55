"""What became of a side effect a run started: the answer a retried step needs.

A worker that resumes a step (after a crash, a takeover, a graph node run again) must not
start a side effect twice, and must not fail because it was settled before: it asks what
the ledger knows of the effect's key and skips, waits or reconciles by the answer. Pure:
the run's fold and the key only.
"""

from __future__ import annotations

from typing import Any

from .checkpoint import Checkpoint


def effect_outcome(cp: Checkpoint, effect_key: str) -> dict[str, Any]:
    """``{"run_id", "effect_key", "state", "outcome", "what", "started_seq", "lease"}``.

    ``state``: ``settled`` (its outcome, ``done`` or ``absent``, is recorded: skip the
    effect, it happened or is known not to have), ``pending`` (started and not settled: the
    world must be looked at and the outcome confirmed before anything else), or ``none``
    (never started under this key: start it)."""
    for key, outcome in cp.settled_effects:
        if key == effect_key:
            return {"run_id": cp.run_id, "effect_key": effect_key, "state": "settled", "outcome": outcome,
                    "what": None, "started_seq": None, "lease": None}
    for fx in cp.pending_effects:
        if fx.key == effect_key:
            return {"run_id": cp.run_id, "effect_key": effect_key, "state": "pending", "outcome": None,
                    "what": fx.what, "started_seq": fx.seq, "lease": fx.lease}
    return {"run_id": cp.run_id, "effect_key": effect_key, "state": "none", "outcome": None, "what": None,
            "started_seq": None, "lease": None}
