"""The SQLite event store: one file, WAL, every write under BEGIN IMMEDIATE.

Durability first: ``synchronous=FULL`` unless the caller names ``NORMAL``. The events
table refuses UPDATE and DELETE by trigger. Positions are assigned inside the write
lock, so they become visible in order and a catch-up reader never skips one.
WAL checkpoints run only under the writer lock (see docs/architecture.md, "WAL reset").
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

from .. import events as ev
from .. import plan, verify
from ..errors import InvalidInput, LedgerError, OutcomeUnknown, StoreUnavailable
from ..store_core import FoldingStore, StoreTransaction
from ..importing import ImportHead, ImportRow
from ..plan import LeaseState, Request
from ..inputs import check_run_id, check_seq
from ..store import (DEFAULT_MAX_PAYLOAD, GENESIS_HASH, Aggregate, AppendResult, Capabilities, Decision, Folded,
                     LeaseToken, Liveness, lease_digest,
                     Head, Problem, Recorded, encode_events, global_link, now_us)
from . import sqlite_schema, sqlite_values
from .driver import explain as _explain
from .sqlite_schema import MARK_UNKEPT
from .group_commit import GroupCommit
from .opening import sniff, unreadable_schema, unusable_path

S = TypeVar("S")

PAGE = 1000
# Runs with events after a position, in the order they first appeared in the log (the
# order a full rebuild inserts them in), so new view rows get rowids in creation order.
_RUNS_SINCE = (
    "SELECT run_id FROM heads WHERE run_id IN "
    "(SELECT run_id FROM events WHERE position > ?) ORDER BY first_position"
)
#: Checkpoint the WAL once its file grows past this many bytes (checked after commits).
WAL_CHECKPOINT_BYTES = 8 << 20

Sync = Literal["FULL", "NORMAL"]

#: The ledger's last event: its position and the ledger-wide chain's hash there.
_TAIL = "SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1"
_COLUMNS = (
    "run_id, seq, position, type, actor, lease, idem_key, recorded_us, "
    "schema_version, payload, prev_hash, hash"
)


_UPSERT_HEAD = (
    "INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, "
    "first_position, last_position) VALUES (?,?,?,?,?,?,?,?) "
    "ON CONFLICT(run_id) DO UPDATE SET last_seq=excluded.last_seq, "
    "last_hash=excluded.last_hash, lease=excluded.lease, "
    "lease_holder=excluded.lease_holder, max_lease=excluded.max_lease, "
    "last_position=excluded.last_position"
)
#: A beat that needs no event (``EventStore.beat``): the row of this lease, same attrs, the
#: last beat within the quiet limit and not later than this one (a clock stepped back: the
#: log records it, so the stall index's deadline moves back with it), the last logged one
#: within the window, and the token
#: proving the run's current lease, all in the statement that moves it.
_BEAT = (
    "UPDATE liveness SET beat_us=:now, beats=beats+1 "
    "WHERE run_id=:run AND lease=:lease AND attrs=:attrs AND beat_us >= :now - quiet_us AND :now >= beat_us "
    "AND logged_us > :now - :mark AND EXISTS (SELECT 1 FROM heads WHERE run_id=:run AND lease=:lease "
    "AND lease_digest=:digest) RETURNING beat_us, beats, logged_us, quiet_us, "
    "(SELECT last_seq FROM heads WHERE run_id=:run), (SELECT last_hash FROM heads WHERE run_id=:run)"
)
#: A logged beat's (or a claim's) liveness, for the run's current lease only (its token's
#: digest, ?9, as the head holds it), never over a
#: later lease's row. A logged beat (?8) is the lease's latest: its time is taken as it is
#: (a clock stepped back moves the row back too, as the log's fold does) and its count is
#: one more than the row's; otherwise the later beat and the larger count are kept.
_PUT_LIVENESS = (
    "INSERT INTO liveness (run_id, lease, beat_us, beats, logged_us, attrs, quiet_us) "
    "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE EXISTS (SELECT 1 FROM heads WHERE run_id=?1 AND lease=?2 "
    "AND lease_digest=?9) "
    "ON CONFLICT(run_id) DO UPDATE SET beat_us=CASE WHEN excluded.lease = liveness.lease AND NOT ?8 "
    "THEN max(liveness.beat_us, excluded.beat_us) ELSE excluded.beat_us END, "
    "beats=CASE WHEN excluded.lease <> liveness.lease THEN excluded.beats WHEN ?8 THEN liveness.beats + 1 "
    "ELSE max(liveness.beats, excluded.beats) END, lease=excluded.lease, logged_us=excluded.logged_us, "
    "attrs=excluded.attrs, quiet_us=excluded.quiet_us WHERE excluded.lease >= liveness.lease"
)
_INSERT = (
    "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, global_hash) VALUES "
)
_INSERT_FIRST = _INSERT + "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
#: Only a batch's first event carries the idempotency key and digest.
_INSERT_REST = _INSERT + "(?,?,?,?,?,?,NULL,NULL,?,?,?,?,?,?,?)"


class SqliteStore(sqlite_values.SqliteValues, FoldingStore):
    """An EventStore in one SQLite file (or ``:memory:`` for tests and scratch work).

    One store object owns one connection and may be shared by threads; open one per
    process for multi-process use. ``synchronous`` is ``"FULL"`` (acknowledged means on
    disk after power loss) or ``"NORMAL"`` (faster; the last commits may be lost on
    power loss, never on a process crash).
    """

    capabilities = Capabilities(is_file=True, group_commit=True)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Sync = "FULL",
        busy_timeout_s: float = 5.0,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        clock: Callable[[], int] | None = None,
        create: bool = True,
        readonly: bool = False,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise InvalidInput(
                f"synchronous must be FULL or NORMAL, got {synchronous!r}", field="synchronous"
            )
        self.path = os.fspath(path)
        self.synchronous = synchronous
        self.busy_timeout_s = busy_timeout_s
        self.max_payload = max_payload
        self._clock = clock or now_us
        FoldingStore.__init__(self)
        self._memory = self.path == ":memory:"
        self._txn = SqliteTransaction(self)
        # A process's first commit checks the WAL's size (a CLI process makes one or two).
        self._commits_since_check = 63
        self._heads_indexed = False
        self._group: GroupCommit | None = None
        #: The file's schema: an older one stays only on a read-only open (see sqlite_schema.prepare).
        self.file_schema = sqlite_schema.STORE_SCHEMA_VERSION
        self.readonly = readonly
        self.conn = self._connect(create=create, readonly=readonly)
        try:
            sqlite_schema.prepare(self, create and not readonly, self._clock)
            # Only once the file is known to be a ledger: switching a foreign database
            # to WAL would rewrite its header even though we then refuse it.
            if not self._memory and not readonly:
                self._enable_wal()
        except BaseException:
            self.conn.close()
            raise
        self._file = None if self._memory else _OPEN.add(self.path)

    @classmethod
    def memory(cls, **kw: Any) -> SqliteStore:
        return cls(":memory:", **kw)

    # --- opening -------------------------------------------------------------------

    def _connect(self, *, create: bool, readonly: bool) -> sqlite3.Connection:
        path = self.path
        if not self._memory:
            refusal = unusable_path(path)
            if refusal is not None:
                raise refusal
            exists = os.path.exists(path)
            if exists and not _OPEN.holds(path):
                # Read the header only of a file no connection of this process holds: closing
                # any descriptor of a file drops every POSIX lock the process holds on it,
                # SQLite's included, and another process could then reset the WAL under them.
                refusal = sniff(path)
                if refusal is not None:
                    raise refusal
            if not exists:
                if not create or readonly:
                    raise StoreUnavailable(
                        f"no ledger at {path}; create one with 'handoff init' or pass --db"
                    )
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                    os.close(fd)
                except FileExistsError:
                    if os.path.islink(path) and not os.path.exists(path):
                        # O_EXCL does not follow a link; SQLite would, creating the file
                        # at the link's target with the umask's mode instead of 0600.
                        raise InvalidInput(
                            f"{path} is a symbolic link to {os.readlink(path)!r}, which does not "
                            "exist; a new ledger is not created through a link. Name the real "
                            "path, or create the ledger there first",
                            field="db",
                        ) from None
                except OSError as exc:
                    raise StoreUnavailable(
                        f"cannot create the ledger {path}: {exc.strerror}; check the directory",
                    ) from exc
        try:
            if readonly and not self._memory:
                import urllib.parse  # only here: every short-lived CLI process pays for imports

                uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
                conn = sqlite3.connect(
                    uri, uri=True, timeout=self.busy_timeout_s, isolation_level=None,
                    check_same_thread=False,
                )
            else:
                conn = sqlite3.connect(
                    path, timeout=self.busy_timeout_s, isolation_level=None,
                    check_same_thread=False,
                )
        except sqlite3.Error as exc:
            raise _explain(exc, "opening", path) from exc
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        try:
            conn.execute("PRAGMA trusted_schema=OFF")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            # After a RESTART checkpoint the next writer overwrites the WAL from its start
            # (no file growth on every commit, which costs ext4 a journal commit per
            # fdatasync); this cap trims it back after an unusually large burst.
            conn.execute(f"PRAGMA journal_size_limit={WAL_CHECKPOINT_BYTES}")
            # No automatic (passive) WAL checkpoints: see _maybe_wal_checkpoint.
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.DatabaseError as exc:
            conn.close()
            low = str(exc).lower()
            if not self._memory and ("not a database" in low or "malformed" in low):
                raise unreadable_schema(path, exc) from exc
            raise _explain(exc, "opening", path) from exc
        except sqlite3.Error as exc:
            conn.close()
            raise _explain(exc, "opening", path) from exc
        return conn

    def _enable_wal(self) -> None:
        try:
            mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.Error as exc:
            raise _explain(exc, "opening", self.path) from exc
        if str(mode).lower() != "wal":
            raise StoreUnavailable(
                f"could not switch {self.path} to WAL mode (got {mode}); is it on a "
                "network filesystem? Those are not supported"
            )

    # --- writing -------------------------------------------------------------------

    def begin(self, doing: str) -> None:
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _explain(exc, doing, self.path) from exc

    def finish(self, ok: bool, doing: str) -> None:
        conn = self.conn
        if ok:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if "i/o" in str(exc).lower():
                    # The frames may be in the WAL already; a crash now would bring them back.
                    raise OutcomeUnknown(
                        f"the commit to {self.path} failed while syncing ({exc}) during {doing}: "
                        "the write may or may not be stored. Retry with the same idempotency key "
                        "(a stored write answers 'duplicate'), or read the run to see",
                        cause=str(exc),
                    ) from exc
                raise _explain(exc, doing, self.path) from exc
            try:
                self._maybe_wal_checkpoint()
            except LedgerError:
                # The commit stands; a WAL checkpoint that could not run now is retried after
                # a later commit. Reporting it would tell the caller "nothing was written".
                pass
        elif conn.in_transaction:
            conn.execute("ROLLBACK")

    def _maybe_wal_checkpoint(self) -> None:
        """Checkpoint the WAL only in RESTART mode, which takes the writer lock for its whole run.

        Automatic checkpoints are off on every connection we open, so no checkpoint ever
        runs beside a commit: that closes the window of SQLite's WAL-reset bug (fixed in
        3.51.3) on the 3.40 library this machine ships. A busy reader makes it give up at
        once (busy_timeout 0), to be retried after a later commit.
        """
        if self._memory:
            return
        self._commits_since_check += 1
        if self._commits_since_check < 64:
            return
        self._commits_since_check = 0
        try:
            size = os.stat(self.path + "-wal").st_size
        except OSError:
            return
        if size >= WAL_CHECKPOINT_BYTES:
            self.wal_checkpoint(wait=False)

    def wal_checkpoint(self, *, wait: bool = True) -> tuple[int, int, int]:
        """Copy the WAL into the database, holding the writer lock; the next writer restarts it.

        Returns SQLite's (busy, WAL frames, frames checkpointed).
        """
        with self._reading("checkpointing the WAL"):
            conn = self.conn
            try:
                if not wait:
                    conn.execute("PRAGMA busy_timeout=0")
                return tuple(conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone())  # type: ignore[return-value]
            finally:
                if not wait:
                    conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")

    def _head_locked(self, run_id: str) -> tuple[Head | None, int]:
        row = self.conn.execute(
            "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
            "last_position, max_lease FROM heads WHERE run_id=?",
            (run_id,),
        ).fetchone()
        if row is None:
            return None, 0
        return Head(*row[:7]), row[7]

    def _hash_at(self, run_id: str, seq: int) -> bytes | None:
        row = self.conn.execute("SELECT hash FROM events WHERE run_id=? AND seq=?", (run_id, seq)).fetchone()
        return None if row is None else row[0]

    _driver_error = sqlite3.Error

    def _ledger_error(self, exc: BaseException, doing: str) -> LedgerError:
        return _explain(exc, doing, self.path)  # type: ignore[arg-type]

    def _lease_digest_locked(self, run_id: str) -> str | None:
        try:
            row = self.conn.execute("SELECT lease_digest FROM heads WHERE run_id=?", (run_id,)).fetchone()
        except sqlite3.OperationalError:
            # A file from before lease tokens, opened read-only (a writable open adds the
            # column): no lease of it has a digest.
            if sqlite_schema.has_lease_digest(self.conn):
                raise
            return None
        return None if row is None else row[0]

    def _duplicate(self, req: Request) -> AppendResult | None:
        """The earlier batch a repeated key names, or None; IdempotencyConflict when that
        key stood for another request."""
        row = self.conn.execute(
            "SELECT seq, position, idem_digest, batch_size, actor FROM events "
            "WHERE run_id=? AND idem_key=?",
            (req.run_id, req.key),
        ).fetchone()
        if row is None:
            return None
        seq, position, stored, size, by = row
        plan.check_repeat(req.run_id, req.key, req.digest, req.actor, stored, by, seq)  # type: ignore[arg-type]
        return AppendResult(req.run_id, "duplicate", seq, seq + size - 1,
                            tuple(range(position, position + size)))

    def _insert_locked(self, req: Request, head: Head | None, max_lease: int, batch: Sequence[ev.Event],
                       encoded: list[tuple[str, bytes]], lease: int | None,
                       written: list[Recorded]) -> tuple[AppendResult, Head]:
        """Insert a batch and move the head; return what was appended and the new head (as
        ``_head_locked`` would now read it), and put the new events in ``written`` as a
        reader would get them, without reading them back."""
        conn = self.conn
        run_id = req.run_id
        last_pos, gprev = self._import_tail()
        done = plan.stamp(run_id, head, max_lease, batch, encoded, req.actor, lease, req.key, req.digest,
                          self._clock(), lambda parent: self._head_locked(parent)[0])
        n = done.size
        rows = []
        for i, (seq, tag, k, digest, payload, prev, h) in enumerate(done.events):
            pos = last_pos + 1 + i
            gprev = global_link(gprev, pos, h)
            # Blobs are bound as bytearray: Python's sqlite3 binds it directly, while bytes
            # (and None) go through the adapter lookup first (docs/performance.md).
            rows.append((pos, run_id, seq, tag, req.actor, lease, k, bytearray(digest) if digest else None,
                         n, done.now, ev.SCHEMA_VERSION, bytearray(payload), bytearray(prev), bytearray(h),
                         bytearray(gprev)))
            written.append(Recorded(run_id, seq, pos, tag, req.actor, lease, k, done.now, ev.SCHEMA_VERSION,
                                    payload, prev, h))
        conn.execute(_INSERT_FIRST, rows[0])
        if n > 1:
            conn.executemany(_INSERT_REST, [r[:6] + r[8:] for r in rows[1:]])
        fence = done.fence
        first_position = head.first_position if head else last_pos + 1
        self._put_head(run_id, done.last_seq, done.last_hash, fence, first_position, last_pos + n)
        if not self._keeps_views:
            conn.execute(MARK_UNKEPT, (last_pos + 1,))
        result = AppendResult(run_id, "committed", done.last_seq - n + 1, done.last_seq,
                              tuple(range(last_pos + 1, last_pos + n + 1)))
        return result, Head(run_id, done.last_seq, done.last_hash, fence.lease, fence.holder, first_position,
                            last_pos + n)

    def _put_head(self, run_id: str, last_seq: int, last_hash: bytes, fence: LeaseState, first_position: int,
                  last_position: int) -> None:
        """A run's head after a write (new run or existing), live or imported."""
        self.conn.execute(_UPSERT_HEAD, (run_id, last_seq, bytearray(last_hash), fence.lease, fence.holder,
                                         fence.max_lease, first_position, last_position))
        if fence.digest_moved:
            self.conn.execute("UPDATE heads SET lease_digest=? WHERE run_id=?", (fence.digest, run_id))

    # --- liveness beside the log (ledger.store.Liveness) -------------------------------

    def beat(self, run_id: str, token: LeaseToken, attrs: bytes, *,
             mark_us: int) -> tuple[Liveness, int, bytes] | None:
        if self.readonly:
            return None  # the command path says why
        now = self._clock()
        args = {"run": run_id, "lease": token.lease, "digest": lease_digest(token.secret), "attrs": attrs,
                "now": now, "mark": mark_us}
        with self._reading("recording a heartbeat"):
            conn = self.conn
            if conn.in_transaction:
                return None  # inside another write (a decide callback): the command path joins it
            # One statement, its own transaction, not synced: the next synced commit (or a
            # checkpoint) makes it durable, and a crash before that loses only this beat.
            conn.execute("PRAGMA synchronous=OFF")
            try:
                rows = conn.execute(_BEAT, args).fetchall()  # stepped to the end: committed
            finally:
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
            if rows:
                try:
                    self._maybe_wal_checkpoint()  # beats grow the WAL too: a fleet may only beat
                except LedgerError:
                    pass  # retried after a later commit, as after a command's
        if not rows:
            return None
        beat_us, beats, logged_us, quiet_us, last_seq, last_hash = rows[0]
        return Liveness(run_id, token.lease, beat_us, beats, logged_us, attrs, quiet_us), last_seq, bytes(last_hash)

    def liveness(self, run_ids: Iterable[str]) -> dict[str, Liveness]:
        ids = list(dict.fromkeys(run_ids))
        out: dict[str, Liveness] = {}
        with self._reading("reading liveness"):
            try:
                for i in range(0, len(ids), 500):
                    chunk = ids[i:i + 500]
                    for row in self.conn.execute(
                        f"SELECT run_id, lease, beat_us, beats, logged_us, attrs, quiet_us FROM liveness "
                        f"WHERE run_id IN ({','.join('?' * len(chunk))})", chunk,
                    ):
                        out[row[0]] = Liveness(row[0], row[1], row[2], row[3], row[4], bytes(row[5]), row[6])
            except sqlite3.OperationalError:
                # A file from before the table, opened read-only: no beat was kept beside its log.
                if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name='liveness'").fetchone():
                    raise
        return out

    def put_liveness(self, live: Liveness, token: LeaseToken, *, one_more: bool = False) -> None:
        if self.readonly or token.lease != live.lease:
            return
        with self._reading("recording liveness"):
            conn = self.conn
            joined = conn.in_transaction
            if not joined:
                conn.execute("PRAGMA synchronous=OFF")
            try:
                conn.execute(_PUT_LIVENESS, (live.run_id, live.lease, live.beat_us, live.beats, live.logged_us,
                                             live.attrs, live.quiet_us, one_more, lease_digest(token.secret)))
            finally:
                if not joined:
                    conn.execute(f"PRAGMA synchronous={self.synchronous}")

    # --- import: the rows of the core's streamed import (FoldingStore.import_records) ---

    def _import_tail(self) -> tuple[int, bytes]:
        """The ledger's last position and global hash, in the open transaction."""
        tail = self.conn.execute(_TAIL).fetchone()
        return tail if tail is not None else (0, GENESIS_HASH)

    def _key_used(self, run_id: str, key: str) -> bool:
        return self.conn.execute("SELECT 1 FROM events WHERE run_id=? AND idem_key=?", (run_id, key)).fetchone() is not None

    def _import_rows(self, rows: list[ImportRow], heads: list[ImportHead]) -> None:
        conn = self.conn
        if rows:
            conn.executemany(_INSERT_FIRST, [
                (pos, r.run_id, r.seq, r.type, r.actor, r.lease, r.idempotency_key, digest, size, r.recorded_us,
                 r.schema_version, bytearray(r.payload), bytearray(r.prev_hash), bytearray(r.hash), bytearray(g))
                for pos, r, digest, size, g in rows])
            if not self._keeps_views:
                conn.execute(MARK_UNKEPT, (rows[0][0],))
        for h in heads:
            self._put_head(h.run_id, h.seq, h.hash, h.fence, h.first_position, h.last_position)  # type: ignore[arg-type]

    def _import_done(self, last_position: int, global_hash: bytes) -> None:
        """Nothing more: the rows carry their positions and the ledger-wide chain."""

    # --- commands --------------------------------------------------------------------

    def _append(self, req: Request) -> AppendResult:
        return self._command(req, None, None, "committing an append")[0]

    def _execute(self, req: Request, aggregate: Aggregate[S],
                 decide: Callable[[S, Head | None], Decision]) -> tuple[AppendResult, S]:
        if self._group is not None:
            return self._group.submit(req.run_id, lambda: self._write_locked(req, aggregate, decide))
        return self._command(req, aggregate, decide, "committing a command")  # type: ignore[return-value]

    def _command(self, req: Request, aggregate: Aggregate[S] | None,
                 decide: Callable[[S, Head | None], Decision] | None, committing: str) -> tuple[AppendResult, S | None]:
        with self.lock:
            with self.write_transaction("appending", committing):
                result, state, folded = self._write_locked(req, aggregate, decide)
            if folded is not None:
                self._remember_all(req.run_id, folded)
            return result, state

    def _write_locked(
        self, req: Request, aggregate: Aggregate[S] | None, decide: Callable[[S, Head | None], Decision] | None,
    ) -> tuple[AppendResult, S | None, Folded | None]:
        """The body of a command inside an open write transaction, in the plan's order: the
        repeated key, the fence, then ``decide`` (an append, with no ``aggregate``, carries
        its events). Returns the result, the state after it, and the folds to remember once
        the transaction commits (None: nothing new)."""
        run_id = req.run_id
        try:
            head, max_lease = self._head_locked(run_id)
            if req.key and (dup := self._duplicate(req)) is not None:
                return dup, None if aggregate is None else self._state_locked(run_id, aggregate, head), None
            plan.check_fence(run_id, head, req.expected_seq, None)
            if req.token is not None:
                plan.check_token(run_id, head, max_lease, req.token, self._lease_digest_locked(run_id))
            # The states before the write (cached for a warm run), so that after it they
            # are evolved over the rows written instead of reading them back.
            aggregates = [agg for agg, _ in self._hooks] if aggregate is None else [aggregate]
            before = [(agg, self._state_locked(run_id, agg, head)) for agg in aggregates]
            events, encoded, lease = req.events, req.encoded, req.lease
            if aggregate is not None and decide is not None:
                decision = decide(before[0][1], head)
                if not decision.events:
                    return plan.unchanged(run_id, head), before[0][1], None
                plan.check_decision(run_id, decision, req.token, head, max_lease)
                events, encoded, lease = decision.events, encode_events(decision.events, self.max_payload), decision.lease
            written: list[Recorded] = []
            result, new_head = self._insert_locked(req, head, max_lease, events, encoded, lease, written)  # type: ignore[arg-type]
            # A new fork child's fold starts from its parent's prefix: fold its lineage.
            forked = head is None and isinstance(events[0], ev.RunForked)
            after = [(agg, self._state_locked(run_id, agg, new_head) if forked else agg.evolve_all(state, written))
                     for agg, state in before]
            folded = self._run_hooks(run_id, new_head, after)
        except sqlite3.Error as exc:
            raise _explain(exc, "appending", self.path) from exc
        if aggregate is None:
            return result, None, folded
        new_state = after[0][1]
        if folded[0] is None:
            # The head new_state belongs to, as of this transaction: after COMMIT
            # another process may already have moved it past what new_state covers.
            folded = (new_head, [])
        if all(a is not aggregate for a, _ in folded[1]):
            folded[1].append((aggregate, new_state))
        return result, new_state, folded

    # --- reading -------------------------------------------------------------------

    def _run_range(self, columns: str, run_id: str, after_seq: int, until_seq: int | None) -> sqlite3.Cursor:
        """The run's events after ``after_seq`` (up to ``until_seq``) in seq order."""
        if until_seq is None:
            return self.conn.execute(f"SELECT {columns} FROM events WHERE run_id=? AND seq>? ORDER BY seq",
                                     (run_id, after_seq))
        return self.conn.execute(f"SELECT {columns} FROM events WHERE run_id=? AND seq>? AND seq<=? ORDER BY seq",
                                 (run_id, after_seq, until_seq))

    def _read_run_page(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Recorded]:
        return [Recorded(*r) for r in self._run_range(_COLUMNS, run_id, after_seq, until_seq)]

    def _step_rows(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Any]:
        # (Called under _reading, or inside a write or read transaction that maps errors.)
        return self._run_range("seq, type, recorded_us, payload, actor", run_id, after_seq, until_seq).fetchall()

    def _iter_all(self, after_position: int, until_position: int | None, page: int) -> Iterator[Recorded]:
        upto = "" if until_position is None else " AND position<=?"
        sql = f"SELECT {_COLUMNS} FROM events WHERE position>?{upto} ORDER BY position LIMIT ?"
        bound = () if until_position is None else (until_position,)
        cursor = after_position
        while True:
            with self._reading():
                rows = self.conn.execute(sql, (cursor, *bound, page)).fetchall()
            yield from itertools.starmap(Recorded, rows)
            if len(rows) < page:
                return
            cursor = rows[-1][2]

    def _export_page(self, after: int) -> list[tuple[Recorded, bytes | None, int]]:
        rows = self.conn.execute(f"SELECT {_COLUMNS}, idem_digest, batch_size FROM events "
                                 "WHERE position>? ORDER BY position LIMIT ?", (after, PAGE)).fetchall()
        return [(Recorded(*r[:12]), r[12], r[13]) for r in rows]

    def head(self, run_id: str) -> Head | None:
        check_run_id(run_id)
        return self._read("reading a run's head", self._head_locked, run_id)[0]

    def list_runs(self, *, prefix: str | None = None) -> Iterator[Head]:
        sql = ("SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
               "last_position FROM heads")
        args: tuple[str, ...] = ()
        if prefix:
            # A key range on the primary key: O(matches), not a scan of every run.
            sql += " WHERE run_id >= ? AND run_id < ?"
            args = (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))
        order = " ORDER BY first_position, run_id"
        if prefix or not self._has_heads_index():
            with self.lock:
                rows = self.conn.execute(sql + order, args).fetchall()
            yield from (Head(*r) for r in rows)
            return
        # Keyset pages on the index: memory stays flat however many runs there are, and
        # each page is read whole, so a caller may write between pages. The key includes
        # run_id so that no row is skipped even where first positions tie or are odd (a
        # damaged heads table, which verify reports; every listing must still show it).
        page = self.conn.execute
        cursor: tuple[Any, ...] | None = None
        while True:
            with self.lock:
                if cursor is None:
                    rows = page(sql + order + " LIMIT ?", (PAGE,)).fetchall()
                else:
                    rows = page(
                        sql + " WHERE (first_position, run_id) > (?, ?)" + order + " LIMIT ?",
                        (*cursor, PAGE),
                    ).fetchall()
            yield from (Head(*r) for r in rows)
            if len(rows) < PAGE:
                return
            cursor = (rows[-1][5], rows[-1][0])

    def count_runs(self) -> int:
        with self.lock:
            return self.conn.execute("SELECT count(*) FROM heads").fetchone()[0]

    def _has_heads_index(self) -> bool:
        if not self._heads_indexed:
            with self.lock:
                self._heads_indexed = bool(self.conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name='heads_first'"
                ).fetchone())
        return self._heads_indexed

    def last_position(self) -> int:
        with self.lock:
            return self.conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]

    # --- checking ------------------------------------------------------------------

    def verify(self, run_id: str | None = None, *, progress: Callable[[int, int], None] | None = None) -> list[Problem]:
        """Walk the log and report broken links, seq gaps, bad payloads and stale heads.

        Reports the first problem of each run (later ones usually follow from it) and any
        hole in the global positions, which is where a deleted row shows. Runs in one
        read transaction, so a concurrent writer cannot make the heads look ahead of the
        events walked (a false head_mismatch).
        """
        with self.read_transaction("verifying"):
            source = self.read_run(run_id) if run_id is not None else self.read_all()
            found = verify.walk(((rec, rec.position) for rec in source), whole=run_id is None,
                                total=self.last_position(), progress=progress)

            # The ledger-wide checks run for one run too: a hole or a break anywhere in the
            # global chain makes every run's place in the order doubtful.
            def page(after: int) -> list[Any]:
                return self.conn.execute("SELECT position, run_id, seq, hash, global_hash FROM events "
                                         "WHERE position > ? ORDER BY position LIMIT ?", (after, PAGE * 10)).fetchall()

            problems = found.problems + verify.chain(page, PAGE * 10, gaps=run_id is not None)[0]
            heads = {h.run_id: h for h in self.list_runs()} if run_id is None else (
                {run_id: h} if (h := self.head(run_id)) else {})

            def fence_of(rid: str) -> tuple:
                row = self.conn.execute("SELECT lease, lease_holder, max_lease FROM heads WHERE run_id=?",
                                        (rid,)).fetchone()
                return (*row, self._lease_digest_locked(rid))

            problems += verify.check_heads(found, heads, fence_of, "positions")
            return problems + sqlite_schema.append_only_problems(self.conn)

    def append_only_problems(self) -> list[Problem]:
        with self._reading("reading the triggers"):
            return sqlite_schema.append_only_problems(self.conn)

    # --- heads of the whole ledger, and copies ---------------------------------------

    def ledger_head(self) -> tuple[int, bytes]:
        with self._reading("reading the ledger's head"):
            row = self.conn.execute(_TAIL).fetchone()
        if row is None:
            return 0, GENESIS_HASH
        return row[0], bytes(row[1]) if isinstance(row[1], (bytes, bytearray)) else b""

    def global_hash_at(self, position: int) -> bytes | None:
        check_seq(position, "position")
        with self._reading("reading the ledger-wide chain"):
            row = self.conn.execute("SELECT global_hash FROM events WHERE position=?", (position,)).fetchone()
        if row is None or not isinstance(row[0], (bytes, bytearray)):
            return None
        return bytes(row[0])

    def backup_to(self, path: str) -> tuple[int, bytes, int]:
        """SQLite's online backup of every page, WAL included, in one step under one read
        snapshot: writers go on meanwhile and the copy is exactly one committed state.
        The copy is left in rollback-journal mode, so it is one self-contained file."""
        try:
            dst = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise _explain(exc, "creating a backup", path) from exc
        try:
            with self.lock:
                self.conn.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
            row = dst.execute(_TAIL).fetchone()
            runs = dst.execute("SELECT count(*) FROM heads").fetchone()[0]
        except sqlite3.Error as exc:
            raise _explain(exc, "copying the ledger into a backup", self.path) from exc
        finally:
            dst.close()
        return (0, GENESIS_HASH, runs) if row is None else (row[0], bytes(row[1]), runs)

    # --- ledger-wide settings (ledger/store.py) -------------------------------------

    def setting(self, name: str) -> str | None:
        with self._reading("reading a ledger setting"):
            row = self.conn.execute("SELECT value FROM handoff_meta WHERE key = ?", (f"setting.{name}",)).fetchone()
        return None if row is None else str(row[0])

    def put_setting(self, name: str, value: str | None) -> None:
        with self.write_transaction("changing a ledger setting"):
            if value is None:
                self.conn.execute("DELETE FROM handoff_meta WHERE key = ?", (f"setting.{name}",))
            else:
                self.conn.execute("INSERT OR REPLACE INTO handoff_meta (key, value) VALUES (?, ?)",
                                  (f"setting.{name}", value))

    # --- the backend-neutral interface for the layers above (ledger/store.py) ---------

    @contextlib.contextmanager
    def read_transaction(self, doing: str = "reading") -> Iterator[SqliteTransaction]:
        """One read snapshot (``BEGIN`` ... ``ROLLBACK``), or the transaction already open."""
        with self.lock:
            conn = self.conn
            began = not conn.in_transaction
            try:
                if began:
                    conn.execute("BEGIN")
                yield self._txn
            except sqlite3.Error as exc:
                raise _explain(exc, doing, self.path) from exc
            finally:
                if began and conn.in_transaction:
                    conn.execute("ROLLBACK")

    @functools.cached_property
    def views(self) -> Any:
        """The view store on this file (ledger/sqlite/sqlite_view_store.py), made on first use."""
        from .sqlite_view_store import SqliteViewStore

        return SqliteViewStore(self)

    def diagnostics(self) -> dict[str, Any]:
        """What ``handoff doctor`` prints: the file, the SQLite library and its settings."""
        version = sqlite3.sqlite_version
        affected = tuple(int(x) for x in version.split(".")[:3]) < (3, 51, 3)
        with self.lock:
            pragma = lambda name: self.conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
            return {
                "path": self.path if self._memory else os.path.abspath(self.path),
                "backend": "sqlite",
                "backend_version": version,
                "sqlite_version": version,
                "wal_reset_bug": {
                    "affected_version": affected,
                    "mitigation": "automatic checkpoints off; checkpoints run only in RESTART mode, "
                    "which holds the writer lock (docs/architecture.md)",
                },
                "journal_mode": pragma("journal_mode"),
                "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(pragma("synchronous")),
                "wal_autocheckpoint": pragma("wal_autocheckpoint"),
                "file_schema": self.file_schema,
                **({"upgrade": note} if (note := sqlite_schema.upgrade_note(self)) else {}),
            }

    def integrity_check(self) -> str:
        with self.lock:
            return "; ".join(r[0] for r in self.conn.execute("PRAGMA integrity_check"))

    def enable_group_commit(self) -> None:
        """Let concurrent ``execute`` calls from this process's threads share one write
        transaction and one fsync (see ``_GroupCommit``); each command is still fenced,
        deduplicated and decided on its own. ``handoff.Ledger(group_commit=True)`` calls it."""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; group commit needs a writable one")
        with self.lock:
            if self._group is None:
                self._group = GroupCommit(self)

    def close(self) -> None:
        with self.lock:
            try:
                self.conn.close()
            except sqlite3.Error:
                pass
            key, self._file = getattr(self, "_file", None), None
            if key is not None:
                _OPEN.discard(key)


