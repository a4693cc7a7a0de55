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

How it is written, so that a hundred thousand events take seconds: a new copy is built
under a private name beside the target (journal off, one transaction, rows inserted with
``executemany``, indexes and the full-text index built once after the rows are in) and
given its name only when complete, so an interrupted export leaves no file at the
target. An export into an existing copy is one transaction: interrupted, it leaves the
copy as it was; run again, it adds everything since.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from handoff.ledger import jsonl
from handoff.ledger.errors import InvalidInput, TargetAppeared
from handoff.ledger.store import WATCHER_PREFIX
from handoff.reducers import stall
from handoff.reducers.checkpoint import iso, packet

FORMAT = "handoff-readable-copy/1"
#: Events read and written per transaction: bounds memory whatever the size of the log.
BATCH = 2_000
#: Payload fields whose text the full-text index reads as the event's detail.
DETAIL_FIELDS = ("detail", "reason", "summary", "notes", "note", "what", "error", "resolution", "next_action",
                 "goal", "receipt")

OnProgress = Callable[[int, int], None] | None

#: The events table's columns, in the order ``_Copy.event_row`` gives them.
EVENT_COLUMNS = ("position", "run_id", "seq", "at", "recorded_us", "actor", "lease", "type", "idempotency_key",
                 "summary", "detail", "payload", "prev_hash", "hash")


def _names(columns: Any) -> str:
    """Columns quoted for SQL: ``by`` and ``exists`` are keywords."""
    return ", ".join(f'"{c}"' for c in columns)


def _upsert(table: str, key: tuple[str, ...], columns: tuple[str, ...], fixed: dict[str, str] | None = None) -> str:
    """An insert of ``columns`` (values as parameters, then ``fixed`` as SQL) that, when the
    key exists, overwrites the same columns: sqlite-utils' ``upsert`` as one statement."""
    fixed = fixed or {}
    names = [*columns, *fixed]
    values = ["?"] * len(columns) + list(fixed.values())
    sets = ", ".join(f'"{c}" = excluded."{c}"' for c in names if c not in key)
    return (f"INSERT INTO {table} ({_names(names)}) VALUES ({', '.join(values)}) "
            f"ON CONFLICT ({_names(key)}) DO UPDATE SET {sets}")


_INSERT_EVENT = f"INSERT INTO events ({_names(EVENT_COLUMNS)}) VALUES ({', '.join('?' * len(EVENT_COLUMNS))})"
_LEASE_GRANTED = _upsert("leases", ("run_id", "lease"), ("run_id", "lease", "worker", "granted_seq", "granted_at"),
                         {"ended_seq": "NULL", "ended_at": "NULL", "ended_by": "NULL", "end_reason": "NULL"})
_LEASE_ENDED = _upsert("leases", ("run_id", "lease"), ("run_id", "lease", "ended_seq", "ended_at", "ended_by",
                                                       "end_reason"))
_ARTIFACT = _upsert("artifacts", ("run_id", "seq"), ("run_id", "seq", "at", "lease", "path", "kind", "bytes",
                                                     "sha256", "exists"),
                    {"withdrawn_seq": "NULL", "withdrawn_reason": "NULL"})
_WITHDRAWN = ("UPDATE artifacts SET withdrawn_seq = ?, withdrawn_reason = ? WHERE run_id = ? AND path = ? "
              "AND withdrawn_seq IS NULL")
_ATTEMPTED = _upsert("deliveries", ("run_id", "key"), ("run_id", "key", "target", "by", "attempted_seq",
                                                       "attempted_at"),
                     {"attempts": "1", "status": "'attempted'", "outcome_seq": "NULL", "outcome_at": "NULL",
                      "receipt": "NULL", "error": "NULL"})
_OUTCOME = ("UPDATE deliveries SET status = ?, outcome_seq = ?, outcome_at = ?, receipt = ?, error = ? "
            "WHERE run_id = ? AND key = ?")
