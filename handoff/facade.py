"""The Python API: every operation the CLI offers, as plain calls on one ``Ledger``.

This is the only place that joins the store, the reducers and the outside world (files
to measure, the clock for "now", environment defaults). The CLI is a thin shell over it.

``Ledger`` is one class assembled here from parts, each a mixin in a module named for what
it holds: the verbs a run takes (verbs.py), delivery (delivering.py), a graph framework's
state (graph_values.py), reads and listings (reads.py), proof of the log (audit.py),
exports and backups (copies.py) and incident reconstruction (incident.py). This module
keeps what every part writes through: opening and closing, and the write paths into the
store (``execute``, ``preview``, ``append_stream``, ``_with_values``, ``import_lines``), so
the one place that writes to the store stays one module (tests/test_backends.py holds it
to that). The parts share no state but the Ledger's ``store``, ``clock`` and ``projector``
and call one another through ``self`` only; none imports this module, so the import graph
has no cycle. Argument checks live in ledger/inputs.py, the names given to actors and runs
in names.py, result structs in results.py, artifact measuring in artifacts.py.
The whole-ledger functions (``init_ledger``, ``copy_ledger``, ``import_into``) open a
``Ledger`` and so live beside it; their file work is ledger/file_copies.py's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from msgspec import UNSET

from handoff.ledger import events as ev
from handoff.ledger import jsonl
from handoff.ledger.backends import open_store
from handoff.ledger.file_copies import built_beside
from handoff.ledger.errors import DamageFound, HistoryRefused, InvalidInput, LedgerError, StaleLease, UnknownRun
from handoff.ledger.inputs import check_path, check_run_id, check_seconds, check_text
from handoff.ledger.store import (
    WATCHER_PREFIX, Actor, AppendResult, Decision, EventStore, Head, LeaseToken, Liveness, Recorded, now_us,
)
from handoff.reducers import admit as admission
from handoff.reducers import commands as C
from handoff.reducers import liveness
from handoff.reducers.liveness import DEFAULT_MARK_S
from handoff.reducers.checkpoint import AGGREGATE, Checkpoint
from handoff.reducers.decide import Context, decide
from handoff.projections import Projector, queries
from handoff.projections.engine import OnProgress

from .artifacts import ARTIFACT_MAX_BYTES, ARTIFACT_MAX_ENV, artifact_max_bytes, measure, parse_size
from .audit import VERIFY_RUN_SKIPS, Audit
from .copies import Copies, admit_watcher_beat, count_lines
from .delivering import MAX_RECORDED_FINDINGS, Delivering
from .graph_values import GraphValues
from .incident import Incident
from .names import lease_token
from .reads import Reads
from .results import DEFAULT_PAGE, Claimed, Outcome, Page, Preview, Sent
from .verbs import POLICY, WATCHER_BEAT_PERIOD_S, Verbs

#: What callers import from ``handoff.facade``: the Ledger, its results and the whole-ledger
#: functions. The checks of its arguments are handoff/ledger/inputs.py's, the names it
#: gives actors and runs handoff/names.py's: import them from there.
__all__ = [
    "ARTIFACT_MAX_BYTES", "ARTIFACT_MAX_ENV", "DEFAULT_PAGE", "MAX_RECORDED_FINDINGS", "POLICY", "VERIFY_RUN_SKIPS",
    "WATCHER_BEAT_PERIOD_S", "Claimed", "Ledger", "Outcome", "Page", "Preview", "Sent", "artifact_max_bytes",
    "copy_ledger", "import_into", "init_ledger", "measure", "parse_size",
]


class _Decided(Exception):
    """Raised inside a preview's transaction once decide has answered: the store rolls it back."""

    def __init__(self, events: tuple[ev.Event, ...]) -> None:
        super().__init__("preview")
        self.events = events


#: The commands whose rules and events read the liveness kept beside the log.
_JUDGES_LIVENESS = (C.Heartbeat, C.Observe, C.Recover)


def _with_liveness(cmd: C.Command, cp: Checkpoint, live: Liveness | None) -> C.Command:
    """``cmd`` carrying the liveness the Ledger read for it (whatever its caller set is replaced)."""
    if isinstance(cmd, C.Heartbeat):
        previous = cp.watch.last_heartbeat_us
        return msgspec.structs.replace(cmd, beats=(live.beats + 1) if live is not None else 1,
                                       previous_us=UNSET if previous is None else previous)
    beat = cp.watch.last_heartbeat_us if cp.lease is not None else None
    return msgspec.structs.replace(cmd, beat_us=UNSET if beat is None else beat,
                                   beats=live.beats if live is not None else UNSET)


class Ledger(Verbs, Delivering, GraphValues, Reads, Audit, Copies, Incident):
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
        beat_mark_s: float = DEFAULT_MARK_S,
    ) -> None:
        self.clock = clock or now_us
        self._holders: dict[tuple[str, int], str] = {}
        #: Seconds between the summary beats the log keeps while a worker only beats
        #: (reducers/liveness.py); the other beats are kept beside the log.
        self.beat_mark_s = check_seconds(beat_mark_s, "beat_mark")
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
            command = cmd
            if isinstance(cmd, _JUDGES_LIVENESS):
                # The liveness kept beside the log, read inside this write: the guard and the
                # rules judge the run as it stands, and the event records what was judged
                # (never what a caller put in the command).
                live = self.store.liveness([run_id]).get(run_id)
                cp = liveness.overlay(cp, live)
                command = _with_liveness(cmd, cp, liveness.current(cp, live))
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
            events = decide(cp, command, Context(actor=actor, owner_load=load, parent=parent))
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

    def import_lines(self, lines: Any, *, progress: OnProgress = None) -> dict[str, int]:
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
        total = count_lines(lines) if progress is not None else None

        def items() -> Iterator[tuple[Recorded, bytes | None, int]]:
            for lineno, rec, digest, size in jsonl.parse_lines(lines, self.store.max_payload):
                where["line"] = lineno
                if total and lineno % 1000 == 0:
                    progress(lineno, total)  # type: ignore[misc]
                yield rec, digest, size

        def admit(cp: Checkpoint, rec: Recorded, event: ev.Event) -> None:
            parent = None
            if isinstance(event, ev.RunForked):
                parent = self.store.fold(event.parent, AGGREGATE, until_seq=event.parent_seq)
            elif not cp.opened and rec.run_id.startswith(WATCHER_PREFIX) and not isinstance(event, ev.HandoffOpened):
                admit_watcher_beat(rec, event)
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
                busy_timeout_s: float = 5.0, progress: OnProgress = None) -> dict[str, Any]:
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
    progress: OnProgress = None,
) -> dict[str, int]:
    """Import an export into the ledger at ``path``, creating it if there is none.

    An existing ledger is extended inside one transaction and never deleted. When no file
    is at ``path``, the new ledger is built under a private, unpredictable name in the same
    directory (created exclusively, mode 0600) and linked into place only once the import
    succeeded; a file that appeared at ``path`` meanwhile is never replaced (the import is
    refused with ``TargetAppeared`` and nothing of it stays behind). A failed import
    removes only the private file it made (``ledger.file_copies.built_beside``).
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
    synchronous = synchronous or address.options.get("synchronous")
    with built_beside(address.location) as private:
        with Ledger(private, synchronous=synchronous, busy_timeout_s=busy_timeout_s) as lg:
            counts = lg.import_lines(lines, progress=progress)
    return counts
