"""The storage contract every backend honours, and the envelope it stores.

Backends see envelopes and payload bytes; the meaning of events belongs to reducers.
The one exception is fencing: lease events set the token a write must carry, so a
superseded worker is refused inside the very transaction that would have written.
Everything here is backend-neutral so a PostgreSQL store can follow without callers
changing; the conformance suite in tests/ledger/conformance.py is the contract in code.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

import msgspec

from . import events as ev
from .errors import CorruptLedger, InvalidInput, NotALedger, PayloadTooLarge, SchemaTooNew, UnknownEventType

if TYPE_CHECKING:
    from .view_tables import ViewStore, ViewWriter

#: Run ids starting with this are the watchdogs' own streams (a watcher's beats), not runs.
WATCHER_PREFIX = "watcher:"
DEFAULT_MAX_PAYLOAD = 1 << 20
GENESIS_HASH = b"\x00" * 32
#: The ``format`` row of every ledger's handoff_meta table: what tells a ledger from any
#: other database of the same engine.
FORMAT_NAME = "handoff-ledger"


class Actor(msgspec.Struct, frozen=True):
    """Who wrote an event: a kind (worker, owner, watchdog, operator) and a name."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Actor:
        kind, _, name = text.partition(":")
        return cls(kind, name)


_decode = ev.decode
#: Every type the payload decoder can produce, with the tag it is stored under.
_TAG_OF_TYPE = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}


class Recorded(msgspec.Struct, frozen=True):
    """One stored event with its envelope. ``recorded_us`` is the store's clock (UTC µs)."""

    run_id: str
    seq: int
    position: int
    type: str
    actor: str
    lease: int | None
    idempotency_key: str | None
    recorded_us: int
    schema_version: int
    payload: bytes
    prev_hash: bytes
    hash: bytes

    @property
    def event(self) -> ev.Event:
        """The decoded payload; one that no longer decodes, or whose type is not the one
        the envelope names, is a damaged ledger."""
        try:
            event = _decode(self.payload)
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError, UnicodeDecodeError) as exc:
            problem = f"cannot be decoded ({exc})"
        else:
            # A catch-up reads this once per event: the type's tag from a dict costs a
            # fraction of building the struct's config (ev.tag_of) every time.
            if _TAG_OF_TYPE.get(type(event)) == self.type:
                return event
            problem = f"is stored as {self.type!r} but its payload is a {ev.tag_of(event)!r}"
        raise CorruptLedger(
            f"event {self.run_id} seq {self.seq} (position {self.position}) {problem}; the "
            "ledger was damaged or edited behind the store. Run 'handoff verify'",
            run_id=self.run_id, seq=self.seq, position=self.position,
        )

    @property
    def recorded_at(self) -> datetime:
        return datetime.fromtimestamp(self.recorded_us / 1_000_000, tz=timezone.utc)


class Step(msgspec.Struct, frozen=True, gc=False):
    """A decoded event with the part of its envelope a fold reads.

    A store hands these to an aggregate that declares itself ``lean``: reading five
    columns and decoding a page of payloads at once costs a fraction of building a
    full ``Recorded`` per row, and a fold never needs the hashes, lease or keys. It does
    need the actor (``kind:name``): whether an event moves a run's progress depends on
    who recorded it (reducers/transitions.py, ``advances``).
    """

    run_id: str
    seq: int
    type: str
    recorded_us: int
    event: ev.Event
    actor: str


class Head(msgspec.Struct, frozen=True):
    """Where a run stands in the log: last seq and hash, and the lease writes must carry."""

    run_id: str
    last_seq: int
    last_hash: bytes
    lease: int | None
    lease_holder: str | None
    first_position: int
    last_position: int


