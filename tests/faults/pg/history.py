"""Every client operation of a fault test, and the checker run over them afterwards.

A client process writes one JSON line per attempt, *before* the call (``invoked``) and
after it (``ok`` with the outcome and seqs, ``failed`` with the error type, or
``unknown`` for OutcomeUnknown). A client killed between the two lines leaves an
``invoked`` attempt with no answer: that is an unknown too. The checker then reads the
whole log and proves, key by key:

- every ``ok`` key is in the log exactly once, at the seq the client was told;
- a key whose attempts all ``failed`` is not in the log at all (failed = nothing written);
- a ``failed`` attempt is never followed by a ``duplicate`` unless an unknown came
  between (else the failure did write);
- every unknown is resolved by its key: retried with the same key now, it answers
  ``duplicate`` if it is in the log and ``committed`` if it is not, after which it is
  there exactly once;
- the log itself: no key twice, seqs contiguous per run, ``verify`` clean.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from handoff.ledger.errors import LedgerError, OutcomeUnknown


class Recorder:
    """One client's history file (JSON lines, flushed per line)."""

    def __init__(self, path: str, client: str) -> None:
        self.f = open(path, "a", encoding="utf-8")
        self.client = client

    def _line(self, **rec: Any) -> None:
        self.f.write(json.dumps({"client": self.client, **rec}) + "\n")
        self.f.flush()

    def call(self, run: str, key: str, fn: Callable[[], Any]) -> str:
        """Run one keyed operation and record it; return its status."""
        self._line(status="invoked", run=run, key=key)
        try:
            out = fn()
        except OutcomeUnknown as exc:
            self._line(status="unknown", run=run, key=key, error=exc.type)
            return "unknown"
        except LedgerError as exc:
            self._line(status="failed", run=run, key=key, error=exc.type, exit=exc.exit_code)
            return "failed"
        r = out.result
        self._line(status="ok", run=run, key=key, outcome=r.outcome, seq=r.first_seq)
        return "ok"

    def close(self) -> None:
        self.f.close()


def read_history(paths: Iterable[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        if not os.path.exists(p):
            continue
        with open(p, encoding="utf-8") as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    return out


def check(lg: Any, history: list[dict[str, Any]], retry: Callable[[str, str], Any]) -> dict[str, Any]:
    """Prove the history against the ledger ``lg``; ``retry(run, key)`` re-sends a key's
    operation (the same request) to resolve an unknown. Returns the counts; raises
    AssertionError naming the first violation."""
    attempts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in history:
        attempts[(rec["run"], rec["key"])].append(rec)

    def in_log() -> dict[tuple[str, str], list[int]]:
        found: dict[tuple[str, str], list[int]] = defaultdict(list)
        for rec in lg.store.read_all():
            if rec.idempotency_key:
                found[(rec.run_id, rec.idempotency_key)].append(rec.seq)
        return found

    logged = in_log()
    counts: Counter[str] = Counter()
    to_resolve: list[tuple[str, str]] = []
    for (run, key), recs in attempts.items():
        answers = [r for r in recs if r["status"] != "invoked"]
        invoked = sum(1 for r in recs if r["status"] == "invoked")
        unanswered = invoked - len(answers)  # a client killed mid-call
        counts["operations"] += 1
        counts["attempts"] += invoked
        oks = [r for r in answers if r["status"] == "ok"]
        counts["ok"] += len(oks)
        counts["duplicate"] += sum(1 for r in oks if r["outcome"] == "duplicate")
        counts["failed"] += sum(1 for r in answers if r["status"] == "failed")
        unknowns = sum(1 for r in answers if r["status"] == "unknown") + unanswered
        counts["unknown"] += unknowns
        where = logged.get((run, key), [])
        assert len(where) <= 1, f"key {key} of {run} is in the log {len(where)} times (seqs {where})"
        if oks:
            assert where, f"acknowledged key {key} of {run} is missing from the log"
            for r in oks:
                assert r["seq"] == where[0], f"key {key}: the client was told seq {r['seq']}, the log has {where[0]}"
        # A failure followed by a duplicate, with no unknown in between, wrote after all.
        seen_unknown = False
        failed_before = False
        for r in recs:
            if r["status"] == "unknown":
                seen_unknown = True
            elif r["status"] == "failed":
                failed_before = True
            elif r["status"] == "ok" and r["outcome"] == "duplicate" and failed_before and not seen_unknown:
                if not any(o["outcome"] == "committed" for o in oks):
                    raise AssertionError(f"key {key} of {run}: an attempt reported failed, yet a later retry "
                                         "found it written")
        if not oks and unknowns == 0:
            assert not where, f"key {key} of {run} failed on every attempt, yet it is in the log"
            counts["failed_absent"] += 1
        if not oks and unknowns:
            to_resolve.append((run, key))
    for run, key in to_resolve:
        was_there = bool(logged.get((run, key)))
        out = retry(run, key)
        outcome = out.result.outcome
        if was_there:
            assert outcome == "duplicate", f"unknown key {key} was in the log but its retry answered {outcome}"
            counts["unknown_landed"] += 1
        else:
            assert outcome == "committed", f"unknown key {key} was not in the log but its retry answered {outcome}"
            counts["unknown_retried_in"] += 1
    logged = in_log()
    for run, key in to_resolve:
        assert len(logged.get((run, key), [])) == 1, f"unknown key {key} is not in the log once after its retry"
    # The log as a whole: contiguous seqs per run, no key twice, verify clean.
    seqs: dict[str, list[int]] = defaultdict(list)
    positions = []
    for rec in lg.store.read_all():
        seqs[rec.run_id].append(rec.seq)
        positions.append(rec.position)
    for run, s in seqs.items():
        assert s == list(range(1, len(s) + 1)), f"run {run}: seqs not contiguous"
    assert positions == list(range(1, len(positions) + 1)), "positions not contiguous"
    assert all(len(v) == 1 for v in logged.values()), "a key is in the log twice"
    problems = lg.verify()
    assert not problems, f"verify found problems: {problems}"
    counts["events"] = len(positions)
    counts["lost"] = 0
    counts["doubled"] = 0
    return dict(counts)
