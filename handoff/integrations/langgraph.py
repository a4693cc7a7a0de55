"""``LedgerSaver``: a LangGraph checkpointer whose history is a handoff run.

One LangGraph thread is one run. Each ``put`` and ``put_writes`` is an event in the run's
log (``graph_checkpoint_saved``, ``graph_writes_saved``) naming its values by sha256; the
values themselves are stored beside the log, once per run and digest; a list that grows
is stored as the items appended since the parent graph checkpoint (the event's ``extends``
names the version they continue), so a state that grows by a message a step writes a
message's worth a step. Deleting (``delete_thread``, ``delete_for_runs``, ``prune``) is
recorded first (``values_erased``), then done, so ``verify`` tells an erasure from
damage. Everything here goes through ``Ledger``'s own methods; the saver keeps a cache of
each run's log (refreshed from the head before a read; a write folds its own event in)
and the last value of each growing list it stored, serialized.

Write ownership: a saver given a lease (``LedgerSaver(lg, lease=lease)`` inside ``with
lg.lease(run, worker=...) as lease``) writes under that lease's token, so after a revoke
or a later claim its ``put`` and ``put_writes`` raise ``StaleLease`` and write nothing;
while a lease is held, a saver without it is refused (``LeaseHeld``), deleting too, unless
the owner names the lease to end in the same write (``delete_thread(thread, end_lease=N)``).
Without a lease the saver writes as the run's owner: one writer by convention, as
LangGraph's own savers. Either way a graph checkpoint is never stored as the tail of a value the
run no longer stores: the ledger refuses it in the write's transaction (``ValueNotStored``)
and the saver reads the run again and stores the value whole.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.types import INTERRUPT, RESUME

from handoff.facade import Ledger
from handoff.lease import HeldLease
from handoff.ledger import events as ev
from handoff.ledger.errors import (
    CorruptLedger,
    InvalidInput,
    LeaseLost,
    RunExists,
    StaleLease,
    UnknownRun,
    ValueNotStored,
)
from handoff.ledger.inputs import RUN_ID_RE, check_chars
from handoff.ledger.store import Actor, value_digest
from handoff.reducers import transitions as T

#: What a run opened by the saver is for, unless the saver or the config says otherwise.
DEFAULT_OWNER = "langgraph"
#: The prefix of the blocker an ``interrupt()`` raises; resuming clears it.
INTERRUPT_BLOCKER = "LangGraph interrupt"
#: A run id made from a thread id that is not one (too long, other characters).
DERIVED_PREFIX = "lg-"
#: Values and graph checkpoints per ``values_erased`` event: far under the payload limit.
ERASE_CHUNK = 2000
#: The serialization a stored list can be continued in: msgpack, whose array is a
#: header and then its items, each encoded on its own.
MSGPACK = "msgpack"
#: Channel values a saver keeps serialized in memory to store the next version as a tail.
HELD = 1024


def run_id_for(thread_id: str) -> str:
    """The run a thread maps to: the thread id itself when it is a valid run id, else
    ``lg-`` and 40 hex digits of its sha256 (the event keeps the thread id)."""
    if RUN_ID_RE.fullmatch(thread_id) and not thread_id.startswith("watcher:"):
        return thread_id
    return DERIVED_PREFIX + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def _thread_id(thread: str) -> str:
    """A thread id as the ledger keeps it: one line of printable text (it also names the
    run's target, and shows in status, logs and reports), or InvalidInput naming it."""
    check_chars(thread, "thread_id")
    if "\n" in thread or "\t" in thread:
        raise InvalidInput(f"thread_id {thread[:80]!r} must be a single line without tabs; give LangGraph a "
                           "thread id of printable text", field="thread_id")
    return thread


def _frame(typed: tuple[str, bytes]) -> bytes:
    kind, data = typed
    return kind.encode() + b"\x00" + data


def _unframe(blob: bytes) -> tuple[str, bytes]:
    kind, _, data = blob.partition(b"\x00")
    return kind.decode(), data


def _array(data: bytes) -> tuple[int, int] | None:
    """(items, header bytes) of a msgpack array, or None when ``data`` is not one."""
    first = data[:1]
    if first and 0x90 <= first[0] <= 0x9F:
        return first[0] & 0x0F, 1
    if first == b"\xdc" and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == b"\xdd" and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 2**16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _tail(typed: tuple[str, bytes], base: tuple[str, bytes]) -> tuple[str, bytes] | None:
    """The items ``typed`` appends to ``base``, as a list of its own; None unless both are
    msgpack lists and ``base``'s items are, byte for byte, the first of ``typed``'s (an
    item changed in place is a different value, stored whole)."""
    if typed[0] != MSGPACK or base[0] != MSGPACK:
        return None
    new, old = _array(typed[1]), _array(base[1])
    if new is None or old is None or new[0] < old[0]:
        return None
    body = base[1][old[1]:]
    if not typed[1].startswith(body, new[1]):
        return None
    return MSGPACK, _array_header(new[0] - old[0]) + typed[1][new[1] + len(body):]


def _joined(parts: Sequence[tuple[str, bytes]]) -> tuple[str, bytes]:
    """A value stored as its first version and the tails appended since, oldest first,
    made whole again: one msgpack list of all their items."""
    if len(parts) == 1:
        return parts[0]
    count, bodies = 0, []
    for kind, data in parts:
        arr = _array(data) if kind == MSGPACK else None
        if arr is None:
            raise CorruptLedger("a graph checkpoint's value continues one that is not a msgpack list; the run's "
                                "values were not written by this saver. Check them with 'handoff verify'")
        count += arr[0]
        bodies.append(memoryview(data)[arr[1]:])
    return MSGPACK, _array_header(count) + b"".join(bodies)


def _extends(e: ev.GraphCheckpointSaved) -> dict[str, str]:
    return e.extends if isinstance(e.extends, dict) else {}


def _plain(value: Any, what: str) -> Any:
    """``value`` as JSON-ready builtins (what an event can hold), or InvalidInput."""
    try:
        return msgspec.to_builtins(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise InvalidInput(f"the graph checkpoint's {what} holds a value the ledger cannot store as JSON ({exc}); "
                           "keep metadata to text, numbers, lists and maps", field=what) from None


@dataclass
class _Saved:
    seq: int
    thread_id: str
    namespace: str
    event: ev.GraphCheckpointSaved
    #: (task_id, idx) -> (channel, sha256, task_path)
    writes: dict[tuple[str, int], tuple[str, str, str]] = field(default_factory=dict)


@dataclass
class _Stored:
    """How one graph checkpoint's values are stored."""

    digests: dict[str, str]  # channel -> sha256 of the value stored for it
    extends: dict[str, str]  # channel -> the version its stored value continues
    bases: dict[str, str]  # channel -> sha256 of that version's stored value
    new: list[bytes]  # the values not stored yet
    #: what the next version of each growing list may be stored as the tail of
    held: dict[tuple[str, str, str, str], tuple[str, tuple[str, bytes]]]


@dataclass
class _Index:
    """One run's saved graph checkpoints and writes, folded from its log up to ``seq``."""

    seq: int = 0
    owner: str = ""
    saved: dict[tuple[str, str, str], _Saved] = field(default_factory=dict)  # (thread, ns, id)
    #: (ns, channel, version) -> (sha256 of the value stored for that version, the version
    #: it continues or None when it is stored whole)
    versions: dict[tuple[str, str, str], tuple[str, str | None]] = field(default_factory=dict)
    #: A write of this saver's may have landed that the index has not seen: refresh it.
    stale: bool = False

    def apply(self, seq: int, event: ev.Event) -> None:
        self.seq = seq
        if isinstance(event, ev.HandoffOpened):
            self.owner = event.owner
        elif isinstance(event, ev.GraphCheckpointSaved):
            key = (event.thread_id, event.namespace, event.checkpoint_id)
            self.saved[key] = _Saved(seq, event.thread_id, event.namespace, event)
            versions = event.checkpoint.get("channel_versions", {})
            extends = _extends(event)
            for channel, digest in event.values.items():
                self.versions[(event.namespace, channel, str(versions.get(channel)))] = (digest,
                                                                                         extends.get(channel))
        elif isinstance(event, ev.GraphWritesSaved):
            s = self.saved.get((event.thread_id, event.namespace, event.checkpoint_id))
            if s is None:
                return
            for w in event.writes:
                k = (event.task_id, w.idx)
                if w.idx >= 0 and k in s.writes:
                    continue  # written once; a special channel's latest value replaces it
                s.writes[k] = (w.channel, w.sha256, event.task_path)
        elif isinstance(event, ev.ValuesErased):
            gone = {(r.namespace, r.checkpoint_id) for r in event.checkpoints}
            for key in [k for k in self.saved if event.everything or (k[1], k[2]) in gone]:
                del self.saved[key]
            erased = set(event.values)
            self.versions = {k: d for k, d in self.versions.items() if d[0] not in erased}

    def chain(self, s: _Saved, channel: str) -> list[str] | None:
        """The digests a graph checkpoint's channel value is stored under, newest first: its own,
        then each version it continues back to one stored whole; None when a link is gone."""
        e = s.event
        out, base, seen = [e.values[channel]], _extends(e).get(channel), set()
        while base is not None:
            link = self.versions.get((e.namespace, channel, base))
            if link is None or base in seen:
                return None
            seen.add(base)
            out.append(link[0])
            base = link[1]
        return out

    def live_digests(self, keep: Any = None) -> set[str]:
        out: set[str] = set()
        for key, s in self.saved.items():
            if keep is None or keep(key):
                for channel, digest in s.event.values.items():
                    out.update(self.chain(s, channel) or [digest])
                out.update(d for _, d, _ in s.writes.values())
        return out


class LedgerSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over a ``Ledger`` (SQLite or PostgreSQL).

    ``lease``: a held lease (``lg.lease(run, worker=...)``): every write carries its token
    and is fenced by the ledger; the saver then serves that run only. ``owner``, ``goal``
    and ``target`` make the contract of a run the saver opens for a thread that has none
    (also ``handoff_owner``, ``handoff_goal``, ``handoff_target`` in the config's
    ``configurable``); ``handoff_run`` there names an existing run for the thread. A run
    the saver opens declares ``graph_step`` as progress while executing.
    """

    def __init__(self, ledger: Ledger, *, lease: HeldLease | None = None, owner: str = DEFAULT_OWNER,
                 goal: str | None = None, target: str | None = None, serde: Any = None) -> None:
        super().__init__(serde=serde)
        if not isinstance(ledger, Ledger):
            raise InvalidInput(f"LedgerSaver needs a handoff Ledger, got {type(ledger).__name__}", field="ledger")
        self.lg = ledger
        self.lease = lease
        self.owner, self.goal, self.target = owner, goal, target
        self._lock = threading.RLock()
        self._indexes: dict[str, _Index] = {}
        self._begun: set[str] = set()
        self._opened: set[str] = set()
        #: (run, thread, ns, channel) -> (version, the value serialized): what the next
        #: version of a growing list is stored as the tail of.
        self._held: collections.OrderedDict[tuple[str, str, str, str], tuple[str, tuple[str, bytes]]] = (
            collections.OrderedDict())

    # --- which run, and who writes ---------------------------------------------------

    def _run_of(self, config: RunnableConfig) -> tuple[str, str, str]:
        """(run id, thread id, namespace) of a config."""
        conf = config.get("configurable", {}) if config else {}
        thread = conf.get("thread_id")
        if thread is None:
            raise InvalidInput("the config has no configurable.thread_id; LangGraph needs one to save a "
                               "thread's state", field="thread_id")
        thread = _thread_id(str(thread))
        if self.lease is not None:
            run = self.lease.run_id
        else:
            run = str(conf.get("handoff_run") or run_id_for(thread))
        return run, thread, str(conf.get("checkpoint_ns", "") or "")

    def _ensure_run(self, run: str, thread: str, config: RunnableConfig) -> None:
        """Open the run for a thread that has none (a named or leased run must exist)."""
        if run in self._opened:
            return
        if self.lg.store.head(run) is not None:
            self._opened.add(run)
            return
        conf = config.get("configurable", {})
        if self.lease is not None or conf.get("handoff_run"):
            raise UnknownRun(f"no run {run} exists for thread {thread}; open it first (lg.open(run_id=...))")
        try:
            self.lg.open(run_id=run, goal=str(conf.get("handoff_goal") or self.goal or f"LangGraph thread {thread}"),
                         target=str(conf.get("handoff_target") or self.target or f"langgraph:{thread[:100]}"),
                         owner=str(conf.get("handoff_owner") or self.owner),
                         progress_kinds={T.EXECUTING: [T.GRAPH_STEP]})
        except RunExists:
            pass  # another saver opened it first
        self._opened.add(run)

    def _writer(self, run: str, index: _Index) -> dict[str, Any]:
        """The write's credentials: the lease's token (checked by the lease block first), or
        the run's owner."""
        if self.lease is not None:
            try:
                return {"lease": self.lease.token}
            except LeaseLost as exc:  # the block already knows: the same refusal the ledger gives
                raise StaleLease(f"the saver's lease on run {run} is lost ({exc.message}); nothing was written and "
                                 "this graph must stop", run_id=run, lease=self.lease.number,
                                 why="lease_lost") from exc
        return {"actor": Actor("owner", index.owner or self.owner)}

    def _start_work(self, run: str, index: _Index) -> None:
        """Once per run, with a lease: move a queued run to executing, where its graph steps
        count as progress (a run left in unknown moves once its side effects are settled)."""
        if self.lease is None or run in self._begun:
            return
        with self._lock:  # LangGraph saves from more than one thread: one of them moves the run
            if run in self._begun:
                return
            token, worker = self._writer(run, index)["lease"], self.lease.worker
            state = self.lg.checkpoint(run).state
            if state == T.QUEUED:
                self._fenced(lambda: self.lg.transition(run, token, T.PLANNING, reason="the graph started",
                                                        worker=worker))
                state = T.PLANNING
            if state in (T.PLANNING, T.UNKNOWN):
                self._fenced(lambda: self.lg.transition(run, token, T.EXECUTING, reason="the graph runs",
                                                        worker=worker))
            self._begun.add(run)

    def _fenced(self, call: Any) -> Any:
        try:
            return call()
        except StaleLease as exc:
            fence = self.lease.fence if self.lease is not None else None
            if fence is not None:
                fence.ended(exc)  # the lease block's heartbeats stop too
            raise

    # --- the run's log, folded ---------------------------------------------------------

    def _index(self, run: str, *, fresh: bool = True) -> _Index | None:
        """The run's index, brought up to its head (``fresh``), or for a write, as this
        saver's own writes left it: a write needs no read of the log first, and one made
        from an index another process has since moved past is still fenced by the ledger
        (at worst it stores a value whole that it could have stored as a tail)."""
        if not fresh:
            with self._lock:
                index = self._indexes.get(run)
                if index is not None and not index.stale:
                    return index
        head = self.lg.store.head(run)
        if head is None:
            return None
        with self._lock:
            index = self._indexes.get(run)
            if index is None or index.seq > head.last_seq:
                index = self._indexes[run] = _Index()
            if index.seq < head.last_seq:
                for rec in self.lg.log(run, after_seq=index.seq):
                    index.apply(rec.seq, rec.event)
            index.stale = False
            return index

    def _learn(self, run: str, index: _Index, out: Any, event: ev.Event) -> None:
        """Fold this saver's own write into the index when nothing else landed before it
        (its first seq follows the index's); else mark the index for a refresh."""
        r = out.result
        with self._lock:
            if r.outcome == "committed" and r.first_seq == index.seq + 1 and self._indexes.get(run) is index:
                index.apply(r.first_seq, event)
                index.seq = r.last_seq
            else:
                index.stale = True

    def _value(self, s: _Saved, channel: str, index: _Index, blobs: dict[str, bytes]) -> tuple[str, bytes] | None:
        chain = index.chain(s, channel)
        if chain is None or any(d not in blobs for d in chain):
            return None
        return _joined([_unframe(blobs[d]) for d in reversed(chain)])

    def _tuple(self, run: str, s: _Saved, index: _Index) -> CheckpointTuple:
        e = s.event
        digests = {d for ch in e.values for d in (index.chain(s, ch) or ())} | {d for _, d, _ in s.writes.values()}
        blobs = self.lg.values(run, digests)
        values = {ch: self.serde.loads_typed(typed) for ch in e.values
                  if (typed := self._value(s, ch, index, blobs)) is not None}
        graph_checkpoint: Checkpoint = {**e.checkpoint, "channel_values": values}  # type: ignore[typeddict-item]
        order = sorted(s.writes.items(), key=lambda kv: (kv[1][2], kv[0][0], kv[0][1]))
        writes = [(task, ch, self.serde.loads_typed(_unframe(blobs[d]))) for (task, _), (ch, d, _) in order
                  if d in blobs]
        conf = {"thread_id": s.thread_id, "checkpoint_ns": s.namespace, "checkpoint_id": e.checkpoint_id}
        parent = ({"configurable": {"thread_id": s.thread_id, "checkpoint_ns": s.namespace,
                                    "checkpoint_id": e.parent_id}} if e.parent_id else None)
        return CheckpointTuple({"configurable": conf}, graph_checkpoint, e.metadata, parent, writes)  # type: ignore[arg-type]

    # --- reading -------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        run, thread, ns = self._run_of(config)
        index = self._index(run)
        if index is None:
            return None
        self._start_work(run, index)  # a leased graph loading its state starts working: its first task may be a tool
        cid = get_checkpoint_id(config)
        if cid:
            s = index.saved.get((thread, ns, cid))
        else:
            mine = [s for (t, n, _), s in index.saved.items() if t == thread and n == ns]
            s = max(mine, key=lambda x: x.event.checkpoint_id, default=None)
        return None if s is None else self._tuple(run, s, index)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        if config is not None and config.get("configurable", {}).get("thread_id") is not None:
            run, thread, _ = self._run_of(config)
            runs, want_thread = [run], thread
        else:
            runs, want_thread = self._graph_runs(), None
        ns = None if config is None else config.get("configurable", {}).get("checkpoint_ns")
        cid = None if config is None else get_checkpoint_id(config)
        before_id = None if before is None else get_checkpoint_id(before)
        found: list[tuple[str, _Saved, _Index]] = []
        for run in runs:
            index = self._index(run)
            if index is None:
                continue
            for (t, n, c), s in index.saved.items():
                if ((want_thread is None or t == want_thread) and (ns is None or n == ns)
                        and (cid is None or c == cid) and (before_id is None or c < before_id)
                        and all(s.event.metadata.get(k) == v for k, v in (filter or {}).items())):
                    found.append((run, s, index))
        found.sort(key=lambda rs: rs[1].event.checkpoint_id, reverse=True)
        for run, s, index in found[:limit] if limit is not None else found:
            yield self._tuple(run, s, index)

    def _graph_runs(self) -> list[str]:
        """Every run holding a saved graph checkpoint (a read of the ledger's log)."""
        if self.lease is not None:
            return [self.lease.run_id]
        return list(dict.fromkeys(rec.run_id for rec in self.lg.events(types=("graph_checkpoint_saved",))))

    # --- writing -------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        run, thread, ns = self._run_of(config)
        self._ensure_run(run, thread, config)
        index = self._index(run, fresh=False)
        assert index is not None
        self._start_work(run, index)
        body = _plain({k: v for k, v in checkpoint.items() if k != "channel_values"}, "checkpoint")
        parent_id = str(config.get("configurable", {}).get("checkpoint_id") or "")
        md = _plain(get_serializable_checkpoint_metadata(config, metadata), "metadata")
        source = md.get("source")
        self._clear_interrupt(run, index, source in ("input", "update"))
        stored = self._stored(run, thread, ns, index, checkpoint, new_versions, parent_id, whole=False)
        try:
            out = self._save(run, thread, ns, index, checkpoint, body, md, parent_id, stored)
        except ValueNotStored:
            # A value this write continues or names again is gone (erased since this saver
            # read the run): read the run again and store every value whole.
            index = self._index(run)
            assert index is not None
            with self._lock:
                for key in [k for k in self._held if k[0] == run]:
                    del self._held[key]
            stored = self._stored(run, thread, ns, index, checkpoint, new_versions, parent_id, whole=True)
            out = self._save(run, thread, ns, index, checkpoint, body, md, parent_id, stored)
        self._learn(run, index, out, ev.GraphCheckpointSaved(
            thread_id=thread, checkpoint_id=checkpoint["id"], checkpoint=body, metadata=md, values=stored.digests,
            namespace=ns, parent_id=parent_id, extends=stored.extends or msgspec.UNSET))
        with self._lock:
            for key, value in stored.held.items():
                self._held[key] = value
                self._held.move_to_end(key)
            while len(self._held) > HELD:
                self._held.popitem(last=False)
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _stored(self, run: str, thread: str, ns: str, index: _Index, graph_checkpoint: Checkpoint,
                new_versions: ChannelVersions, parent_id: str, *, whole: bool) -> _Stored:
        """How a graph checkpoint's values are stored. ``whole``: every value stored whole, none
        named again (after the ledger said one this saver named is gone)."""
        values = graph_checkpoint.get("channel_values", {})
        versions = graph_checkpoint.get("channel_versions", {})
        parent = index.saved.get((thread, ns, parent_id)) if parent_id else None
        before = parent.event.checkpoint.get("channel_versions", {}) if parent is not None else {}
        digests: dict[str, str] = {}
        extends: dict[str, str] = {}
        bases: dict[str, str] = {}
        new: list[bytes] = []
        held: dict[tuple[str, str, str, str], tuple[str, tuple[str, bytes]]] = {}
        for channel, version in versions.items():
            if channel not in values:
                continue
            known = None if whole or channel in new_versions else index.versions.get((ns, channel, str(version)))
            if known is not None and known[1] is not None:  # named again, and stored as a tail
                link = index.versions.get((ns, channel, known[1]))
                if link is None:
                    known = None  # what it continues is gone: stored whole
                else:
                    bases[channel] = link[0]
            if known is None:
                typed = self.serde.dumps_typed(values[channel])
                base = None if whole else self._base((run, thread, ns, channel), before.get(channel), index)
                tail = _tail(typed, base[1]) if base is not None else None
                blob = _frame(tail or typed)
                known = (value_digest(blob), base[0] if tail is not None and base is not None else None)
                if tail is not None and base is not None:
                    bases[channel] = index.versions[(ns, channel, base[0])][0]
                new.append(blob)
                if typed[0] == MSGPACK:
                    held[(run, thread, ns, channel)] = (str(version), typed)
            digests[channel] = known[0]
            if known[1] is not None:
                extends[channel] = known[1]
        return _Stored(digests, extends, bases, new, held)

    def _save(self, run: str, thread: str, ns: str, index: _Index, graph_checkpoint: Checkpoint, body: Any, md: Any,
              parent_id: str, stored: _Stored) -> Any:
        return self._fenced(lambda: self.lg.save_graph_checkpoint(
            run, thread_id=thread, checkpoint_id=graph_checkpoint["id"], checkpoint=body, metadata=md,
            values=stored.digests, new_values=stored.new, namespace=ns, parent_id=parent_id,
            extends=stored.extends, bases=stored.bases, **self._writer(run, index)))

    def _base(self, key: tuple[str, str, str, str], version: Any, index: _Index) -> tuple[str, tuple[str, bytes]] | None:
        """What a channel's new value may be stored as the tail of: the parent graph checkpoint's
        version of it, when this saver stored that version and still holds it serialized."""
        if version is None:
            return None
        with self._lock:
            held = self._held.get(key)
        if held is None or held[0] != str(version) or (key[2], key[3], held[0]) not in index.versions:
            return None
        return held

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        run, thread, ns = self._run_of(config)
        self._ensure_run(run, thread, config)
        index = self._index(run, fresh=False)
        assert index is not None
        cid = str(config["configurable"]["checkpoint_id"])
        saved = index.saved.get((thread, ns, cid))
        items: list[tuple[int, str, bytes]] = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            blob = _frame(self.serde.dumps_typed(value))
            had = saved.writes.get((task_id, idx)) if saved is not None else None
            if had is not None and (idx >= 0 or had[1] == value_digest(blob)):
                continue  # stored once, across restarts (the index is the log's)
            items.append((idx, channel, blob))
        if not items:
            return
        self._start_work(run, index)
        if any(ch == RESUME for _, ch, _ in items):
            self._clear_interrupt(run, index, True)
        out = self._fenced(lambda: self.lg.save_graph_writes(
            run, thread_id=thread, checkpoint_id=cid, task_id=task_id, writes=items, namespace=ns,
            task_path=task_path, **self._writer(run, index)))
        self._learn(run, index, out, ev.GraphWritesSaved(
            thread_id=thread, checkpoint_id=cid, task_id=task_id, namespace=ns, task_path=task_path,
            writes=tuple(ev.GraphWrite(idx=i, channel=ch, sha256=value_digest(b)) for i, ch, b in items)))
        for idx, ch, blob in items:
            if ch == INTERRUPT:
                self._raise_interrupt(run, index, thread, task_id, blob)
                break

    def _raise_interrupt(self, run: str, index: _Index, thread: str, task_id: str, blob: bytes) -> None:
        """An ``interrupt()``: a blocker whose next action is resuming the thread."""
        shown = repr(self.serde.loads_typed(_unframe(blob)))
        shown = shown if len(shown) <= 300 else shown[:299] + "..."
        with self._lock:
            if any(b.reason.startswith(INTERRUPT_BLOCKER) for b in self.lg.checkpoint(run).blockers):
                return
            self._fenced(lambda: self.lg.block(
                run, f"{INTERRUPT_BLOCKER} in task {task_id} of thread {thread}: {shown}",
                f"resume the graph on thread {thread} with Command(resume=...)", **self._writer(run, index)))

    def _clear_interrupt(self, run: str, index: _Index, resumed: bool) -> None:
        if not resumed:
            return
        with self._lock:  # the resume's writes and the next graph checkpoint may come from two threads
            for b in self.lg.checkpoint(run).blockers:
                if b.reason.startswith(INTERRUPT_BLOCKER):
                    self._fenced(lambda b=b: self.lg.unblock(run, "the graph was resumed", blocker_id=b.id,
                                                            **self._writer(run, index)))

    # --- deleting: recorded first, then done ---------------------------------------------

    def _erase(self, run: str, index: _Index, doomed: set[tuple[str, str, str]], reason: str,
               end_lease: int | None = None) -> None:
        """Record, then delete, the values only ``doomed`` graph checkpoints use. While a worker
        holds the run's lease only a saver under it may (else LeaseHeld, nothing erased),
        or the owner naming the lease (``end_lease``), which ends it in the first write."""
        if not doomed:
            return
        kept = index.live_digests(lambda k: k not in doomed)
        gone = index.live_digests(lambda k: k in doomed) - kept
        everything = len(doomed) == len(index.saved)
        refs = sorted({(ns, cid) for _, ns, cid in doomed})
        digests = sorted(gone)
        chunks = max(1, -(-max(len(refs), len(digests)) // ERASE_CHUNK))
        for i in range(chunks):
            part = slice(i * ERASE_CHUNK, (i + 1) * ERASE_CHUNK)
            ending = {"end_lease": end_lease} if end_lease is not None and i == 0 else {}
            self._fenced(lambda part=part, ending=ending: self.lg.erase_values(
                run, reason=reason, values=digests[part], checkpoints=() if everything else refs[part],
                everything=everything and i == chunks - 1, **ending, **self._writer(run, index)))
        self._index(run)
        with self._lock:  # nothing erased is continued from memory
            for key in [k for k in self._held if k[0] == run]:
                del self._held[key]

    def delete_thread(self, thread_id: str, *, end_lease: int | None = None) -> None:
        """Erase the thread's graph checkpoints, writes and values (recorded first). While a
        worker holds the run's lease: a saver under that lease, or the run's owner naming
        the lease (``end_lease``, its number in ``handoff status``), which ends it in the
        same write so the holder's next write is refused as stale; else LeaseHeld."""
        run, thread, _ = self._run_of({"configurable": {"thread_id": thread_id}})
        index = self._index(run)
        if index is not None:
            self._erase(run, index, {k for k in index.saved if k[0] == thread}, "delete_thread", end_lease)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = set(run_ids)
        if not wanted:
            return
        for run in self._graph_runs():
            index = self._index(run)
            if index is not None:
                self._erase(run, index, {k for k, s in index.saved.items() if s.event.metadata.get("run_id") in wanted},
                            "delete_for_runs")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInput(f"prune strategy must be keep_latest or delete, got {strategy!r}", field="strategy")
        for thread_id in thread_ids:
            run, thread, _ = self._run_of({"configurable": {"thread_id": thread_id}})
            index = self._index(run)
            if index is None:
                continue
            mine = {k for k in index.saved if k[0] == thread}
            if strategy == "keep_latest":
                latest: dict[str, tuple[str, str, str]] = {}
                for k in mine:
                    if k[1] not in latest or k[2] > latest[k[1]][2]:
                        latest[k[1]] = k
                mine -= set(latest.values())
            self._erase(run, index, mine, "prune")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Every saved graph checkpoint of the source thread, with its writes, onto the target
        thread (its own run, opened as for a first ``put``), values copied beside it."""
        src, s_thread, _ = self._run_of({"configurable": {"thread_id": source_thread_id}})
        index = self._index(src)
        if index is None:
            return
        saved = sorted((s for k, s in index.saved.items() if k[0] == s_thread), key=lambda s: s.seq)
        if not saved:
            return
        target = {"configurable": {"thread_id": target_thread_id}}
        dst, d_thread, _ = self._run_of(target)
        self._ensure_run(dst, d_thread, target)
        dindex = self._index(dst)
        assert dindex is not None
        self._start_work(dst, dindex)
        copied: set[tuple[str, str, str]] = set()
        for s in saved:
            e = s.event
            chains = {ch: index.chain(s, ch) or [d] for ch, d in e.values.items()}
            blobs = self.lg.values(src, {d for c in chains.values() for d in c} | {d for _, d, _ in s.writes.values()})
            values, extends, new = dict(e.values), dict(_extends(e)), []
            versions = e.checkpoint.get("channel_versions", {})
            for ch, d in e.values.items():
                base = extends.get(ch)
                if base is not None and (e.namespace, ch, base) not in copied and all(x in blobs for x in chains[ch]):
                    # The versions it continues were not copied (pruned before): stored whole.
                    whole = self._value(s, ch, index, blobs)
                    assert whole is not None
                    blob = _frame(whole)
                    values[ch] = value_digest(blob)
                    del extends[ch]
                    new.append(blob)
                elif d in blobs:
                    new.append(blobs[d])
                copied.add((e.namespace, ch, str(versions.get(ch))))
            bases = {ch: chains[ch][1] if len(chains[ch]) > 1 else "" for ch in extends}
            self._fenced(lambda e=e, values=values, extends=extends, new=new, bases=bases: self.lg.save_graph_checkpoint(
                dst, thread_id=d_thread, checkpoint_id=e.checkpoint_id, checkpoint=e.checkpoint, metadata=e.metadata,
                values=values, new_values=new, namespace=e.namespace, parent_id=e.parent_id, extends=extends,
                bases=bases, **self._writer(dst, dindex)))
            by_task: dict[tuple[str, str], list[tuple[int, str, bytes]]] = {}
            for (task, idx), (ch, d, path) in s.writes.items():
                if d in blobs:
                    by_task.setdefault((task, path), []).append((idx, ch, blobs[d]))
            for (task, path), items in by_task.items():
                self._fenced(lambda task=task, path=path, items=items, e=e: self.lg.save_graph_writes(
                    dst, thread_id=d_thread, checkpoint_id=e.checkpoint_id, task_id=task, writes=items,
                    namespace=e.namespace, task_path=path, **self._writer(dst, dindex)))

    def get_next_version(self, current: str | int | float | None, channel: None = None) -> str:
        """Versions as LangGraph's own SQL savers make them: a zero-padded counter (so they
        sort as text) and a random fraction."""
        if current is None:
            n = 0
        elif isinstance(current, (int, float)):
            n = int(current)
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    # --- the async face: the same calls on a worker thread -------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for tup in found:
            yield tup

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str, *, end_lease: int | None = None) -> None:
        await asyncio.to_thread(lambda: self.delete_thread(thread_id, end_lease=end_lease))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


__all__ = ["DEFAULT_OWNER", "INTERRUPT_BLOCKER", "LedgerSaver", "run_id_for"]
