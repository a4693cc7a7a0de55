"""The progress bar of the ``handoff`` command's long work: one class, so when a bar
shows (and that it never touches stdout) is decided in one place, apart from the commands.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

#: Work of fewer items than this shows no bar: it is over before a bar would help. Set
#: HANDOFF_PROGRESS_MIN to change it (0: a bar for any amount of work).
PROGRESS_MIN = 20_000


def _progress_min() -> int:
    text = os.environ.get("HANDOFF_PROGRESS_MIN", "")
    return int(text) if text.isdigit() else PROGRESS_MIN


class ProgressBar:
    """The progress bar of every long command (copy, import, export, backup, verify,
    rebuild, check, report): a callable ``progress(done, total)`` handed to the library.

    click's own bar (a dependency already; rich would add a package for the same three
    numbers): items done of the total, the rate, the time left. It is drawn on stderr,
    and only when stderr is a terminal, so stdout (an export to -, a report to -) and
    anything piped or logged stay exactly the data. Off with --quiet and with --json,
    and for work smaller than ``PROGRESS_MIN``. A new total (the next stage of a copy:
    import, then verify) starts a new bar.
    """

    def __init__(self, label: str, *, quiet: bool = False) -> None:
        self.label, self.bar, self.done, self.total = label, None, 0, 0
        self.enabled = not quiet and sys.stderr.isatty()
        self.started = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < max(_progress_min(), 1):
            return
        import time

        if self.bar is not None and (total != self.total or done < self.done):
            self.close()
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True,
                                         show_eta=True, item_show_func=lambda rate: rate)
            self.bar.__enter__()
            self.done, self.total, self.started = 0, total, time.monotonic()
        elapsed = time.monotonic() - self.started
        rate = f"{done / elapsed:,.0f}/s" if elapsed > 0 else None
        self.bar.update(max(0, min(done, total) - self.done), rate)
        self.done = min(done, total)

    def close(self) -> None:
        """Finish the bar (the work is done, or failed: the error prints on a fresh line)."""
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