class _OpenFiles:
    """The ledger files this process holds a connection to, by (device, inode), counted.

    SQLite keeps its POSIX locks per process and per file, and ``close()`` of any
    descriptor of that file drops them all (sqlite.org/howtocorrupt.html, 2.2). A second
    store opening a file the process already holds must not read its header with a plain
    ``open``: the first store's locks would be gone, and another process closing its own
    connection could then checkpoint and delete the WAL the first store still writes to."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._count: dict[tuple[int, int], int] = {}

    @staticmethod
    def _key(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def holds(self, path: str) -> bool:
        key = self._key(path)
        with self._lock:
            return key is not None and key in self._count

    def add(self, path: str) -> tuple[int, int] | None:
        key = self._key(path)
        if key is not None:
            with self._lock:
                self._count[key] = self._count.get(key, 0) + 1
        return key

    def discard(self, key: tuple[int, int]) -> None:
        with self._lock:
            left = self._count.get(key, 0) - 1
            if left > 0:
                self._count[key] = left
            else:
                self._count.pop(key, None)


_OPEN = _OpenFiles()


class SqliteTransaction(StoreTransaction):
    """The handle ``write_transaction``, ``read_transaction`` and inline hooks receive."""

    __slots__ = ()

    def head(self, run_id: str) -> Head | None:
        return self._store._head_locked(run_id)[0]

    def runs_since(self, position: int) -> list[str]:
        return [r[0] for r in self._store.conn.execute(_RUNS_SINCE, (position,))]

    def count_runs(self, *, begun_by: int | None = None) -> int:
        conn = self._store.conn
        if begun_by is None:
            return conn.execute("SELECT count(*) FROM heads").fetchone()[0]
        return conn.execute("SELECT count(*) FROM heads WHERE first_position <= ?", (begun_by,)).fetchone()[0]

    def last_position(self) -> int:
        return self._store.last_position()