class Liveness(msgspec.Struct, frozen=True):
    """A run's liveness as its lease holder last reported it: kept beside the log, not in it.

    A heartbeat is an observation, not a fact of the work: most beats only move this row
    (``EventStore.beat``), fenced by the lease token and committed without waiting for the
    disk, since a beat lost in a crash reads as the silence a crash is. The log keeps the
    beats that matter (the lease's grant, the first beat after a silence, changed attrs, one
    per summary window) and every watchdog decision with the liveness it saw. A row whose
    ``lease`` is not the run's current lease says nothing about the run.
    """

    run_id: str
    lease: int
    #: The last beat, in the store's clock (µs).
    beat_us: int
    #: Beats of this lease so far, logged or not.
    beats: int
    #: When the last beat that went into the log was recorded (µs).
    logged_us: int
    #: The last beat's attrs as encoded by ``encode_beat_attrs`` (b"" for none).
    attrs: bytes = b""
    #: The longest gap between beats that is not a silence (µs): half the run's heartbeat
    #: timeout, kept in the row so a beat needs nothing else read first.
    quiet_us: int = 0


def encode_beat_attrs(attrs: dict[str, Any] | None) -> bytes:
    """A beat's attrs in one canonical form, so two beats with the same attrs compare equal
    (keys sorted; b"" for none)."""
    return msgspec.json.encode(dict(sorted(attrs.items()))) if attrs else b""


class AppendResult(msgspec.Struct, frozen=True):
    """What an append did, in ``outcome``:

    - ``committed``: new events were written, seqs ``first_seq``..``last_seq``;
    - ``duplicate``: the idempotency key was already used for this same request; nothing
      was written, and the seqs and positions are those of that earlier write;
    - ``unchanged``: the command was accepted but had nothing to add (``execute`` whose
      decide returned no events: a retried delivery attempt, an effect already settled);
      nothing was written, ``positions`` is empty and ``first_seq`` = ``last_seq`` = the
      run's last seq as it stood (0 for a run that does not exist).

    ``positions`` are the events' ledger positions. On PostgreSQL they are given after
    the commit (docs/postgres.md, "Order"); in the rare case that could not happen at
    once (the seal lock held past the lock timeout) a committed write returns
    ``positions=()``, and its events get theirs from the next writer or reader.
    """

    run_id: str
    outcome: Literal["committed", "duplicate", "unchanged"]
    first_seq: int
    last_seq: int
    positions: tuple[int, ...]


class Problem(msgspec.Struct, frozen=True):
    """One thing ``verify`` found wrong, at the first position where it shows."""

    kind: str
    run_id: str | None  # None for a ledger-wide problem (a head anchor, a missing trigger)
    seq: int | None
    position: int | None
    message: str


S = TypeVar("S")


class Aggregate(abc.ABC, Generic[S]):
    """A fold the store can keep warm: ``initial`` then ``evolve`` over recorded events.

    The store calls it inside a write transaction to rebuild a run's state, and may
    cache the result per (run, seq); it never needs to know what the state means.
    """

    @abc.abstractmethod
    def initial(self, run_id: str) -> S: ...

    #: True when ``evolve`` reads nothing of its record but ``run_id``, ``seq``, ``type``,
    #: ``recorded_us``, ``actor`` and ``event``: the store may then fold it over ``Step``s.
    lean: bool = False

    @abc.abstractmethod
    def evolve(self, state: S, recorded: Recorded) -> S: ...

    def evolve_all(self, state: S, records: Iterable[Recorded]) -> S:
        """Fold many records; an aggregate overrides it when it can fold without a copy per event."""
        for rec in records:
            state = self.evolve(state, rec)
        return state


#: What a write hands back to remember once it commits: the head its hooks ran at (None:
#: no hook ran) and each aggregate's state there.
Folded = tuple[Head | None, list[tuple[Aggregate[Any], Any]]]


class Decision(msgspec.Struct, frozen=True):
    """What a decide callback returns: events to append (may be empty) and the lease they use.

    ``lease`` is the number recorded in the envelope; a write that sets it must also have
    passed that lease's token to ``execute`` (the store refuses a number without its token).
    """

    events: tuple[ev.Event, ...]
    lease: int | None = None


# --- helpers every backend shares --------------------------------------------------


