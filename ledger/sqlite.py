"""The SQLite event store: one file, WAL, every write under BEGIN IMMEDIATE.

Durability first: ``synchronous=FULL`` unless the caller names ``NORMAL``. The events
table refuses UPDATE and DELETE by trigger. Positions are assigned inside the write
lock, so they become visible in order and a catch-up reader never skips one.
Checkpoints run only under the writer lock (see docs/architecture.md, "WAL reset").
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

import msgspec

from . import events as ev
from . import files
from .errors import (
    CorruptLedger,
    IdempotencyConflict,
    InvalidInput,
    LedgerError,
    NotALedger,
    OutcomeUnknown,
    PayloadTooLarge,
    SchemaTooNew,
    SeqConflict,
    StaleLease,
    StoreUnavailable,
)
from .store import (
    GENESIS_HASH,
    Actor,
    LeaseToken,
    Aggregate,
    AppendResult,
    Decision,
    EventStore,
    Head,
    Problem,
    Recorded,
    Step,
    Transaction,
    chain_hash,
    check_actor,
    check_idempotency_key,
    check_run_id,
    check_seq,
    encode_events,
    request_digest,
    DEFAULT_MAX_PAYLOAD,
)

S = TypeVar("S")

#: Layout version of the file itself (tables, indexes, triggers). 2: the views_unkept
#: table (writes that did not keep every projection inline), and inline writes no longer
#: move the tracking rows; a file of schema 1 is upgraded by its first writable open.
STORE_SCHEMA_VERSION = 2
#: Each write that did not keep every projection inline (a bare store, a projector of some
#: views only, an older tool) records its first position here, with the projections it did
#: keep (comma-separated; '' for none). A projection is current up to the log's end but
#: for the first such write after its tracking position that did not keep it: so a write
#: that keeps them all, the usual one, writes no tracking row (SqliteViewStore.lagging).
UNKEPT = "views_unkept"
_CREATE_UNKEPT = f"CREATE TABLE IF NOT EXISTS {UNKEPT} (position INTEGER PRIMARY KEY, kept TEXT NOT NULL)"
# Written only once projection tables exist: before that, a view made later is built
# from the whole log anyway (its tracking row starts unbuilt), so nothing need be marked.
_MARK_UNKEPT = (
    f"INSERT INTO {UNKEPT} (position, kept) SELECT ?, '' "
    "WHERE EXISTS (SELECT 1 FROM sqlite_master WHERE type='table' AND name='projection_positions')"
)
FORMAT_NAME = "handoff-ledger"
PAGE = 1000
# Runs in the order they first appeared, a page at a time: list_runs and a rebuild walk
# every run without holding them all in memory. A run's first position never changes,
# so head updates never touch this index; only a run's first append adds an entry.
_HEADS_FIRST = "CREATE INDEX IF NOT EXISTS heads_first ON heads(first_position)"
_TAGS = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}
#: The triggers that make the events table append-only, exactly as created. verify and
#: doctor compare the file's triggers with these: one dropped or rewritten is reported.
APPEND_ONLY_TRIGGERS = {
    "events_no_update": (
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: UPDATE refused'); END"
    ),
    "events_no_overwrite": (
        "CREATE TRIGGER events_no_overwrite BEFORE INSERT ON events WHEN EXISTS ("
        "SELECT 1 FROM events WHERE position = NEW.position "
        "OR (run_id = NEW.run_id AND seq = NEW.seq)) BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: overwrite refused'); END"
    ),
    "events_no_delete": (
        "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: DELETE refused'); END"
    ),
}
_MISSING = object()
# Runs with events after a position, in the order they first appeared in the log (the
# order a full rebuild inserts them in), so new view rows get rowids in creation order.
_RUNS_SINCE = (
    "SELECT run_id FROM heads WHERE run_id IN "
    "(SELECT run_id FROM events WHERE position > ?) ORDER BY first_position"
)
#: Checkpoint once the WAL file grows past this many bytes (checked after commits).
WAL_CHECKPOINT_BYTES = 8 << 20

Sync = Literal["FULL", "NORMAL"]

_COLUMNS = (
    "run_id, seq, position, type, actor, lease, idem_key, recorded_us, "
    "schema_version, payload, prev_hash, hash"
)


#: A run's head after a write (new run or existing): the one statement both the live
#: append and the import keep it with.
_UPSERT_HEAD = (
    "INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, "
    "first_position, last_position) VALUES (?,?,?,?,?,?,?,?) "
    "ON CONFLICT(run_id) DO UPDATE SET last_seq=excluded.last_seq, "
    "last_hash=excluded.last_hash, lease=excluded.lease, "
    "lease_holder=excluded.lease_holder, max_lease=excluded.max_lease, "
    "last_position=excluded.last_position"
)
_INSERT_FIRST = (
    "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, global_hash) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_REST = (
    "INSERT INTO events (position, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, global_hash) "
    "VALUES (?,?,?,?,?,?,NULL,NULL,?,?,?,?,?,?,?)"
)


def _decoded(payloads: list[bytes], types: list[str]) -> list[ev.Event] | None:
    """A page of payloads decoded together, or None if one does not decode or is not the
    type its row names (the caller then reads the page whole, to name the damaged one)."""
    try:
        events = ev.decode_many(payloads)
        if list(map(_TAGS.__getitem__, map(type, events))) == types:
            return events
    except (msgspec.ValidationError, msgspec.DecodeError, TypeError, UnicodeDecodeError, KeyError):
        pass
    return None


def global_link(prev_global: bytes, position: int, event_hash: bytes) -> bytes:
    """The ledger-wide chain: each event's hash bound to its global position and to the one
    before it. Per-run chains leave positions out (an exported run keeps its hashes in any
    ledger); this chain is local to one file and is what shows a reordering across runs."""
    return hashlib.sha256(b"".join((prev_global, position.to_bytes(8, "big"), event_hash))).digest()


def _now_us() -> int:
    return time.time_ns() // 1000


def is_driver_error(exc: BaseException) -> bool:
    """An error from the sqlite3 driver itself (ledger.backends.is_driver_error asks)."""
    return isinstance(exc, sqlite3.Error)


def _explain(exc: sqlite3.Error, doing: str, path: str) -> LedgerError:
    """Map a driver error to the library's own, in one place."""
    text = str(exc)
    low = text.lower()
    if "locked" in low or "busy" in low:
        return StoreUnavailable(
            f"the ledger {path} stayed locked by another process past the busy timeout while "
            f"{doing}; nothing was written. Retry, or raise the timeout (--busy-timeout)",
            cause=text,
        )
    if "readonly" in low or "read-only" in low:
        return StoreUnavailable(
            f"the ledger {path} is read-only, so {doing} wrote nothing. Check the file's "
            "permissions and the directory's (SQLite writes -wal and -shm files beside it)",
            cause=text,
        )
    if "disk is full" in low or "disk or i/o" in low or "i/o error" in low:
        return StoreUnavailable(
            f"the disk holding {path} is full or failing ({text}) while {doing}; nothing was "
            "written. Free space and retry; acknowledged events are intact",
            cause=text,
        )
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return CorruptLedger(
            f"{path} is damaged or not a database ({text}) while {doing}. Run "
            "'handoff verify' on a copy, and restore from a backup or export",
            cause=text,
        )
    if "unable to open" in low:
        return StoreUnavailable(
            f"cannot open {path} ({text}); check that the directory exists and is writable",
            cause=text,
        )
    return StoreUnavailable(f"SQLite failed while {doing} on {path}: {text}", cause=text)


#: Times an imported event may carry (UTC µs): from 2000-01-01 to the end of year 9999.
#: Nothing this library wrote predates 2000, and later than 9999 cannot be printed.
IMPORT_MIN_US = 946_684_800_000_000
IMPORT_MAX_US = 253_402_300_799_999_999
#: How far after the importing store's "now" an imported event may be dated (µs): ten
#: minutes of clock difference between the host that wrote it and this one.
IMPORT_MAX_AHEAD_US = 600_000_000
#: Rows buffered before one executemany; runs whose fold is kept warm during an import.
IMPORT_ROWS = 1000
IMPORT_RUNS = 4096


def check_imported_envelope(rec: Recorded, max_payload: int, now_us: int | None = None) -> None:
    """What a live write guarantees about an envelope, required of an imported one.

    ``now_us`` (the importing store's clock): no event can have been written later than
    now, give or take ``IMPORT_MAX_AHEAD_US`` of clock difference between hosts."""
    where = f"run {rec.run_id} seq {rec.seq}"
    try:
        actor = check_actor(Actor.parse(rec.actor))
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: actor {rec.actor[:60]!r} is not valid ({exc.message})", field="actor") from None
    if rec.lease is not None and rec.lease < 1:
        raise InvalidInput(f"{where}: lease {rec.lease} is not a lease (leases start at 1)", field="lease")
    if rec.lease is not None and not rec.actor.startswith("worker:"):
        raise InvalidInput(f"{where}: only a worker writes under a lease, not {rec.actor[:60]}", field="lease")
    try:
        check_idempotency_key(rec.idempotency_key, actor)  # the watchdog's keys stay the watchdog's
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}", field="idempotency_key") from None
    if now_us is not None and rec.recorded_us > now_us + IMPORT_MAX_AHEAD_US:
        raise InvalidInput(
            f"{where}: recorded_us {rec.recorded_us} is {(rec.recorded_us - now_us) // 1_000_000} s after "
            "now by this ledger's clock; history cannot come from the future (a heartbeat dated ahead "
            "would keep a dead worker looking alive). Check the exporting host's clock",
            field="recorded_us",
        )
    if not 1 <= rec.schema_version <= ev.SCHEMA_VERSION:
        raise InvalidInput(
            f"{where}: schema_version {rec.schema_version} is not one this version writes or reads "
            f"(1 to {ev.SCHEMA_VERSION}); upgrade handoff-ledger to import it",
            field="schema_version",
        )
    if len(rec.payload) > max_payload:
        raise PayloadTooLarge(
            f"{where} ({rec.type}) is {len(rec.payload)} bytes, over the limit of {max_payload} a "
            "live write obeys; such an event cannot have been written by this library",
            field="payload",
        )
    if not IMPORT_MIN_US <= rec.recorded_us <= IMPORT_MAX_US:
        raise InvalidInput(
            f"{where}: recorded_us {rec.recorded_us} is outside 2000-01-01 to 9999-12-31 (UTC); "
            "the export was edited or its clock was wrong",
            field="recorded_us",
        )


