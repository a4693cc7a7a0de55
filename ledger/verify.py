"""The verify walk every backend runs: each run's chain, seqs and payloads, then its head.

A dialect feeds ``walk`` its events (with the unit its heads table keeps a run's span
in: a position, or PostgreSQL's write id) inside one read snapshot, feeds ``chain`` its
ledger-wide chain a page at a time, and hands ``check_heads`` its heads; the rules of
what is damaged are written here once. The walk also follows each run's saved graph
checkpoints: one that is not erased but continues a value that no longer is (erased, or
never saved) cannot be read back whole, and is damage (``checkpoint_values_missing``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from . import events as ev
from .errors import ValueNotStored
from .plan import LeaseState
from .store import GENESIS_HASH, Head, Problem, Recorded, chain_hash, global_link

_LEASE_TYPES = frozenset(("lease_granted", "lease_released", "lease_revoked"))
_GRAPH_TYPES = frozenset(("graph_checkpoint_saved", "values_erased"))


def not_stored(run_id: str, digest: str | None = None) -> ValueNotStored:
    """The write-side half of ``checkpoint_values_missing``: each dialect's refusal, in the
    write's own transaction, of a write that continues or names again a value the run does
    not store (erased, or never written). The writer's picture of the run is old."""
    which = f"value {digest[:16]}..." if digest else "a value"
    return ValueNotStored(
        f"the write to run {run_id} needs {which}, which the run does not store (it was erased, or never "
        "written); nothing was written. Re-read the run and store the value whole",
        run_id=run_id, why="value_not_stored", sha256=digest)


