"""The Python API: every operation the CLI offers, as plain calls on one ``Ledger``.

This is the only place that joins the store, the reducers and the outside world (files
to measure, the clock for "now", environment defaults). The CLI is a thin shell over it.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

from handoff.ledger import anchor, files, portable
from handoff.ledger.files import check_path
from handoff.ledger import events as ev
from handoff.ledger.backends import open_store
from handoff.ledger.errors import (
    ClaimAlreadyMade, DamageFound, HeadAnchorBroken, HistoryRefused, InvalidInput, LedgerError, ResendRefused,
    SanitizationRequired, StaleLease, StoreUnavailable, TargetAppeared, UnknownRun,
)
from handoff.ledger.store import (
    Actor,
    AppendResult,
    Decision,
    EventStore,
    Head,
    LeaseToken,
    Recorded,
    WATCHER_PREFIX,
    check_run_id,
    check_idempotency_key,
    check_seq,
    check_utf8,
    new_lease_secret,
    value_digest,
)
from handoff.reducers import admit as admission
from handoff.reducers import commands as C
from handoff.reducers import stall
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint, iso, packet
from handoff.reducers.decide import Context, check_attrs, check_progress_kinds, decide
from handoff.projections import Projector, queries
from handoff.projections.engine import Progress

#: The policy defaults; their one home is ``ledger.events.Policy`` (a contract that omits a
#: field is stored, and decoded, with these).
POLICY = ev.Policy()

#: A sanitization check records at most this many findings (then one that counts the rest);
#: ``Ledger.sanitize`` returns them all.
MAX_RECORDED_FINDINGS = 200
#: A watcher beats at most this often (seconds); coverage allows three missed beats.
WATCHER_BEAT_PERIOD_S = 10.0
#: The times the API accepts (UTC µs since 1970): years 1 to 9999, what can be printed.
MIN_TIME_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_TIME_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
#: The longest lock wait the API accepts (seconds): a day.
MAX_BUSY_TIMEOUT_S = 86_400.0


# --- argument checks: every refusal an InvalidInput naming the field ------------------


def check_time_us(value: object, field: str) -> int:
    """A moment as whole UTC microseconds (not a bool) within years 1..9999."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_TIME_US <= value <= MAX_TIME_US:
        shown = repr(value)[:60]
        raise InvalidInput(
            f"{field} must be whole microseconds since 1970 (UTC) within years 1 to 9999, got {shown}",
            field=field,
        )
    return value


def check_seconds(value: object, field: str, *, low: float = 0.0, high: float = MAX_BUSY_TIMEOUT_S,
                  low_open: bool = False) -> float:
    """A finite number of seconds (not a bool) within bounds."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (low < value if low_open else low <= value) and value <= high)
    if not ok:
        shown = repr(value)[:60]
        above = "above" if low_open else "at least"
        raise InvalidInput(f"{field} must be a finite number of seconds {above} {low:g} and at most {high:g}, "
                           f"got {shown}", field=field)
    return float(value)  # type: ignore[arg-type]


def check_text(value: object, field: str, _depth: int = 0) -> None:
    """Every string in a command (its fields, their tuples, nested structs) must encode as
    UTF-8: a lone surrogate (invalid UTF-8 from argv, say) would otherwise pass decide and
    fail while the event is encoded. Types themselves are decide's business."""
    if isinstance(value, str):
        check_utf8(value, field)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            if isinstance(item, str):
                check_utf8(item, f"{field}[{i}]")
    elif isinstance(value, msgspec.Struct) and _depth < 3:
        for name in value.__struct_fields__:
            check_text(getattr(value, name), f"{field}.{name}" if field else name, _depth + 1)


def check_filter(value: object, field: str) -> str | None:
    """An optional text filter of a query (owner, state, ...): None, or UTF-8 text."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text, got {type(value).__name__}", field=field)
    return check_utf8(value, field)


def actor_filter(actors: tuple[str, ...] | list[str]) -> Callable[[str], bool]:
    """Whether a recorded actor (``kind:name``) is one of ``actors``: each given as
    ``kind:name``, or as a name alone (any kind). No actors: every actor matches."""
    exact = {a for a in actors if ":" in a}
    names = {a for a in actors if ":" not in a}
    if not actors:
        return lambda actor: True
    return lambda actor: actor in exact or actor.partition(":")[2] in names


class Preview(msgspec.Struct, frozen=True):
    """What a command would do (``Ledger.preview``): ``would_commit`` these events,
    ``unchanged`` (nothing to add), or ``duplicate`` (its key was already used for it)."""

    outcome: str
    events: tuple[ev.Event, ...]
    #: For ``duplicate``: what the earlier write under the key recorded.
    result: AppendResult | None = None


class _Decided(Exception):
    """Raised inside a preview's transaction once decide has answered: the store rolls it back."""

    def __init__(self, events: tuple[ev.Event, ...]) -> None:
        super().__init__("preview")
        self.events = events


class Outcome(msgspec.Struct, frozen=True):
    """What a command did: the append result and the run's checkpoint right after it."""

    result: AppendResult
    checkpoint: Checkpoint

    @property
    def duplicate(self) -> bool:
        """True when nothing new was written: a replayed idempotency key (outcome
        ``duplicate``) or a command with nothing to add (outcome ``unchanged``).

        Kept this broad on purpose, so code written as ``if not out.duplicate: send()``
        never acts twice; ``result.outcome`` tells the two cases apart."""
        return self.result.outcome != "committed"

    @property
    def unchanged(self) -> bool:
        """The command was accepted but had nothing to add (no idempotency key replayed)."""
        return self.result.outcome == "unchanged"


class Sent(msgspec.Struct, frozen=True):
    """What ``send_delivery`` came to: ``status`` confirmed, failed or unknown; ``sent``
    whether anything was sent by this call (false for a key already confirmed)."""

    status: str
    sent: bool
    receipt: str
    error: str
    tries: int
    checkpoint: Checkpoint


class Page(msgspec.Struct, frozen=True):
    """One page of a listing: its entries in listing order, the cursor to pass as
    ``after=`` for the next page (None when nothing follows) and how many entries follow."""

    items: tuple[Any, ...]
    next: str | None
    more: int


#: How many entries a listing page holds unless the caller says otherwise.
DEFAULT_PAGE = 100


def check_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise InvalidInput(f"limit must be a whole number from 1 to 1000000, got {repr(value)[:60]}", field="limit")
    return value


class Claimed(msgspec.Struct, frozen=True):
    """What a claim got: the lease token (shown this once, never stored) and the write."""

    token: LeaseToken
    outcome: Outcome


def lease_token(value: object, field: str = "lease") -> LeaseToken:
    """The lease token a worker passed, or InvalidInput (a bare lease number is not one)."""
    return LeaseToken.parse(value, field)


def now_us() -> int:
    return time.time_ns() // 1000


def new_run_id() -> str:
    import secrets  # imported when needed: CLI start-up time is what a shell agent pays per event

    return "run-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def keyed_id(prefix: str, *parts: object) -> str:
    """A run id derived from an idempotency key and what it is scoped to: the same key
    always names the same run, so a retried keyed ``open`` or ``fork`` finds its first
    attempt (and answers ``duplicate``) instead of creating a second run."""
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}{digest[:24]}"


#: The largest artifact the ledger reads unless told otherwise: 1 GiB. Hashing is about
#: 4 s per GiB here, and a file that big is rarely the evidence a reviewer wants.
ARTIFACT_MAX_BYTES = 1 << 30
#: The environment variable that sets another limit for every call that does not give one.
ARTIFACT_MAX_ENV = "HANDOFF_ARTIFACT_MAX_BYTES"
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object, field: str = "max_bytes") -> int:
    """A byte count: a whole number, or text such as ``1048576``, ``512K``, ``64M``, ``2G``
    (binary units: K is 1024 bytes; a trailing ``B``/``iB`` is allowed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("ib").removesuffix("b")
        unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
        digits = text[: len(text) - len(unit)].strip()
        if digits.isdigit() and digits.isascii():
            return int(digits) * _SIZE_UNITS[unit]
    shown = repr(value)[:60]
    raise InvalidInput(f"{field} must be a number of bytes such as 1048576, 512K, 64M or 2G, got {shown}",
                       field=field)


def artifact_max_bytes(value: object = None) -> int:
    """The artifact size limit: ``value`` if given, else $HANDOFF_ARTIFACT_MAX_BYTES, else 1 GiB."""
    if value is not None:
        return parse_size(value)
    env = os.environ.get(ARTIFACT_MAX_ENV)
    return ARTIFACT_MAX_BYTES if env is None or not env.strip() else parse_size(env, ARTIFACT_MAX_ENV)


def _human(n: int, *, exact: bool = False) -> str:
    """1073741824 -> '1 GiB', 1536 -> '1.5 KiB'; with ``exact``, a size no unit divides stays in bytes."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
        if n >= size and not exact:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _not_regular(path: str, mode: int) -> InvalidInput | None:
    """The refusal for anything but a regular file, naming what it is, or None."""
    if stat.S_ISREG(mode):
        return None
    return InvalidInput(f"artifact {path} is {files.file_kind(mode)}, not a regular file, and the ledger reads only regular files "
                        "(reading this could wait forever or mean nothing); write what it holds to a regular "
                        "file and record that file",
                        field="path", reason="not_regular")


def _changed(path: str, what: str) -> InvalidInput:
    return InvalidInput(f"artifact {path} {what}; nothing was recorded. Record it again once it is "
                        "finished and nothing is writing to it", field="path", reason="changed")


def measure(path: str, *, root: str | None = None, max_bytes: object = None) -> tuple[str, int, str, bool]:
    """(resolved path, size, sha256, exists) of an artifact, read by the ledger itself.

    Only a regular file is read, and only what it held when opened: the descriptor that is
    read is the one checked (opened without blocking and without following a last-moment
    symlink), at most the size it reported, and no more than ``max_bytes`` (default
    ``artifact_max_bytes()``). A file that grows, shrinks or changes while read, or yields
    more than its size said (kernel pseudo-files), is refused. With ``root``, a path that
    resolves outside it (``..``, symlinks) is refused. A path that does not exist is
    measured as missing (``exists`` false), which the run's packet shows.
    """
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidInput("artifact path must be a non-empty path without NUL bytes", field="path")
    limit = artifact_max_bytes(max_bytes)
    real = os.path.realpath(path)
    if root is not None:
        base = os.path.realpath(root)
        if os.path.commonpath([base, real]) != base:
            raise InvalidInput(
                f"artifact {path} resolves to {real}, outside the declared root {base}", field="path"
            )
    try:  # refuse a device or a FIFO before anything opens it (opening some has effects)
        st = os.stat(real)
    except FileNotFoundError:
        return real, 0, "", False
    except OSError as exc:
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    if (refusal := _not_regular(path, st.st_mode)) is not None:
        raise refusal
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        return real, 0, "", False
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink after it was resolved
            raise _changed(path, f"was replaced by a symbolic link at {real} while being recorded") from None
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    try:
        return (real, *_read_bounded(path, fd, limit), True)  # type: ignore[return-value]
    finally:
        os.close(fd)


