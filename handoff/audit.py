"""Proving the ledger: the verify walk and its report, the head digest kept elsewhere and
checked later, the projections checked against (or rebuilt from) the log, and the facts
``doctor`` gathers for support.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from handoff.ledger import anchor, files
from handoff.ledger.file_copies import read_small
from handoff.ledger.errors import HeadAnchorBroken, InvalidInput, UnknownRun
from handoff.ledger.inputs import check_run_id
from handoff.ledger.store import EventStore
from handoff.projections import Projector

#: What ``verify(run_id)`` does not look at (reported by ``handoff verify RUN``).
VERIFY_RUN_SKIPS = (
    "the hash chains, heads and lease fences of the other runs",
    "the projections (run 'handoff check' or a whole-ledger 'handoff verify')",
)


class Audit:
    """The audit methods of ``Ledger``; the store and its projector are the Ledger's."""

    store: EventStore
    projector: Projector

    def rebuild(self, name: str | None = None, *, progress: Any = None) -> dict[str, int]:
        """Drop and refold one projection (or all) from the log; atomic, memory flat."""
        return self.projector.rebuild(None if name is None else [name], progress=progress)

    def check(self, name: str | None = None, *, progress: Any = None) -> list[dict[str, Any]]:
        """Differences between the kept projections and a fresh fold of the log."""
        return self.projector.check(None if name is None else [name], progress=progress)

    def verify(self, run_id: str | None = None, *, progress: Any = None,
               expect_head: str | list[str] | tuple[str, ...] | None = None) -> list[Any]:
        """Hash chain, seq gaps, decodability and heads; an empty list means all is well.

        The ledger-wide checks (global chain, holes in positions, append-only triggers)
        run with ``run_id`` too. ``expect_head``: head digests kept from ``ledger_head()``; each
        must still be contained (a ``head_anchor`` problem otherwise). The values kept
        beside the log are checked against the events that name them: one missing or
        changed is a problem, unless a ``values_erased`` event recorded its deletion."""
        return self._verify(run_id, progress, expect_head)[0]

    def _verify(self, run_id: str | None, progress: Any,
                expect_head: str | list[str] | tuple[str, ...] | None) -> tuple[list[Any], list[dict[str, Any]]]:
        anchors = [] if expect_head is None else [expect_head] if isinstance(expect_head, str) else list(expect_head)
        parsed = [anchor.parse_digest(a) for a in anchors]  # malformed: refused before any work
        if run_id is not None:
            check_run_id(run_id)
            # Unknown means no head and no events: a run whose head row alone is gone is
            # damage for verify to report, not an unknown run.
            if self.store.head(run_id) is None and next(iter(self.store.read_run(run_id)), None) is None:
                raise UnknownRun(f"no run {run_id} in {self.store.path}; nothing to verify "
                                 "(list runs with 'handoff status --all')")
        problems = self.store.verify(run_id, progress=progress)
        if progress is not None:  # the store reports every 10,000 positions: say it finished
            last = self.store.last_position()
            progress(last, last)
        for position, ghash in parsed:
            if (p := anchor.anchor_problem(self.store, position, ghash)) is not None:
                problems.append(p)
        value_problems, erased = self._check_values(run_id)
        return problems + value_problems, erased

    def _check_values(self, run_id: str | None) -> tuple[list[Any], list[dict[str, Any]]]:
        """The values beside the log against the events that name them (handoff/verify_values.py)."""
        from handoff import verify_values

        records = self.store.read_run(run_id) if run_id is not None else self.store.read_all()
        return verify_values.check(self.store, records)

    def verify_report(self, run_id: str | None = None, *, progress: Any = None,
                      expect_head: str | list[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
        """``verify`` and, for the whole ledger, ``check``, as one document (what
        ``handoff verify --json`` prints; docs/cli.md): ``ok`` is true only when the log has
        no problem and the projections match a fresh fold."""
        anchors = [] if expect_head is None else [expect_head] if isinstance(expect_head, str) else list(expect_head)
        found, erased = self._verify(run_id, progress, anchors)
        problems = [msgspec.to_builtins(p) for p in found]
        diffs = self.check() if run_id is None else []
        if run_id is None:
            events, streams = self.store.last_position(), self.store.count_runs()
        else:  # a run whose head row is damaged still has its events counted
            head = self.store.head(run_id)
            events = head.last_seq if head is not None else sum(1 for _ in self.store.read_run(run_id))
            streams = 1
        return {"ok": not problems and not diffs, "run_id": run_id, "events": events, "streams": streams,
                "problems": problems, "projections": diffs, "anchors": len(anchors), "erased": erased,
                "skipped": list(VERIFY_RUN_SKIPS) if run_id is not None else [],
                "db_roles": self.store.db_role_counts(run_id)}

    def ledger_head(self) -> dict[str, Any]:
        """Where the ledger ends: ``{"digest", "position", "global_hash"}``.

        Keep ``digest`` somewhere the ledger's writers cannot change; ``verify(expect_head=
        digest)`` later proves the ledger still holds everything up to it."""
        position, ghash = self.store.ledger_head()
        return {"digest": anchor.format_digest(position, ghash), "position": position,
                "global_hash": ghash.hex()}

    def ledger_head_digest(self) -> str:
        return self.ledger_head()["digest"]

    def check_anchor(self, digest: str, *, field: str = "expect_head") -> Any:
        """The problem between a kept head digest and the ledger now, or None."""
        position, ghash = anchor.parse_digest(digest, field)
        return anchor.anchor_problem(self.store, position, ghash)

    def write_head(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Record the head digest in ``path`` (one line, replaced atomically, ledger's mode).

        The digest already in the file must still hold first: a ledger whose tail was cut
        since the last record is refused (``HeadAnchorBroken``, exit 4) and the file is
        left as it was, so a scheduled job cannot launder a truncation into a new anchor.
        Returns ``ledger_head()`` plus ``"path"`` and ``"previous"`` (the digest replaced, or None).
        """
        target = files.check_target(path, "path")
        self._not_the_ledger(target, path, "path", "write the head digest")
        previous = None
        if os.path.exists(target):
            raw = read_small(target, 4097, "path")
            text = raw.decode("utf-8", "replace").strip()
            if text and not anchor.is_digest(text):
                # Described, never shown: a file named by mistake may hold anything.
                kind = "text" if raw.isascii() and all(c.isprintable() or c.isspace() for c in text) else "binary data"
                size = f"{len(raw)} bytes" if len(raw) <= 4096 else f"{os.path.getsize(target):,} bytes"
                raise InvalidInput(
                    f"path: {path} holds {size} of {kind} that are not a head digest (one line, "
                    "POSITION:HASH), so it is not a file 'handoff head --write' made; it was left as it "
                    "was. Name another file, or a new one",
                    field="path",
                )
            if text:
                problem = self.check_anchor(text, field="path")
                if problem is not None:
                    raise HeadAnchorBroken(f"{path} holds the head digest {text.strip()}, which this ledger no "
                                           f"longer contains: {problem.message}. The file was left as it was",
                                           position=problem.position)
                previous = text
        doc = self.ledger_head()
        files.atomic_write(target, [doc["digest"].encode() + b"\n"], mode=self.copy_mode(), field="path")
        return {**doc, "path": target, "previous": previous}

    def doctor(self) -> dict[str, Any]:
        """Facts about the ledger and the backend underneath, for support and audits:
        the store's ``diagnostics()`` (backend, version, settings), then the counts."""
        return {
            **self.store.diagnostics(),
            **self.store.counts(),
            "projections": self.projector.positions(),
            "problems": [msgspec.to_builtins(p) for p in self.store.append_only_problems()],
        }