_OUTCOMES = {"delivery_confirmed": "confirmed", "delivery_failed": "failed", "delivery_unanswered": "unanswered"}


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

        from handoff.render import summarize

        self.summarize = summarize  # once: an import statement per event costs a tenth of the export
        self.lg = lg
        self.db = sqlite_utils.Database(path)
        self.redactor = None
        if salt is not None:
            from handoff import redact

            self.redactor = redact.Redactor(salt, fields=fields)

    # --- what each row holds ----------------------------------------------------------

    def event_doc(self, rec: Any) -> dict[str, Any]:
        """The event as the JSON Lines export has it (redacted, when the copy is)."""
        line = jsonl.to_line(rec)
        if self.redactor is None:
            return msgspec.json.decode(line)  # type: ignore[no-any-return]
        self.teach(rec.run_id)
        return msgspec.json.decode(self.redactor.line(line))  # type: ignore[no-any-return]

    def event_row(self, rec: Any, doc: dict[str, Any], at: str) -> tuple[Any, ...]:
        """The event's row, in ``EVENT_COLUMNS`` order."""
        payload = doc["payload"]
        detail = " ".join(str(payload[f]) for f in DETAIL_FIELDS if isinstance(payload.get(f), str) and payload[f])
        plain = self.redactor is None
        return (rec.position, doc["run_id"], rec.seq, at, rec.recorded_us, doc["actor"], rec.lease, rec.type,
                doc["idempotency_key"],
                # The ledger's own one-line summary holds names and free text: a redacted copy has none.
                self.summarize(rec.event) if plain else None,
                detail or None, msgspec.json.encode(payload).decode(),
                # Hashes of the unredacted payload would let a guess be checked: kept only in a plain copy.
                rec.prev_hash.hex() if plain else None, rec.hash.hex() if plain else None)

    @staticmethod
    def derived(rec: Any, doc: dict[str, Any], at: str) -> tuple[str, tuple[Any, ...]] | None:
        """The statement that starts or ends the lease, artifact or delivery row an event
        touches, or None. Applied in the log's order: an end updates its start's row."""
        p, run, t = doc["payload"], doc["run_id"], rec.type
        if t == "lease_granted":
            return _LEASE_GRANTED, (run, p["lease"], p.get("worker"), rec.seq, at)
        if t in ("lease_released", "lease_revoked"):
            return _LEASE_ENDED, (run, p["lease"], rec.seq, at, "released" if t == "lease_released" else "revoked",
                                  p.get("reason"))
        if t == "artifact_recorded":
            return _ARTIFACT, (run, rec.seq, at, rec.lease, p.get("path"), p.get("kind"), p.get("bytes"),
                               p.get("sha256"), p.get("exists", True))
        if t == "artifact_withdrawn":
            return _WITHDRAWN, (rec.seq, p.get("reason"), run, p.get("path"))
        if t == "delivery_attempted":
            return _ATTEMPTED, (run, p["key"], p.get("target"), p.get("by"), rec.seq, at)
        if t in _OUTCOMES:
            return _OUTCOME, (_OUTCOMES[t], rec.seq, at, p.get("receipt"), p.get("error") or p.get("reason"), run,
                              p["key"])
        return None

    def load(self, records: Iterator[Any], total: int, last: int, progress: OnProgress) -> tuple[int, set[str]]:
        """Insert ``records`` (those after position ``last``) into the open transaction,
        ``BATCH`` at a time: the events with one ``executemany``, the lease, artifact and
        delivery statements in the log's order (consecutive ones of a kind together).
        Returns the events added and the runs they touch."""
        conn = self.db.conn
        touched: set[str] = set()
        added = 0
        while True:
            batch = [rec for _, rec in zip(range(BATCH), records)]
            if not batch:
                return added, touched
            rows = []
            steps: list[tuple[str, list[tuple[Any, ...]]]] = []
            for rec in batch:
                if rec.run_id.startswith(WATCHER_PREFIX):
                    continue
                doc = self.event_doc(rec)
                at = iso(rec.recorded_us)
                rows.append(self.event_row(rec, doc, at))
                step = self.derived(rec, doc, at)
                if step is not None:
                    if steps and steps[-1][0] == step[0]:
                        steps[-1][1].append(step[1])
                    else:
                        steps.append((step[0], [step[1]]))
                touched.add(rec.run_id)
            conn.executemany(_INSERT_EVENT, rows)
            for sql, params in steps:
                conn.executemany(sql, params)
            added += len(rows)
            if progress is not None:
                progress(batch[-1].position - last, total)

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
        """Create the tables and their keys, once; ``indexes`` adds what searches them."""
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

    def indexes(self) -> None:
        """The indexes and the events' full-text index (with the triggers that keep it
        current). Built once the first rows are in: a single pass over them is far cheaper
        than keeping each index up to date row by row. Commits (sqlite-utils runs the
        full-text statements as a script)."""
        db = self.db
        if "events_fts" in db.table_names():
            return
        db["events"].create_index(["run_id", "seq"], unique=True, if_not_exists=True)
        db["events"].create_index(["run_id", "lease"], if_not_exists=True)
        db["events"].create_index(["type", "recorded_us"], if_not_exists=True)
        db["artifacts"].create_index(["sha256"], if_not_exists=True)
        db["deliveries"].create_index(["target", "status"], if_not_exists=True)
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
                  fields: Any = (), progress: OnProgress = None) -> dict[str, Any]:
    """Write (or extend) the readable copy of ``lg`` at ``path``; ``Ledger.export_sqlite``.

    Returns ``{"output", "events", "runs", "last_position", "redacted"}``: the events added
    by this export, the run rows written (the runs those events touched, and every live
    run, whose health is judged again), and the last position the copy now holds.
    """
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
    fields = tuple(fields)
    if os.path.exists(target):
        return _write(lg, target, target, salt=salt if redact else None, salt_id=salt_id, fields=fields,
                      progress=progress, fresh=False)
    with files.private_dir(target) as d:
        private = os.path.join(d, os.path.basename(target))
        try:  # the copy holds what the ledger holds: the ledger's permissions, before any byte
            os.close(os.open(private, os.O_CREAT | os.O_EXCL | os.O_WRONLY, lg.copy_mode()))
        except OSError as exc:
            raise files._failed(target, exc) from exc
        doc = _write(lg, private, target, salt=salt if redact else None, salt_id=salt_id, fields=fields,
                     progress=progress, fresh=True)
        try:
            files.fsync_file(private)
            files.publish_no_replace(private, target)
        except FileExistsError:
            raise TargetAppeared(f"output: a file appeared at {target} while the copy was written; it was left "
                                 "alone. If it is a readable copy of this ledger, export into it again to "
                                 "extend it; otherwise name a new file", field="output") from None
        except OSError as exc:
            raise files._failed(target, exc) from exc
        files.sync_dir(os.path.dirname(target))
    return doc