def _read_bounded(path: str, fd: int, limit: int) -> tuple[int, str]:
    """Size and sha256 of what the open descriptor ``fd`` holds, checked and bounded."""
    st = os.fstat(fd)  # what was opened, not what the path named a moment before
    if (refusal := _not_regular(path, st.st_mode)) is not None:
        raise refusal
    if (pseudo := files.pseudo_root(path, st)) is not None:
        raise InvalidInput(f"artifact {path} is a kernel pseudo-file under {pseudo}: its reported size is not "
                           "its content and reading it can wait or change it; copy what you need into a "
                           "regular file and record that", field="path", reason="pseudo_file")
    if st.st_size > limit:
        raise InvalidInput(
            f"artifact {path} is {st.st_size} bytes ({_human(st.st_size)}), over the {_human(limit, exact=True)} limit on "
            f"what the ledger reads; record a smaller file (an excerpt, an archive's digest), or raise the "
            f"limit with --max-bytes, ${ARTIFACT_MAX_ENV} or max_bytes= in Python",
            field="path", reason="too_large", size=st.st_size, limit=limit,
        )
    h = hashlib.sha256()
    left = st.st_size
    try:
        while left > 0:
            chunk = os.read(fd, min(1 << 20, left))
            if not chunk:
                raise _changed(path, f"shrank while being read (it said {st.st_size} bytes)")
            h.update(chunk)
            left -= len(chunk)
        if os.read(fd, 1):
            raise _changed(path, f"held more than the {st.st_size} bytes its size said (it grew while "
                                 "being read, or its size is not its content)")
    except BlockingIOError:
        raise InvalidInput(f"artifact {path} has no data ready and reading it would wait; it is not a "
                           "finished regular file on disk: record a regular file", field="path",
                           reason="not_regular") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    after = os.fstat(fd)
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise _changed(path, "changed while being read")
    return st.st_size, h.hexdigest()


