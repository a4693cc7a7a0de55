"""The ledger's events leaving it: the JSON Lines export (whole, redacted, into a file),
the readable SQLite copy, a backup of the ledger file, and the helpers ``import_lines``
(handoff/facade.py) uses to read an export back.

What a copy does to files (where it is built, what it must never overwrite, SQLite's
-wal, -shm and -journal beside a database) is storage work, in ledger/file_copies.py and
ledger/files.py; these methods check the caller's arguments and say what came of it.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from typing import Any

import msgspec

from handoff.ledger import anchor, files, jsonl
from handoff.ledger import file_copies as stored
from handoff.ledger import events as ev
from handoff.ledger.errors import HistoryRefused, InvalidInput, UnknownRun
from handoff.ledger.inputs import check_run_id
from handoff.ledger.store import WATCHER_PREFIX, EventStore, Recorded
from handoff.projections.engine import OnProgress

from .verbs import WATCHER_BEAT_PERIOD_S


class Copies:
    """The export, copy and backup methods of ``Ledger``; the store is the Ledger's."""

    store: EventStore

    def export(self, run_ids: list[str] | None = None, *, progress: OnProgress = None) -> Iterator[bytes]:
        """Each event as one JSON line (docs/cli.md), in global order; forks bring their parents.

        A forked run cannot be imported without the parent history it folds, so asking
        for a child exports its ancestors' events too. ``progress(done, total)`` is called
        every thousand events (``total``: the events of the runs exported).
        """
        wanted: list[str] | None = None
        if run_ids is not None:
            wanted = []
            for rid in run_ids:
                check_run_id(rid)
                if self.store.head(rid) is None:
                    raise UnknownRun(f"no run {rid} in {self.store.path}; nothing exported")
                while rid is not None and rid not in wanted:
                    wanted.append(rid)
                    first = next(iter(self.store.read_run(rid, until_seq=1)), None)
                    fork = first.event if first is not None else None
                    rid = fork.parent if isinstance(fork, ev.RunForked) else None
        total = 0
        if progress is not None:  # heads only: one row per run, never the events
            total = (self.store.last_position() if wanted is None else
                     sum(h.last_seq for rid in wanted if (h := self.store.head(rid)) is not None))
        # Who inserted each event, where the server says it (PostgreSQL), a page at a time.
        page: list[tuple[Recorded, bytes | None, int]] = []
        done = 0
        for item in self.store.read_for_export(wanted):
            page.append(item)
            if len(page) == 1000:
                yield from self._export_page(page)
                done += len(page)
                page = []
                if progress is not None:
                    progress(done, total)
        yield from self._export_page(page)
        if progress is not None:
            progress(total, total)

    def _export_page(self, page: list[Any]) -> Iterator[bytes]:
        if not page:
            return
        roles = self.store.db_roles(page[0][0].position, page[-1][0].position)
        for rec, digest, size in page:
            yield jsonl.to_line(rec, digest, size, roles.get(rec.position))

    # --- copies and head digests (docs/reliability.md, "Copies and anchors") ----------

    def copy_mode(self) -> int:
        """The permission bits every copy of this ledger gets: the ledger file's own read
        and write bits, or 0600 when there is no file."""
        return files.copy_mode(None if self.store.path == ":memory:" else self.store.path)

    def _not_the_ledger(self, target: str, given: object, field: str, verb: str) -> None:
        """Refuse to write a copy over the ledger itself or a file SQLite keeps beside it
        (``ledger.file_copies.refuse_the_ledger``)."""
        stored.refuse_the_ledger(self.store.path, target, given, field, verb)

    def export_redacted(self, run_ids: list[str] | None = None, *, salt: bytes | None = None,
                        fields: Any = (), progress: OnProgress = None) -> Iterator[bytes]:
        """``export`` made fit to share outside (handoff/redact.py): a header line saying it is
        redacted, then each event with only its structure as it is (types, seqs, times,
        states, outcomes, numbers, content digests: ``redact.KEPT``) and every other value a
        salted digest; ``fields`` digests further fields. ``salt`` (default: fresh random
        bytes) keeps digests stable across exports made with it; keep it secret. Never
        importable (RedactedExportRefused).
        """
        import secrets

        from handoff import redact

        if salt is None:
            salt = secrets.token_bytes(32)
        if not isinstance(salt, bytes) or len(salt) < 16:
            raise InvalidInput("salt must be at least 16 bytes; a short salt lets anyone guess names back",
                               field="salt")
        fields = tuple(fields)
        for f in fields:
            if not isinstance(f, str) or not f:
                raise InvalidInput("fields must be payload field names", field="fields")
        chosen = None if run_ids is None else list(run_ids)
        return redact.lines(self.export(run_ids, progress=progress), salt, chosen, fields=fields)

    def export_to(self, path: str | os.PathLike[str], run_ids: list[str] | None = None, *, redact: bool = False,
                  salt: bytes | None = None, fields: Any = (), progress: OnProgress = None) -> dict[str, Any]:
        """``export`` (or, with ``redact``, ``export_redacted``) into a file, atomically, with
        the ledger's mode (see ``ledger.files``).

        Returns ``{"output", "events", "runs"}``, plus ``"redacted": true`` for a redacted
        file. On any refusal the file at
        ``path`` is as it was: a symbolic link there is refused (InvalidInput), never
        followed, and so is the ledger itself or one of its side files.
        """
        target = files.check_target(path, "output")
        self._not_the_ledger(target, path, "output", "export")
        counts = {"events": 0}
        seen: set[str] = set()
        run_of = msgspec.json.Decoder(_RunOf)
        source = (self.export_redacted(run_ids, salt=salt, fields=fields, progress=progress) if redact
                  else self.export(run_ids, progress=progress))

        def lines() -> Iterator[bytes]:
            for i, line in enumerate(source):
                if not (redact and i == 0):  # a redacted file's first line is its header
                    counts["events"] += 1
                    seen.add(run_of.decode(line).run_id)
                yield line + b"\n"

        files.atomic_write(target, lines(), mode=self.copy_mode(), field="output")
        doc: dict[str, Any] = {"output": target, "events": counts["events"], "runs": len(seen)}
        if redact:
            doc["redacted"] = True
        return doc

    def export_sqlite(self, path: str | os.PathLike[str], *, redact: bool = False, salt: bytes | None = None,
                      fields: Any = (), progress: OnProgress = None) -> dict[str, Any]:
        """Write, or extend with what is new, a readable SQLite copy of the whole ledger at
        ``path``: plain tables (runs, events, leases, artifacts, deliveries) an analyst's SQL
        tool opens; ``redact`` shows only what the redacted JSON Lines export shows. See
        handoff/sqlite_export.py and docs/readable-copy.md. Returns ``{"output", "events",
        "runs", "last_position", "redacted"}``."""
        from handoff import sqlite_export

        return sqlite_export.export_sqlite(self, path, redact=redact, salt=salt, fields=fields, progress=progress)

    def backup(self, dest: str | os.PathLike[str], *, replace: bool = False) -> dict[str, Any]:
        """A consistent copy of the whole ledger file, WAL included, taken while writers go on.

        Uses SQLite's online backup into a private directory beside ``dest``, then renames
        the copy into place with the ledger's mode. Refuses (InvalidInput, nothing written)
        a link at ``dest``, the ledger itself, a file that is a live database (its -wal or
        -shm beside it), any existing file unless ``replace``, and even then one that is
        not an SQLite database (a mistyped name must not cost someone's file). Returns ``{"path",
        "positions", "head", "bytes", "runs"}``: ``head`` is the copy's head digest.
        """
        target = files.check_target(dest, "dest")
        self._not_the_ledger(target, dest, "dest", "back it up")
        position, ghash, runs, size = stored.backup_file(self.store, target, dest, replace=replace,
                                                         mode=self.copy_mode())
        return {"path": target, "positions": position, "head": anchor.format_digest(position, ghash),
                "bytes": size, "runs": runs}


