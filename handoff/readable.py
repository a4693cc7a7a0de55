"""A readable copy: the ledger as plain SQLite tables anyone's SQL tool can open.

The ledger stores payloads as msgspec bytes behind hash chains; an analyst with
Datasette or the sqlite3 shell cannot read them. ``export_sqlite`` writes (with
sqlite-utils) a separate file of plain tables: ``runs`` (one row per run, the packet's
fields as columns, health judged at export time), ``events`` (envelope, summary, payload
as JSON, hashes), ``leases``, ``artifacts`` and ``deliveries`` read from the events,
with indexes, foreign keys to ``runs``, and full-text search over the events' summaries
and details and the runs' goals.

It is a derivative for reading, never a ledger: nothing reads it back. A second export
into the same file adds only the events written since (``_export``, a one-row table,
keeps the last position copied) and refreshes the rows of the runs they touch and of
every live run (their health moves with the clock). ``redact`` writes what the redacted
JSON Lines export shows (handoff/redact.py), and only that: a file is redacted or not
for good, and a redacted one is extended only with the same salt.

Watchers' own streams (``watcher:NAME``, their liveness beats) are not runs and stay out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from handoff.ledger import portable
from handoff.ledger.errors import InvalidInput
from handoff.reducers import stall
from handoff.reducers.checkpoint import iso, packet

FORMAT = "handoff-readable-copy/1"
#: Events read and written per transaction: bounds memory whatever the size of the log.
BATCH = 2_000
#: Payload fields whose text the full-text index reads as the event's detail.
DETAIL_FIELDS = ("detail", "reason", "summary", "notes", "note", "what", "error", "resolution", "next_action",
                 "goal", "receipt")

Progress = Callable[[int, int], None] | None


def _flat(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A packet as columns: a map's fields one level down as ``outer_inner``; lists as JSON."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and not prefix:
            out.update(_flat(v, f"{name}_"))
        elif isinstance(v, (dict, list, tuple)):
            out[name] = msgspec.json.encode(v).decode()
        else:
            out[name] = v
    return out


class _Copy:
    """One export into one file: the tables, and the redactor when the copy is redacted."""

    def __init__(self, lg: Any, path: str, *, salt: bytes | None, fields: tuple[str, ...]) -> None:
        import sqlite_utils

        self.lg = lg
        self.db = sqlite_utils.Database(path)
        self.redactor = None
        if salt is not None:
            from handoff import redact

            self.redactor = redact.Redactor(salt, fields=fields)

    # --- what each row holds ----------------------------------------------------------

    def event_doc(self, rec: Any) -> dict[str, Any]:
        """The event as the JSON Lines export has it (redacted, when the copy is)."""
        line = portable.to_line(rec)
        if self.redactor is None:
            return msgspec.json.decode(line)  # type: ignore[no-any-return]
        self.teach(rec.run_id)
        return msgspec.json.decode(self.redactor.line(line))  # type: ignore[no-any-return]

    def event_row(self, rec: Any, doc: dict[str, Any]) -> dict[str, Any]:
        from handoff.render import summarize

        payload = doc["payload"]
        detail = " ".join(str(payload[f]) for f in DETAIL_FIELDS if isinstance(payload.get(f), str) and payload[f])
        plain = self.redactor is None
        return {
            "position": rec.position, "run_id": doc["run_id"], "seq": rec.seq, "at": iso(rec.recorded_us),
            "recorded_us": rec.recorded_us, "actor": doc["actor"], "lease": rec.lease, "type": rec.type,
            "idempotency_key": doc["idempotency_key"],
            # The ledger's own one-line summary holds names and free text: a redacted copy has none.
            "summary": summarize(rec.event) if plain else None,
            "detail": detail or None, "payload": msgspec.json.encode(payload).decode(),
            # Hashes of the unredacted payload would let a guess be checked: kept only in a plain copy.
            "prev_hash": rec.prev_hash.hex() if plain else None, "hash": rec.hash.hex() if plain else None,
        }

    def derived(self, rec: Any, doc: dict[str, Any]) -> None:
        """The lease, artifact and delivery rows an event starts or ends."""
        p, run, at = doc["payload"], doc["run_id"], iso(rec.recorded_us)
        t = rec.type
        if t == "lease_granted":
            self.db["leases"].upsert({"run_id": run, "lease": p["lease"], "worker": p.get("worker"),
                                      "granted_seq": rec.seq, "granted_at": at, "ended_seq": None, "ended_at": None,
                                      "ended_by": None, "end_reason": None}, pk=("run_id", "lease"))
        elif t in ("lease_released", "lease_revoked"):
            self.db["leases"].upsert({"run_id": run, "lease": p["lease"], "ended_seq": rec.seq, "ended_at": at,
                                      "ended_by": "released" if t == "lease_released" else "revoked",
                                      "end_reason": p.get("reason")}, pk=("run_id", "lease"))
        elif t == "artifact_recorded":
            self.db["artifacts"].upsert({"run_id": run, "seq": rec.seq, "at": at, "lease": rec.lease,
                                         "path": p.get("path"), "kind": p.get("kind"), "bytes": p.get("bytes"),
                                         "sha256": p.get("sha256"), "exists": p.get("exists", True),
                                         "withdrawn_seq": None, "withdrawn_reason": None}, pk=("run_id", "seq"))
        elif t == "artifact_withdrawn":
            self.db.execute("UPDATE artifacts SET withdrawn_seq = ?, withdrawn_reason = ? WHERE run_id = ? AND "
                            "path = ? AND withdrawn_seq IS NULL", [rec.seq, p.get("reason"), run, p.get("path")])
        elif t == "delivery_attempted":
            self.db["deliveries"].upsert({"run_id": run, "key": p["key"], "target": p.get("target"),
                                          "by": p.get("by"), "attempts": 1, "attempted_seq": rec.seq,
                                          "attempted_at": at, "status": "attempted", "outcome_seq": None,
                                          "outcome_at": None, "receipt": None, "error": None},
                                         pk=("run_id", "key"))
            self.db.execute("UPDATE deliveries SET attempts = attempts + 1, attempted_seq = ?, attempted_at = ?, "
                            "status = 'attempted' WHERE run_id = ? AND key = ? AND attempted_seq < ?",
                            [rec.seq, at, run, p["key"], rec.seq])
        elif t in ("delivery_confirmed", "delivery_failed", "delivery_unanswered"):
            status = {"delivery_confirmed": "confirmed", "delivery_failed": "failed",
                      "delivery_unanswered": "unanswered"}[t]
            self.db.execute("UPDATE deliveries SET status = ?, outcome_seq = ?, outcome_at = ?, receipt = ?, "
                            "error = ? WHERE run_id = ? AND key = ?",
                            [status, rec.seq, at, p.get("receipt"), p.get("error") or p.get("reason"), run,
                             p["key"]])

    def teach(self, run_id: str) -> None:
        """Give the redactor the run's own patterns (its contract's, a fork's parent's) when
        its opening event was copied by an earlier export and so not seen by this one."""
        r = self.redactor
        if r is None or run_id in r.patterns:
            return
        first = next(iter(self.lg.store.read_run(run_id, until_seq=1)), None)
        if first is None:
            return
        payload = msgspec.to_builtins(first.event)
        if first.type == "run_forked":
            self.teach(payload["parent"])
        r.learn(run_id, first.type, payload)

    def run_id(self, run_id: str) -> str:
        """A run id as the redacted export shows it (digested only where a detector or the
        owner's patterns match it); as it is in a plain copy."""
        if self.redactor is None:
            return run_id
        from handoff import redact

        self.teach(run_id)
        return self.redactor.keep(redact.RUN_ID_KEPT, "run_id", run_id, run_id)

    def run_row(self, cp: Any, now_us: int, watchers: dict[str, Any]) -> dict[str, Any]:
        """The run's packet at ``now_us`` as columns; in a redacted copy every text column
        that is not the ledger's own vocabulary or a time becomes its salted digest."""
        doc = _flat(packet(cp, now_us=now_us, watchers=watchers))
        doc["health_judged_at"] = iso(now_us)
        if self.redactor is not None:
            for k, v in doc.items():
                if isinstance(v, str) and k != "run_id" and k not in _STRUCTURE:
                    doc[k] = self.redactor.digest(k, v)
            doc["run_id"] = self.run_id(cp.run_id)
        return doc

    # --- the whole export ------------------------------------------------------------------

    def tables(self) -> None:
        """Create the tables, their indexes and keys, and the full-text index, once."""
        db = self.db
        if "runs" in db.table_names():
            return
        db["runs"].create({"run_id": str}, pk="run_id")
        db["events"].create({"position": int, "run_id": str, "seq": int, "at": str, "recorded_us": int,
                             "actor": str, "lease": int, "type": str, "idempotency_key": str, "summary": str,
                             "detail": str, "payload": str, "prev_hash": str, "hash": str},
                            pk="position", foreign_keys=[("run_id", "runs", "run_id")])
        db["leases"].create({"run_id": str, "lease": int, "worker": str, "granted_seq": int, "granted_at": str,
                             "ended_seq": int, "ended_at": str, "ended_by": str, "end_reason": str},
                            pk=("run_id", "lease"), foreign_keys=[("run_id", "runs", "run_id")])
        db["artifacts"].create({"run_id": str, "seq": int, "at": str, "lease": int, "path": str, "kind": str,
                                "bytes": int, "sha256": str, "exists": bool, "withdrawn_seq": int,
                                "withdrawn_reason": str},
                               pk=("run_id", "seq"), foreign_keys=[("run_id", "runs", "run_id")])
        db["deliveries"].create({"run_id": str, "key": str, "target": str, "by": str, "attempts": int,
                                 "attempted_seq": int, "attempted_at": str, "status": str, "outcome_seq": int,
                                 "outcome_at": str, "receipt": str, "error": str},
                                pk=("run_id", "key"), foreign_keys=[("run_id", "runs", "run_id")])
        db["events"].create_index(["run_id", "seq"], unique=True)
        db["events"].create_index(["run_id", "lease"])
        db["events"].create_index(["type", "recorded_us"])
        db["artifacts"].create_index(["sha256"])
        db["deliveries"].create_index(["target", "status"])
        db["events"].enable_fts(["summary", "detail"], create_triggers=True)

    def meta(self) -> dict[str, Any] | None:
        if "_export" not in self.db.table_names():
            return None
        rows = list(self.db["_export"].rows)
        return rows[0] if rows else None

    def check_meta(self, source: str, salt_id: str | None) -> int:
        """Where an earlier export into this file stopped; refuses a file that is not one,
        or one made redacted differently (mixing them would show what one of them hides)."""
        names = set(self.db.table_names())
        meta = self.meta()
        if meta is None:
            if names:
                raise InvalidInput(f"output: {self.db.conn.execute('PRAGMA database_list').fetchone()[2]} holds "
                                   "tables but is not a readable copy of a ledger; name a new file", field="output")
            return 0
        if meta.get("format") != FORMAT:
            raise InvalidInput(f"output: the file is a readable copy of another format ({meta.get('format')}); "
                               "name a new file", field="output")
        if meta.get("source") != source:
            raise InvalidInput(f"output: the file is a readable copy of {meta.get('source')}, not of {source}; "
                               "name a new file for this ledger", field="output")
        if meta.get("salt_id") != salt_id:
            had = "redacted" if meta.get("salt_id") else "not redacted"
            raise InvalidInput(f"output: the file was written {had}" + (" with another salt" if meta.get("salt_id")
                               and salt_id else "") + "; a copy is extended only the way it was begun. Name a "
                               "new file, or export with the same --redact and salt", field="output")
        return int(meta["last_position"])

    def write_meta(self, source: str, salt_id: str | None, last: int, now_us: int) -> None:
        self.db["_export"].upsert({"id": 1, "format": FORMAT, "source": source, "salt_id": salt_id,
                                   "last_position": last, "exported_at": iso(now_us)}, pk="id")


#: Packet columns that are structure, kept as they are in a redacted copy (as redact.KEPT does).
_STRUCTURE = frozenset({
    "state", "disposition", "health_classification", "health_action", "delivery_status", "last_heartbeat_at",
    "opened_at", "updated_at", "health_judged_at", "monitored_last_observed_at", "last_progress_at",
    "fork_seq",
})


def export_sqlite(lg: Any, path: str | os.PathLike[str], *, redact: bool = False, salt: bytes | None = None,
                  fields: Any = (), progress: Progress = None) -> dict[str, Any]:
    """Write (or extend) the readable copy of ``lg`` at ``path``; ``Ledger.export_sqlite``.

    Returns ``{"output", "events", "runs", "last_position", "redacted"}``: the events added
    by this export, the run rows written (the runs those events touched, and every live
    run, whose health is judged again), and the last position the copy now holds.
    """
    from handoff.api import WATCHER_PREFIX
    from handoff.ledger import files

    target = files.check_target(path, "output")
    lg._not_the_ledger(target, path, "output", "export")
    salt_id = None
    if redact:
        import secrets

        from handoff import redact as rd

        salt = secrets.token_bytes(32) if salt is None else salt
        if not isinstance(salt, bytes) or len(salt) < 16:
            raise InvalidInput("salt must be at least 16 bytes; a short salt lets anyone guess names back",
                               field="salt")
        salt_id = rd.salt_id(salt)
    elif salt is not None or tuple(fields):
        raise InvalidInput("a salt and redacted fields apply to a redacted copy only (redact=True)", field="salt")
    if not os.path.exists(target):  # the copy holds what the ledger holds: the ledger's permissions
        os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, lg.copy_mode()))
    copy = _Copy(lg, target, salt=salt if redact else None, fields=tuple(fields))
    try:
        source = lg.store.path
        last = copy.check_meta(source, salt_id)
        copy.tables()
        end = lg.store.last_position()
        total = max(end - last, 0)
        touched: set[str] = set()
        added = 0
        records = lg.store.read_all(after_position=last, until_position=end)
        while True:
            batch = [rec for _, rec in zip(range(BATCH), records)]
            if not batch:
                break
            with copy.db.conn:
                rows = []
                for rec in batch:
                    if rec.run_id.startswith(WATCHER_PREFIX):
                        continue
                    doc = copy.event_doc(rec)
                    rows.append(copy.event_row(rec, doc))
                    copy.derived(rec, doc)
                    touched.add(rec.run_id)
                copy.db["events"].insert_all(rows, pk="position")
                copy.write_meta(source, salt_id, batch[-1].position, lg.clock())
            added += len(rows)
            if progress is not None:
                progress(batch[-1].position - last, total)
        now = lg.clock()
        watchers = lg.watchers()
        written = 0
        with copy.db.conn:
            page: list[dict[str, Any]] = []
            for cp in lg.iter_runs(include_terminal=True):
                if cp.run_id in touched or not cp.terminal:
                    page.append(copy.run_row(cp, now, watchers))
                if len(page) >= BATCH:
                    copy.db["runs"].upsert_all(page, pk="run_id", alter=True)
                    written += len(page)
                    page = []
            copy.db["runs"].upsert_all(page, pk="run_id", alter=True)
            written += len(page)
            copy.write_meta(source, salt_id, max(end, last), now)
        if "runs_fts" not in copy.db.table_names() and "goal" in copy.db["runs"].columns_dict:
            copy.db["runs"].enable_fts(["goal"], create_triggers=True)
        if progress is not None:
            progress(total, total)
        return {"output": target, "events": added, "runs": written, "last_position": max(end, last),
                "redacted": redact}
    finally:
        copy.db.close()