def _write(lg: Any, path: str, target: str, *, salt: bytes | None, salt_id: str | None, fields: tuple[str, ...],
           progress: OnProgress, fresh: bool) -> dict[str, Any]:
    """The export proper, into ``path``: a new private file (``fresh``) that nobody reads
    until it is complete, or the existing copy at ``target``, changed in one transaction."""
    copy = _Copy(lg, path, salt=salt, fields=fields)
    conn = copy.db.conn
    try:
        source = lg.store.path
        last = copy.check_meta(source, salt_id)
        if fresh:
            # Nobody sees this file before it is complete and synced, and a failure removes
            # it: SQLite's journal and per-commit syncs would protect nothing.
            conn.execute("PRAGMA journal_mode = OFF")
            conn.execute("PRAGMA synchronous = OFF")
        copy.tables()
        if not fresh:
            copy.indexes()  # an existing file that was empty; afterwards the triggers keep it
        end = lg.store.last_position()
        total = max(end - last, 0)
        conn.execute("BEGIN IMMEDIATE")
        try:
            added, touched = copy.load(lg.store.read_all(after_position=last, until_position=end), total, last,
                                       progress)
            if fresh:
                conn.commit()
                copy.indexes()  # one pass over the rows; commits
                conn.execute("BEGIN IMMEDIATE")
            now = lg.clock()
            watchers = lg.watchers()
            written = 0
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
            conn.commit()
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        if "runs_fts" not in copy.db.table_names() and "goal" in copy.db["runs"].columns_dict:
            copy.db["runs"].enable_fts(["goal"], create_triggers=True)
        if progress is not None:
            progress(total, total)
        return {"output": target, "events": added, "runs": written, "last_position": max(end, last),
                "redacted": salt is not None}
    finally:
        copy.db.close()