def now_us() -> int:
    """This host's clock, in UTC µs: what a store stamps events with unless given its own."""
    return time.time_ns() // 1000


def meta_schema_version(meta: dict[str, str], where: str, newest: int, what: str = "schema") -> int:
    """The schema version a ledger's handoff_meta rows declare: NotALedger without the
    format mark, SchemaTooNew when a newer version than this one (``newest``) wrote it."""
    if meta.get("format") != FORMAT_NAME:
        raise NotALedger(f"{where} has a handoff_meta table but no handoff-ledger format mark")
    version = int(meta.get("schema_version", "0"))
    if version > newest:
        raise SchemaTooNew(
            f"{where} was written by a newer handoff-ledger ({what} {version}, this "
            f"version reads up to {newest}); upgrade handoff-ledger"
        )
    return version


# --- lease tokens ------------------------------------------------------------------

#: Domain separation for the digest of a lease token's secret.
LEASE_TOKEN_DOMAIN = b"handoff-ledger lease token v1\x00"
_LEASE_TOKEN_RE = re.compile(r"([1-9][0-9]{0,15})\.([A-Za-z0-9_-]{22,128})")


def lease_digest(secret: str) -> str:
    """The hex sha256 the ledger keeps for a token's secret; the secret itself is never stored."""
    return hashlib.sha256(LEASE_TOKEN_DOMAIN + secret.encode("ascii")).hexdigest()


def new_lease_secret() -> tuple[str, str]:
    """A fresh (secret, digest) for a claim: 32 random bytes, URL-safe base64."""
    import secrets

    secret = secrets.token_urlsafe(32)
    return secret, lease_digest(secret)


class LeaseToken(str):
    """What a claim returns: ``"<lease>.<secret>"``, the proof every write under the lease carries.

    A ``str``, so it goes into environment variables and command lines as it is; ``lease``
    is the fencing number, for ordering and display. ``repr`` hides the secret, so a token
    printed by accident in a traceback or a log line does not hand the lease to a reader.
    """

    __slots__ = ()

    @classmethod
    def parse(cls, value: object, field: str = "lease") -> LeaseToken:
        """The token in ``value``, or InvalidInput saying a lease number is not a token."""
        if isinstance(value, str) and _LEASE_TOKEN_RE.fullmatch(value):
            return cls(value)
        what = ("a bare lease number" if isinstance(value, int) and not isinstance(value, bool)
                or isinstance(value, str) and value.isdigit() else "not a lease token")
        raise InvalidInput(
            f"{field} is {what}: a write under a lease must carry the token its claim printed "
            "(<lease>.<secret>). The lease number shown by status or the log proves nothing",
            field=field,
        )

    @property
    def lease(self) -> int:
        return int(self.partition(".")[0])

    @property
    def secret(self) -> str:
        return self.partition(".")[2]

    def matches(self, digest: str | None) -> bool:
        """Constant-time: does this token's secret hash to ``digest``?"""
        if not digest:
            return False
        return hmac.compare_digest(lease_digest(self.secret), digest)

    def __repr__(self) -> str:
        return f"LeaseToken(lease={self.lease}, secret=...)"


_TAGS: dict[type, str] = {cls: tag for tag, cls in ev.EVENT_TYPES.items()}
_batch_decoder = msgspec.json.Decoder(list[ev.AnyEvent])  # type: ignore[valid-type]