class Walk:
    """What the walk found: problems, the runs broken (later events of theirs unread),
    and per sound run its last (seq, hash), its span, the fence its lease events set, and
    its saved graph checkpoints."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.broken: set[str] = set()
        self.seen: dict[str, tuple[int, bytes]] = {}
        self.spans: dict[str, tuple[int, int]] = {}
        self.fences: dict[str, LeaseState] = {}
        self.graphs: dict[str, _Graph] = {}


class _Graph:
    """One run's saved graph checkpoints as a reader folds them: each channel version's
    stored value (its digest, and the version it continues), and the checkpoints not
    erased that continue a version."""

    def __init__(self) -> None:
        #: (namespace, channel, version) -> (digest, the version it continues or None)
        self.versions: dict[tuple[str, str, str], tuple[str, str | None]] = {}
        #: (thread, namespace, checkpoint id) -> (the record, {channel: version it continues})
        self.continuing: dict[tuple[str, str, str], tuple[Recorded, dict[str, str]]] = {}
        #: (namespace, channel, version) -> the seq of the values_erased event that erased its value
        self.erased: dict[tuple[str, str, str], int] = {}

    def see(self, rec: Recorded, event: ev.Event) -> None:
        if isinstance(event, ev.GraphCheckpointSaved):
            versions = event.checkpoint.get("channel_versions", {}) if isinstance(event.checkpoint, dict) else {}
            extends = event.extends if isinstance(event.extends, dict) else {}
            for channel, digest in event.values.items():
                self.versions[(event.namespace, channel, str(versions.get(channel)))] = (digest, extends.get(channel))
            key = (event.thread_id, event.namespace, event.checkpoint_id)
            if extends:
                self.continuing[key] = (rec, dict(extends))
            else:
                self.continuing.pop(key, None)
        elif isinstance(event, ev.ValuesErased):
            gone = {(r.namespace, r.checkpoint_id) for r in event.checkpoints}
            for key in [k for k in self.continuing if event.everything or (k[1], k[2]) in gone]:
                del self.continuing[key]
            erased = set(event.values)
            for k in [k for k, d in self.versions.items() if d[0] in erased]:
                del self.versions[k]
                self.erased[k] = rec.seq

    def problems(self, run_id: str) -> list[Problem]:
        out = []
        for (thread, ns, cid), (rec, extends) in self.continuing.items():
            for channel, base in sorted(extends.items()):
                why = self._broken(ns, channel, base)
                if why is not None:
                    out.append(Problem(
                        "checkpoint_values_missing", run_id, rec.seq, rec.position,
                        f"graph checkpoint {cid[:80]} of thread {thread[:80]!r} stores channel {channel[:60]!r} as "
                        f"the items appended to an earlier version, {why}, and no values_erased event erased the "
                        "checkpoint itself: it cannot be read back whole. Restore the run's values from a backup, "
                        "or delete the thread"))
                    break
        return out

    def _broken(self, ns: str, channel: str, base: str | None) -> str | None:
        seen: set[str] = set()
        while base is not None:
            link = self.versions.get((ns, channel, base))
            if link is None:
                by = self.erased.get((ns, channel, base))
                return (f"whose value (version {base[:40]}) was erased at seq {by}" if by is not None
                        else f"whose value (version {base[:40]}) no checkpoint saved")
            if base in seen:
                return f"whose versions continue one another in a loop (at version {base[:40]})"
            seen.add(base)
            base = link[1]
        return None


def _problem_of(rec: Recorded, last_seq: int, prev: bytes) -> tuple[str, str] | None:
    if not all(isinstance(v, bytes) for v in (rec.payload, rec.prev_hash, rec.hash)) or not all(
        isinstance(v, int) for v in (rec.seq, rec.recorded_us, rec.schema_version)
    ):
        return ("bad_type", "a column holds a value of the wrong type (edited behind the store)")
    if rec.seq != last_seq + 1:
        return ("seq_gap", f"seq {rec.seq} follows seq {last_seq}")
    if rec.prev_hash != prev:
        return ("broken_link", "prev_hash does not match the previous event's hash")
    if rec.hash != chain_hash(rec.prev_hash, rec.run_id, rec.seq, rec.type, rec.actor, rec.lease,
                              rec.idempotency_key, rec.recorded_us, rec.schema_version, rec.payload):
        return ("bad_hash", "the event's content does not match its hash")
    try:
        event = ev.decode(rec.payload)
        if ev.tag_of(event) != rec.type:
            return ("type_mismatch", f"type column {rec.type} but payload is {ev.tag_of(event)}")
    except Exception as exc:  # msgspec errors, bad UTF-8
        return ("undecodable", f"payload cannot be decoded: {exc}")
    return None


def walk(records: Iterable[tuple[Recorded, int]], *, whole: bool, total: int,
         progress: Callable[[int, int], None] | None) -> Walk:
    """Walk (record, span id) pairs in ledger order (a run's own in seq order). ``whole``:
    the whole ledger, so a hole in the positions is a problem too. Reports the first
    problem of each run (later ones usually follow from it). A record with position 0
    (committed, not yet given one) is checked but takes no part in the gap check."""
    out = Walk()
    expected_pos = None
    for rec, span_id in records:
        if whole and rec.position:
            if expected_pos is not None and rec.position != expected_pos:
                out.problems.append(Problem("position_gap", rec.run_id, rec.seq, rec.position,
                                            f"positions jump from {expected_pos - 1} to {rec.position}: "
                                            "events are missing"))
            expected_pos = rec.position + 1
        if progress is not None and rec.position and rec.position % 10_000 == 0:
            progress(rec.position, total)
        if rec.run_id in out.broken:
            continue
        last_seq, prev = out.seen.get(rec.run_id, (0, GENESIS_HASH))
        problem = _problem_of(rec, last_seq, prev)
        if problem:
            out.broken.add(rec.run_id)
            out.problems.append(Problem(problem[0], rec.run_id, rec.seq, rec.position, problem[1]))
            continue
        out.seen[rec.run_id] = (rec.seq, rec.hash)
        span = out.spans.get(rec.run_id)
        out.spans[rec.run_id] = (span_id if span is None else span[0], span_id)
        if rec.type in _LEASE_TYPES:
            fence = out.fences.get(rec.run_id)
            if fence is None:
                fence = out.fences[rec.run_id] = LeaseState(None, None, 0)
            fence.move(ev.decode(rec.payload))
        elif rec.type in _GRAPH_TYPES:
            graph = out.graphs.get(rec.run_id)
            if graph is None:
                graph = out.graphs[rec.run_id] = _Graph()
            graph.see(rec, ev.decode(rec.payload))
    for rid, graph in out.graphs.items():
        if rid not in out.broken:
            out.problems.extend(graph.problems(rid))
    return out


def check_heads(found: Walk, heads: dict[str, Head], fence_of: Callable[[str], tuple], unit: str) -> list[Problem]:
    """Each sound run's head against the log: seq and hash, span (in ``unit``: "positions"
    or "write ids"), fence and token digest. ``fence_of(run_id)`` reads the heads row's
    (lease, holder, highest lease, token digest)."""
    problems = []
    for rid, (last_seq, last_hash) in found.seen.items():
        if rid in found.broken:
            continue
        h = heads.get(rid)
        if h is None or h.last_seq != last_seq or h.last_hash != last_hash:
            problems.append(Problem("head_mismatch", rid, last_seq, None,
                                    f"the heads table says seq {h.last_seq if h else None}, the log ends "
                                    f"at seq {last_seq}: events were removed or added behind the store"))
            continue
        span = found.spans[rid]
        if (h.first_position, h.last_position) != span:
            problems.append(Problem("head_mismatch", rid, last_seq, None,
                                    f"the heads table places the run at {unit} {h.first_position}-"
                                    f"{h.last_position}, the log at {span[0]}-{span[1]}: the "
                                    "heads row was edited behind the store"))
            continue
        fence = found.fences.get(rid) or LeaseState(None, None, 0)
        want = (fence.lease, fence.holder, fence.max_lease)
        row = fence_of(rid)
        if tuple(row[:3]) != want:
            problems.append(Problem("fence_mismatch", rid, last_seq, None,
                                    f"the heads table fences with lease {row[0]} (holder {row[1]}, highest "
                                    f"{row[2]}) but the log's lease events say {want[0]} (holder {want[1]}, "
                                    f"highest {want[2]}): writes would be checked against a forged lease"))
            continue
        if row[3] != fence.digest:
            problems.append(Problem("fence_mismatch", rid, last_seq, None,
                                    f"the heads table holds another lease token digest than the grant of lease "
                                    f"{want[0]} in the log: a token nobody was given would be accepted as the "
                                    "holder's (the heads row was edited behind the store)"))
    for rid, h in heads.items():
        if rid not in found.seen and rid not in found.broken:
            problems.append(Problem("head_mismatch", rid, None, None,
                                    f"run {rid} has a head at seq {h.last_seq} but no events"))
    return problems


Link = tuple[int, str | None, int | None, bytes | None, bytes]


def chain(page: Callable[[int], Sequence[Link]], size: int, *, gaps: bool) -> tuple[list[Problem], int, bytes | None]:
    """Walk the ledger-wide chain from its start and report where it first breaks.

    ``page(after)`` returns up to ``size`` links (position, run_id, seq, event hash,
    global hash) past position ``after``, in position order; an event hash of None says
    the position names an event that is gone. ``gaps``: also report the first hole in
    the positions (the whole-ledger ``walk`` finds those itself; a one-run verify relies
    on this walk for them). Returns the problems, the last position read, and the last
    global hash when the chain held to there (None when it broke)."""
    prev, cursor = GENESIS_HASH, 0
    found: list[Problem] = []
    while True:
        rows = page(cursor)
        for position, rid, seq, h, g in rows:
            if gaps and position != cursor + 1:
                found.append(Problem("position_gap", rid, seq, position,
                                     f"positions jump from {cursor} to {position}: events are missing"))
                gaps = False
            cursor = position
            if h is None:
                return found + [Problem("position_gap", None, None, position,
                                        f"position {position} names an event that is not in the log: "
                                        "an event was removed behind the store")], cursor, None
            if not isinstance(h, bytes) or g != global_link(prev, position, h):
                return found + [Problem("global_chain", rid, seq, position,
                                        "the ledger-wide chain breaks here: events were reordered, moved "
                                        "between positions, inserted or removed behind the store")], cursor, None
            prev = g
        if len(rows) < size:
            return found, cursor, prev