class Ledger:
    """A handoff ledger. Open it, issue commands, read packets.

    ``path`` names the ledger: a file path or ``:memory:`` (SQLite), or a URL such as
    ``sqlite:///abs/path?synchronous=NORMAL`` (see ledger/backends.py). ``store=`` hands
    it an already open store of any backend instead.

    >>> lg = Ledger("handoff.db")                                   # doctest: +SKIP
    >>> run = lg.open(goal="Draft the report", target="chat:#ops", owner="alice")
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = "handoff.db",
        *,
        synchronous: str | None = None,
        busy_timeout_s: float = 5.0,
        readonly: bool = False,
        create: bool = True,
        clock: Any = None,
        store: EventStore | None = None,
        group_commit: bool = False,
    ) -> None:
        self.clock = clock or now_us
        self._holders: dict[tuple[str, int], str] = {}
        given_clock = clock
        if store is not None:
            if not isinstance(store, EventStore):
                raise InvalidInput(f"store must be an EventStore, got {type(store).__name__}", field="store")
            self.store = store
        else:
            path = check_path(path)
            busy_timeout_s = check_seconds(busy_timeout_s, "busy_timeout")
            # ``synchronous`` is the SQLite backend's setting, kept here as a shorthand
            # for ``sqlite:///path?synchronous=...``; other backends refuse it.
            self.store = open_store(
                path, readonly=readonly, create=create, busy_timeout_s=busy_timeout_s,
                clock=given_clock, synchronous=synchronous,
            )
        if given_clock is None:
            # A store with a clock of its own (PostgreSQL: the server's) is the one clock
            # that stamps events and judges health; this host's wall clock is not asked.
            self.clock = self.store.clock if self.store.capabilities.own_clock else now_us
        try:
            self.projector = Projector(self.store)
            if group_commit:
                self._enable_group_commit()
        except BaseException:
            self.store.close()
            raise

    def _enable_group_commit(self) -> None:
        """Commands from this Ledger's threads share write transactions and fsyncs.

        A thread's ``execute`` waits for the commit of the group it joined, so an answer
        still means "on disk"; each command is still fenced, deduplicated and decided on its
        own (a refused one rolls back alone). Worth it with many threads writing through one
        Ledger; a single thread gains nothing. Offered by the SQLite backend."""
        self.store.enable_group_commit()

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the one write path ----------------------------------------------------------

    def execute(
        self, run_id: str, cmd: C.Command, *, actor: Actor, key: str | None = None,
        guard: Callable[[Checkpoint], bool] | None = None, token: str | None = None,
    ) -> Outcome:
        """Fold, decide and append in one write transaction; refusals write nothing.

        A worker's command that names a lease needs ``token``, that lease's token from
        ``claim``: the store checks it before anything else is decided. ``guard``, if
        given, sees the run's checkpoint inside that transaction first; when it returns
        False nothing is decided or written (the watchdog acts only on a run that still
        stands where it classified it) and the result is ``unchanged``.
        """
        token = self._token_for(run_id, cmd, actor, token)
        try:
            result, state = self.store.execute(
                run_id, AGGREGATE, self._decider(run_id, cmd, actor, guard), actor=actor, idempotency_key=key,
                digest_of=C.request_bytes(cmd) if key else None, lease=token,
            )
        except StaleLease as exc:
            # The store fences the token before the run is folded, so a token sent to a run
            # that does not exist reads "never issued"; say what every other verb says.
            if exc.details.get("why") == "never_issued" and self.store.head(run_id) is None:
                raise UnknownRun(f"no run {run_id} exists; open it first ('handoff open')") from None
            raise
        return Outcome(result, state)

    def _token_for(self, run_id: str, cmd: C.Command, actor: Actor, token: str | None) -> LeaseToken | None:
        """The checked token of a command's lease; a worker's leased command without one is refused."""
        check_run_id(run_id)
        if run_id.startswith(WATCHER_PREFIX):
            # A watcher's own stream holds its beats (append_stream); a run opened there
            # would make that watcher's every pass fail, switching it off.
            raise InvalidInput(f"run ids starting with {WATCHER_PREFIX!r} are the watchdogs' own streams; "
                               f"choose another id than {run_id[:80]!r}", field="run_id")
        check_text(cmd, "")
        number = getattr(cmd, "lease", None)
        if token is not None:
            token = lease_token(token, "token")
            if number is not None and number != token.lease:
                raise InvalidInput(
                    f"the command names lease {number} but the token is for lease {token.lease}; "
                    "pass the token's own lease", field="lease",
                )
            return token
        if actor.kind == "worker" and number is not None:
            raise StaleLease(
                f"a worker's write under lease {number} of run {run_id} must carry that lease's "
                "token (token=, what claim returned); a lease number alone proves nothing",
                run_id=run_id, lease=number, why="no_token",
            )
        return None

    def preview(
        self, run_id: str, cmd: C.Command, *, actor: Actor, key: str | None = None,
        guard: Callable[[Checkpoint], bool] | None = None, token: str | None = None,
    ) -> Preview:
        """What ``execute`` would do now, found by the same transaction, then rolled back.

        The key lookup, the token, the guard and decide all run as they would for real, so
        the answer is the one a real write would get at this moment; nothing is written.
        Refusals raise as they would from ``execute``. The write lock is held for the moment
        it takes.
        """
        token = self._token_for(run_id, cmd, actor, token)
        decider = self._decider(run_id, cmd, actor, guard)

        def _decide(cp: Checkpoint, head: Head | None) -> Decision:
            raise _Decided(decider(cp, head).events)

        try:
            result, _ = self.store.execute(run_id, AGGREGATE, _decide, actor=actor, idempotency_key=key,
                                           digest_of=C.request_bytes(cmd) if key else None, lease=token)
        except _Decided as d:
            return Preview("would_commit" if d.events else "unchanged", d.events)
        return Preview(result.outcome, (), result)  # a replayed key: answered before anything is decided

    def _decider(self, run_id: str, cmd: C.Command, actor: Actor,
                 guard: Callable[[Checkpoint], bool] | None) -> Callable[[Checkpoint, Head | None], Decision]:
        def _decide(cp: Checkpoint, head: Head | None) -> Decision:
            if guard is not None and not guard(cp):
                return Decision(())
            load = None
            parent = None
            if isinstance(cmd, C.Claim) and cp.opened:
                load = self._owner_load_locked(cp.owner, exclude=run_id)
            if isinstance(cmd, C.Fork):
                check_run_id(cmd.parent, "parent")
                if self.store.head(cmd.parent) is not None:
                    parent = self.store.fold(cmd.parent, AGGREGATE, until_seq=cmd.at_seq)
            events = decide(cp, cmd, Context(actor=actor, owner_load=load, parent=parent))
            lease = getattr(cmd, "lease", None) if actor.kind == "worker" else None
            return Decision(tuple(events), lease=lease)

        return _decide

    def append_stream(self, stream_id: str, events: Any, *, actor: Actor, key: str | None = None) -> AppendResult:
        """The second write path: events no rule decides, on a stream that is not a run.

        A watcher's liveness beats live in a stream of their own (``watcher:NAME``); no
        command folds them, so they do not go through ``decide``. They take the same
        write transaction as ``execute`` (inline projections, fencing, idempotency), and
        the stream is checked inside it: a handoff run's stream is refused, so nothing
        reaches a run's log without its rules.
        """
        check_run_id(stream_id)
        batch = tuple(events)
        for i, e in enumerate(batch):
            check_text(e, f"events[{i}]")

        def _decide(cp: Checkpoint, head: Head | None) -> Decision:
            if cp.opened:
                raise InvalidInput(
                    f"{stream_id} is a handoff run; write to it with its commands (Ledger.execute), "
                    "not append_stream", field="stream_id",
                )
            return Decision(batch)

        result, _ = self.store.execute(
            stream_id, AGGREGATE, _decide, actor=actor, idempotency_key=key,
            digest_of=b"".join(ev.encode(e) for e in batch) if key else None,
        )
        return result

    def _owner_load_locked(self, owner: str, *, exclude: str) -> int:
        # Read inside the claim's own write transaction, so two racing claims see each other.
        return queries.owner_load(self.store, owner, exclude=exclude)

    # --- verbs -------------------------------------------------------------------------

    def open(
        self, *, goal: str, target: str, owner: str, origin: str = "", run_id: str | None = None,
        result_path: str | None = None, stop_rules: tuple[str, ...] = (), require_review: bool = False,
        heartbeat_timeout_s: float = POLICY.heartbeat_timeout_s, progress_timeout_s: float = POLICY.progress_timeout_s,
        retry_budget: int = POLICY.retry_budget, delivery_timeout_s: float = POLICY.delivery_timeout_s,
        owner_cap: int = POLICY.owner_cap, key: str | None = None,
        actor: Actor | None = None, public: bool = False, sanitize_patterns: tuple[str, ...] = (),
        send: ev.SendPolicy | None = None, progress_kinds: Mapping[str, Any] | None = None,
    ) -> str:
        """Write a run's contract. ``public``: the target is visible to others, so delivery
        needs a passing sanitization check (``sanitize``); ``sanitize_patterns`` add the
        owner's own regular expressions to the built-in detectors; ``send`` sets how the
        ledger sends to an adapter target (``deliver(send=True)``, docs/delivery.md);
        ``progress_kinds`` declares kinds of the run's own that count as progress in a
        working state (``{"executing": ["llm_step"]}``), fixed from now on."""
        if run_id is None and key is not None:
            # The id follows from the key and the owner, so a retry cannot open a second run.
            check_idempotency_key(key)
            run_id = keyed_id("run-k", "open", owner, key)
        run_id = new_run_id() if run_id is None else run_id  # '' is refused, not replaced
        if isinstance(result_path, str) and result_path and "\x00" not in result_path:
            # Artifacts are recorded at their resolved path; submit compares the two.
            result_path = os.path.realpath(result_path)
        policy = ev.Policy(heartbeat_timeout_s, progress_timeout_s, retry_budget, delivery_timeout_s, owner_cap)
        cmd = C.Open(goal=goal, target=target, owner=owner, origin=origin, result_path=result_path,
                     stop_rules=tuple(stop_rules), require_review=require_review, policy=policy,
                     public=public, sanitize_patterns=tuple(sanitize_patterns), send=send or ev.SendPolicy(),
                     progress_kinds=check_progress_kinds(progress_kinds))
        self.execute(run_id, cmd, actor=actor or Actor("owner", owner if isinstance(owner, str) and owner else "?"), key=key)
        return run_id

    def open_contract(self, contract: Any, *, key: str | None = None) -> str:
        """Open a run from a contract given as JSON text, bytes, a dict or a HandoffContract.

        Every field is checked first (handoff.contract); the errors name each bad field.
        """
        from . import contract as hc

        c = contract if isinstance(contract, hc.HandoffContract) else hc.load(contract)
        p = c.policy
        return self.open(
            goal=c.goal, target=c.target, owner=c.owner, origin=c.origin, run_id=c.run_id,
            result_path=c.result_path, stop_rules=tuple(c.stop_rules), require_review=c.require_review,
            heartbeat_timeout_s=p.heartbeat_timeout_s, progress_timeout_s=p.progress_timeout_s,
            retry_budget=p.retry_budget, delivery_timeout_s=p.delivery_timeout_s, owner_cap=p.owner_cap,
            key=key, public=c.public, sanitize_patterns=tuple(c.sanitize_patterns),
            send=ev.SendPolicy(**c.send.model_dump()), progress_kinds=c.progress_kinds,
        )

    def claim(self, run_id: str, worker: str, *, key: str | None = None) -> LeaseToken:
        """Take the run's lease and return its token: ``"<lease>.<secret>"``, a ``str``.

        Every later write under the lease passes it (``lg.progress(run, token, ...)``);
        ``token.lease`` is the number status shows. Only a digest is stored, so this is the
        one time the token can be seen: a retried keyed claim cannot show it again and
        raises ClaimAlreadyMade instead (see ``claim_outcome``).
        """
        return self.claim_outcome(run_id, worker, key=key).token

    def lease(self, run_id: str, *, worker: str, token: str | None = None, heartbeat_s: float | None = None,
              fence_margin_s: float | None = None, on_lost: Callable[[Any], None] | None = None,
              key: str | None = None) -> Any:
        """A lease held in a block: ``with lg.lease(run, worker="agent-1") as lease:``
        claims (or adopts ``token``), heartbeats while the block runs, fences itself when
        no heartbeat can be recorded, and releases (or records why the work stopped) at
        its end. The block's verbs need no token (``handoff.lease.Lease``)."""
        from handoff.lease import Lease

        return Lease(self, run_id, worker=worker, token=token, heartbeat_s=heartbeat_s,
                     fence_margin_s=fence_margin_s, on_lost=on_lost, key=key)

    def claim_outcome(self, run_id: str, worker: str, *, key: str | None = None) -> Claimed:
        """``claim`` with the write it made (for the CLI's --json)."""
        secret, digest = new_lease_secret()
        cmd = C.Claim(worker=worker, token_digest=digest)
        out = self.execute(run_id, cmd, actor=Actor("worker", worker), key=key)
        if out.duplicate:
            raise self._claim_already_made(run_id, key, out)
        lease = out.checkpoint.lease
        assert lease is not None  # a committed claim ends with its own lease current
        return Claimed(LeaseToken(f"{lease}.{secret}"), out)

    def _claim_already_made(self, run_id: str, key: str | None, out: Outcome) -> ClaimAlreadyMade:
        """The refusal for a keyed claim that already happened: which lease it got, and what
        a caller without that lease's token can do now."""
        seq = out.result.first_seq
        first = next(iter(self.store.read_run(run_id, after_seq=seq - 1, until_seq=seq)))
        granted = first.event
        assert isinstance(granted, ev.LeaseGranted)
        n, cp = granted.lease, out.checkpoint
        said = (f"claim key {key!r} on run {run_id} was already used: that claim got lease {n} for "
                f"worker {granted.worker} (seq {seq}). Its token was printed once, to that claim, "
                "and is not stored, so it cannot be shown again. ")
        if cp.lease == n:
            state = "held"
            said += (f"Lease {n} is still held: if this worker kept the token, keep using it. "
                     "Without the token the lease can be neither used nor released: wait for the "
                     "watchdog to revoke it after its heartbeat timeout, or ask the owner to run "
                     f"'handoff revoke {run_id} --lease {n}', then claim with a new key")
        elif cp.lease is not None:
            state = "moved_on"
            said += (f"Lease {n} has ended and another claim holds the run now; this worker does "
                     "not hold it and must not write to it")
        else:
            state = "ended"
            said += (f"Lease {n} has ended and no lease is held now: claim again with a new key "
                     "to take the run")
        return ClaimAlreadyMade(said, run_id=run_id, lease=n, seq=seq, state=state)

    def worker_actor(self, run_id: str, lease: object = None, worker: str | None = None) -> Actor:
        """Who a worker's write is logged as; the one rule for the API and the CLI alike.

        ``worker`` when given, else $HANDOFF_WORKER, else the worker the lease was granted
        to (the current holder, or for an ended lease the name its grant recorded, so a
        keyed retry is the same request as the first attempt), else ``login_name()``. Only
        a name for the envelope: the write itself is proven by the token, not by this."""
        name = worker or os.environ.get("HANDOFF_WORKER") or self._lease_holder(run_id, lease)
        return Actor("worker", name or login_name())  # never "worker", which would log worker:worker

    def _lease_holder(self, run_id: str, lease: object) -> str | None:
        text = str(lease.lease if isinstance(lease, LeaseToken) else lease or "").partition(".")[0]
        if not text.isdigit():
            return None
        number = int(text)
        # A lease number names one grant of one run for good: its holder is looked up once
        # per process (a read before the write: a round trip on a server).
        known = self._holders.get((run_id, number))
        if known is not None:
            return known
        try:
            head = self.store.head(run_id)
        except LedgerError:  # a malformed run id: the write itself will say so
            return None
        if head is None:
            return None
        holder = None
        if head.lease_holder and head.lease == number:
            holder = head.lease_holder
        else:
            for rec in self.store.read_run(run_id):
                if rec.type == "lease_granted" and rec.event.lease == number:  # type: ignore[attr-defined]
                    holder = rec.event.worker  # type: ignore[attr-defined]
                    break
        if holder is not None:
            if len(self._holders) > 4096:
                self._holders.clear()
            self._holders[(run_id, number)] = holder
        return holder

    def _actor(self, run_id: str, token: LeaseToken | None, actor: Actor | None, by: str | None,
               worker: str | None = None) -> Actor:
        """A write that a worker (with its token) or a person (without) may make: an explicit
        ``actor``, else the lease's worker, else the operator ``by`` names."""
        if actor is not None:
            return actor
        if token is not None:
            return self.worker_actor(run_id, token, worker)
        return Actor("operator", operator_name(by))

    def _worker(self, worker: str | None, run_id: str = "", token: LeaseToken | None = None) -> Actor:
        return self.worker_actor(run_id, token, worker)

    # A worker's ``lease`` below is the token claim returned; a bare number is refused.

    # ``attrs``, where a record takes them: a few facts about the step (model, tokens in and
    # out, cost, tool, trace and span ids) as {name: text, number or bool}; the bounds are
    # reducers.decide.check_attrs'. They show in the log, the report and the export.

    def heartbeat(self, run_id: str, lease: str, *, worker: str | None = None,
                  attrs: Mapping[str, Any] | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Heartbeat(lease=t.lease, attrs=check_attrs(attrs)),
                            actor=self._worker(worker, run_id, t), token=t)

    def transition(self, run_id: str, lease: str, to: str, *, reason: str = "", worker: str | None = None, key: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Transition(lease=t.lease, to=to, reason=reason), actor=self._worker(worker, run_id, t),
                            key=key, token=t)

    def progress(self, run_id: str, lease: str, kind: str, detail: str = "", *, key: str | None = None, worker: str | None = None,
                 attrs: Mapping[str, Any] | None = None) -> Outcome:
        t = lease_token(lease)
        cmd = C.Progress(lease=t.lease, kind=kind, detail=detail, attrs=check_attrs(attrs))
        return self.execute(run_id, cmd, actor=self._worker(worker, run_id, t), key=key, token=t)

    def artifact(self, run_id: str, lease: str, path: str, *, kind: str = "result", root: str | None = None,
                 key: str | None = None, worker: str | None = None, max_bytes: int | str | None = None,
                 attrs: Mapping[str, Any] | None = None) -> Outcome:
        """Measure a file (``measure``: regular files only, at most ``max_bytes``) and record it."""
        t = lease_token(lease)
        checked = check_attrs(attrs)  # before the file is read: a refusal costs nothing
        real, size, sha, exists = measure(path, root=root, max_bytes=max_bytes)
        cmd = C.RecordArtifact(lease=t.lease, path=real, kind=kind, bytes=size, sha256=sha, exists=exists,
                               attrs=checked)
        return self.execute(run_id, cmd, actor=self._worker(worker, run_id, t), key=key, token=t)

    def withdraw_artifact(self, run_id: str, path: str, reason: str, *, lease: str | None = None,
                          actor: Actor | None = None, key: str | None = None, worker: str | None = None,
                          by: str | None = None) -> Outcome:
        """Take back a recorded artifact (a mistyped path, a superseded file) so it no longer
        counts for submit; the log keeps both records. ``path`` is matched as recorded, else
        resolved the way ``artifact`` resolved it. The file itself is not touched. With
        ``lease`` it acts as that lease's worker (``worker_actor``), else as ``actor`` or the
        operator ``by`` names (``operator_name``)."""
        check_run_id(run_id)
        cp = self.checkpoint(run_id) if self.store.head(run_id) is not None else None
        if cp is not None and isinstance(path, str) and path and "\x00" not in path:
            if path not in {a.path for a in cp.artifacts}:
                path = os.path.realpath(path)
        t = None if lease is None else lease_token(lease)
        actor = self._actor(run_id, t, actor, by, worker)
        cmd = C.WithdrawArtifact(path=path, reason=reason, lease=t and t.lease)
        return self.execute(run_id, cmd, actor=actor, key=key, token=t)

    def evidence(self, run_id: str, kind: str, outcome: str, detail: str = "", *, lease: str | None = None,
                 actor: Actor | None = None, key: str | None = None, by: str | None = None,
                 attrs: Mapping[str, Any] | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = self._actor(run_id, t, actor, by)
        cmd = C.RecordEvidence(kind=kind, outcome=outcome, detail=detail, lease=t and t.lease,  # type: ignore[arg-type]
                               attrs=check_attrs(attrs))
        return self.execute(run_id, cmd, actor=actor, key=key, token=t)

    def block(self, run_id: str, reason: str, next_action: str, *, lease: str | None = None,
              actor: Actor | None = None, key: str | None = None, by: str | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = self._actor(run_id, t, actor, by)
        return self.execute(run_id, C.Block(reason=reason, next_action=next_action, lease=t and t.lease),
                            actor=actor, key=key, token=t)

    def unblock(self, run_id: str, resolution: str, *, blocker_id: int | None = None, lease: str | None = None,
                actor: Actor | None = None, key: str | None = None, by: str | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = self._actor(run_id, t, actor, by)
        return self.execute(run_id, C.Unblock(resolution=resolution, blocker_id=blocker_id, lease=t and t.lease),
                            actor=actor, key=key, token=t)

    def effect_start(self, run_id: str, lease: str, key: str, what: str, *, worker: str | None = None,
                     attrs: Mapping[str, Any] | None = None) -> Outcome:
        t = lease_token(lease)
        cmd = C.StartEffect(lease=t.lease, key=key, what=what, attrs=check_attrs(attrs))
        return self.execute(run_id, cmd, actor=self._worker(worker, run_id, t), token=t)

    def effect_confirm(self, run_id: str, key: str, outcome: str, *, note: str = "", lease: str | None = None,
                       actor: Actor | None = None, by: str | None = None,
                       attrs: Mapping[str, Any] | None = None) -> Outcome:
        t = None if lease is None else lease_token(lease)
        actor = self._actor(run_id, t, actor, by)
        cmd = C.ConfirmEffect(key=key, outcome=outcome, note=note, lease=t and t.lease,  # type: ignore[arg-type]
                              attrs=check_attrs(attrs))
        return self.execute(run_id, cmd, actor=actor, token=t)

    def submit(self, run_id: str, lease: str, summary: str = "", *, worker: str | None = None, key: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Submit(lease=t.lease, summary=summary), actor=self._worker(worker, run_id, t), key=key, token=t)

    def review(self, run_id: str, by: str, approve: bool, notes: str = "", *, key: str | None = None) -> Outcome:
        return self.execute(run_id, C.ReviewResult(approve=approve, notes=notes), actor=Actor("owner", by), key=key)

    def transfer(self, run_id: str, action: str, to: str, *, by: str, key: str | None = None) -> Outcome:
        return self.execute(run_id, C.TransferAuthority(action=action, to=to), actor=Actor("owner", by), key=key)

    def deliver(self, run_id: str, by: str, key: str, *, send: bool = False, timeout_s: float | None = None,
                retries: int | None = None, env: Any = None) -> Any:
        """Record a delivery attempt under ``key``; retrying the same key sends nothing twice.

        Without ``send`` the owner sends the result itself and records the outcome with
        ``delivered`` or ``delivery_failed``; returns the write's ``Outcome``. With
        ``send=True`` the ledger sends it through the target's adapter (``send_delivery``)
        and returns a ``Sent``. A public target's attempt needs a passing ``sanitize``
        over exactly what is sent either way.
        """
        if send:
            return self.send_delivery(run_id, by, key, timeout_s=timeout_s, retries=retries, env=env)
        # No idempotency key on purpose: decide itself treats a retry of a pending or
        # confirmed attempt as a no-op and refuses a key that already failed.
        cp = self.checkpoint(run_id)
        digest = ""
        if cp.delivery.public and cp.delivery.confirmed_key is None:
            from handoff.delivery import bundle as db

            digest = db.build(cp).sha256  # the gate compares it with the last check
        return self.execute(run_id, C.Deliver(key=key, bundle_sha256=digest), actor=Actor("owner", by))

    def send_delivery(self, run_id: str, by: str, key: str, *, timeout_s: float | None = None,
                      retries: int | None = None, env: Any = None, sleep: Callable[[float], None] = time.sleep) -> Sent:
        """Send the result to the contract's target and record what happened, in that order:
        the attempt (before anything leaves), the send, then the confirmation with its
        receipt, the failure, or ``delivery_unanswered`` when the outcome cannot be known.

        A repeat under an open key sends again only to a target that honours keys (http(s)
        with ``Idempotency-Key``, ``file://``); to a ``cmd:`` target it is refused
        (``ResendRefused``): a person checks the target and records ``delivered`` or
        ``delivery_failed``. ``timeout_s`` and ``retries`` override the contract's ``send``
        settings; ``env`` (default ``os.environ``) is where a bearer token is read from.
        Everything that can be refused is refused before the attempt is recorded.
        """
        from handoff.delivery import adapters as da
        from handoff.delivery import bundle as db
        from handoff.reducers import delivery as dl

        cp = self.checkpoint(run_id)
        policy = cp.delivery.send
        if timeout_s is not None:
            timeout_s = check_seconds(timeout_s, "timeout", low=0.0, low_open=True)
        if retries is not None:
            retries = check_seq(retries, "retries", low=0, high=20)
        if cp.delivery.confirmed_key == key:
            return Sent("confirmed", False, cp.delivery.receipt or "", "", 0, cp)
        from handoff.delivery import allowed as al

        al.check(cp.target, self.allowed_targets(), run_id=run_id, whose="the ledger's list of allowed targets",
                 how="Allow it with 'handoff targets --allow TARGET' (Ledger.allow_targets), or deliver by "
                     "hand: 'handoff deliver' without --send, send it, then 'handoff delivered'",
                 see="'handoff targets' shows it (Ledger.allowed_targets)")
        adapter = da.adapter_for(cp.target, policy, timeout_s=timeout_s, env=env)
        bundle = db.build(cp)
        adapter.prepare(bundle, key, run_id)  # what the send could never carry: refused before the record
        honours = dl.honours_keys(cp.target)

        def refuse_resend(c: Checkpoint) -> None:
            a = c.delivery.attempt(key)
            if a is not None and a.open and not honours:
                raise ResendRefused(
                    f"delivery {key!r} of run {run_id} was already attempted and its outcome is not known; "
                    f"{cp.target.split(':', 1)[0]}: targets do not honour delivery keys, so sending again could "
                    "deliver twice. Check the target, then record 'handoff delivered' or 'handoff "
                    "delivery-failed'", key=key)

        refuse_resend(cp)
        from handoff.reducers.decide import authorize

        for record in (C.ConfirmDelivery(key=key, receipt="-"), C.FailDelivery(key=key, error="-"),
                       C.RecordUnanswered(key=key, reason="-")):
            authorize(cp, record, Actor("owner", by))  # it must be able to record what happens
        out = self.execute(run_id, C.Deliver(key=key, bundle_sha256=bundle.sha256), actor=Actor("owner", by))
        if out.result.outcome != "committed":
            if out.checkpoint.delivery.confirmed_key == key:
                return Sent("confirmed", False, out.checkpoint.delivery.receipt or "", "", 0, out.checkpoint)
            refuse_resend(out.checkpoint)
        result = adapter.send(bundle, key, run_id, retries=policy.retries if retries is None else retries,
                              backoff_s=policy.backoff_s, sleep=sleep)
        actor = Actor("owner", by)
        if result.outcome == "confirmed":
            out = self.execute(run_id, C.ConfirmDelivery(key=key, receipt=result.receipt), actor=actor)
        elif result.outcome == "failed":
            out = self.execute(run_id, C.FailDelivery(key=key, error=result.error), actor=actor)
        else:
            out = self.execute(run_id, C.RecordUnanswered(key=key, reason=result.error), actor=actor)
        return Sent(result.outcome, True, result.receipt, result.error, result.tries, out.checkpoint)

    def sanitize(self, run_id: str, by: str) -> dict[str, Any]:
        """Run the sanitization detectors over exactly what a delivery would send now and
        record the check (``sanitization_checked``) with the digests it read. A check with
        findings is recorded too (``passed`` false), naming detector, part and line, never
        the matched text. An artifact that cannot be read as recorded refuses the check
        (typed, nothing recorded): what cannot be read cannot pass.

        Returns ``{"run_id", "passed", "bundle_sha256", "items", "findings", "seq"}``.
        """
        from handoff.delivery import bundle as db
        from handoff.reducers import sanitize as sz

        cp = self.checkpoint(run_id)
        bundle = db.build(cp)
        try:
            findings = sz.scan(bundle.parts, cp.delivery.patterns)
        except Exception as exc:  # a detector that fails must not read as a pass
            raise SanitizationRequired(
                f"a sanitization detector failed on run {run_id} ({type(exc).__name__}); nothing was recorded "
                "and delivery to its public target stays refused") from None
        kept = findings
        if len(findings) > MAX_RECORDED_FINDINGS:  # the log keeps the first ones and a count of the rest
            rest = findings[MAX_RECORDED_FINDINGS:]
            kept = (*findings[:MAX_RECORDED_FINDINGS],
                    ev.Finding(sz.MORE, f"{len(rest)} more findings", 0, sum(f.count for f in rest)))
        cmd = C.Sanitize(passed=not findings, bundle_sha256=bundle.sha256, items=bundle.items, findings=kept,
                         rules_sha256=sz.rules_digest(cp.delivery.patterns))
        out = self.execute(run_id, cmd, actor=Actor("owner", by))
        return {"run_id": run_id, "passed": not findings, "bundle_sha256": bundle.sha256,
                "items": [msgspec.to_builtins(i) for i in bundle.items],
                "findings": [msgspec.to_builtins(f) for f in findings], "seq": out.result.last_seq}

    def delivered(self, run_id: str, key: str, receipt: str, *, by: str | None = None) -> Outcome:
        cp = self.checkpoint(run_id)
        return self.execute(run_id, C.ConfirmDelivery(key=key, receipt=receipt), actor=Actor("owner", by or cp.owner))

    def delivery_failed(self, run_id: str, key: str, error: str, *, by: str | None = None) -> Outcome:
        cp = self.checkpoint(run_id)
        return self.execute(run_id, C.FailDelivery(key=key, error=error), actor=Actor("owner", by or cp.owner))

    def release(self, run_id: str, lease: str, reason: str = "", *, worker: str | None = None,
                key: str | None = None) -> Outcome:
        t = lease_token(lease)
        return self.execute(run_id, C.Release(lease=t.lease, reason=reason), actor=self._worker(worker, run_id, t), token=t,
                            key=key)

    def revoke(self, run_id: str, reason: str, *, lease: int | None = None, actor: Actor | None = None,
               key: str | None = None, by: str | None = None) -> Outcome:
        """Take the lease away; logged as ``actor``, else as whom ``by`` names (``operator_name``):
        the run's owner when that is its name, else an operator."""
        if actor is None:
            name = operator_name(by)
            actor = Actor("owner" if name == self.checkpoint(run_id).owner else "operator", name)
        return self.execute(run_id, C.Revoke(reason=reason, lease=lease), actor=actor, key=key)

    def close_run(self, run_id: str, by: str, disposition: str, reason: str = "", *, as_operator: bool = False,
                  key: str | None = None) -> Outcome:
        actor = Actor("operator" if as_operator else "owner", by)
        return self.execute(run_id, C.Close(disposition=disposition, reason=reason), actor=actor, key=key)  # type: ignore[arg-type]

    def reopen(self, run_id: str, *, by: str, reason: str, as_operator: bool = False,
               key: str | None = None) -> Outcome:
        """Send a succeeded run whose latest sanitization check failed back to verifying.

        The gate refuses such a result for delivery, and after submit nobody else can change
        it (withdraw, reject, claim are refused); this is the owner's way forward: a worker
        then withdraws what the check found, records the result again and submits it, and
        the new result is checked again. Refused in any other case (docs/lifecycle.md)."""
        actor = Actor("operator" if as_operator else "owner", by)
        return self.execute(run_id, C.Reopen(reason=reason), actor=actor, key=key)

    def fork(self, run_id: str, at_seq: int, *, new_run_id: str | None = None, by: str | None = None,
             key: str | None = None, actor: Actor | None = None) -> str:
        """A child run continuing ``run_id`` at ``at_seq``; with ``key`` and no id, the
        child's id follows from the key, so a retried keyed fork makes one child. Logged as
        ``actor`` (the parent's owner may fork its own run), else the operator ``by`` names."""
        check_run_id(run_id)
        check_seq(at_seq, "at_seq", low=1)
        if new_run_id is not None:
            check_run_id(new_run_id, "new_run_id")
        import secrets

        if new_run_id is None and key is not None:
            check_idempotency_key(key)
            new_run_id = keyed_id(f"{run_id[:80]}.fork{at_seq}-k", "fork", run_id, at_seq, key)
        child = f"{run_id}.fork{at_seq}-{secrets.token_hex(2)}" if new_run_id is None else new_run_id
        actor = actor or Actor("operator", operator_name(by))
        self.execute(child, C.Fork(parent=run_id, at_seq=at_seq), actor=actor, key=key)
        return child

    def observe(self, run_id: str, watcher: str, classification: str, progress_seq: int, *, reason: str = "",
                interval_s: float = 0.0, key: str | None = None) -> Outcome:
        cmd = C.Observe(classification=classification, progress_seq=progress_seq, reason=reason, interval_s=interval_s)
        return self.execute(run_id, cmd, actor=Actor("watchdog", watcher), key=key)

    def recover(self, run_id: str, watcher: str, action: str, classification: str, progress_seq: int, *,
                reason: str = "", key: str | None = None, lease: int | None = None) -> Outcome:
        cmd = C.Recover(action=action, classification=classification, progress_seq=progress_seq,
                        reason=reason, lease=lease)
        return self.execute(run_id, cmd, actor=Actor("watchdog", watcher), key=key)

    # --- the delivery targets the ledger may send to (handoff/delivery/allowed.py) ------

    def allowed_targets(self) -> tuple[str, ...] | None:
        """The ledger's list of delivery targets a send may use (patterns: a target in full,
        or a prefix ending in ``*``), or None when no list is set and every adapter target
        may be sent to. Kept in the ledger itself, so every process and host that sends
        from this ledger follows it."""
        import json

        from handoff.delivery import allowed as al

        text = self.store.setting(al.SETTING)
        if text is None:
            return None
        try:
            patterns = json.loads(text)
            return al.check_patterns(patterns)
        except (ValueError, InvalidInput):
            # Unreadable (edited behind the store): refuse every send until it is set again.
            return ()

    def set_allowed_targets(self, patterns: Iterable[str] | None) -> tuple[str, ...] | None:
        """Replace the ledger's list of allowed delivery targets (``None`` lifts it: every
        adapter target may be sent to again; ``()`` lets no send through). Every pattern is
        checked first; a bad one changes nothing. Returns the list now in force."""
        import json

        from handoff.delivery import allowed as al

        checked = None if patterns is None else al.check_patterns(patterns)
        self.store.put_setting(al.SETTING, None if checked is None else json.dumps(list(checked)))
        return checked

    def allow_targets(self, *patterns: str) -> tuple[str, ...]:
        """Add patterns to the ledger's list of allowed delivery targets (starting one when
        none is set: from then on only what the list names is sent). Returns the list."""
        from handoff.delivery import allowed as al

        added = al.check_patterns(patterns)
        if not added:
            raise InvalidInput("name at least one target to allow", field="target")
        now = self.set_allowed_targets((*(self.allowed_targets() or ()), *added))
        assert now is not None
        return now

    def deny_targets(self, *patterns: str) -> tuple[str, ...]:
        """Remove patterns from the ledger's list (exactly as listed); a list left empty lets
        no send through. Refused (nothing changed) for a pattern the list does not hold."""
        current = self.allowed_targets()
        if not patterns:
            raise InvalidInput("name at least one target to remove from the list", field="target")
        missing = [p for p in patterns if current is None or p not in current]
        if missing:
            listed = "no list is set" if current is None else f"it holds {', '.join(map(repr, current)) or 'nothing'}"
            raise InvalidInput(f"{missing[0]!r:.200} is not on the ledger's list of allowed targets ({listed}); "
                               "remove a pattern exactly as 'handoff targets' lists it", field="target")
        assert current is not None
        now = self.set_allowed_targets(tuple(p for p in current if p not in patterns))
        assert now is not None
        return now

    # --- a graph framework's state, with its values beside the log ----------------------
    #
    # handoff.integrations.langgraph writes through these. A value is stored once per run
    # under its sha256 (EventStore.put_values) and the event names the digest, so the log
    # stays small while the state grows, and verify proves each value (handoff/values.py).

    def save_graph_checkpoint(
        self, run_id: str, *, thread_id: str, checkpoint_id: str, checkpoint: Mapping[str, Any],
        metadata: Mapping[str, Any], values: Mapping[str, str], new_values: Iterable[bytes] = (),
        namespace: str = "", parent_id: str = "", lease: str | None = None, actor: Actor | None = None,
        extends: Mapping[str, str] | None = None, bases: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Record a graph checkpoint (``graph_checkpoint_saved``): ``values`` maps each channel
        to the sha256 of its value; ``new_values`` are the values not stored yet (a channel
        whose version did not change names the value an earlier checkpoint stored).
        ``extends`` maps a channel whose stored value holds only the items appended since
        the parent checkpoint to the parent's version of that channel, and ``bases`` that
        channel to the sha256 of the stored value it continues. In the write's own
        transaction every value the checkpoint names without storing it, and every base,
        must be stored and not erased, or the write is refused (SeqConflict: re-read the
        run and store the value whole) and nothing is written. With
        ``lease`` (a token) it is that lease's worker's write, fenced; else ``actor`` (the
        run's owner when not given). Where the contract declares ``graph_step`` as progress,
        a checkpoint whose metadata says ``source: loop`` also records that progress."""
        t = None if lease is None else lease_token(lease)
        named = set(values.values()) if isinstance(values, Mapping) else set()
        blobs = self._new_values(new_values, named)
        cmd = C.SaveGraphCheckpoint(thread_id=thread_id, checkpoint_id=checkpoint_id, checkpoint=dict(checkpoint),
                                    metadata=dict(metadata), values=dict(values), namespace=namespace,
                                    parent_id=parent_id, lease=t and t.lease,
                                    extends=dict(extends) if extends else msgspec.UNSET)
        given = dict(bases) if isinstance(bases, Mapping) else {}

        def needed() -> set[str]:  # after decide has checked values and extends
            for channel in extends or {}:
                base = given.get(channel)
                if not isinstance(base, str) or len(base) != 64 or base.strip("0123456789abcdef"):
                    raise InvalidInput(f"extends names channel {str(channel)[:60]!r} but bases gives no sha256 of "
                                       "the stored value it continues; pass bases={channel: sha256}",
                                       field="bases")
            return {d for d in named if d not in blobs} | {given[ch] for ch in extends or {}}

        return self._with_values(run_id, cmd, blobs, t, actor, needed)

    def save_graph_writes(
        self, run_id: str, *, thread_id: str, checkpoint_id: str, task_id: str,
        writes: Iterable[tuple[int, str, bytes]], namespace: str = "", task_path: str = "",
        lease: str | None = None, actor: Actor | None = None,
    ) -> Outcome:
        """Record a graph task's writes against a saved checkpoint (``graph_writes_saved``):
        ``writes`` are (index, channel, value bytes); each value is stored under its sha256."""
        t = None if lease is None else lease_token(lease)
        blobs: dict[str, bytes] = {}
        items = []
        for i, w in enumerate(writes):
            if not (isinstance(w, tuple) and len(w) == 3 and isinstance(w[2], bytes)):
                raise InvalidInput(f"writes[{i}] must be (idx, channel, value bytes)", field="writes")
            digest = value_digest(w[2])
            blobs[digest] = w[2]
            items.append(ev.GraphWrite(idx=w[0], channel=w[1], sha256=digest))
        cmd = C.SaveGraphWrites(thread_id=thread_id, checkpoint_id=checkpoint_id, task_id=task_id,
                                writes=tuple(items), namespace=namespace, task_path=task_path, lease=t and t.lease)
        return self._with_values(run_id, cmd, blobs, t, actor)

    def erase_values(
        self, run_id: str, *, reason: str, values: Iterable[str] = (), checkpoints: Iterable[tuple[str, str]] = (),
        everything: bool = False, lease: str | None = None, actor: Actor | None = None,
        end_lease: int | None = None,
    ) -> Outcome:
        """Delete values kept beside the run's log, recording it first (``values_erased``):
        the digests, and the saved graph checkpoints (namespace, id) that go with them, or
        ``everything`` saved so far. The events that named the values stay; ``verify`` then
        reports the values as erased, naming this event. Accepted on an ended run too.

        While a worker holds the run's lease only a write under it (``lease``, its token)
        erases; the owner or an operator names the lease instead (``end_lease``, its
        number) to end it in the same write (``lease_revoked``), so the holder's next
        write is refused as stale. Anyone else gets LeaseHeld and nothing is erased."""
        t = None if lease is None else lease_token(lease)
        if end_lease is not None and t is not None:
            raise InvalidInput("pass lease (the holder's token, erasing under it) or end_lease (the owner ending "
                               "that lease), not both", field="end_lease")
        number = t.lease if t is not None else end_lease
        digests = tuple(dict.fromkeys(values))
        refs = tuple(ev.GraphRef(namespace=ns, checkpoint_id=cid) for ns, cid in checkpoints)
        cmd = C.EraseValues(reason=reason, values=digests, checkpoints=refs, everything=everything, lease=number)
        out = self.execute(run_id, cmd, actor=self._saver_actor(run_id, t, actor), token=t)
        if out.result.outcome == "committed" and digests:
            self.store.delete_values(run_id, digests)
        return out

    def values(self, run_id: str, digests: Iterable[str]) -> dict[str, bytes]:
        """The stored bytes of each digest the run keeps beside its log (missing ones left out)."""
        check_run_id(run_id)
        return self.store.get_values(run_id, digests)

    def _new_values(self, new_values: Iterable[bytes], named: set[str]) -> dict[str, bytes]:
        blobs: dict[str, bytes] = {}
        for i, v in enumerate(new_values):
            if not isinstance(v, bytes):
                raise InvalidInput(f"new_values[{i}] must be bytes, got {type(v).__name__}", field="new_values")
            digest = value_digest(v)
            if digest not in named:
                raise InvalidInput(f"new_values[{i}] (sha256 {digest[:16]}...) is named by no channel in values; "
                                   "store only the values the checkpoint names", field="new_values")
            blobs[digest] = v
        return blobs

    def _saver_actor(self, run_id: str, t: LeaseToken | None, actor: Actor | None) -> Actor:
        if t is not None:
            return self.worker_actor(run_id, t)
        if actor is not None:
            return actor
        return Actor("owner", self.checkpoint(run_id).owner or "?")

    def _with_values(self, run_id: str, cmd: C.Command, blobs: dict[str, bytes], t: LeaseToken | None,
                     actor: Actor | None, needed: Callable[[], set[str]] | None = None) -> Outcome:
        """The command's event and its values, written together where the store lets a put
        join the write (SQLite: one transaction, a refusal writes neither), else values first:
        a value nothing names yet is harmless (docs/langgraph.md, "Storage"). ``needed``
        gives the values the write needs stored already, checked in its transaction."""
        who = self._saver_actor(run_id, t, actor)
        if not blobs and needed is None:
            return self.execute(run_id, cmd, actor=who, token=t)
        if not self.store.values_join_writes:
            self._token_for(run_id, cmd, who, t)  # a malformed call stores nothing
            self.store.put_values(run_id, blobs)
            return self.execute(run_id, cmd, actor=who, token=t)
        token = self._token_for(run_id, cmd, who, t)
        decider = self._decider(run_id, cmd, who, None)
        store = self.store

        def _decide(cp: Checkpoint, head: Head | None) -> Decision:
            decision = decider(cp, head)
            if decision.events:  # inside this write's transaction
                if needed is not None:
                    store.require_values(run_id, needed())
                store.put_values(run_id, blobs)
            return decision

        result, state = store.execute(run_id, AGGREGATE, _decide, actor=who, lease=token)
        return Outcome(result, state)

    # --- reading -----------------------------------------------------------------------

    def checkpoint(self, run_id: str, *, at_seq: int | None = None, as_of_us: int | None = None) -> Checkpoint:
        check_run_id(run_id)
        if at_seq is not None:
            check_seq(at_seq, "at", low=1)
        if as_of_us is not None:
            check_time_us(as_of_us, "as_of")
        if self.store.head(run_id) is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}; list runs with 'handoff status'")
        if as_of_us is not None:
            at_seq = 0
            for rec in self.store.read_run(run_id):
                if rec.recorded_us > as_of_us:
                    break
                at_seq = rec.seq
            if at_seq == 0:
                raise InvalidInput(f"run {run_id} did not exist yet at that time", field="as_of")
        if at_seq is not None and at_seq < 1:
            raise InvalidInput("--at must be a seq of 1 or more", field="at")
        if at_seq is None:
            cp = queries.checkpoint(self.store, run_id)
            if cp is not None:
                return cp
        return self.store.fold(run_id, AGGREGATE, until_seq=at_seq)

    def watchers(self, *, until_us: int | None = None) -> dict[str, tuple[int, float]]:
        """Each watcher's last beat (µs) and beat period, from its own stream in the log.

        With ``until_us`` (replay), only beats recorded at or before that moment count, so
        a replayed packet never claims coverage by a watcher that started later.
        """
        out: dict[str, tuple[int, float]] = {}
        for head in self.store.list_runs(prefix=WATCHER_PREFIX):
            start = 0 if until_us is not None else head.last_seq - 1
            for rec in self.store.read_run(head.run_id, after_seq=start):
                if until_us is not None and rec.recorded_us > until_us:
                    break
                e = rec.event
                if isinstance(e, ev.WatchdogObserved):
                    out[e.watcher] = (rec.recorded_us, e.interval_s)
        return out

    def status(self, run_id: str, *, now: int | None = None, at_seq: int | None = None,
               as_of_us: int | None = None) -> dict[str, Any]:
        """The checkpoint packet (docs/cli.md documents its keys)."""
        if now is not None:
            check_time_us(now, "now")
        cp = self.checkpoint(run_id, at_seq=at_seq, as_of_us=as_of_us)
        when = now if now is not None else (as_of_us if as_of_us is not None else self.clock())
        if at_seq is not None and as_of_us is None and now is None:
            when = cp.last_event_us or when
        replaying = at_seq is not None or as_of_us is not None
        return packet(cp, now_us=when, watchers=self.watchers(until_us=when if replaying else None))

    def runs(self, *, include_terminal: bool = False, state: str | None = None,
             owner: str | None = None, target: str | None = None) -> Iterator[Checkpoint]:
        """Runs from the checkpoints view, oldest first (not terminal unless asked); read a
        page at a time, so memory does not grow with the number of runs."""
        for field, value in (("state", state), ("owner", owner), ("target", target)):
            check_filter(value, field)
        return queries.runs_after(self.store, None, states=() if state is None else (state,), owner=owner,
                                  target=target, include_terminal=include_terminal)

    # --- listings a page at a time (queries.py says how they are sorted) ---------------

    def _cursor(self, after: str | None, view: str = "checkpoints") -> queries.Cursor | None:
        if after is None:
            return None
        check_run_id(after, "after")
        cursor = queries.cursor_of(self.store, after, view)
        if cursor is None:
            raise InvalidInput(f"no run {after} in {self.store.path} to continue after; pass the run id an "
                               "earlier page gave as its next cursor ('next')", field="after")
        return cursor

    def iter_runs(self, *, after: str | None = None, include_terminal: bool = False,
                  states: tuple[str, ...] = (), owner: str | None = None,
                  target: str | None = None, worker: str | None = None, health: tuple[str, ...] = (),
                  opened_after: int | None = None, opened_before: int | None = None,
                  now: int | None = None) -> Iterator[Checkpoint]:
        """Every run matching the filters, oldest first (in the order the ledger first recorded
        them), strictly after the run ``after``. Terminal runs only with
        ``include_terminal`` or when a terminal state is asked for by name.

        ``states``, ``owner``, ``target`` and ``worker`` (the current lease holder) are
        columns of the checkpoints view: the view store filters them (SQL on both
        backends). ``health`` (classifications, judged at ``now``, default the clock) and
        ``opened_after``/``opened_before`` (UTC µs, inclusive) are judged run by run as the
        pages stream past, so memory stays flat either way."""
        states = _texts(states, "states")
        health = _texts(health, "health")
        unknown = [h for h in health if h not in stall.CLASSIFICATIONS]
        if unknown:
            raise InvalidInput(f"no health {unknown[0]!r}; it is one of: {', '.join(sorted(stall.CLASSIFICATIONS))}",
                               field="health")
        for field, value in (("owner", owner), ("target", target), ("worker", worker)):
            check_filter(value, field)
        for field, value in (("opened_after", opened_after), ("opened_before", opened_before)):
            if value is not None:
                check_time_us(value, field)
        from handoff.reducers.transitions import TERMINAL

        include_terminal = bool(include_terminal) or any(s in TERMINAL for s in states)
        rows = queries.runs_after(self.store, self._cursor(after), include_terminal=include_terminal,
                                  states=states, owner=owner, target=target, worker=worker)
        if not health and opened_after is None and opened_before is None:
            return rows
        when = check_time_us(now, "now") if now is not None else self.clock()
        low = opened_after if opened_after is not None else MIN_TIME_US
        high = opened_before if opened_before is not None else MAX_TIME_US
        return (cp for cp in rows if cp.opened_us is not None and low <= cp.opened_us <= high
                and (not health or stall.classify(cp, now_us=when).classification in health))

    def runs_page(self, *, limit: int = DEFAULT_PAGE, after: str | None = None, include_terminal: bool = False,
                  states: tuple[str, ...] = (), owner: str | None = None, target: str | None = None,
                  worker: str | None = None, health: tuple[str, ...] = (), opened_after: int | None = None,
                  opened_before: int | None = None, now: int | None = None) -> Page:
        """One page of ``iter_runs`` (the same filters): at most ``limit`` runs, ``next`` to
        continue, ``more`` left. ``handoff runs`` and ``handoff status`` list these."""
        check_limit(limit)
        judged = bool(health) or opened_after is not None or opened_before is not None
        if judged and now is None:
            now = self.clock()  # one moment for the page and for the count of what is left
        stream = self.iter_runs(after=after, include_terminal=include_terminal, states=states, owner=owner,
                                target=target, worker=worker, health=health, opened_after=opened_after,
                                opened_before=opened_before, now=now)
        items = tuple(itertools.islice(stream, limit))
        if len(items) < limit:
            return Page(items, None, 0)
        last = items[-1].run_id
        if judged:
            more = sum(1 for _ in stream)  # judged run by run: counted as they pass, not kept
        else:
            from handoff.reducers.transitions import TERMINAL

            more = queries.count_runs_after(
                self.store, queries.cursor_of(self.store, last), states=tuple(states), owner=owner, target=target,
                worker=worker, include_terminal=bool(include_terminal) or any(s in TERMINAL for s in states))
        return Page(items, last if more else None, more)

    def run_ids(self, prefix: str = "", *, limit: int = 50) -> list[str]:
        """At most ``limit`` run ids beginning with ``prefix``, in id order (what shell
        completion offers): one range scan of an index, whatever the size of the ledger."""
        if not isinstance(prefix, str):
            raise InvalidInput("prefix must be text", field="prefix")
        check_limit(limit)
        return queries.run_ids_starting(self.store, prefix, limit)

    def iter_stalls(self, *, now: int | None = None, after: str | None = None
                    ) -> Iterator[tuple[Checkpoint, stall.Health]]:
        """Every run that needs attention at ``now``, in listing order, after the run ``after``."""
        when = check_time_us(now, "now") if now is not None else self.clock()
        cursor = self._cursor(after, "stall_watch")  # checked here, not at next()
        if self.projector.current:
            return queries.judged_after(self.store, when, cursor)
        due = queries.due_after(self.store, when, cursor)  # views of an older version, read-only
        return ((cp, h) for cp in due if (h := stall.classify(cp, now_us=when)).needs_attention)

    def stalls_page(self, *, limit: int = DEFAULT_PAGE, after: str | None = None, now: int | None = None) -> Page:
        """One page of ``iter_stalls`` (pairs of checkpoint and health), judged at one ``now``."""
        check_limit(limit)
        when = check_time_us(now, "now") if now is not None else self.clock()
        stream = self.iter_stalls(now=when, after=after)
        items = tuple(itertools.islice(stream, limit))
        more = sum(1 for _ in stream)  # the rest, judged at the same moment; counted, not kept
        return Page(items, items[-1][0].run_id if more else None, more)

    def stalls(self, *, now: int | None = None) -> list[tuple[Checkpoint, stall.Health]]:
        """Every run that needs attention at ``now``: a range scan of the stall index, each due
        run judged from its stall view row. A run judged from its row alone comes as a
        ``queries.DueRun``: run_id, state, lease and worker from the row, any other Checkpoint
        attribute read and decoded on first use (docs/python-api.md), so possibly newer than
        the verdict: to act on a verdict, check the run as it then stands with
        ``DueRun.still_as_judged`` (the watchdog does)."""
        when = check_time_us(now, "now") if now is not None else self.clock()
        if self.projector.current:
            return queries.judge_due(self.store, queries.due_signals(self.store, when), when)
        out = []
        for cp in queries.stall_candidates(self.store, when):
            h = stall.classify(cp, now_us=when)
            if h.needs_attention:
                out.append((cp, h))
        return out

    def owner_load(self, owner: str) -> int:
        check_filter(owner, "owner")
        return queries.owner_load(self.store, owner)

    def deliveries(self, *, status: str | None = None, now: int | None = None) -> list[dict[str, Any]]:
        check_filter(status, "status")
        when = check_time_us(now, "now") if now is not None else self.clock()
        return queries.deliveries(self.store, now_us=when, status=status)

    def rebuild(self, name: str | None = None, *, progress: Any = None) -> dict[str, int]:
        """Drop and refold one projection (or all) from the log; atomic, memory flat."""
        return self.projector.rebuild(None if name is None else [name], progress=progress)

    def check(self, name: str | None = None, *, progress: Any = None) -> list[dict[str, Any]]:
        """Differences between the kept projections and a fresh fold of the log."""
        return self.projector.check(None if name is None else [name], progress=progress)

    def watcher_beat(self, watcher: str, interval_s: float) -> AppendResult | None:
        """Record that a watcher is alive and how often it beats, in its own stream.

        ``status`` reads these beats to say truthfully whether any watcher covers a run. A
        beat is written at most every ``WATCHER_BEAT_PERIOD_S`` (or every interval, if
        longer), so a watchdog polling every few seconds adds a few thousand small events a
        day, not tens of thousands; the recorded period is what coverage is judged by.
        Returns None when no beat was due.
        """
        if not isinstance(watcher, str):
            raise InvalidInput(f"watcher must be text, got {type(watcher).__name__}", field="watcher")
        run_id = WATCHER_PREFIX + watcher
        check_run_id(run_id, "watcher")
        period = max(check_seconds(interval_s, "interval", high=1e7, low_open=True), WATCHER_BEAT_PERIOD_S)
        head = self.store.head(run_id)
        if head is not None:
            last = next(iter(self.store.read_run(run_id, after_seq=head.last_seq - 1)))
            prev = last.event
            fresh = (self.clock() - last.recorded_us) / 1e6 < period / 2
            if fresh and isinstance(prev, ev.WatchdogObserved) and prev.interval_s == period:
                return None
        beat = ev.WatchdogObserved(watcher=watcher, classification="alive", progress_seq=0, interval_s=period)
        return self.append_stream(run_id, [beat], actor=Actor("watchdog", watcher))

    def verify(self, run_id: str | None = None, *, progress: Any = None,
               expect_head: str | list[str] | tuple[str, ...] | None = None) -> list[Any]:
        """Hash chain, seq gaps, decodability and heads; an empty list means all is well.

        The ledger-wide checks (global chain, holes in positions, append-only triggers)
        run with ``run_id`` too. ``expect_head``: head digests kept from ``head()``; each
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
        """The values beside the log against the events that name them (handoff/values.py)."""
        from handoff import values

        records = self.store.read_run(run_id) if run_id is not None else self.store.read_all()
        return values.check(self.store, records)

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

    def export(self, run_ids: list[str] | None = None, *, progress: Progress = None) -> Iterator[bytes]:
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
            yield portable.to_line(rec, digest, size, roles.get(rec.position))

    # --- copies and head digests (docs/reliability.md, "Copies and anchors") ----------

    def copy_mode(self) -> int:
        """The permission bits every copy of this ledger gets: the ledger file's own read
        and write bits, or 0600 when there is no file."""
        return files.copy_mode(None if self.store.path == ":memory:" else self.store.path)

    def _not_the_ledger(self, target: str, given: object, field: str, verb: str) -> None:
        """Refuse to write a copy over the ledger itself or one of the files SQLite keeps
        beside it (-wal, -shm, -journal): replacing the WAL silently drops every commit
        still in it."""
        src = self.store.path
        if not src or src == ":memory:" or "://" in src:
            return
        base = os.path.abspath(src)
        names = {base, *(base + x for x in _SIDE)}
        same = target in names or any(
            os.path.exists(n) and os.path.exists(target) and os.path.samefile(n, target) for n in names)
        if same:
            raise InvalidInput(f"{field}: {given} is the ledger itself or one of its files ({os.path.basename(base)}, "
                               f"its -wal, -shm or -journal); {verb} to another name", field=field)

    def export_redacted(self, run_ids: list[str] | None = None, *, salt: bytes | None = None,
                        fields: Any = (), progress: Progress = None) -> Iterator[bytes]:
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
                  salt: bytes | None = None, fields: Any = (), progress: Progress = None) -> dict[str, Any]:
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
                      fields: Any = (), progress: Progress = None) -> dict[str, Any]:
        """Write, or extend with what is new, a readable SQLite copy of the whole ledger at
        ``path``: plain tables (runs, events, leases, artifacts, deliveries) an analyst's SQL
        tool opens; ``redact`` shows only what the redacted JSON Lines export shows. See
        handoff/readable.py and docs/readable-copy.md. Returns ``{"output", "events",
        "runs", "last_position", "redacted"}``."""
        from handoff import readable

        return readable.export_sqlite(self, path, redact=redact, salt=salt, fields=fields, progress=progress)

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
        src = self.store.path
        if os.path.exists(target):
            if not replace:
                raise InvalidInput(f"dest: {dest} already exists; pass --replace (replace=True) to "
                                   "overwrite it, or name a new file", field="dest")
            head = _read_small(target, 16, "dest")
            if head and head != b"SQLite format 3\x00":
                raise InvalidInput(f"dest: {dest} exists and is not an SQLite database; --replace only "
                                   "overwrites an earlier backup. Name a new file", field="dest")
        live = [target + x for x in _SIDE if os.path.lexists(target + x)]
        if live:
            raise InvalidInput(
                f"dest: {live[0]} exists beside {dest}, so that name belongs to a database in use "
                "(or one that was not closed cleanly), whose leftover journal SQLite would apply to "
                "the copy. Choose another name",
                field="dest",
            )
        with files.private_dir(target) as d:
            tmp = os.path.join(d, "backup.db")
            position, ghash, runs = self.store.backup_to(tmp)
            try:
                os.chmod(tmp, self.copy_mode())
                files.fsync_file(tmp)
                size = os.stat(tmp).st_size
            except OSError as exc:
                raise files._failed(target, exc) from exc
            if not replace and os.path.lexists(target):
                raise InvalidInput(f"dest: {dest} appeared while the backup was taken; nothing was "
                                   "replaced. Name a new file", field="dest")
            files.place(tmp, target, "dest")
        return {"path": target, "positions": position, "head": anchor.format_digest(position, ghash),
                "bytes": size, "runs": runs}

    def head(self) -> dict[str, Any]:
        """Where the ledger ends: ``{"digest", "position", "global_hash"}``.

        Keep ``digest`` somewhere the ledger's writers cannot change; ``verify(expect_head=
        digest)`` later proves the ledger still holds everything up to it."""
        position, ghash = self.store.ledger_head()
        return {"digest": anchor.format_digest(position, ghash), "position": position,
                "global_hash": ghash.hex()}

    def head_digest(self) -> str:
        return self.head()["digest"]

    def check_anchor(self, digest: str, *, field: str = "expect_head") -> Any:
        """The problem between a kept head digest and the ledger now, or None."""
        position, ghash = anchor.parse_digest(digest, field)
        return anchor.anchor_problem(self.store, position, ghash)

    def write_head(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Record the head digest in ``path`` (one line, replaced atomically, ledger's mode).

        The digest already in the file must still hold first: a ledger whose tail was cut
        since the last record is refused (``HeadAnchorBroken``, exit 4) and the file is
        left as it was, so a scheduled job cannot launder a truncation into a new anchor.
        Returns ``head()`` plus ``"path"`` and ``"previous"`` (the digest replaced, or None).
        """
        target = files.check_target(path, "path")
        self._not_the_ledger(target, path, "path", "write the head digest")
        previous = None
        if os.path.exists(target):
            raw = _read_small(target, 4097, "path")
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
        doc = self.head()
        files.atomic_write(target, [doc["digest"].encode() + b"\n"], mode=self.copy_mode(), field="path")
        return {**doc, "path": target, "previous": previous}

    def import_lines(self, lines: Any, *, progress: Progress = None) -> dict[str, int]:
        """Import an export: all of it, or nothing of it.

        Every line's hash chain is verified, and every new event is admitted only if a live
        command could have written it at that point (``reducers.admit``: the command is
        decided again against the run's fold, fenced on the lease, and its actor, time and
        size checked). ``lines``: a file object (binary or text; read in bounded chunks, a
        line longer than any event the store accepts is refused) or an iterable of lines.
        Lines are read and inserted as they come, inside one write transaction, so memory
        stays flat in the size of the file. A refusal names the line and leaves the ledger
        as it was. Importing the same export twice changes nothing.

        ``progress(done, total)`` is called every thousand lines when ``lines`` is a file
        that can be read twice (a regular file: its lines are counted first); from a pipe,
        where the total cannot be known, it is not called.
        """
        where = {"line": 0}
        pending: dict[str, admission.Pending] = {}
        total = _count_lines(lines) if progress is not None else None

        def items() -> Iterator[tuple[Recorded, bytes | None, int]]:
            for lineno, rec, digest, size in portable.parse_lines(lines, self.store.max_payload):
                where["line"] = lineno
                if total and lineno % 1000 == 0:
                    progress(lineno, total)  # type: ignore[misc]
                yield rec, digest, size

        def admit(cp: Checkpoint, rec: Recorded, event: ev.Event) -> None:
            parent = None
            if isinstance(event, ev.RunForked):
                parent = self.store.fold(event.parent, AGGREGATE, until_seq=event.parent_seq)
            elif not cp.opened and rec.run_id.startswith(WATCHER_PREFIX) and not isinstance(event, ev.HandoffOpened):
                _admit_watcher_beat(rec, event)
                return
            owed = admission.admit(cp, pending.pop(rec.run_id, None), seq=rec.seq, actor=rec.actor,
                                   lease=rec.lease, recorded_us=rec.recorded_us, event=event, parent=parent)
            if owed is not None:
                pending[rec.run_id] = owed

        def complete() -> None:
            for run_id, owed in pending.items():
                where["line"] = 0
                raise HistoryRefused(
                    f"run {run_id} ends in the middle of a command: the one that wrote seq {owed.seq} "
                    f"also writes {ev.tag_of(owed.events[0])}, which the file does not have; it was cut",
                    run_id=run_id,
                )

        try:
            return self.store.import_records(items(), aggregate=AGGREGATE, admit=admit, before_commit=complete)
        except LedgerError as exc:
            if where["line"] and not exc.message.startswith("line "):
                exc.message = f"line {where['line']}: {exc.message}"
                exc.args = (exc.message,)
            raise

    def doctor(self) -> dict[str, Any]:
        """Facts about the ledger and the backend underneath, for support and audits:
        the store's ``diagnostics()`` (backend, version, settings), then the counts."""
        return {
            **self.store.diagnostics(),
            **self.store.counts(),
            "projections": self.projector.positions(),
            "problems": [msgspec.to_builtins(p) for p in self.store.append_only_problems()],
        }

    def written(self, out: Outcome) -> list[Recorded]:
        """The events a write stands for: the ones it wrote, or for a replayed key the ones
        the first attempt wrote; empty when it wrote nothing (``unchanged``)."""
        r = out.result
        if r.outcome == "unchanged":  # (a committed write's positions can still be on their way)
            return []
        return list(self.store.read_run(r.run_id, after_seq=r.first_seq - 1, until_seq=r.last_seq))

    def log(self, run_id: str, *, after_seq: int = 0) -> Iterator[Recorded]:
        """The run's events after ``after_seq``, oldest first, read a page at a time."""
        check_run_id(run_id)
        if self.store.head(run_id) is None:
            raise UnknownRun(f"no run {run_id} in {self.store.path}")
        return self.store.read_run(run_id, after_seq=after_seq)

    # --- incident reconstruction: the report, reading across runs, diff ----------------

    def report(self, run_id: str, *, at_seq: int | None = None, as_of_us: int | None = None,
               progress: Progress = None) -> Any:
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
                     progress: Progress = None) -> dict[str, Any]:
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

    def events(
        self, *, since_position: int | None = None, until_position: int | None = None,
        since_us: int | None = None, until_us: int | None = None, types: tuple[str, ...] = (),
        actors: tuple[str, ...] = (), runs: tuple[str, ...] = (), follow: bool = False, poll_s: float = 0.5,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[Recorded]:
        """Events across the ledger in position order, filtered; read a page at a time, so
        memory stays flat whatever the size of the log. Bounds are inclusive. An actor
        filter is ``kind:name``, or a name alone (any kind). ``runs`` reads only those
        streams (merged by position). With ``follow``, waits for new events (woken by the
        store's ``wait_for_events``, asking ``should_stop`` at least every ``poll_s``) until
        ``should_stop()`` is true or ``until_position`` is passed."""
        for field, value in (("since", since_position), ("until", until_position)):
            if value is not None:
                check_seq(value, field)
        for field, value in (("since", since_us), ("until", until_us)):
            if value is not None:
                check_time_us(value, field)
        for group, values in (("type", types), ("actor", actors), ("run", runs)):
            if not isinstance(values, (tuple, list)):
                raise InvalidInput(f"{group} filters must be a tuple or list of text, got {type(values).__name__}",
                                   field=group)
            for value in values:
                check_filter(value, group)
        for r in runs:
            check_run_id(r, "run")
            if self.store.head(r) is None:
                raise UnknownRun(f"no run {r} in {self.store.path}; list runs with 'handoff status --all'")
        unknown = [t for t in types if t not in ev.EVENT_TYPES]
        if unknown:
            raise InvalidInput(f"no event type {unknown[0]!r}; the types are: {', '.join(sorted(ev.EVENT_TYPES))}",
                               field="type")
        check_seconds(poll_s, "poll_s", low=0.01, high=3600)
        by = actor_filter(actors)

        def wanted(rec: Recorded) -> bool:
            return ((not types or rec.type in types)
                    and by(rec.actor)
                    and (since_us is None or rec.recorded_us >= since_us)
                    and (until_us is None or rec.recorded_us <= until_us))

        after = (since_position - 1) if since_position else 0
        return self._events(after, until_position, runs, wanted, follow, poll_s, should_stop)

    def _events(self, after: int, until: int | None, runs: tuple[str, ...], wanted: Callable[[Recorded], bool],
                follow: bool, poll_s: float, should_stop: Callable[[], bool] | None) -> Iterator[Recorded]:
        import heapq

        seen = dict.fromkeys(runs, 0)  # with --run: the last seq read of each stream
        while True:
            if runs:
                streams = [(r for r in self.store.read_run(run, after_seq=last) if r.position > after)
                           for run, last in seen.items()]
                source: Iterator[Recorded] = heapq.merge(*streams, key=lambda r: r.position)
            else:
                source = self.store.read_all(after_position=after, until_position=until)
            for rec in source:
                if until is not None and rec.position > until:
                    return
                after = rec.position
                if runs:
                    seen[rec.run_id] = rec.seq
                if wanted(rec):
                    yield rec
            if not follow or (until is not None and after >= until) or (should_stop is not None and should_stop()):
                return
            # Sleep until the log grows (LISTEN/NOTIFY on PostgreSQL, a short poll on
            # SQLite), at most poll_s, so should_stop is asked that often.
            self.store.wait_for_events(after, poll_s)
            if should_stop is not None and should_stop():
                return

    def db_role_of(self) -> Callable[[int], str | None]:
        """A lookup, position -> the database role that inserted the event there, reading
        the store a thousand positions at a time (None where the backend records no role:
        SQLite, whose actors are self-declared)."""
        if not self.store.records_roles:
            return lambda position: None
        cache: dict[int, str] = {}

        def role(position: int) -> str | None:
            if position not in cache:
                if len(cache) > 100_000:
                    cache.clear()
                cache.update(self.store.db_roles(position, position + 999))
            return cache.get(position)

        return role

    def terminal_count(self, *, owner: str | None = None) -> int:
        """How many runs have ended: what a listing of live runs leaves out."""
        check_filter(owner, "owner")
        return queries.count_terminal(self.store, owner=owner)

    def diff(self, run_a: str, run_b: str) -> dict[str, Any]:
        """Align two runs' histories and name the first divergence, then what differs after
        it (``reducers.diff.compare``; its keys are ``handoff diff --json``'s)."""
        from handoff.reducers import diff

        for field, run in (("run_a", run_a), ("run_b", run_b)):
            check_run_id(run, field)
            if self.store.head(run) is None:
                raise UnknownRun(f"no run {run} in {self.store.path}; list runs with 'handoff status --all'")
        return diff.compare(self.store.history(run_a), self.store.history(run_b), run_a, run_b)

# --- creating a ledger -------------------------------------------------------------------


def init_ledger(path: str | os.PathLike[str], *, busy_timeout_s: float = 5.0) -> dict[str, Any]:
    """Create an empty ledger at ``path`` (any address ``Ledger`` takes), or confirm the one
    there; returns ``{"db", "created", "runs"}`` (what ``handoff init --json`` prints), ``db``
    being the ledger file's absolute path (the address itself for one that is not a file)."""
    from handoff.ledger.backends import capabilities_of, parse

    given = check_path(path)
    is_file = capabilities_of(given).is_file
    where = parse(given).location if is_file else None
    existed = where is not None and os.path.exists(where) and os.path.getsize(where) > 0
    with Ledger(path, create=True, busy_timeout_s=busy_timeout_s) as lg:
        runs = lg.store.count_runs()
        if where is None:
            # No file of its own (a server's database, a memory store): the store says
            # whether this open made the schema, and its path is the address with any
            # password masked (never echo a secret).
            existed, shown = not lg.store.created_schema, lg.store.path
    return {"db": os.path.abspath(where) if where is not None else shown, "created": not existed, "runs": runs}


# --- importing into a file that does not exist yet ------------------------------------


def copy_ledger(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, run_ids: list[str] | None = None,
                busy_timeout_s: float = 5.0, progress: Progress = None) -> dict[str, Any]:
    """Copy runs (all by default) from the ledger at ``src`` to the one at ``dst``, any two
    addresses (a SQLite file and a PostgreSQL database, either way round), then prove it.

    The events stream from ``src``'s export into ``import_into(dst)``: the same rules and
    all-or-nothing as ``handoff import``, memory flat. Afterwards ``dst`` must verify clean
    and fold every copied run to exactly the checkpoint ``src`` folds it to; otherwise
    ``DamageFound`` (exit 4) names the run (what was imported stays: the error says the
    destination cannot be trusted as a copy, it does not undo the import). Returns the import's counts plus ``"src"``,
    ``"dst"`` (addresses as the stores show them, no password) and ``"checked"`` (runs
    compared). ``progress(done, total)`` follows each stage in turn (the events copied, the
    copy verified, the runs folded on both sides); each stage has its own total.
    """
    src_s, dst_s = check_path(src, "src"), check_path(dst, "dst")
    with Ledger(src_s, create=False, busy_timeout_s=busy_timeout_s) as source:
        counts = import_into(dst_s, source.export(run_ids, progress=progress), busy_timeout_s=busy_timeout_s)
        with Ledger(dst_s, create=False, busy_timeout_s=busy_timeout_s) as target:
            problems = target.verify(progress=progress)
            if problems:
                raise DamageFound(f"the copy in {target.store.path} does not verify: {problems[0].message}",
                                  problems=len(problems))
            checked = 0
            wanted = None if run_ids is None else set(run_ids)
            streams = source.store.count_runs() if progress is not None else 0
            for i, head in enumerate(source.store.list_runs(), 1):
                if progress is not None and i % 1000 == 0:
                    progress(i, streams)
                if wanted is not None and head.run_id not in wanted:
                    continue
                if source.store.fold(head.run_id, AGGREGATE) != target.store.fold(head.run_id, AGGREGATE):
                    raise DamageFound(f"run {head.run_id} folds differently in {target.store.path} than in "
                                      f"{source.store.path} after the copy", run_id=head.run_id)
                checked += 1
            return {**counts, "src": source.store.path, "dst": target.store.path, "checked": checked}


def import_into(
    path: str | os.PathLike[str], lines: Any, *, synchronous: str | None = None, busy_timeout_s: float = 5.0,
    progress: Progress = None,
) -> dict[str, int]:
    """Import an export into the ledger at ``path``, creating it if there is none.

    An existing ledger is extended inside one transaction and never deleted. When no file
    is at ``path``, the new ledger is built under a private, unpredictable name in the same
    directory (created exclusively, mode 0600) and linked into place only once the import
    succeeded; a file that appeared at ``path`` meanwhile is never replaced (the import is
    refused with ``TargetAppeared`` and nothing of it stays behind). A failed import
    removes only the private file it made.
    """
    from handoff.ledger.backends import capabilities_of, parse

    given = check_path(path)
    busy_timeout_s = check_seconds(busy_timeout_s, "busy_timeout")
    address = parse(given)
    if not capabilities_of(given).is_file or os.path.lexists(address.location):
        # A server's database (one transaction there is the whole of it), a memory store,
        # or a ledger file that exists: imported into in place, nothing to publish.
        with Ledger(given, synchronous=synchronous, busy_timeout_s=busy_timeout_s) as lg:
            return lg.import_lines(lines, progress=progress)
    path = address.location
    synchronous = synchronous or address.options.get("synchronous")
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, private = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.import-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise StoreUnavailable(
            f"cannot create a file in {directory} to build the new ledger: {exc.strerror}; "
            "check that the directory exists and is writable"
        ) from exc
    os.close(fd)
    try:
        with Ledger(private, synchronous=synchronous, busy_timeout_s=busy_timeout_s) as lg:
            counts = lg.import_lines(lines, progress=progress)
        # The last connection closed: SQLite copied the WAL into the file and removed it.
        if os.path.exists(private + "-wal") and os.path.getsize(private + "-wal") > 0:
            raise StoreUnavailable(
                f"the new ledger {private} still has unmerged WAL content after closing; "
                "nothing was published at the target. Retry the import"
            )
        files.fsync_file(private)
        try:
            files.publish_no_replace(private, path)
        except FileExistsError:
            raise TargetAppeared(
                f"a file appeared at {path} while the import ran; it was left alone and nothing "
                f"was imported. If it is a ledger, import into it again ('handoff --db {path} import')",
                field="db",
            ) from None
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot put the new ledger at {path}: {exc.strerror} (this filesystem supports "
                "neither hard links nor a rename that refuses to replace); nothing was imported"
            ) from exc
        files.sync_dir(directory)
        return counts
    finally:
        # Only the private names are removed, never the target: once published, the
        # target is a second link to the same file (or the private name was renamed away).
        for suffix in ("-wal", "-shm", "-journal", ""):
            try:
                os.remove(private + suffix)
            except FileNotFoundError:
                pass


def _texts(values: Any, field: str) -> tuple[str, ...]:
    """A filter given as several texts (states, health), checked one by one."""
    values = (values,) if isinstance(values, str) else tuple(values)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InvalidInput(f"{field}[{i}] must be text, got {type(value).__name__}", field=field)
        check_filter(value, f"{field}[{i}]")
    return values


def _count_lines(source: Any) -> int | None:
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


def _counted(items: Iterable[Any], progress: Callable[[int, int], None], total: int) -> Iterator[Any]:
    """``items`` as they are, with ``progress(done, total)`` every thousand (a fork's
    inherited history can pass ``total``: the bar then just stays full)."""
    done = 0
    for done, item in enumerate(items, 1):
        if done % 1000 == 0:
            progress(done, max(total, done))
        yield item
    progress(max(total, done), max(total, done))


def _read_small(path: str, limit: int, field: str) -> bytes:
    """Up to ``limit`` bytes of a regular file, opened without following a link or
    blocking on a FIFO swapped in since it was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(f"{field}: cannot read {path}: {exc.strerror}", field=field) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(f"{field}: {path} is not a regular file", field=field)
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _admit_watcher_beat(rec: Recorded, event: ev.Event) -> None:
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


class _RunOf(msgspec.Struct):
    run_id: str


#: The files SQLite keeps beside a database while it is open (or after an unclean close).
_SIDE = ("-wal", "-shm", "-journal")

#: What ``verify(run_id)`` does not look at (reported by ``handoff verify RUN``).
VERIFY_RUN_SKIPS = (
    "the hash chains, heads and lease fences of the other runs",
    "the projections (run 'handoff check' or a whole-ledger 'handoff verify')",
)


def login_name() -> str:
    """Who runs this process: $USER, else $LOGNAME, else the name the password database
    gives the process's uid, else ``uid-N``. Never a placeholder such as "operator", which
    would log the actor as ``operator:operator`` and hide who acted."""
    for var in ("USER", "LOGNAME"):
        name = os.environ.get(var)
        if name:
            return name
    uid = os.getuid()
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name or f"uid-{uid}"
    except (ImportError, KeyError):
        return f"uid-{uid}"


def operator_name(by: object = None) -> str:
    """The name an operator (or a person acting without a lease) is logged under: ``by``
    when given, else $HANDOFF_ACTOR, else ``login_name()``. The CLI's ``--by`` is ``by``."""
    if by is not None:
        if not isinstance(by, str) or not by.strip():
            raise InvalidInput("--by must name who is acting; leave it out to use $HANDOFF_ACTOR or your "
                               "login name", field="by")
        return by
    return os.environ.get("HANDOFF_ACTOR") or login_name()