def encode_events(events: Sequence[ev.Event], max_payload: int) -> list[tuple[str, bytes]]:
    """Validate and encode a batch: known event types, under the size limit, and readable.

    Each payload is decoded back before anything is written: msgspec does not type-check
    Struct constructors, so ``ProgressRecorded(kind=5)`` would otherwise be stored,
    acknowledged and then be unreadable. The whole batch is decoded in one call; only
    when that fails is it decoded event by event, to name the bad one.
    """
    out = []
    for i, event in enumerate(events):
        tag = _TAGS.get(type(event))
        if tag is None:
            raise UnknownEventType(
                f"event #{i + 1} is a {type(event).__name__}, not one of the ledger's event "
                "types (see docs/events.md)",
                field=f"events[{i}]",
            )
        payload = ev.encode(event)
        if len(payload) > max_payload:
            raise PayloadTooLarge(
                f"event #{i + 1} ({tag}) encodes to {len(payload)} bytes, over "
                f"the limit of {max_payload}; store large content as an artifact file instead",
                field=f"events[{i}]",
            )
        out.append((tag, payload))
    try:
        _batch_decoder.decode(b"[" + b",".join(p for _, p in out) + b"]")
    except (msgspec.ValidationError, msgspec.DecodeError):
        for i, (tag, payload) in enumerate(out):
            try:
                ev.decode(payload)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise InvalidInput(
                    f"event #{i + 1} ({tag}) has a field of the wrong type and could not be "
                    f"read back: {exc}",
                    field=f"events[{i}]",
                ) from None
        raise  # pragma: no cover - the batch failed yet every event decodes alone
    return out


_hdr = msgspec.msgpack.Encoder()


def chain_hash(
    prev_hash: bytes,
    run_id: str,
    seq: int,
    type_: str,
    actor: str,
    lease: int | None,
    idempotency_key: str | None,
    recorded_us: int,
    schema_version: int,
    payload: bytes,
) -> bytes:
    """sha256 over the previous hash, the envelope (minus position) and the payload.

    The global position is left out so that an exported run re-imported elsewhere keeps
    its hashes; everything a reader could act on is covered.
    """
    header = _hdr.encode(
        (run_id, seq, type_, actor, lease, idempotency_key, recorded_us, schema_version)
    )
    return hashlib.sha256(b"".join((prev_hash, len(header).to_bytes(4, "big"), header, payload))).digest()


def global_link(prev_global: bytes, position: int, event_hash: bytes) -> bytes:
    """The ledger-wide chain: each event's hash bound to its global position and to the one
    before it. Per-run chains leave positions out (an exported run keeps its hashes in any
    ledger); this chain is local to one ledger and is what shows a reordering across runs."""
    return hashlib.sha256(b"".join((prev_global, position.to_bytes(8, "big"), event_hash))).digest()


def value_digest(data: bytes) -> str:
    """The name a value is stored under beside the log: its sha256, in hex."""
    return hashlib.sha256(data).hexdigest()


def request_digest(actor: str, lease: int | None, payloads: Sequence[bytes]) -> bytes:
    """What an idempotency key stands for: the same actor sending the same bytes."""
    parts = [actor.encode(), b"\x00", str(lease).encode(), b"\x00"]
    for p in payloads:
        parts += (len(p).to_bytes(4, "big"), p)
    return hashlib.sha256(b"".join(parts)).digest()


class Transaction(abc.ABC):
    """A handle on one open transaction of a store: a write transaction (holding the
    store's write lock) or a read snapshot. Valid only inside the ``with`` block that
    yielded it; everything it answers is as of that transaction.

    Inline projection hooks receive one (inside the append's own write transaction), and
    callers above the store use ``store.write_transaction`` / ``store.read_transaction``
    to get one.
    """

    @abc.abstractmethod
    def head(self, run_id: str) -> Head | None:
        """The run's head, or None if it has no events."""

    @abc.abstractmethod
    def state(self, run_id: str, aggregate: Aggregate[S], head: Any = ...) -> S:
        """The aggregate's fold of the run at its head (a cached fold when still current);
        pass ``head`` when just read from this transaction, to save reading it again."""

    def fold(self, run_id: str, aggregate: Aggregate[S]) -> S:
        """A fresh fold of the run from the log, no cache involved (a rebuild's view)."""
        return self.state(run_id, aggregate)

    @abc.abstractmethod
    def runs_since(self, position: int) -> list[str]:
        """The runs with events after ``position``, in the order they first appeared."""

    @abc.abstractmethod
    def count_runs(self, *, begun_by: int | None = None) -> int:
        """How many streams exist (only those whose first event is at or before
        ``begun_by`` if given)."""

    @abc.abstractmethod
    def last_position(self) -> int: ...

    @property
    @abc.abstractmethod
    def views(self) -> ViewWriter:
        """The view writer bound to this transaction (its writes commit or roll back with it)."""