class _RunOf(msgspec.Struct):
    run_id: str


def count_lines(source: Any) -> int | None:
    """How many lines a regular file holds from where it stands, read in 1 MiB chunks up to
    the size it had when asked, and put back where it was; None for anything else (a pipe,
    a list, and a device such as /dev/zero, which is seekable but never ends)."""
    try:
        if not source.seekable() or not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            return None
        start = source.tell()
        left = os.fstat(source.fileno()).st_size - start
    except (AttributeError, OSError, ValueError):
        return None
    n, last = 0, b""
    while left > 0 and (chunk := source.read(min(1 << 20, left))):
        left -= len(chunk)
        data = chunk.encode("utf-8", "surrogateescape") if isinstance(chunk, str) else chunk
        n += data.count(b"\n")
        last = data
    source.seek(start)
    return n + (1 if last and not last.endswith(b"\n") else 0)


def admit_watcher_beat(rec: Recorded, event: ev.Event) -> None:
    """A watcher's own stream holds only its beats, written by ``Ledger.watcher_beat``."""
    name = rec.run_id[len(WATCHER_PREFIX):]
    ok = (isinstance(event, ev.WatchdogObserved) and event.watcher == name and rec.actor == f"watchdog:{name}"
          and rec.lease is None and event.classification == "alive" and event.progress_seq == 0
          and math.isfinite(event.interval_s) and event.interval_s >= WATCHER_BEAT_PERIOD_S)
    if not ok:
        raise HistoryRefused(
            f"{rec.run_id} seq {rec.seq}: a watcher's stream holds only its own beats "
            f"(watchdog_observed 'alive' by watchdog:{name}), not this {rec.type} by {rec.actor[:60]}",
            run_id=rec.run_id, seq=rec.seq,
        )