class _Cursor:
    """Where one run stands during an import: its head as it will be written, and its fold."""

    __slots__ = ("seq", "hash", "lease", "holder", "max_lease", "first_position", "last_position",
                 "stored_seq", "state", "dirty", "digest", "digest_moved", "granted_here")


class _Import:
    """One streamed import inside the caller's write transaction: rows buffered and inserted
    a thousand at a time, runs' heads and folds kept for the most recent few thousand runs
    (others are read back from the transaction when they reappear), so memory stays flat
    in the size of the file."""

    def __init__(self, store: SqliteStore, aggregate: Aggregate[Any] | None,
                 admit: Callable[[Any, Recorded, ev.Event], None] | None) -> None:
        self.store, self.conn = store, store._conn
        self.aggregate, self.admit = aggregate, admit
        tail = self.conn.execute("SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
        self.last_pos, self.gprev = tail if tail is not None else (0, GENESIS_HASH)
        self.runs: collections.OrderedDict[str, _Cursor] = collections.OrderedDict()
        self.rows: list[tuple[Any, ...]] = []
        self.keys: set[tuple[str, str]] = set()
        self.seen: set[str] = set()
        self.folded: dict[str, tuple[Head | None, list[tuple[Aggregate[Any], Any]]]] = {}
        self.imported = self.skipped = 0

    def _cursor(self, run_id: str) -> _Cursor:
        cur = self.runs.get(run_id)
        if cur is not None:
            self.runs.move_to_end(run_id)
            return cur
        if len(self.runs) >= IMPORT_RUNS:
            self.flush()
            while len(self.runs) >= IMPORT_RUNS // 2:
                self.runs.popitem(last=False)
        head, max_lease = self.store._head_locked(run_id)
        cur = _Cursor()
        cur.seq = head.last_seq if head else 0
        cur.hash = head.last_hash if head else GENESIS_HASH
        cur.lease, cur.holder = (head.lease, head.lease_holder) if head else (None, None)
        cur.max_lease = max_lease
        cur.first_position = head.first_position if head else None
        cur.last_position = head.last_position if head else None
        cur.stored_seq = cur.seq
        cur.digest, cur.digest_moved = None, False
        # The current lease, if any, was granted by this ledger: only its token proves it.
        cur.granted_here = cur.lease is not None
        cur.state = None
        if self.aggregate is not None and head is not None:
            cur.state = self.store._state_locked(run_id, self.aggregate, head)
        cur.dirty = False
        self.runs[run_id] = cur
        return cur

    def add(self, r: Recorded, digest: bytes | None, size: int) -> None:
        run_id = r.run_id
        self.seen.add(run_id)
        cur = self._cursor(run_id)
        if r.seq <= cur.stored_seq:
            row = self.conn.execute("SELECT hash FROM events WHERE run_id=? AND seq=?", (run_id, r.seq)).fetchone()
            if row is None or row[0] != r.hash:
                raise InvalidInput(
                    f"run {run_id} already exists here with a different event at seq {r.seq}; "
                    "import it into another ledger, or fork it",
                    field="import",
                )
            self.skipped += 1
            return
        if r.seq != cur.seq + 1 or r.prev_hash != cur.hash:
            raise InvalidInput(
                f"imported run {run_id} seq {r.seq} does not continue the stored chain (the "
                f"ledger's run is at seq {cur.seq}); nothing was imported",
                field="import",
            )
        check_imported_envelope(r, self.store.max_payload, self.store._clock())
        event = ev.decode(r.payload)
        if r.schema_version >= ev.CANONICAL_SINCE and ev.encode(event) != r.payload:
            # A live write stores the canonical encoding; anything else (a duplicated key,
            # unknown fields, other spacing) reads differently in different JSON parsers.
            raise InvalidInput(
                f"run {run_id} seq {r.seq}: the payload is not in the form this library writes "
                "(duplicate or unknown keys, or re-formatted JSON); export it again from the ledger",
                field="payload",
            )
        if self.aggregate is not None and cur.state is None:
            cur.state = self.aggregate.initial(run_id)
        if isinstance(event, ev.RunForked):
            self.flush()  # the parent's rows must be readable for the checks below
            self.store._check_fork(run_id, r.seq, event)
        if self.admit is not None:
            self.admit(cur.state, r, event)
        if isinstance(event, ev.RunForked) and self.aggregate is not None:
            # A child's fold starts from its parent's history up to the fork point.
            agg = self.aggregate
            prefix = (self.store._lineage_steps(event.parent, event.parent_seq) if agg.lean
                      else self.store.history(event.parent, until_seq=event.parent_seq))
            cur.state = agg.evolve_all(agg.initial(run_id), prefix)
        self._fence(cur, r, event)
        key = r.idempotency_key
        if key is not None:
            if (run_id, key) in self.keys or self.conn.execute(
                "SELECT 1 FROM events WHERE run_id=? AND idem_key=?", (run_id, key)
            ).fetchone():
                raise InvalidInput(
                    f"run {run_id} seq {r.seq} reuses idempotency key {key[:60]!r}, which an earlier "
                    "event of the run already carries; a live write never stores a key twice",
                    field="idempotency_key",
                )
            self.keys.add((run_id, key))
        self.last_pos += 1
        pos = self.last_pos
        self.gprev = global_link(self.gprev, pos, r.hash)
        self.rows.append(
            (pos, run_id, r.seq, r.type, r.actor, r.lease, key, digest, size, r.recorded_us,
             r.schema_version, bytearray(r.payload), bytearray(r.prev_hash), bytearray(r.hash),
             bytearray(self.gprev))
        )
        if self.aggregate is not None:
            stored = Recorded(run_id, r.seq, pos, r.type, r.actor, r.lease, key, r.recorded_us,
                              r.schema_version, r.payload, r.prev_hash, r.hash)
            if self.aggregate.lean:
                stored = Step(run_id, r.seq, r.type, r.recorded_us, event, r.actor)  # type: ignore[assignment]
            cur.state = self.aggregate.evolve(cur.state, stored)
        cur.seq, cur.hash, cur.dirty = r.seq, r.hash, True
        cur.last_position = pos
        if cur.first_position is None:
            cur.first_position = pos
        self.imported += 1
        if len(self.rows) >= IMPORT_ROWS:
            self.flush()

    def _fence(self, cur: _Cursor, r: Recorded, event: ev.Event) -> None:
        """The store's own fencing, as on a live append: a worker writes under the current
        lease, and lease numbers only grow. And one rule a live write does not need: an
        import writes nothing under a lease this ledger granted before it, since a write
        under it must show the lease's token and an import has none to show."""
        if r.lease is not None and r.lease == cur.lease and cur.granted_here:
            raise StaleLease(
                f"run {r.run_id} seq {r.seq} is written under lease {r.lease}, which this ledger granted "
                f"to {cur.holder}: a write under it must carry that lease's token, and an import carries "
                "none. The holder writes it live; import a run continued elsewhere into a new ledger",
                lease=r.lease, current_lease=cur.lease, why="imported_under_a_live_lease",
            )
        if r.lease is not None and r.lease != cur.lease:
            raise StaleLease(
                f"run {r.run_id} seq {r.seq} was written under lease {r.lease}, but the run's lease "
                f"at that point is {cur.lease if cur.lease is not None else 'none'}; no live write "
                "could carry it",
                lease=r.lease, current_lease=cur.lease,
            )
        if isinstance(event, ev.LeaseGranted):
            if event.lease <= cur.max_lease:
                raise StaleLease(
                    f"run {r.run_id} seq {r.seq} grants lease {event.lease}, not above the run's "
                    f"highest lease {cur.max_lease}; fencing tokens only grow",
                    lease=event.lease, current_lease=cur.lease,
                )
            cur.lease, cur.holder, cur.max_lease = event.lease, event.worker, event.lease
            cur.granted_here = False  # granted by the imported history itself
            # The grant's digest, as a live claim sets it: the holder's token works here too.
            cur.digest, cur.digest_moved = event.token_digest or None, True
        elif isinstance(event, (ev.LeaseReleased, ev.LeaseRevoked)):
            if event.lease == cur.lease:
                cur.lease, cur.holder = None, None
                cur.digest, cur.digest_moved = None, True
        elif isinstance(event, ev.RunForked):
            cur.lease = cur.holder = None

    def flush(self) -> None:
        if self.rows:
            self.conn.executemany(_INSERT_FIRST, self.rows)
            if not self.store._keeps_views:
                self.conn.execute(_MARK_UNKEPT, (self.rows[0][0],))
            self.store._after_insert(self.rows)
            self.rows = []
            self.keys.clear()
        for run_id, cur in self.runs.items():
            if not cur.dirty:
                continue
            self.conn.execute(
                _UPSERT_HEAD,
                (run_id, cur.seq, bytearray(cur.hash), cur.lease, cur.holder, cur.max_lease,
                 cur.first_position, cur.last_position),
            )
            if cur.digest_moved:
                self.conn.execute("UPDATE heads SET lease_digest=? WHERE run_id=?", (cur.digest, run_id))
                cur.digest_moved = False
            head = Head(run_id, cur.seq, bytes(cur.hash), cur.lease, cur.holder, cur.first_position,
                        cur.last_position)
            known = [(self.aggregate, cur.state)] if self.aggregate is not None else []
            self.folded[run_id] = self.store._run_hooks(run_id, head, known)
            if len(self.folded) > IMPORT_RUNS:
                self.folded.pop(next(iter(self.folded)))
            cur.dirty = False
            cur.stored_seq = cur.seq

    def finish(self) -> list[tuple[str, tuple[Head | None, list[tuple[Aggregate[Any], Any]]]]]:
        self.flush()
        return list(self.folded.items())


#: The first 16 bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"
#: The ledger's marker row (handoff_meta: format = handoff-ledger) as SQLite stores it:
#: the two values side by side. The table is created first, so the row sits on an early
#: page; the bytes are too specific to turn up in a text file that merely names the project.
_MARKER = b"format" + FORMAT_NAME.encode()
_MARKER_SCAN = 1 << 20


def _sniff(path: str) -> LedgerError | None:
    """Why an existing file cannot be opened as a ledger, judged from its bytes, or None.

    Tells a file that never was a ledger (no SQLite header, no marker table) from a
    ledger that was damaged (the marker is there behind a broken header): the first
    needs a different path, the second a backup. Empty files and unreadable ones are
    left to SQLite and the schema check.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
            if not head or head == SQLITE_HEADER:
                return None
            marked = _MARKER in head + f.read(_MARKER_SCAN)
    except OSError:
        return None
    if marked:
        return CorruptLedger(
            f"{path} is a handoff ledger whose SQLite header is damaged (its first bytes "
            "are not SQLite's), so it cannot be opened. Restore it from a backup or an "
            "export; keep this copy for inspection",
        )
    return NotALedger(_not_a_ledger(path, "it is not a database at all: its first bytes are not SQLite's header"))


def _unusable_path(path: str) -> NotALedger | None:
    """Why ``path`` can never hold a ledger, judged before SQLite opens it, or None.

    Only a regular file on a disk can: opening a FIFO or a device can block or have
    effects, a directory is no file, and a kernel pseudo-file's size and bytes are not
    stored data (SQLite's writes to /proc/self/mem fail as I/O errors, which would read as
    a failing disk). A path that does not exist is judged by its directory."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        try:
            root = files.pseudo_root(parent, os.stat(parent))
        except OSError:
            return None  # no such directory: creating the file says so
        if root is None:
            return None
        return NotALedger(
            f"{path} would be a new file on the kernel pseudo-filesystem {root}, which holds no "
            "regular file the ledger can use. Check the path given by --db or HANDOFF_DB, and name "
            "a file on a disk"
        )
    except OSError:
        return None  # unreadable: opening it reports why
    if not stat.S_ISREG(st.st_mode):
        return NotALedger(_not_usable(path, files.file_kind(st.st_mode)))
    root = files.pseudo_root(path, st)
    if root is not None:
        return NotALedger(_not_usable(path, f"a kernel pseudo-file under {root} (its size and bytes are "
                                            "not stored data, and writing to it acts on the system)"))
    return None


def _not_usable(path: str, kind: str) -> str:
    return (
        f"{path} is {kind}, not a regular file the ledger can use. Check the path given by --db or "
        "HANDOFF_DB, or name a new file and create it with 'handoff --db FILE init'"
    )


def _not_a_ledger(path: str, why: str) -> str:
    return (
        f"{path} is not a handoff ledger; {why}. Check the path given by --db or "
        "HANDOFF_DB, or name a new file and create it with 'handoff --db FILE init'"
    )


def _unreadable_schema(path: str, exc: sqlite3.Error) -> LedgerError:
    """SQLite's header is there but its schema cannot be read: damage if the marker shows."""
    try:
        with open(path, "rb") as f:
            marked = _MARKER in f.read(_MARKER_SCAN)
    except OSError:
        marked = False
    if marked:
        return CorruptLedger(
            f"{path} is a handoff ledger that SQLite cannot read ({exc}); it was damaged. "
            "Restore it from a backup or an export; keep this copy for inspection",
            cause=str(exc),
        )
    return NotALedger(_not_a_ledger(path, f"SQLite cannot read it ({exc}) and it carries no ledger marker"))


class _Request:
    """One command waiting for a group commit: its work, then its answer or its error."""

    __slots__ = ("done", "error", "folded", "run_id", "value", "work")

    def __init__(self, run_id: str, work: Callable[[], tuple[Any, Any, Any]]) -> None:
        self.run_id = run_id
        self.work = work
        self.done = False
        self.error: BaseException | None = None
        self.value: Any = None
        self.folded: Any = None


class _GroupCommit:
    """Commands from many threads in one write transaction and one fsync.

    The first thread to arrive leads: it takes the write lock, runs every queued command
    in a savepoint of its own (a refused command rolls back to it alone, so each is still
    fenced, deduplicated and decided on its own against the state the ones before it
    left), picks up the commands that arrived meanwhile, and commits once. The others
    wait for that commit; no caller hears "committed" before it. One leader at a time:
    commands that arrive during a commit form the next group.
    """

    #: Commands per transaction at most, so a steady stream cannot hold one open forever.
    LIMIT = 256

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[_Request] = []
        self._leading = False
        self._leader: int | None = None  # the thread running a group now

    def submit(self, run_id: str, work: Callable[[], tuple[Any, Any, Any]]) -> tuple[Any, Any]:
        if self._leader == threading.get_ident():
            # A guard or decide callback issuing a command: it would wait for the group it
            # is running. Without group commit SQLite refuses the nested transaction.
            raise StoreUnavailable(
                f"a command on run {run_id} was issued from inside another command's "
                f"transaction on {self._store.path} (a guard or decide callback calling the "
                "Ledger); nothing was written. Issue it after that command has returned"
            )
        req = _Request(run_id, work)
        cv = self._cv
        with cv:
            self._queue.append(req)
            while not req.done:
                if self._leading:
                    cv.wait()
                    continue
                # No leader: this thread leads the next group (which may not reach this
                # request when the queue is longer than LIMIT; then it leads again).
                self._leading, self._leader = True, threading.get_ident()
                cv.release()
                try:
                    self._lead()
                finally:
                    cv.acquire()
                    self._leading, self._leader = False, None
                    cv.notify_all()
        if req.error is not None:
            raise req.error
        return req.value

    def _take(self, room: int) -> list[_Request]:
        with self._cv:
            batch, self._queue = self._queue[:room], self._queue[room:]
        return batch

    def _lead(self) -> None:
        store = self._store
        taken: list[_Request] = []
        with store._lock:
            try:
                batch = self._take(self.LIMIT)
                taken.extend(batch)
                store._begin("appending")
                ran: list[_Request] = []
                while batch:
                    for req in batch:
                        self._run(req, ran)
                        ran.append(req)
                    batch = self._take(self.LIMIT - len(taken))
                    taken.extend(batch)
                # What a lone execute does after its body: commit, once for the group.
                store._finish(True, "committing a group of commands")
            except BaseException as exc:  # the begin or the commit failed: no command stands
                if isinstance(exc, sqlite3.Error):
                    exc = _explain(exc, "committing a group of commands", store.path)
                if store._conn.in_transaction:
                    store._conn.execute("ROLLBACK")
                for req in taken:
                    if req.error is None:
                        req.error, req.value, req.folded = exc, None, None
            else:
                for req in taken:
                    if req.error is None and req.folded is not None:
                        store._remember_all(req.run_id, req.folded)
        with self._cv:
            for req in taken:
                req.done = True
            self._cv.notify_all()

    def _run(self, req: _Request, ran: list[_Request]) -> None:
        """One command in a savepoint of its own; ``ran``: the group's commands before it."""
        conn = self._store._conn
        conn.execute("SAVEPOINT handoff_command")
        try:
            result, state, folded = req.work()
        except BaseException as exc:
            req.error = exc
            if conn.in_transaction:
                conn.execute("ROLLBACK TO handoff_command")
                conn.execute("RELEASE handoff_command")
            else:
                # SQLite rolled the whole transaction back (a full disk, an I/O error): the
                # commands before this one went with it, so none of them is acknowledged,
                # and a fresh transaction takes the rest of the group.
                for earlier in ran:
                    if earlier.error is None:
                        earlier.error, earlier.value, earlier.folded = exc, None, None
                self._store._begin("appending")
            return
        conn.execute("RELEASE handoff_command")
        req.value, req.folded = (result, state), folded


class SqliteStore(EventStore):
    """An EventStore in one SQLite file (or ``:memory:`` for tests and scratch work).

    One store object owns one connection and may be shared by threads; open one per
    process for multi-process use. ``synchronous`` is ``"FULL"`` (acknowledged means on
    disk after power loss) or ``"NORMAL"`` (faster; the last commits may be lost on
    power loss, never on a process crash).
    """

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
        self._clock = clock or _now_us
        self._lock = threading.RLock()
        self._cache: collections.OrderedDict[tuple[int, str], tuple[Any, int, bytes, Any]] = (
            collections.OrderedDict()
        )
        self._memory = self.path == ":memory:"
        self._hooks: list[tuple[Aggregate[Any], Callable[..., None]]] = []
        self._txn = SqliteTransaction(self)
        self._views: Any = None
        self._db: Any = None
        self._commits_since_check = 0
        self._heads_indexed = False
        self._group: _GroupCommit | None = None
        self._keeps_views = False  # an attached hook keeps every projection inline
        #: The file's schema: an older one stays only on a read-only open (see _migrate).
        self.file_schema = STORE_SCHEMA_VERSION
        self.readonly = readonly
        self._conn = self._connect(create=create, readonly=readonly)
        try:
            self._ensure_schema(create and not readonly)
            # Only once the file is known to be a ledger: switching a foreign database
            # to WAL would rewrite its header even though we then refuse it.
            if not self._memory and not readonly:
                self._enable_wal()
        except BaseException:
            self._conn.close()
            raise

    @property
    def db(self) -> Any:
        """A sqlite_utils.Database on the store's connection, for schema work and inspection.

        Imported on first use: sqlite-utils costs ~60 ms to import, which every short-lived
        ``handoff progress`` process would otherwise pay.
        """
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self._conn)
        return self._db

    @classmethod
    def memory(cls, **kw: Any) -> SqliteStore:
        return cls(":memory:", **kw)

    # --- opening -------------------------------------------------------------------

    def _connect(self, *, create: bool, readonly: bool) -> sqlite3.Connection:
        path = self.path
        if not self._memory:
            refusal = _unusable_path(path)
            if refusal is not None:
                raise refusal
            exists = os.path.exists(path)
            if exists:
                refusal = _sniff(path)
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
            # No automatic (passive) checkpoints: see _maybe_checkpoint.
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.DatabaseError as exc:
            conn.close()
            low = str(exc).lower()
            if not self._memory and ("not a database" in low or "malformed" in low):
                raise _unreadable_schema(path, exc) from exc
            raise _explain(exc, "opening", path) from exc
        except sqlite3.Error as exc:
            conn.close()
            raise _explain(exc, "opening", path) from exc
        return conn

    def _enable_wal(self) -> None:
        try:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.Error as exc:
            raise _explain(exc, "opening", self.path) from exc
        if str(mode).lower() != "wal":
            raise StoreUnavailable(
                f"could not switch {self.path} to WAL mode (got {mode}); is it on a "
                "network filesystem? Those are not supported"
            )

    def _ensure_schema(self, may_create: bool) -> None:
        conn = self._conn
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            raise (_unreadable_schema(self.path, exc) if not self._memory else _explain(exc, "opening", self.path)) from exc
        if "handoff_meta" not in tables:
            if tables:
                raise NotALedger(
                    f"{self.path} is an SQLite database but not a handoff ledger (it has "
                    f"tables {', '.join(sorted(tables)[:5])}); use another file name"
                )
            if not may_create:
                raise NotALedger(f"{self.path} is empty, not a handoff ledger; run 'handoff init'")
            self._create_schema()
            return
        meta = dict(conn.execute("SELECT key, value FROM handoff_meta"))
        if meta.get("format") != FORMAT_NAME:
            raise NotALedger(f"{self.path} has a handoff_meta table but no handoff-ledger format mark")
        version = int(meta.get("schema_version", "0"))
        if version > STORE_SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} was written by a newer handoff-ledger (file schema {version}, "
                f"this version reads up to {STORE_SCHEMA_VERSION}); upgrade handoff-ledger"
            )
        self.file_schema = version
        if version < STORE_SCHEMA_VERSION and not self.readonly:  # any writable open upgrades
            self._migrate(version)
            self.file_schema = STORE_SCHEMA_VERSION
        if not self.readonly:
            self._ensure_heads_index()
            self._ensure_lease_digest_column()

    def _ensure_heads_index(self) -> None:
        """Add ``heads_first`` to a ledger made before it existed.

        An additive index, so the file schema version stays: older versions read and
        write the file as before and SQLite keeps the index current for them. Without it
        (a file only ever opened read-only) ``list_runs`` falls back to one query."""
        conn = self._conn
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='heads_first'").fetchone():
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_HEADS_FIRST)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _explain(exc, "adding an index to the heads table", self.path) from exc

    def _ensure_lease_digest_column(self) -> None:
        """Add ``heads.lease_digest`` (the digest a write's lease token must match) to a
        ledger made before lease tokens. Additive like ``heads_first``: the file schema
        version stays. A lease held at the upgrade has no digest, so no write can prove it:
        it must be revoked and claimed again (docs/reliability.md, "Lease tokens")."""
        conn = self._conn
        if any(r[1] == "lease_digest" for r in conn.execute("PRAGMA table_info(heads)")):
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            # Another process may have added it while we waited for the lock.
            if not any(r[1] == "lease_digest" for r in conn.execute("PRAGMA table_info(heads)")):
                conn.execute("ALTER TABLE heads ADD COLUMN lease_digest TEXT")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _explain(exc, "adding the lease_digest column to the heads table", self.path) from exc

    def _create_schema(self) -> None:
        db = self.db
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            # Another process may have created it while we waited for the lock.
            if db["handoff_meta"].exists():
                self._conn.execute("COMMIT")
                return
            db.create_table("handoff_meta", {"key": str, "value": str}, pk="key")
            db["handoff_meta"].insert_all(
                [
                    {"key": "format", "value": FORMAT_NAME},
                    {"key": "schema_version", "value": str(STORE_SCHEMA_VERSION)},
                    {"key": "created_us", "value": str(self._clock())},
                ]
            )
            db.create_table(
                "events",
                {
                    "position": int,
                    "run_id": str,
                    "seq": int,
                    "type": str,
                    "actor": str,
                    "lease": int,
                    "idem_key": str,
                    "idem_digest": bytes,
                    "batch_size": int,
                    "recorded_us": int,
                    "schema_version": int,
                    "payload": bytes,
                    "prev_hash": bytes,
                    "hash": bytes,
                    "global_hash": bytes,
                },
                pk="position",
                not_null=[
                    "run_id", "seq", "type", "actor", "batch_size", "recorded_us",
                    "schema_version", "payload", "prev_hash", "hash", "global_hash",
                ],
            )
            db["events"].create_index(["run_id", "seq"], index_name="events_run_seq", unique=True)
            self._conn.execute(
                "CREATE UNIQUE INDEX events_idem ON events(run_id, idem_key) "
                "WHERE idem_key IS NOT NULL"
            )
            for sql in APPEND_ONLY_TRIGGERS.values():
                self._conn.execute(sql)
            db.create_table(
                "heads",
                {
                    "run_id": str,
                    "last_seq": int,
                    "last_hash": bytes,
                    "lease": int,
                    "lease_holder": str,
                    "max_lease": int,
                    "first_position": int,
                    "last_position": int,
                    "lease_digest": str,
                },
                pk="run_id",
                not_null=["last_seq", "last_hash", "max_lease", "first_position", "last_position"],
            )
            self._conn.execute(_HEADS_FIRST)
            self._conn.execute(_CREATE_UNKEPT)
            self._conn.execute("COMMIT")
            self.created_schema = True
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise _explain(exc, "creating the ledger schema", self.path) from exc

    def _migrate(self, from_version: int) -> None:
        """Upgrade the file to ``STORE_SCHEMA_VERSION`` in one write transaction.

        1 -> 2: the views_unkept table. Under schema 1 every inline write moved the tracking
        rows, so a projection whose row stands behind the log's end was not kept by the
        writes after it: each such position gets a mark naming the projections that were
        ahead of it, so catch-up refolds exactly what it would have. Events, hashes, chains
        and view rows are untouched. An older version then refuses the file (SchemaTooNew):
        it would write without marking."""
        if from_version != 1:
            raise SchemaTooNew(f"{self.path} has file schema {from_version}; no migration from it is known")
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            found = int(dict(conn.execute("SELECT key, value FROM handoff_meta")).get("schema_version", "0"))
            if found == from_version:  # another process may have upgraded it while we waited
                conn.execute(_CREATE_UNKEPT)
                tracked = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='projection_positions'").fetchone()
                if tracked:
                    last = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]
                    tracking = dict(conn.execute("SELECT name, position FROM projection_positions"))
                    for pos in sorted({p for p in tracking.values() if p < last}):
                        kept = ",".join(sorted(n for n, p in tracking.items() if p > pos))
                        conn.execute(f"INSERT OR REPLACE INTO {UNKEPT} (position, kept) VALUES (?, ?)",
                                     (pos + 1, kept))
                conn.execute("UPDATE handoff_meta SET value=? WHERE key='schema_version'",
                             (str(STORE_SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _explain(exc, f"upgrading the file from schema {from_version}", self.path) from exc

    def upgrade_note(self) -> str | None:
        """What to run when a read-only open found an older file schema, else None."""
        if self.file_schema >= STORE_SCHEMA_VERSION or self._memory:
            return None
        return (f"{self.path} is in file schema {self.file_schema}; this version writes "
                f"{STORE_SCHEMA_VERSION}. It reads as it is; to upgrade it in place, open it once with "
                "write access (any handoff command without read-only access, e.g. 'handoff doctor')")

    # --- writing -------------------------------------------------------------------

    def _begin(self, doing: str) -> None:
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; {doing} refused")
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _explain(exc, doing, self.path) from exc

    def _finish(self, ok: bool, doing: str) -> None:
        conn = self._conn
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
                self._maybe_checkpoint()
            except LedgerError:
                # The commit stands; a checkpoint that could not run now is retried after
                # a later commit. Reporting it would tell the caller "nothing was written".
                pass
        elif conn.in_transaction:
            conn.execute("ROLLBACK")

    def _maybe_checkpoint(self) -> None:
        """Checkpoint only in RESTART mode, which takes the writer lock for its whole run.

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
            self.checkpoint(wait=False)

    def checkpoint(self, *, wait: bool = True) -> tuple[int, int, int]:
        """Copy the WAL into the database, holding the writer lock; the next writer restarts it.

        Returns SQLite's (busy, WAL frames, frames checkpointed).
        """
        with self._lock:
            conn = self._conn
            try:
                if not wait:
                    conn.execute("PRAGMA busy_timeout=0")
                row = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                return tuple(row)  # type: ignore[return-value]
            except sqlite3.Error as exc:
                raise _explain(exc, "checkpointing", self.path) from exc
            finally:
                if not wait:
                    conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")

    def _head_locked(self, run_id: str) -> tuple[Head | None, int]:
        row = self._conn.execute(
            "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
            "last_position, max_lease FROM heads WHERE run_id=?",
            (run_id,),
        ).fetchone()
        if row is None:
            return None, 0
        return Head(*row[:7]), row[7]

    def _lease_digest_locked(self, run_id: str) -> str | None:
        try:
            row = self._conn.execute("SELECT lease_digest FROM heads WHERE run_id=?", (run_id,)).fetchone()
        except sqlite3.OperationalError:
            # A file from before lease tokens, opened read-only (a writable open adds the
            # column): no lease of it has a digest.
            if any(r[1] == "lease_digest" for r in self._conn.execute("PRAGMA table_info(heads)")):
                raise
            return None
        return None if row is None else row[0]

    def _check_token(self, run_id: str, head: Head | None, max_lease: int, token: LeaseToken) -> None:
        """Does ``token`` prove the run's current lease? The number first, then its secret's
        digest against the one the grant stored, compared in constant time."""
        self._check_fence(run_id, head, None, token.lease, max_lease)
        digest = self._lease_digest_locked(run_id)
        if digest is None:
            raise StaleLease.untokened(run_id, token.lease)
        if not token.matches(digest):
            raise StaleLease.wrong_token(run_id, token.lease)

    def _find_duplicate(
        self, run_id: str, key: str, digest: bytes, actor: str
    ) -> AppendResult | None:
        row = self._conn.execute(
            "SELECT seq, position, idem_digest, batch_size, actor FROM events "
            "WHERE run_id=? AND idem_key=?",
            (run_id, key),
        ).fetchone()
        if row is None:
            return None
        seq, position, stored, size, by = row
        # The digest covers the actor, so for anything this library wrote the second test
        # adds nothing; it stops an imported line whose digest was copied from another
        # actor's request from answering that actor's live command as "already done".
        if stored != digest or by != actor:
            raise IdempotencyConflict(
                f"idempotency key {key!r} was already used on run {run_id} (seq {seq}) for a "
                "different request; use a new key for a new request",
                run_id=run_id,
                seq=seq,
            )
        return AppendResult(
            run_id=run_id,
            outcome="duplicate",
            first_seq=seq,
            last_seq=seq + size - 1,
            positions=tuple(range(position, position + size)),
        )

    def _insert_locked(
        self,
        run_id: str,
        head: Head | None,
        max_lease: int,
        batch: Sequence[ev.Event],
        encoded: list[tuple[str, bytes]],
        actor: str,
        lease: int | None,
        key: str | None,
        digest: bytes | None,
        verbatim: Sequence[tuple[Recorded, bytes | None, int]] | None = None,
        written: list[Recorded] | None = None,
    ) -> tuple[AppendResult, Head]:
        """Insert a batch and move the head; return what was appended and the new head (as
        ``_head_locked`` would now read it). ``verbatim`` (import) keeps each event's own
        envelope and hash instead of stamping new ones; its chain must continue the head's."""
        conn = self._conn
        tail = conn.execute("SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
        last_pos, gprev = tail if tail is not None else (0, GENESIS_HASH)
        seq = head.last_seq if head else 0
        prev = head.last_hash if head else GENESIS_HASH
        cur_lease = head.lease if head else None
        holder = head.lease_holder if head else None
        token_digest: str | None = None
        digest_moved = False
        first_position = head.first_position if head else last_pos + 1
        now = self._clock()
        rows = []
        n = len(encoded)
        for i, ((tag, payload), event) in enumerate(zip(encoded, batch)):
            seq += 1
            pos = last_pos + 1 + i
            # Blobs are bound as bytearray: Python's sqlite3 binds it directly, while bytes
            # (and None) go through the adapter lookup first (docs/performance.md).
            if verbatim is None:
                k = key if i == 0 else None
                h = chain_hash(prev, run_id, seq, tag, actor, lease, k, now, ev.SCHEMA_VERSION, payload)
                gprev = global_link(gprev, pos, h)
                rows.append(
                    (pos, run_id, seq, tag, actor, lease, k, bytearray(digest) if (i == 0 and digest) else None,
                     n, now, ev.SCHEMA_VERSION, bytearray(payload), bytearray(prev), bytearray(h),
                     bytearray(gprev))
                )
            else:
                r, r_digest, r_size = verbatim[i]
                if r.seq != seq or r.prev_hash != prev:
                    raise InvalidInput(
                        f"imported run {run_id} seq {r.seq} does not continue the stored chain "
                        f"(the ledger's run is at seq {seq - 1}); nothing was imported",
                        field="import",
                    )
                h = r.hash
                gprev = global_link(gprev, pos, h)
                rows.append(
                    (pos, run_id, seq, tag, r.actor, r.lease, r.idempotency_key, r_digest, r_size,
                     r.recorded_us, r.schema_version, bytearray(payload), bytearray(prev), bytearray(h),
                     bytearray(gprev))
                )
            prev = h
            if isinstance(event, ev.LeaseGranted):
                if event.lease <= max_lease:
                    raise StaleLease(
                        f"lease token {event.lease} is not above run {run_id}'s highest lease "
                        f"{max_lease}; fencing tokens only grow, so an old token can never "
                        "be granted again",
                        lease=event.lease,
                        current_lease=cur_lease,
                    )
                cur_lease, holder, max_lease = event.lease, event.worker, event.lease
                token_digest, digest_moved = event.token_digest or None, True
            elif isinstance(event, (ev.LeaseReleased, ev.LeaseRevoked)):
                if event.lease == cur_lease:
                    cur_lease, holder = None, None
                    token_digest, digest_moved = None, True
            elif isinstance(event, ev.RunForked):
                self._check_fork(run_id, seq, event)
        conn.execute(_INSERT_FIRST, rows[0])
        if n > 1:
            if verbatim is None:
                # Only a batch's first event carries the idempotency key and digest.
                conn.executemany(_INSERT_REST, [r[:6] + r[8:] for r in rows[1:]])
            else:
                conn.executemany(_INSERT_FIRST, rows[1:])
        conn.execute(
            _UPSERT_HEAD,
            (run_id, seq, bytearray(prev), cur_lease, holder, max_lease, first_position, last_pos + n),
        )
        if digest_moved:
            conn.execute("UPDATE heads SET lease_digest=? WHERE run_id=?", (token_digest, run_id))
        if not self._keeps_views:
            conn.execute(_MARK_UNKEPT, (last_pos + 1,))
        self._after_insert(rows)
        if written is not None:
            # The new events as a reader would get them, without reading them back.
            written.extend(
                Recorded(r[1], r[2], r[0], r[3], r[4], r[5], r[6], r[9], r[10], bytes(r[11]),
                         bytes(r[12]), bytes(r[13]))
                for r in rows
            )
        result = AppendResult(
            run_id=run_id,
            outcome="committed",
            first_seq=seq - n + 1,
            last_seq=seq,
            positions=tuple(range(last_pos + 1, last_pos + n + 1)),
        )
        return result, Head(run_id, seq, bytes(prev), cur_lease, holder, first_position, last_pos + n)

    def import_records(
        self,
        items: Iterable[tuple[Recorded, bytes | None, int]],
        *,
        aggregate: Aggregate[Any] | None = None,
        admit: Callable[[Any, Recorded, ev.Event], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        """Insert exported events verbatim, all or nothing; already-present ones are skipped.

        Each item is (record, idempotency digest, batch size), with chains already checked
        by ledger.portable.parse_lines. Items are consumed as they come (a file is read line
        by line, rows go in by the thousand), inside one write transaction: any refusal
        rolls all of it back. A run that exists must hold the same events up to its head
        (same hashes); the import may only extend it. Every new event's envelope is checked
        as a live write's would be (actor, lease, key, payload size, time: see
        ``check_imported_envelope``) and fenced on leases; with ``aggregate`` and ``admit``,
        ``admit(state, record, event)`` is called with the run's folded state before each
        new event and may refuse it (the rules live with the caller, not in the store).
        ``before_commit()`` may refuse the whole import at its end. Inline projections are
        kept in the same transaction. Importing twice changes nothing.
        """
        with self._lock:
            self._begin("importing")
            ok = False
            try:
                run = _Import(self, aggregate, admit)
                for item in items:
                    run.add(*item)
                touched = run.finish()
                if before_commit is not None:
                    before_commit()
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, "importing", self.path) from exc
            finally:
                self._finish(ok, "committing an import")
        for run_id, folded in touched:
            self._remember_all(run_id, folded)
        return {"imported": run.imported, "skipped": run.skipped, "runs": len(run.seen)}

    def _check_fork(self, run_id: str, seq: int, fork: ev.RunForked) -> None:
        """history() follows run_forked to the parent: refuse what would loop or dangle.

        The parent must already exist, so lineage is acyclic by construction.
        """
        if seq != 1:
            raise InvalidInput(
                f"run_forked can only be the first event of a new run; run {run_id} "
                f"would get it at seq {seq}",
                field="events",
            )
        parent = fork.parent
        if parent == run_id or not isinstance(parent, str):
            raise InvalidInput(f"run {run_id} cannot be forked from itself", field="parent")
        check_run_id(parent, "parent")
        parent_head, _ = self._head_locked(parent)
        if parent_head is None or not 0 <= fork.parent_seq <= parent_head.last_seq:
            at = parent_head.last_seq if parent_head else None
            raise InvalidInput(
                f"cannot fork {run_id} from {parent} at seq {fork.parent_seq}: the parent "
                + ("does not exist" if at is None else f"is at seq {at}"),
                field="parent_seq",
            )

    def _after_insert(self, rows: list[tuple[Any, ...]]) -> None:
        """Hook for subclasses; runs inside the write transaction."""

    def attach(self, aggregate: Aggregate[Any], hook: Callable[..., None], *, keeps_views: bool = False,
               reads_position: bool = True) -> None:
        """Run ``hook(txn, run_id, state, last_position)`` inside every append's transaction.

        ``state`` is ``aggregate``'s fold of the run after the append. This is how inline
        projections stay in step with the log: a failing hook rolls the append back. Unless
        a hook ``keeps_views`` (all of them), each write is marked in ``views_unkept``.
        """
        self._hooks.append((aggregate, hook))
        self._keeps_views = self._keeps_views or keeps_views

    def _run_hooks(
        self, run_id: str, head: Head, known: list[tuple[Aggregate[Any], Any]]
    ) -> tuple[Head | None, list[tuple[Aggregate[Any], Any]]]:
        """Run every hook on the run's state after a write, at ``head`` (the one the write
        left); ``known`` holds states the caller already folded from the rows it wrote."""
        if not self._hooks:
            return None, []
        folded = []
        for aggregate, hook in self._hooks:
            state = next((st for agg, st in known if agg is aggregate), _MISSING)
            if state is _MISSING:
                state = self._state_locked(run_id, aggregate, head)
            hook(self._txn, run_id, state, head.last_position)
            folded.append((aggregate, state))
        return head, folded

    def _remember_all(
        self, run_id: str, folded: tuple[Head | None, list[tuple[Aggregate[Any], Any]]]
    ) -> None:
        head, states = folded
        if head is None:
            return
        for aggregate, state in states:
            self._remember(aggregate, run_id, head.last_seq, head.last_hash, state)

    def _check_fence(
        self, run_id: str, head: Head | None, expected_seq: int | None, lease: int | None,
        max_lease: int | None = None,
    ) -> None:
        actual = head.last_seq if head else 0
        if expected_seq is not None and expected_seq != actual:
            raise SeqConflict(
                f"run {run_id} is at seq {actual}, not {expected_seq} as expected; someone "
                "else wrote first. Re-read the run and decide again",
                run_id=run_id,
                actual_seq=actual,
                expected_seq=expected_seq,
            )
        if lease is not None:
            current = head.lease if head else None
            if current != lease:
                raise StaleLease.superseded(run_id, lease, current, head.lease_holder if head else None,
                                            max_lease if max_lease is not None else 0)

    def append(
        self,
        run_id: str,
        events: Sequence[ev.Event],
        *,
        actor: Actor,
        expected_seq: int | None = None,
        lease: str | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        check_run_id(run_id)
        check_actor(actor)
        check_idempotency_key(idempotency_key, actor)
        try:
            # Materialise once: a generator would be consumed by encode_events and the
            # insert would then see an empty batch yet acknowledge it.
            events = tuple(events)
        except TypeError:
            raise InvalidInput("events must be a sequence of events", field="events") from None
        if not events:
            raise InvalidInput("an append needs at least one event", field="events")
        if expected_seq is not None and (
            isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0
        ):
            raise InvalidInput("expected_seq must be a whole number >= 0", field="expected_seq")
        token = LeaseToken.parse(lease) if lease is not None else None
        lease_n = token.lease if token is not None else None
        encoded = encode_events(events, self.max_payload)
        actor_s = str(actor)
        digest = (
            request_digest(actor_s, lease_n, [p for _, p in encoded]) if idempotency_key else None
        )
        with self._lock:
            self._begin("appending")
            ok = False
            try:
                if idempotency_key:
                    dup = self._find_duplicate(run_id, idempotency_key, digest, actor_s)  # type: ignore[arg-type]
                    if dup is not None:
                        ok = True
                        return dup
                head, max_lease = self._head_locked(run_id)
                self._check_fence(run_id, head, expected_seq, None)
                if token is not None:
                    self._check_token(run_id, head, max_lease, token)
                # The hooks' states before the write (cached for a warm run), so that after
                # it they are evolved over the rows written instead of reading them back. A
                # new fork child is the exception: its fold starts with the parent's prefix.
                forking = head is None and isinstance(events[0], ev.RunForked)
                before = [] if forking else [
                    (agg, self._state_locked(run_id, agg, head)) for agg, _ in self._hooks
                ]
                written: list[Recorded] = []
                result, new_head = self._insert_locked(
                    run_id, head, max_lease, events, encoded, actor_s, lease_n, idempotency_key, digest,
                    written=written,
                )
                folded = self._run_hooks(
                    run_id, new_head, [(agg, agg.evolve_all(state, written)) for agg, state in before]
                )
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, "appending", self.path) from exc
            finally:
                self._finish(ok, "committing an append")
            self._remember_all(run_id, folded)
            return result

    def fold(self, run_id: str, aggregate: Aggregate[S], *, until_seq: int | None = None) -> S:
        if not aggregate.lean:
            return super().fold(run_id, aggregate, until_seq=until_seq)
        check_run_id(run_id)
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return aggregate.evolve_all(aggregate.initial(run_id), self._lineage_steps(run_id, until_seq))

    def _lineage_steps(self, run_id: str, until_seq: int | None) -> Iterator[Step]:
        """``history`` as Steps: a fork's inherited prefix first, then the run, a page at a time."""
        return itertools.chain.from_iterable(self._lineage_pages(run_id, until_seq))

    def _lineage_pages(self, run_id: str, until_seq: int | None) -> Iterator[list[Step]]:
        # Pages, chained by the caller in C: a generator resumed per event cost ~8% of a fold.
        cursor = 0
        while until_seq is None or cursor < until_seq:
            stop = cursor + PAGE if until_seq is None else min(cursor + PAGE, until_seq)
            with self._lock:
                page = self._steps_locked(run_id, cursor, stop)
            if cursor == 0 and page and page[0].type == "run_forked":
                fork = page[0].event
                assert isinstance(fork, ev.RunForked)
                yield from self._lineage_pages(fork.parent, fork.parent_seq)
            yield page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def _steps_locked(self, run_id: str, after_seq: int, until_seq: int | None) -> list[Step]:
        """Events of one run as Steps: five columns read, the payloads decoded together."""
        sql = "SELECT seq, type, recorded_us, payload, actor FROM events WHERE run_id=? AND seq>?"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=?"
            args.append(until_seq)
        try:
            rows = self._conn.execute(sql + " ORDER BY seq", args).fetchall()
        except sqlite3.Error as exc:
            raise _explain(exc, "reading", self.path) from exc
        events = _decoded([r[3] for r in rows], [r[1] for r in rows])
        if events is None:
            # Read the page again whole: Recorded.event raises CorruptLedger naming the
            # position of the payload that does not decode or does not match its type.
            events = [rec.event for rec in self._read_run_locked(run_id, after_seq, until_seq)]
        return [
            Step(run_id, seq, type_, at_us, event, actor)
            for (seq, type_, at_us, _, actor), event in zip(rows, events)
        ]

    def _state_locked(self, run_id: str, aggregate: Aggregate[S], head: Head | None) -> S:
        """The folded state at the head, reusing a cached fold when it is still current."""
        ckey = (id(aggregate), run_id)
        cached = self._cache.get(ckey)
        if head is None:
            return aggregate.initial(run_id)
        if cached is not None and cached[0] is aggregate and cached[1] <= head.last_seq:
            _, seq, h, state = cached
            if seq == head.last_seq and h == head.last_hash:
                self._cache.move_to_end(ckey)
                return state
            # Verify the cached point is still on the chain before folding forward.
            row = self._conn.execute(
                "SELECT hash FROM events WHERE run_id=? AND seq=?", (run_id, seq)
            ).fetchone()
            if row is not None and row[0] == h:
                if aggregate.lean:
                    return aggregate.evolve_all(state, self._steps_locked(run_id, seq, None))
                return aggregate.evolve_all(state, self._read_run_locked(run_id, seq, None))
        if aggregate.lean:
            return aggregate.evolve_all(aggregate.initial(run_id), self._lineage_steps(run_id, None))
        return aggregate.evolve_all(aggregate.initial(run_id), self.history(run_id))

    def _remember(self, aggregate: Aggregate[Any], run_id: str, seq: int, h: bytes, state: Any) -> None:
        ckey = (id(aggregate), run_id)
        # Holding the aggregate keeps its id() from being reused by another object.
        self._cache[ckey] = (aggregate, seq, h, state)
        self._cache.move_to_end(ckey)
        while len(self._cache) > 4096:
            self._cache.popitem(last=False)

    def execute(
        self,
        run_id: str,
        aggregate: Aggregate[S],
        decide: Callable[[S, Head | None], Decision],
        *,
        actor: Actor,
        idempotency_key: str | None = None,
        digest_of: bytes | None = None,
        lease: str | None = None,
    ) -> tuple[AppendResult, S]:
        check_run_id(run_id)
        check_actor(actor)
        check_idempotency_key(idempotency_key, actor)
        token = LeaseToken.parse(lease) if lease is not None else None
        actor_s = str(actor)
        digest = None
        if idempotency_key:
            digest = request_digest(actor_s, None, [digest_of or b""])
        if self._group is not None:
            return self._group.submit(
                run_id, lambda: self._execute_locked(run_id, aggregate, decide, actor_s, idempotency_key, digest, token)
            )
        with self._lock:
            self._begin("appending")
            ok = False
            try:
                result, state, folded = self._execute_locked(
                    run_id, aggregate, decide, actor_s, idempotency_key, digest, token
                )
                ok = True
            finally:
                self._finish(ok, "committing a command")
            if folded is not None:
                self._remember_all(run_id, folded)
            return result, state

    def _execute_locked(
        self,
        run_id: str,
        aggregate: Aggregate[S],
        decide: Callable[[S, Head | None], Decision],
        actor_s: str,
        idempotency_key: str | None,
        digest: bytes | None,
        token: LeaseToken | None,
    ) -> tuple[AppendResult, S, tuple[Head | None, list[tuple[Aggregate[Any], Any]]] | None]:
        """The body of ``execute`` inside an open write transaction: the result, the state
        after it, and the folds to remember once the transaction commits (None: nothing new)."""
        try:
            head, max_lease = self._head_locked(run_id)
            if idempotency_key:
                dup = self._find_duplicate(run_id, idempotency_key, digest, actor_s)  # type: ignore[arg-type]
                if dup is not None:
                    return dup, self._state_locked(run_id, aggregate, head), None
            if token is not None:
                self._check_token(run_id, head, max_lease, token)
            state = self._state_locked(run_id, aggregate, head)
            decision = decide(state, head)
            if not decision.events:
                seq = head.last_seq if head else 0
                # Not "duplicate": no key was replayed; the command had nothing to add.
                return AppendResult(run_id, "unchanged", seq, seq, ()), state, None
            if decision.lease is not None and (token is None or token.lease != decision.lease):
                # A number alone proves nothing: the write must have shown that lease's token.
                raise StaleLease(
                    f"a write under lease {decision.lease} of run {run_id} must carry that "
                    "lease's token (the one its claim printed); nothing was written",
                    run_id=run_id, lease=decision.lease, why="no_token",
                )
            self._check_fence(run_id, head, None, decision.lease, max_lease)
            encoded = encode_events(decision.events, self.max_payload)
            written: list[Recorded] = []
            result, new_head = self._insert_locked(
                run_id, head, max_lease, decision.events, encoded, actor_s,
                decision.lease, idempotency_key, digest, written=written,
            )
            if head is None:
                # A new run: fold its whole lineage, so a fork child that this
                # command created starts from the parent's prefix.
                new_state = self._state_locked(run_id, aggregate, new_head)
            else:
                new_state = aggregate.evolve_all(state, written)
            folded = self._run_hooks(run_id, new_head, [(aggregate, new_state)])
        except sqlite3.Error as exc:
            raise _explain(exc, "appending", self.path) from exc
        if folded[0] is None:
            # The head new_state belongs to, as of this transaction: after COMMIT
            # another process may already have moved it past what new_state covers.
            folded = (new_head, [])
        if all(a is not aggregate for a, _ in folded[1]):
            folded[1].append((aggregate, new_state))
        return result, new_state, folded

    # --- reading -------------------------------------------------------------------

    def _read_run_locked(
        self, run_id: str, after_seq: int, until_seq: int | None
    ) -> list[Recorded]:
        sql = f"SELECT {_COLUMNS} FROM events WHERE run_id=? AND seq>?"
        args: list[Any] = [run_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=?"
            args.append(until_seq)
        sql += " ORDER BY seq"
        return [Recorded(*r) for r in self._conn.execute(sql, args)]

    def read_run(
        self, run_id: str, *, after_seq: int = 0, until_seq: int | None = None
    ) -> Iterator[Recorded]:
        # Checked now, not at the first next(): a bad argument fails where it was passed.
        check_run_id(run_id)
        check_seq(after_seq, "after_seq")
        if until_seq is not None:
            check_seq(until_seq, "until_seq")
        return self._iter_run(run_id, after_seq, until_seq)

    def _iter_run(self, run_id: str, after_seq: int, until_seq: int | None) -> Iterator[Recorded]:
        cursor = after_seq
        while True:
            stop = cursor + PAGE if until_seq is None else min(cursor + PAGE, until_seq)
            if until_seq is not None and cursor >= until_seq:
                return
            with self._lock:
                try:
                    page = self._read_run_locked(run_id, cursor, stop)
                except sqlite3.Error as exc:
                    raise _explain(exc, "reading", self.path) from exc
            yield from page
            if len(page) < stop - cursor:
                return
            cursor = stop

    def read_all(
        self, *, after_position: int = 0, until_position: int | None = None, page: int = PAGE
    ) -> Iterator[Recorded]:
        check_seq(after_position, "after_position")
        if until_position is not None:
            check_seq(until_position, "until_position")
        check_seq(page, "page", low=1, high=1_000_000)
        return self._iter_all(after_position, until_position, page)

    def _iter_all(self, after_position: int, until_position: int | None, page: int) -> Iterator[Recorded]:
        cursor = after_position
        while True:
            sql = f"SELECT {_COLUMNS} FROM events WHERE position>?"
            args: list[Any] = [cursor]
            if until_position is not None:
                sql += " AND position<=?"
                args.append(until_position)
            sql += " ORDER BY position LIMIT ?"
            args.append(page)
            with self._lock:
                try:
                    rows = self._conn.execute(sql, args).fetchall()
                except sqlite3.Error as exc:
                    raise _explain(exc, "reading", self.path) from exc
            if not rows:
                return
            for r in rows:
                yield Recorded(*r)
            cursor = rows[-1][2]
            if len(rows) < page:
                return

    def read_for_export(
        self, run_ids: Sequence[str] | None = None
    ) -> Iterator[tuple[Recorded, bytes | None, int]]:
        """Events in global order with what an export needs beyond the envelope."""
        wanted = None if run_ids is None else set(run_ids)
        cursor = 0
        while True:
            with self._lock:
                try:
                    rows = self._conn.execute(
                        f"SELECT {_COLUMNS}, idem_digest, batch_size FROM events WHERE position>? "
                        "ORDER BY position LIMIT ?",
                        (cursor, PAGE),
                    ).fetchall()
                except sqlite3.Error as exc:
                    raise _explain(exc, "exporting", self.path) from exc
            if not rows:
                return
            for r in rows:
                if wanted is None or r[0] in wanted:
                    yield Recorded(*r[:12]), r[12], r[13]
            cursor = rows[-1][2]

    def head(self, run_id: str) -> Head | None:
        check_run_id(run_id)
        with self._lock:
            try:
                return self._head_locked(run_id)[0]
            except sqlite3.Error as exc:
                raise _explain(exc, "reading a run's head", self.path) from exc

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
            with self._lock:
                rows = self._conn.execute(sql + order, args).fetchall()
            yield from (Head(*r) for r in rows)
            return
        # Keyset pages on the index: memory stays flat however many runs there are, and
        # each page is read whole, so a caller may write between pages. The key includes
        # run_id so that no row is skipped even where first positions tie or are odd (a
        # damaged heads table, which verify reports; every listing must still show it).
        page = self._conn.execute
        cursor: tuple[Any, ...] | None = None
        while True:
            with self._lock:
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
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM heads").fetchone()[0]

    def _has_heads_index(self) -> bool:
        if not self._heads_indexed:
            with self._lock:
                self._heads_indexed = bool(self._conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name='heads_first'"
                ).fetchone())
        return self._heads_indexed

    def last_position(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]

    # --- checking ------------------------------------------------------------------

    def verify(
        self, run_id: str | None = None, *, progress: Callable[[int, int], None] | None = None
    ) -> list[Problem]:
        """Walk the log and report broken links, seq gaps, bad payloads and stale heads.

        Reports the first problem of each run (later ones usually follow from it) and any
        hole in the global positions, which is where a deleted row shows. Runs in one
        read transaction, so a concurrent writer cannot make the heads look ahead of the
        events walked (a false head_mismatch).
        """
        with self._lock:
            began = not self._conn.in_transaction
            try:
                if began:
                    self._conn.execute("BEGIN")
                return self._verify_snapshot(run_id, progress)
            except sqlite3.Error as exc:
                raise _explain(exc, "verifying", self.path) from exc
            finally:
                if began and self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def _verify_snapshot(
        self, run_id: str | None, progress: Callable[[int, int], None] | None
    ) -> list[Problem]:
        problems: list[Problem] = []
        broken: set[str] = set()
        seen: dict[str, tuple[int, bytes]] = {}
        spans: dict[str, tuple[int, int]] = {}  # each run's first and last position in the log
        fences: dict[str, tuple[int | None, str | None, int]] = {}
        digests: dict[str, str | None] = {}  # the digest a write's token must match, per the log
        total = self.last_position()
        expected_pos = None
        source: Iterator[Recorded] = (
            self.read_run(run_id) if run_id is not None else self.read_all()
        )
        for rec in source:
            if run_id is None:
                if expected_pos is not None and rec.position != expected_pos:
                    problems.append(
                        Problem("position_gap", rec.run_id, rec.seq, rec.position,
                                f"positions jump from {expected_pos - 1} to {rec.position}: "
                                "events are missing")
                    )
                expected_pos = rec.position + 1
            if progress is not None and rec.position % 10_000 == 0:
                progress(rec.position, total)
            if rec.run_id in broken:
                continue
            last_seq, prev = seen.get(rec.run_id, (0, GENESIS_HASH))
            problem = None
            if not all(isinstance(v, bytes) for v in (rec.payload, rec.prev_hash, rec.hash)) or not all(
                isinstance(v, int) for v in (rec.seq, rec.recorded_us, rec.schema_version)
            ):
                problem = ("bad_type", "a column holds a value of the wrong type (edited behind the store)")
            elif rec.seq != last_seq + 1:
                problem = ("seq_gap", f"seq {rec.seq} follows seq {last_seq}")
            elif rec.prev_hash != prev:
                problem = ("broken_link", "prev_hash does not match the previous event's hash")
            elif rec.hash != chain_hash(
                rec.prev_hash, rec.run_id, rec.seq, rec.type, rec.actor, rec.lease,
                rec.idempotency_key, rec.recorded_us, rec.schema_version, rec.payload,
            ):
                problem = ("bad_hash", "the event's content does not match its hash")
            else:
                try:
                    event = ev.decode(rec.payload)
                    if ev.tag_of(event) != rec.type:
                        problem = ("type_mismatch", f"type column {rec.type} but payload is {ev.tag_of(event)}")
                except Exception as exc:  # msgspec errors, bad UTF-8
                    problem = ("undecodable", f"payload cannot be decoded: {exc}")
            if problem:
                broken.add(rec.run_id)
                problems.append(Problem(problem[0], rec.run_id, rec.seq, rec.position, problem[1]))
                continue
            seen[rec.run_id] = (rec.seq, rec.hash)
            span = spans.get(rec.run_id)
            spans[rec.run_id] = (rec.position if span is None else span[0], rec.position)
            if rec.type in ("lease_granted", "lease_released", "lease_revoked"):
                lease, holder, top = fences.get(rec.run_id, (None, None, 0))
                e = ev.decode(rec.payload)
                if isinstance(e, ev.LeaseGranted):
                    lease, holder, top = e.lease, e.worker, max(top, e.lease)
                    digests[rec.run_id] = e.token_digest or None
                elif e.lease == lease:  # released or revoked: the current lease ends
                    lease, holder = None, None
                    digests[rec.run_id] = None
                fences[rec.run_id] = (lease, holder, top)
        # The ledger-wide checks run for one run too: a hole or a break anywhere in the
        # global chain makes every run's place in the order doubtful.
        problems.extend(self._verify_global_chain(gaps=run_id is not None))
        heads = {h.run_id: h for h in self.list_runs()} if run_id is None else (
            {run_id: h} if (h := self.head(run_id)) else {}
        )
        for rid, (last_seq, last_hash) in seen.items():
            if rid in broken:
                continue
            h = heads.get(rid)
            if h is None or h.last_seq != last_seq or h.last_hash != last_hash:
                problems.append(
                    Problem("head_mismatch", rid, last_seq, None,
                            f"the heads table says seq {h.last_seq if h else None}, the log ends "
                            f"at seq {last_seq}: events were removed or added behind the store")
                )
                continue
            if (h.first_position, h.last_position) != spans[rid]:
                problems.append(
                    Problem("head_mismatch", rid, last_seq, None,
                            f"the heads table places the run at positions {h.first_position}-"
                            f"{h.last_position}, the log at {spans[rid][0]}-{spans[rid][1]}: the "
                            "heads row was edited behind the store")
                )
                continue
            want = fences.get(rid, (None, None, 0))
            row = self._conn.execute(
                "SELECT lease, lease_holder, max_lease FROM heads WHERE run_id=?", (rid,)
            ).fetchone()
            if tuple(row) != want:
                problems.append(
                    Problem("fence_mismatch", rid, last_seq, None,
                            f"the heads table fences with lease {row[0]} (holder {row[1]}, highest "
                            f"{row[2]}) but the log's lease events say {want[0]} (holder {want[1]}, "
                            f"highest {want[2]}): writes would be checked against a forged lease")
                )
                continue
            kept = self._lease_digest_locked(rid)
            if kept != digests.get(rid):
                problems.append(
                    Problem("fence_mismatch", rid, last_seq, None,
                            f"the heads table holds another lease token digest than the grant of lease "
                            f"{want[0]} in the log: a token nobody was given would be accepted as the "
                            "holder's (the heads row was edited behind the store)")
                )
        for rid, h in heads.items():
            if rid not in seen and rid not in broken:
                problems.append(Problem("head_mismatch", rid, None, None,
                                        f"run {rid} has a head at seq {h.last_seq} but no events"))
        problems.extend(self._append_only_locked())
        return problems

    def _verify_global_chain(self, *, gaps: bool = False) -> list[Problem]:
        """Walk the ledger-wide chain; report the first position where it breaks.

        ``gaps``: also report the first hole in the positions (the whole-ledger walk
        finds those itself; a one-run verify relies on this walk for them)."""
        prev, cursor = GENESIS_HASH, 0
        found: list[Problem] = []
        while True:
            rows = self._conn.execute(
                "SELECT position, run_id, seq, hash, global_hash FROM events WHERE position > ? "
                "ORDER BY position LIMIT ?", (cursor, PAGE * 10),
            ).fetchall()
            for position, rid, seq, h, g in rows:
                if gaps and position != cursor + 1:
                    found.append(Problem("position_gap", rid, seq, position,
                                         f"positions jump from {cursor} to {position}: events are missing"))
                    gaps = False
                cursor = position
                if not isinstance(h, bytes) or g != global_link(prev, position, h):
                    return found + [Problem("global_chain", rid, seq, position,
                                            "the ledger-wide chain breaks here: events were reordered, moved "
                                            "between positions, inserted or removed behind the store")]
                prev = g
            if len(rows) < PAGE * 10:
                return found

    def _append_only_locked(self) -> list[Problem]:
        have = dict(self._conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type='trigger' AND tbl_name='events'"
        ).fetchall())
        out = []
        for name, sql in APPEND_ONLY_TRIGGERS.items():
            if name not in have:
                out.append(Problem(
                    "trigger_missing", None, None, None,
                    f"the append-only trigger {name} is gone: events can be changed or deleted "
                    "without any error. Someone edited the file behind the store; run 'handoff "
                    "verify' against a head digest kept elsewhere, and restore from a backup",
                ))
            elif " ".join(str(have[name]).split()) != " ".join(sql.split()):
                out.append(Problem(
                    "trigger_altered", None, None, None,
                    f"the append-only trigger {name} is not the one the store created: it may "
                    "no longer refuse changes. Someone edited the file behind the store; restore "
                    "from a backup and compare with a head digest kept elsewhere",
                ))
        return out

    def append_only_problems(self) -> list[Problem]:
        with self._lock:
            try:
                return self._append_only_locked()
            except sqlite3.Error as exc:
                raise _explain(exc, "reading the triggers", self.path) from exc

    # --- heads of the whole ledger, and copies ---------------------------------------

    def ledger_head(self) -> tuple[int, bytes]:
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1"
                ).fetchone()
            except sqlite3.Error as exc:
                raise _explain(exc, "reading the ledger's head", self.path) from exc
        if row is None:
            return 0, GENESIS_HASH
        return row[0], bytes(row[1]) if isinstance(row[1], (bytes, bytearray)) else b""

    def global_hash_at(self, position: int) -> bytes | None:
        check_seq(position, "position")
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT global_hash FROM events WHERE position=?", (position,)
                ).fetchone()
            except sqlite3.Error as exc:
                raise _explain(exc, "reading the ledger-wide chain", self.path) from exc
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
            with self._lock:
                self._conn.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
            row = dst.execute("SELECT position, global_hash FROM events ORDER BY position DESC LIMIT 1").fetchone()
            runs = dst.execute("SELECT count(*) FROM heads").fetchone()[0]
        except sqlite3.Error as exc:
            raise _explain(exc, "copying the ledger into a backup", self.path) from exc
        finally:
            dst.close()
        return (0, GENESIS_HASH, runs) if row is None else (row[0], bytes(row[1]), runs)

    # --- the backend-neutral interface for the layers above (ledger/store.py) ---------

    @contextlib.contextmanager
    def write_transaction(self, doing: str) -> Iterator[SqliteTransaction]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception), under the lock."""
        with self._lock:
            self._begin(doing)
            ok = False
            try:
                yield self._txn
                ok = True
            except sqlite3.Error as exc:
                raise _explain(exc, doing, self.path) from exc
            finally:
                self._finish(ok, doing)

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[SqliteTransaction]:
        """One read snapshot (``BEGIN`` ... ``ROLLBACK``), or the transaction already open."""
        with self._lock:
            conn = self._conn
            began = not conn.in_transaction
            try:
                if began:
                    conn.execute("BEGIN")
                yield self._txn
            except sqlite3.Error as exc:
                raise _explain(exc, "reading", self.path) from exc
            finally:
                if began and conn.in_transaction:
                    conn.execute("ROLLBACK")

    @property
    def views(self) -> Any:
        """The view store on this file (ledger/sqlite_views.py)."""
        if self._views is None:
            from .sqlite_views import SqliteViewStore

            self._views = SqliteViewStore(self)
        return self._views

    def diagnostics(self) -> dict[str, Any]:
        """What ``handoff doctor`` prints: the file, the SQLite library and its settings."""
        version = sqlite3.sqlite_version
        affected = tuple(int(x) for x in version.split(".")[:3]) < (3, 51, 3)
        with self._lock:
            pragma = lambda name: self._conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
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
                **({"upgrade": note} if (note := self.upgrade_note()) else {}),
            }

    def integrity_check(self) -> str:
        with self._lock:
            return "; ".join(r[0] for r in self._conn.execute("PRAGMA integrity_check"))

    @property
    def sqlite_version(self) -> str:
        return sqlite3.sqlite_version

    def enable_group_commit(self) -> None:
        """Let concurrent ``execute`` calls from this process's threads share one write
        transaction and one fsync (see ``_GroupCommit``); each command is still fenced,
        deduplicated and decided on its own. ``handoff.Ledger(group_commit=True)`` calls it."""
        if self.readonly:
            raise StoreUnavailable(f"the ledger {self.path} was opened read-only; group commit needs a writable one")
        with self._lock:
            if self._group is None:
                self._group = _GroupCommit(self)

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass


class SqliteTransaction(Transaction):
    """The handle ``write_transaction``, ``read_transaction`` and inline hooks receive.

    Stateless beyond its store: the transaction is the connection's, and the store's
    lock is held by whoever opened it."""

    __slots__ = ("_store",)

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def head(self, run_id: str) -> Head | None:
        return self._store._head_locked(run_id)[0]

    def state(self, run_id: str, aggregate: Aggregate[S], head: Head | None | object = _MISSING) -> S:
        store = self._store
        if head is _MISSING:
            head = store._head_locked(run_id)[0]
        return store._state_locked(run_id, aggregate, head)  # type: ignore[arg-type]

    def fold(self, run_id: str, aggregate: Aggregate[S]) -> S:
        return self._store.fold(run_id, aggregate)

    def runs_since(self, position: int) -> list[str]:
        return [r[0] for r in self._store._conn.execute(_RUNS_SINCE, (position,))]

    def count_runs(self, *, begun_by: int | None = None) -> int:
        conn = self._store._conn
        if begun_by is None:
            return conn.execute("SELECT count(*) FROM heads").fetchone()[0]
        return conn.execute("SELECT count(*) FROM heads WHERE first_position <= ?", (begun_by,)).fetchone()[0]

    def last_position(self) -> int:
        return self._store.last_position()

    @property
    def views(self) -> Any:
        return self._store.views