#: ``hook(txn, run_id, state, last_position)``, run inside every append's write transaction.
InlineHook = Callable[[Transaction, str, Any, int], None]


class Hook(abc.ABC):
    """An inline hook that says what it does, as an aggregate says it is ``lean``: the
    store reads these declarations and decides for itself what they let it skip. A plain
    callable is a hook that declares nothing (the defaults below)."""

    #: True when the hook keeps every one of the ledger's projections: a write it ran in
    #: leaves catch-up nothing to do, so the store marks no view as behind for it.
    keeps_views: bool = False
    #: False when the hook never uses ``last_position``: a backend may then hand it a
    #: number that only the server resolves, and write in fewer round trips.
    reads_position: bool = True

    @abc.abstractmethod
    def __call__(self, txn: Transaction, run_id: str, state: Any, last_position: int) -> None: ...


def keeps_views(hook: InlineHook) -> bool:
    """What ``hook`` declares (``Hook.keeps_views``); a plain callable keeps none for sure."""
    return bool(getattr(hook, "keeps_views", False))


def reads_position(hook: InlineHook) -> bool:
    """What ``hook`` declares (``Hook.reads_position``); a plain callable may read it."""
    return bool(getattr(hook, "reads_position", True))


class Capabilities(msgspec.Struct, frozen=True):
    """What a backend offers beyond the interface every store honours, declared by its
    class, so that the layers above ask the record instead of the backend's name.

    - ``is_file``: the ledger is one local file an address names by path (``init`` and
      ``import`` publish a new one under a private name; ``doctor`` shows its settings);
    - ``group_commit``: threads of one process may share a write transaction
      (``enable_group_commit``);
    - ``attested_roles``: the server records which database role inserted each event
      (``db_roles``), and the ledger has least-privilege roles (``access_roles``);
    - ``own_clock``: the store's ``clock()`` is the one every host shares (a server's),
      which stamps events and judges health instead of this host's clock.
    """

    is_file: bool = False
    group_commit: bool = False
    attested_roles: bool = False
    own_clock: bool = False


