"""What ``verify`` proves about the values kept beside the log, and nothing else.

A graph checkpoint's channel values and a task's writes are stored outside the events
(``EventStore.put_values``), under their sha256; the events name the digests. The chain
proves the events; this walk proves the values against them: every value a live event
names must be stored with bytes that hash to its name. A value that a later
``values_erased`` event names was deleted on purpose and is reported as erased, naming
that event; a value missing without such a record, or changed, is damage.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from handoff.ledger import events as ev
from handoff.ledger.errors import CorruptLedger
from handoff.ledger.store import EventStore, Problem, Recorded

#: The event types that name values or erase them.
VALUE_TYPES = ("graph_checkpoint_saved", "graph_writes_saved", "values_erased")


def named(event: ev.Event) -> Iterable[str]:
    """The digests of the values an event names (none for an event that names none)."""
    if isinstance(event, ev.GraphCheckpointSaved):
        return event.values.values()
    if isinstance(event, ev.GraphWritesSaved):
        return (w.sha256 for w in event.writes)
    return ()


class _RunValues:
    """One run's references: the last event naming each digest, and the last erasing it."""

    def __init__(self) -> None:
        self.named: dict[str, Recorded] = {}
        self.erased: dict[str, Recorded] = {}
        self.erasures: list[Recorded] = []


def check(store: EventStore, records: Iterable[Recorded]) -> tuple[list[Problem], list[dict[str, Any]]]:
    """Check the values named by ``records`` (one run's events, or the ledger's, in order):
    the problems, and per ``values_erased`` event what it erased (``run_id``, ``seq``,
    ``position``, ``reason``, ``erased``: values now gone, ``kept``: still stored because a
    later event names them again)."""
    runs: dict[str, _RunValues] = {}
    for rec in records:
        if rec.type not in VALUE_TYPES:
            continue
        try:
            event = rec.event
        except CorruptLedger:
            continue  # the chain walk reports the damaged event itself
        rv = runs.setdefault(rec.run_id, _RunValues())
        if isinstance(event, ev.ValuesErased):
            rv.erasures.append(rec)
            for d in event.values:
                rv.erased[d] = rec
        else:
            for d in named(event):
                rv.named[d] = rec
    problems: list[Problem] = []
    erased: list[dict[str, Any]] = []
    for run_id, rv in runs.items():
        stored = store.value_digests(run_id) if rv.named else {}
        gone: dict[int, int] = {}
        for d, rec in rv.named.items():
            actual = stored.get(d)
            if actual is not None and actual != d:
                problems.append(Problem("value_altered", run_id, rec.seq, rec.position,
                                        f"the value {d[:16]}... that seq {rec.seq} ({rec.type}) names is stored with "
                                        f"other bytes (their sha256 is {actual[:16]}...); it was changed behind the ledger"))
                continue
            by = rv.erased.get(d)
            if by is not None and by.seq > rec.seq:
                if actual is None:
                    gone[by.seq] = gone.get(by.seq, 0) + 1
                continue
            if actual is None:
                problems.append(Problem("value_missing", run_id, rec.seq, rec.position,
                                        f"the value {d[:16]}... that seq {rec.seq} ({rec.type}) names is not stored, "
                                        "and no values_erased event records its deletion: it was deleted behind "
                                        "the ledger"))
        for rec in rv.erasures:
            e = rec.event
            assert isinstance(e, ev.ValuesErased)
            erased.append({"run_id": run_id, "seq": rec.seq, "position": rec.position, "reason": e.reason,
                           "erased": gone.get(rec.seq, 0), "listed": len(e.values)})
    return problems, erased


__all__ = ["VALUE_TYPES", "check", "named"]
