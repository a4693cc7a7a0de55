"""Incident reconstruction: a run's timeline as the ledger stood at a seq or a moment,
drawn as a report (handoff/report.py), and where two runs' histories part.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from handoff.ledger import events as ev
from handoff.ledger import files
from handoff.ledger.errors import InvalidInput, UnknownRun
from handoff.ledger.inputs import check_run_id, check_seq, check_time_us
from handoff.ledger.store import WATCHER_PREFIX, EventStore
from handoff.projections.engine import OnProgress
from handoff.reducers.checkpoint import iso



class Incident:
    """The incident methods of ``Ledger``; the store is the Ledger's."""

    store: EventStore

    def report(self, run_id: str, *, at_seq: int | None = None, as_of_us: int | None = None,
               progress: OnProgress = None) -> Any:
        """The run's timeline (``reducers.timeline.Timeline``), as the ledger stood at
        ``at_seq`` or ``as_of_us`` if given; ``handoff.report`` draws it as HTML or Markdown."""
        from handoff.reducers import timeline
        from handoff.render import summarize

        check_run_id(run_id)
        if at_seq is not None and as_of_us is not None:
            raise InvalidInput("give a seq or a time to draw the report at, not both", field="at")
        if at_seq is not None:
            check_seq(at_seq, "at", low=1)
        if as_of_us is not None:
            check_time_us(as_of_us, "as_of")
        head = self.store.head(run_id)
        if head is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}; list runs with 'handoff status --all'")
        first = next(self.store.read_run(run_id, until_seq=1))
        if as_of_us is not None and as_of_us < first.recorded_us:
            raise InvalidInput(f"run {run_id} did not exist yet at that time; it begins at "
                               f"{iso(first.recorded_us)}", field="as_of")
        last = next(self.store.read_run(run_id, after_seq=head.last_seq - 1))
        beats = self._watcher_beats(first.recorded_us, as_of_us if as_of_us is not None else last.recorded_us)
        history = self.store.history(run_id)
        if progress is not None:
            history = _counted(history, progress, at_seq or head.last_seq)
        return timeline.build(history, run_id, summarize=summarize, last_seq=head.last_seq,
                              at_seq=at_seq, as_of_us=as_of_us, watcher_beats=beats)

    def write_report(self, run_id: str, path: str | os.PathLike[str] | None = None, *, fmt: str = "html",
                     at_seq: int | None = None, as_of_us: int | None = None, db_hint: str = "",
                     progress: OnProgress = None) -> dict[str, Any]:
        """Draw ``report`` (``handoff.report``: "html" or "md") and write it to ``path``
        atomically, with the ledger's permission bits (a report holds what the ledger holds);
        a symbolic link there, or the ledger itself, is refused. Without ``path`` nothing is
        written and the document is returned under "text". Returns ``{"run_id", "path",
        "format", "bytes", "last_seq", "end", "as_of"}`` (``handoff report --json``)."""
        from handoff import report as rp

        if fmt not in rp.FORMATS:
            raise InvalidInput(f"report format must be one of {', '.join(rp.FORMATS)}, got {str(fmt)[:40]!r}",
                               field="format")
        target = None
        if path is not None:
            target = files.check_target(path, "output")
            self._not_the_ledger(target, path, "output", "report")
        tl = self.report(run_id, at_seq=at_seq, as_of_us=as_of_us, progress=progress)
        cut = (f"seq {tl.last_seq}" if at_seq is not None else
               f"{iso(as_of_us)} (seq {tl.last_seq})" if as_of_us is not None else None)
        text = rp.render(tl, fmt, as_of=cut, db_hint=db_hint)
        data = text.encode("utf-8")
        doc: dict[str, Any] = {"run_id": run_id, "path": target, "format": fmt, "bytes": len(data),
                               "last_seq": tl.last_seq, "end": iso(tl.end_us), "as_of": cut}
        if target is None:
            doc["text"] = text
        else:
            files.atomic_write(target, [data], mode=self.copy_mode(), field="output")
        return doc

    def _watcher_beats(self, from_us: int, until_us: int | None) -> dict[str, list[tuple[int, float]]]:
        """Every watcher's beats from the last one before ``from_us`` on, in time order."""
        out: dict[str, list[tuple[int, float]]] = {}
        for head in self.store.list_runs(prefix=WATCHER_PREFIX):
            for rec in self.store.read_run(head.run_id):
                if until_us is not None and rec.recorded_us > until_us:
                    break
                e = rec.event
                if isinstance(e, ev.WatchdogObserved):
                    beats = out.setdefault(e.watcher, [])
                    if rec.recorded_us < from_us and beats:
                        beats.pop()  # of the beats before the run began, only the last one matters
                    beats.append((rec.recorded_us, e.interval_s))
        for beats in out.values():
            beats.sort()
        return out

    def diff(self, run_a: str, run_b: str) -> dict[str, Any]:
        """Align two runs' histories and name the first divergence, then what differs after
        it (``reducers.diff.compare``; its keys are ``handoff diff --json``'s)."""
        from handoff.reducers import diff

        for field, run in (("run_a", run_a), ("run_b", run_b)):
            check_run_id(run, field)
            if self.store.head(run) is None:
                raise UnknownRun(f"no run {run} in {self.store.path}; list runs with 'handoff status --all'")
        return diff.compare(self.store.history(run_a), self.store.history(run_b), run_a, run_b)


def _counted(items: Iterable[Any], progress: Callable[[int, int], None], total: int) -> Iterator[Any]:
    """``items`` as they are, with ``progress(done, total)`` every thousand (a fork's
    inherited history can pass ``total``: the bar then just stays full)."""
    done = 0
    for done, item in enumerate(items, 1):
        if done % 1000 == 0:
            progress(done, max(total, done))
        yield item
    progress(max(total, done), max(total, done))