class EventStore(abc.ABC):
    """The interface: append-only per-run streams with a global order.

    Every write is all-or-nothing; every refusal raises a LedgerError and writes nothing.
    """

    #: What this backend offers beyond the interface (see ``Capabilities``).
    capabilities: ClassVar[Capabilities] = Capabilities()

    def clock(self) -> int:
        """The store's "now" in µs; this host's clock unless ``capabilities.own_clock``."""
        return now_us()

    def enable_group_commit(self) -> None:
        """Let concurrent commands of this process share write transactions; only a backend
        whose ``capabilities.group_commit`` says so offers it."""
        raise InvalidInput(
            f"group commit is offered by the SQLite backend; this ledger's store "
            f"({type(self).__name__}) does not have it. Open the Ledger without "
            "group_commit=True", field="group_commit",
        )

    def access_roles(self, prefix: str = "handoff") -> dict[str, Any]:
        """The ledger's least-privilege roles: ``{"schema", "roles", "sql"}``, the SQL for
        its owner to run. Only where ``capabilities.attested_roles``: a file's access is
        its permissions."""
        raise InvalidInput(
            f"roles are for a PostgreSQL ledger, and {self.path} is an SQLite file: its access is "
            "the file's permissions", field="db")

    @abc.abstractmethod
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
        """Append a batch to one run atomically.

        ``expected_seq`` is the head the caller saw (0 for a new run); ``lease``, when
        given, is a lease token (``LeaseToken``) that must prove the run's current lease;
        a repeated ``idempotency_key`` with the same request returns the earlier result as
        ``duplicate``.
        """

    @abc.abstractmethod
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
        """Fold the run, call ``decide`` and append what it returns, in one write transaction.

        ``lease`` is the token of the lease the write is made under: it is checked before
        ``decide`` is called, so a caller that cannot prove the lease learns nothing else.

        Two racing commands therefore cannot both pass a check only one may pass.
        Returns the append result and the folded state after the new events.
        """

    @abc.abstractmethod
    def read_run(
        self, run_id: str, *, after_seq: int = 0, until_seq: int | None = None
    ) -> Iterator[Recorded]:
        """The run's own events in seq order, streamed."""

    @abc.abstractmethod
    def read_all(
        self, *, after_position: int = 0, until_position: int | None = None
    ) -> Iterator[Recorded]:
        """Every event in global order after a position, streamed; never skips one."""

    @abc.abstractmethod
    def read_for_export(
        self, run_ids: Sequence[str] | None = None
    ) -> Iterator[tuple[Recorded, bytes | None, int]]:
        """Events in global order with their idempotency digest and batch size."""

    @abc.abstractmethod
    def import_records(
        self,
        items: Iterable[tuple[Recorded, bytes | None, int]],
        *,
        aggregate: Aggregate[Any] | None = None,
        admit: Callable[[Any, Recorded, ev.Event], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        """Insert exported events verbatim, all or nothing, skipping ones already present
        (ledger/importing.py says what is checked): ``admit(state, record, event)`` may
        refuse an event given ``aggregate``'s fold of its run before it, and
        ``before_commit()`` the whole import at its end."""

    @abc.abstractmethod
    def head(self, run_id: str) -> Head | None: ...

    @abc.abstractmethod
    def list_runs(self, *, prefix: str | None = None) -> Iterator[Head]:
        """Every stream's head, oldest first; only ids starting with ``prefix`` if given."""

    def count_runs(self) -> int:
        """How many streams the ledger holds (runs and watcher streams)."""
        return sum(1 for _ in self.list_runs())

    @abc.abstractmethod
    def last_position(self) -> int: ...

    def counts(self) -> dict[str, int]:
        """How many events and streams the ledger holds."""
        return {"events": self.last_position(), "runs": self.count_runs()}

    @property
    def records_roles(self) -> bool:
        """Whether the backend records the database role that inserted each event."""
        return self.capabilities.attested_roles

    def db_roles(self, first_position: int, last_position: int) -> dict[int, str]:
        """The database role that inserted each event in the positions given, as the
        server recorded it ({} here: where there is no server, the actor is all there is,
        and it is self-declared). ``log``, ``export`` and ``verify`` show it."""
        return {}

    def db_role_counts(self, run_id: str | None = None) -> dict[str, int]:
        """How many events each database role inserted (the whole ledger, or one run)."""
        return {}

    def wait_for_events(self, after_position: int, timeout_s: float) -> int:
        """Wait until the ledger holds an event after ``after_position``, or ``timeout_s``
        passes; return the last position either way. What a tailing reader (``log
        --follow``, ``watch``) sleeps on. Here: a poll every 50 ms; a backend that can be
        told about commits (PostgreSQL's LISTEN/NOTIFY) wakes sooner and polls less."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            last = self.last_position()
            left = deadline - time.monotonic()
            if last > after_position or left <= 0:
                return last
            time.sleep(min(0.05, left))

    # --- liveness beside the log (``Liveness``) ---------------------------------------

    def beat(self, run_id: str, token: LeaseToken, attrs: bytes, *,
             mark_us: int) -> tuple[Liveness, int, bytes] | None:
        """Refresh the run's liveness without an event, when nothing about this beat is worth
        logging; return the row as it now stands, with the run's head (last seq and hash)
        read in the same statement, so a caller holding the fold at that head needs no read.

        None means the beat must go through the log as a ``heartbeat`` command instead (which
        also says why a beat cannot be taken): there is no row for this token's lease yet (its
        first beat), the last beat is more than the row's ``quiet_us`` old (a silence ended) or
        later than now (a clock stepped back), ``attrs``
        differ from the last beat's, the last logged beat is ``mark_us`` old or more (the
        summary window), or the token does not prove the run's current lease. The refresh
        is committed without a sync: a crash may lose it, never tear the file.
        """
        return None

    def liveness(self, run_ids: Iterable[str]) -> dict[str, Liveness]:
        """The liveness rows of these runs (a run without one is left out). A row whose lease
        is not the run's current lease is stale: readers compare it with the head's."""
        return {}

    def state_at(self, run_id: str, aggregate: Aggregate[S], last_seq: int, last_hash: bytes) -> S | None:
        """The fold this store already holds for the run at exactly this head, or None; no I/O."""
        return None

    def put_liveness(self, live: Liveness, token: LeaseToken, *, one_more: bool = False) -> None:
        """Store a run's liveness after a beat the log recorded (or a claim), for the run's
        current lease only, whose ``token`` must prove it (else nothing is stored): never over a later lease's row. ``one_more`` (a logged beat, the
        lease's latest): its time is taken as it is and the count is the row's plus one for
        the same lease (``live.beats`` for another); otherwise the later beat and the larger
        count are kept. Committed without a sync."""

    @abc.abstractmethod
    def close(self) -> None: ...

    # --- values beside the log (ledger/sqlite/sqlite_values.py, ledger/postgres/postgres_values.py) ------
    #
    # Large state (a graph's channel values) is kept out of the events: each value is
    # stored once per run under its sha256, and the event that uses it records that
    # digest, which is how ``Ledger.verify`` proves the value is the one written. Values
    # are not part of the chain; deleting one is recorded as an event first
    # (``values_erased``), then done here. A backend without such a table refuses.

    #: True when ``put_values`` called inside a write of this store (an ``execute``'s
    #: decide) joins that write's transaction; False when it always commits on its own, so
    #: values are written before the event that names them.
    values_join_writes: ClassVar[bool] = False

    def put_values(self, run_id: str, values: dict[str, bytes]) -> int:
        """Store ``{sha256 hex: bytes}`` for the run, each written once (a digest already
        stored is left as it is); return how many were new. Never call it inside a
        ``read_transaction``."""
        raise self._no_values()

    def get_values(self, run_id: str, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored bytes of each digest the run has (a missing one is left out)."""
        raise self._no_values()

    def require_values(self, run_id: str, digests: Iterable[str]) -> None:
        """Refuse (``ValueNotStored``) unless each value is stored and no recorded
        ``values_erased`` event of the run names it. Called inside an ``execute``'s decide
        (as ``Ledger`` does for a graph checkpoint that continues a value), it is checked in
        that write's own transaction, so no erasure can come between the check and the write."""
        raise self._no_values()

    def delete_values(self, run_id: str, digests: Iterable[str]) -> int:
        """Delete the run's values with these digests that a recorded ``values_erased``
        event of the run names and no graph event after it names again (record first, then
        delete: a value is never deleted without a record); how many were deleted."""
        raise self._no_values()

    def value_digests(self, run_id: str) -> dict[str, str]:
        """Every value the run has: its digest as stored, and the sha256 of the bytes as
        they are now (the two differ for a value changed behind the store)."""
        raise self._no_values()

    def _no_values(self) -> InvalidInput:
        return InvalidInput(f"this ledger's store ({type(self).__name__}) keeps no values beside the log; "
                            "open a SQLite or PostgreSQL ledger", field="store")

    # --- ledger-wide settings (the handoff_meta table, rows named 'setting.NAME') ------
    #
    # What the person who runs the ledger decides for every writer of it (the delivery
    # targets the ledger may send to: handoff/delivery/allowed.py). Kept beside the log,
    # not in it: a setting is not a fact of any run. On PostgreSQL only the role that owns
    # the ledger may change one (the least-privilege roles read it).

    def setting(self, name: str) -> str | None:
        """The setting's value, or None when it was never set (or was unset); a store that
        keeps no settings has none set."""
        return None

    def put_setting(self, name: str, value: str | None) -> None:
        """Set the setting (None: unset it), in a write transaction of its own."""
        raise InvalidInput(f"this ledger's store ({type(self).__name__}) keeps no settings; open a SQLite or "
                           "PostgreSQL ledger", field="store")

    # --- what lets a copy or an outside anchor be checked (docs/reliability.md) -------

    @abc.abstractmethod
    def ledger_head(self) -> tuple[int, bytes]:
        """The last global position and the ledger-wide chain hash there (0 and the
        genesis hash when empty), read together."""

    @abc.abstractmethod
    def global_hash_at(self, position: int) -> bytes | None:
        """The ledger-wide chain hash stored at ``position``, or None when there is none."""

    @abc.abstractmethod
    def append_only_problems(self) -> list[Problem]:
        """What is missing or altered in the store's own refusal of UPDATE and DELETE."""

    @abc.abstractmethod
    def backup_to(self, path: str) -> tuple[int, bytes, int]:
        """Copy the whole ledger, as one consistent snapshot, into the new file ``path``
        (which the caller made in a private place); return the copy's last position,
        ledger-wide hash there, and run count."""

    # --- transactions and views for the layers above -------------------------------

    #: True when the store was opened for reading only: every write is refused.
    readonly: bool = False
    #: Where the ledger lives, as error messages name it (a file path for SQLite; a
    #: backend whose address holds a secret gives it here without the secret).
    path: str = ""
    #: True when this open created the ledger's schema (``handoff init`` reports it).
    created_schema: bool = False

    @abc.abstractmethod
    def write_transaction(self, doing: str) -> contextlib.AbstractContextManager[Transaction]:
        """Hold the write lock for the block: all of it commits, or (on an exception)
        none of it. ``doing`` names the work in error messages ("rebuilding projections")."""

    @abc.abstractmethod
    def read_transaction(self) -> contextlib.AbstractContextManager[Transaction]:
        """One consistent snapshot for the block; writes nothing."""

    @abc.abstractmethod
    def attach(self, aggregate: Aggregate[Any], hook: InlineHook) -> None:
        """Run ``hook(txn, run_id, state, last_position)`` inside every write that appends,
        with ``state`` the aggregate's fold after it. A failing hook rolls the write back.
        This is how inline projections stay in step with the log. What a hook does beyond
        that it declares itself (``Hook``); the backend reads the declaration."""

    @property
    @abc.abstractmethod
    def views(self) -> ViewStore:
        """This backend's view store (see ledger/view_tables.py)."""

    @abc.abstractmethod
    def verify(
        self, run_id: str | None = None, *, progress: Callable[[int, int], None] | None = None
    ) -> list[Problem]:
        """Walk the log (one run, or all of it) and report what is damaged; [] when sound."""

    @abc.abstractmethod
    def diagnostics(self) -> dict[str, Any]:
        """Facts for ``handoff doctor``: at least ``backend`` and ``backend_version``, then
        the backend's own settings (as JSON-ready values)."""

    # --- shared behaviour built on the primitives above --------------------------

    def history(self, run_id: str, *, until_seq: int | None = None) -> Iterator[Recorded]:
        """The run's events with a forked run's inherited prefix first.

        A child run begins with ``run_forked``; the parent's events up to the fork point
        are yielded before it, recursively, so a fold sees the whole lineage.
        """
        first = True
        for rec in self.read_run(run_id, until_seq=until_seq):
            if first and rec.type == "run_forked":
                fork = rec.event
                assert isinstance(fork, ev.RunForked)
                yield from self.history(fork.parent, until_seq=fork.parent_seq)
            first = False
            yield rec

    def fold(self, run_id: str, aggregate: Aggregate[S], *, until_seq: int | None = None) -> S:
        return aggregate.evolve_all(aggregate.initial(run_id), self.history(run_id, until_seq=until_seq))

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
