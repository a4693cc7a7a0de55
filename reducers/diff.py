"""Two runs side by side: where their histories part, and what differs after that.

A fork and its origin, or two attempts at the same goal, are compared step by step over
their histories (a fork's inherited prefix first, as every fold reads it). Heartbeats
are left out of the alignment: they say a worker was alive, not what it did, and two
honest attempts never beat the same number of times. A step matches when its event type
and payload are equal, except a lease grant's token digest, which is a fresh secret's
digest in every claim. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded

from . import checkpoint as ckp
from . import delivery as dl

#: Payload fields that differ between any two claims and mean nothing for a comparison.
IGNORED_FIELDS = {"lease_granted": ("token_digest",)}


def _step(rec: Recorded, event: ev.Event) -> tuple[str, dict[str, Any]]:
    data = msgspec.to_builtins(event)
    for name in IGNORED_FIELDS.get(rec.type, ()):
        data.pop(name, None)
    return rec.type, data


def _where(rec: Recorded | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {"run_id": rec.run_id, "seq": rec.seq, "type": rec.type, "at": ckp.iso(rec.recorded_us)}


def _clip(value: Any, limit: int = 200) -> Any:
    text = value if isinstance(value, str) else repr(value)
    return value if len(text) <= limit else text[: limit - 1] + "…"


class _Side:
    """One run's fold, and the steps kept for the alignment."""

    def __init__(self, run_id: str) -> None:
        self.cp = ckp.initial(run_id)
        self.steps: list[tuple[Recorded, tuple[str, dict[str, Any]]]] = []
        self.beats = 0

    def take(self, records: Iterable[Recorded]) -> None:
        for rec in records:
            e = rec.event
            self.cp = ckp.evolve(self.cp, rec, e)
            if isinstance(e, ev.HeartbeatRecorded):
                self.beats += 1
            else:
                self.steps.append((rec, _step(rec, e)))


def _divergence(a: _Side, b: _Side) -> tuple[int, dict[str, Any] | None]:
    n = min(len(a.steps), len(b.steps))
    i = 0
    while i < n and a.steps[i][1] == b.steps[i][1]:
        i += 1
    if i == n and len(a.steps) == len(b.steps):
        return i, None
    ra = a.steps[i][0] if i < len(a.steps) else None
    rb = b.steps[i][0] if i < len(b.steps) else None
    differs: list[dict[str, Any]] = []
    if ra is None or rb is None:
        longer, rest = ("b", len(b.steps) - i) if ra is None else ("a", len(a.steps) - i)
        what = f"run {'a' if ra is None else 'b'} ends here; run {longer} goes on with {rest} more event(s)"
    else:
        (ta, da), (tb, db) = a.steps[i][1], b.steps[i][1]
        if ta != tb:
            what = f"run a has {ta} where run b has {tb}"
            differs.append({"field": "type", "a": ta, "b": tb})
        else:
            fields = [k for k in dict.fromkeys([*da, *db]) if da.get(k) != db.get(k)]
            differs.extend({"field": k, "a": _clip(da.get(k)), "b": _clip(db.get(k))} for k in fields)
            what = f"both have {ta}, with different {', '.join(fields)}"
    return i, {"step": i + 1, "a": _where(ra), "b": _where(rb), "what": what, "differs": differs}


def _facts(cp: ckp.Checkpoint) -> dict[str, Any]:
    d = cp.delivery
    return {
        "state": cp.state, "progress_seq": cp.progress_seq,
        "artifacts": {a.path: a.sha256 for a in cp.artifacts},
        "evidence": {e.kind: e.outcome for e in cp.evidence},
        "delivery": {"status": dl.stage(d, ready=cp.delivery_ready), "key": d.confirmed_key, "receipt": d.receipt,
                     "attempts": len(d.attempts)},
    }


def compare(history_a: Iterable[Recorded], history_b: Iterable[Recorded], run_a: str, run_b: str) -> dict[str, Any]:
    """The comparison ``handoff diff --json`` prints (docs/cli.md documents its keys)."""
    a, b = _Side(run_a), _Side(run_b)
    a.take(history_a)
    b.take(history_b)
    i, first = _divergence(a, b)
    fa, fb = _facts(a.cp), _facts(b.cp)
    arts_a, arts_b = fa["artifacts"], fb["artifacts"]
    after = {
        "state": {"a": fa["state"], "b": fb["state"]},
        "progress_seq": {"a": fa["progress_seq"], "b": fb["progress_seq"]},
        "artifacts": {
            "only_a": sorted(p for p in arts_a if p not in arts_b),
            "only_b": sorted(p for p in arts_b if p not in arts_a),
            "changed": sorted(p for p in arts_a if p in arts_b and arts_a[p] != arts_b[p]),
            "same": sorted(p for p in arts_a if arts_b.get(p) == arts_a[p]),
        },
        "evidence": {k: {"a": fa["evidence"].get(k), "b": fb["evidence"].get(k)}
                     for k in sorted({*fa["evidence"], *fb["evidence"]})
                     if fa["evidence"].get(k) != fb["evidence"].get(k)},
        "delivery": {"a": fa["delivery"], "b": fb["delivery"]},
        "events_after": {"a": dict(Counter(t for _, (t, _) in a.steps[i:])),
                         "b": dict(Counter(t for _, (t, _) in b.steps[i:]))},
    }
    return {
        "run_a": run_a, "run_b": run_b, "same": first is None,
        "compared": {"a": len(a.steps), "b": len(b.steps)}, "heartbeats": {"a": a.beats, "b": b.beats},
        "common_steps": i, "first_divergence": first, "after": after,
    }
