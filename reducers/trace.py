"""A run as one trace: the pure fold behind ``handoff otel`` (handoff/integrations/otel.py).

People look at traces first; the ledger is the system of record. This fold turns a run's
history into span and event descriptions shaped by the OpenTelemetry GenAI agent
conventions, with nothing of OpenTelemetry imported: the exporter turns them into SDK
spans. The shape:

- one root span for the run, ``invoke_workflow handoff``, from its first event to its last;
- one ``invoke_agent {worker}`` span per lease, child of the root, ended by the release,
  the revocation (``revoked`` by a person, ``lost`` when the watchdog took it because the
  worker went silent), the next grant (``superseded``), or the end of the log (``held``);
- one ``execute_tool`` span per side effect, child of the lease that started it, from its
  start to its confirmation or reconciliation (``unknown`` while neither came);
- everything else as span events named ``handoff.<event type>``: on the lease span for a
  lease holder's own writes, on the root otherwise. Heartbeats are events one by one up to
  ``HEARTBEAT_EVENTS``, then ``HEARTBEAT_EVENTS`` binned events with counts.

Ids are derived from the run id (and the lease number or the seq that began a span), so
exporting a run twice gives the same trace and a collector deduplicates. A worker that
recorded a W3C ``trace_id`` (and ``span_id``) in a record's ``attrs`` gets the run's spans
in its own trace, under that span. Idempotency keys and lease tokens never appear: no key
field is read, token digests are not, and in recorded text any key of the run (wherever it
stands, ``key:K``, ``idem_K``, ``X-K``), anything shaped like a lease token
(``tok_1.<secret>``) and the secret of any of the run's lease tokens on its own
(``token=<secret>``, found by its digest) is replaced by a placeholder. No I/O, no clock.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.store import Recorded, lease_digest

from . import checkpoint as ckp
from . import transitions as T

#: Up to this many heartbeats of a lease become one event each; past it, this many
#: events each stand for a bin of consecutive heartbeats, so a week-long lease stays small.
HEARTBEAT_EVENTS = 20
#: Attribute and event names. The GenAI ones are the conventions' (checked against
#: opentelemetry-semantic-conventions in the tests); ours live under ``handoff.``.
OP = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
WORKFLOW_NAME = "gen_ai.workflow.name"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
MODEL = "gen_ai.request.model"
USAGE = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
#: What the worker records to join its own trace (W3C trace-context ids, lowercase hex).
TRACE_ID_ATTR, SPAN_ID_ATTR = "trace_id", "span_id"
#: Lease span end reasons (``handoff.lease.end``).
LEASE_ENDS = ("held", "released", "revoked", "lost", "superseded")
#: Side-effect span outcomes (``handoff.effect.outcome``).
EFFECT_OUTCOMES = ("pending", "done", "absent", "unknown", "reconciled_done", "reconciled_absent")

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
#: A lease token as claim prints it: "<lease>.<43 URL-safe base64 characters>", wherever it
#: stands (``tok_1.<secret>``, ``HANDOFF_LEASE=1.<secret>``).
_TOKEN = re.compile(r"(?<![\d.])\d+\.[A-Za-z0-9_-]{40,}")
#: A run of URL-safe base64 long enough to be a token's secret (ledger.store: 22 to 128).
_SECRETISH = re.compile(r"[A-Za-z0-9_-]{22,}")
#: The length of the secret ``Ledger.claim`` draws (32 random bytes, URL-safe base64).
_SECRET_LEN = 43
#: A key shorter than this is replaced only where no letter or digit touches it: a short
#: key (``v1``) is also a piece of ordinary words and versions.
_SHORT_KEY = 8
#: Attribute names a worker may have used for a secret or a key: never exported.
_SECRET_NAME = re.compile(r"(^|[._:-])(key|token|secret|password|idempotency[._-]?key|lease[._-]?token)$",
                          re.IGNORECASE)
#: Event fields never exported: keys (idempotency keys, side-effect and delivery keys), the
#: lease token's digest, and the attrs map (exported on its own, filtered).
#: A target is not exported either (a webhook's address can hold its secret): only its kind.
_NEVER = frozenset({"key", "token_digest", "attrs", "target"})
REDACTED_KEY = "[key]"
REDACTED_TOKEN = "[lease token]"

Attr = str | int | float | bool


class SpanEvent(msgspec.Struct, frozen=True):
    name: str
    at_us: int
    attributes: dict[str, Attr]


class Span(msgspec.Struct):
    """One span: ids are lowercase hex (16 digits for a span, 32 for a trace)."""

    span_id: str
    parent_id: str | None
    name: str
    start_us: int
    end_us: int
    attributes: dict[str, Attr]
    events: list[SpanEvent]
    #: "unset", "ok" or "error" (OpenTelemetry's status codes), with a description for errors.
    status: str = "unset"
    status_message: str = ""


class Trace(msgspec.Struct):
    run_id: str
    trace_id: str
    #: The worker's span the run's root hangs under, when it recorded one; else None.
    remote_parent: str | None
    #: The root first, then lease and side-effect spans in the order they began.
    spans: list[Span]
    first_seq: int
    last_seq: int


def _hex(text: str, digits: int) -> str:
    h = hashlib.sha256(text.encode("utf-8")).hexdigest()[:digits]
    return h if h.strip("0") else "1".rjust(digits, "0")  # an all-zero id is invalid


def trace_id_for(run_id: str) -> str:
    return _hex(f"handoff:trace:{run_id}", 32)


def span_id_for(run_id: str, what: str) -> str:
    """``what``: ``run``, ``lease:<n>`` or ``effect:<seq that started it>``."""
    return _hex(f"handoff:span:{run_id}:{what}", 16)


def safe_attrs(attrs: dict[str, Attr]) -> dict[str, Attr]:
    """A record's attrs without any whose name says key, token, secret or password."""
    return {k: v for k, v in attrs.items() if not _SECRET_NAME.search(k)}


class _Lease:
    def __init__(self, span: Span) -> None:
        self.span = span
        self.beats: list[tuple[int, int]] = []  # (seq, µs)


class _Fold:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.root = Span(span_id_for(run_id, "run"), None, "invoke_workflow handoff", 0, 0,
                         {OP: "invoke_workflow", WORKFLOW_NAME: "handoff", "handoff.run_id": run_id}, [])
        self.spans: list[Span] = [self.root]
        self.leases: dict[int, _Lease] = {}
        self.open_lease: int | None = None
        self.effects: dict[str, Span] = {}  # open side effects by key (the key itself is never exported)
        self.effect_lease: dict[str, int | None] = {}
        self.trace_id: str | None = None
        self.remote_parent: str | None = None
        self.keys: set[str] = set()
        self.digests: set[str] = set()  # of the run's lease tokens' secrets
        self.usage: dict[str, dict[str, int | float]] = {}  # span id -> usage sums

    # --- where an event goes ------------------------------------------------------

    def owner_span(self, rec: Recorded) -> Span:
        held = self.leases.get(rec.lease) if rec.lease is not None else None
        if held is not None and rec.actor.startswith("worker:"):
            return held.span
        return self.root

    def event(self, span: Span, rec: Recorded, e: ev.Event, extra: dict[str, Attr] | None = None) -> None:
        attrs: dict[str, Attr] = {"handoff.seq": rec.seq}
        for name, value in msgspec.structs.asdict(e).items():
            if name in _NEVER or value is None or value is ev.UNSET or value == "":
                continue
            if isinstance(value, (str, int, float, bool)):
                attrs[f"handoff.{name}"] = value
            elif isinstance(value, (tuple, list)):
                attrs[f"handoff.{name}.count"] = len(value)
        target = getattr(e, "target", None)
        if isinstance(target, str) and target:
            attrs["handoff.target.kind"] = target.split(":", 1)[0]
        attrs.update(extra or {})
        attrs.update(safe_attrs(ev.attrs_of(e)))
        span.events.append(SpanEvent(f"handoff.{rec.type}", rec.recorded_us, attrs))

    def count_usage(self, spans: Iterable[Span], attrs: dict[str, Attr]) -> None:
        for span in spans:
            sums = self.usage.setdefault(span.span_id, {})
            for name in USAGE:
                value = attrs.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    sums[name] = sums.get(name, 0) + value
            model = attrs.get(MODEL, attrs.get("model"))
            if isinstance(model, str):
                span.attributes[MODEL] = model

    # --- the rules ----------------------------------------------------------------

    def add(self, rec: Recorded, e: ev.Event, before: ckp.Checkpoint, after: ckp.Checkpoint) -> None:
        if rec.idempotency_key:
            self.keys.add(rec.idempotency_key)
        attrs = ev.attrs_of(e)
        if self.trace_id is None and isinstance(attrs.get(TRACE_ID_ATTR), str):
            tid = str(attrs[TRACE_ID_ATTR]).lower()
            if _HEX32.fullmatch(tid) and tid.strip("0"):
                self.trace_id = tid
                sid = str(attrs.get(SPAN_ID_ATTR, "")).lower()
                self.remote_parent = sid if _HEX16.fullmatch(sid) and sid.strip("0") else None
        span = self.owner_span(rec)
        if attrs:
            self.count_usage([self.root] if span is self.root else [self.root, span], attrs)
        match e:
            case ev.HandoffOpened() | ev.RunForked():
                if isinstance(e, ev.RunForked):
                    self.root.attributes["handoff.fork.parent"] = e.parent
                    self.root.attributes["handoff.fork.parent_seq"] = e.parent_seq
                self.event(self.root, rec, e)
            case ev.LeaseGranted():
                if e.token_digest:
                    self.digests.add(e.token_digest)
                if self.open_lease is not None:
                    self.end_lease(self.open_lease, rec, "superseded")
                s = Span(span_id_for(self.run_id, f"lease:{e.lease}"), self.root.span_id, f"invoke_agent {e.worker}",
                         rec.recorded_us, rec.recorded_us,
                         {OP: "invoke_agent", AGENT_NAME: e.worker, AGENT_ID: f"{self.run_id}/lease-{e.lease}",
                          "handoff.lease": e.lease, "handoff.seq.first": rec.seq}, [])
                self.spans.append(s)
                self.leases[e.lease] = _Lease(s)
                self.open_lease = e.lease
            case ev.LeaseReleased() | ev.LeaseRevoked():
                if isinstance(e, ev.LeaseReleased):
                    why = "released"
                else:
                    why = "lost" if rec.actor.startswith("watchdog:") else "revoked"
                self.end_lease(e.lease, rec, why, e.reason)
            case ev.HeartbeatRecorded():
                held = self.leases.get(rec.lease) if rec.lease is not None else None
                if held is not None:
                    held.beats.append((rec.seq, rec.recorded_us))
            case ev.SideEffectStarted():
                parent = self.owner_span(rec)
                tool = attrs.get(TOOL_NAME)
                a: dict[str, Attr] = {OP: "execute_tool", "handoff.effect.what": e.what,
                                      "handoff.seq.first": rec.seq, "handoff.effect.outcome": "pending"}
                if isinstance(tool, str):
                    a[TOOL_NAME] = tool
                a.update(safe_attrs(attrs))
                if rec.lease is not None:
                    a["handoff.lease"] = rec.lease
                s = Span(span_id_for(self.run_id, f"effect:{rec.seq}"), parent.span_id,
                         f"execute_tool {tool}" if isinstance(tool, str) else "execute_tool", rec.recorded_us,
                         rec.recorded_us, a, [])
                self.spans.append(s)
                self.effects[e.key] = s
                self.effect_lease[e.key] = rec.lease
                self.keys.add(e.key)
            case ev.SideEffectConfirmed() | ev.ReconciliationRecorded():
                s = self.effects.pop(e.key, None)
                if s is not None:
                    reconciled = isinstance(e, ev.ReconciliationRecorded)
                    outcome = f"reconciled_{e.outcome}" if reconciled else e.outcome
                    self.end_effect(s, rec, outcome)
                    self.event(s, rec, e)
                    s.attributes.update(safe_attrs(attrs))
                else:
                    self.event(span, rec, e)
            case ev.StateChanged():
                if e.from_state != e.to_state:
                    self.event(span, rec, e)
            case ev.DeliveryAttempted() | ev.DeliveryConfirmed() | ev.DeliveryFailed() | ev.DeliveryUnanswered():
                self.keys.add(e.key)
                self.event(self.root, rec, e)
            case _:
                extra: dict[str, Attr] = {}
                if isinstance(e, ev.ProgressRecorded):
                    extra["handoff.progress_seq"] = after.progress_seq
                self.event(span, rec, e, extra)

    def end_lease(self, lease: int, rec: Recorded, why: str, reason: str = "") -> None:
        held = self.leases.get(lease)
        if held is None or "handoff.lease.end" in held.span.attributes:
            return
        s = held.span
        s.end_us = rec.recorded_us
        s.attributes["handoff.lease.end"] = why
        s.attributes["handoff.seq.last"] = rec.seq
        if reason:
            s.attributes["handoff.lease.end_reason"] = reason
        if why in ("revoked", "lost"):
            s.status, s.status_message = "error", f"lease {lease} {why}" + (f": {reason}" if reason else "")
        if self.open_lease == lease:
            self.open_lease = None
        for key, started_by in self.effect_lease.items():  # its side effects in flight: outcome unknown
            if started_by == lease and key in self.effects:
                fx = self.effects[key]
                fx.attributes["handoff.effect.outcome"] = "unknown"
                fx.status, fx.status_message = "error", f"outcome unknown: lease {lease} ended before it was confirmed"
                fx.events.append(SpanEvent("handoff.effect_unknown", rec.recorded_us,
                                           {"handoff.seq": rec.seq, "handoff.lease": lease}))

    def end_effect(self, s: Span, rec: Recorded, outcome: str) -> None:
        s.end_us = rec.recorded_us
        s.attributes["handoff.effect.outcome"] = outcome
        s.attributes["handoff.seq.last"] = rec.seq
        if outcome in ("done", "absent", "reconciled_done", "reconciled_absent") and s.status == "error":
            s.status, s.status_message = "unset", ""  # settled after all: the error was the wait

    def beats(self, held: _Lease) -> None:
        beats = held.beats
        if len(beats) <= HEARTBEAT_EVENTS:
            for seq, at in beats:
                held.span.events.append(SpanEvent("handoff.heartbeat_recorded", at, {"handoff.seq": seq}))
            return
        size = -(-len(beats) // HEARTBEAT_EVENTS)  # ceiling: at most HEARTBEAT_EVENTS bins
        for i in range(0, len(beats), size):
            chunk = beats[i:i + size]
            held.span.events.append(SpanEvent("handoff.heartbeats", chunk[0][1], {
                "handoff.heartbeat.count": len(chunk), "handoff.seq.first": chunk[0][0],
                "handoff.seq.last": chunk[-1][0], "handoff.heartbeat.last_us": chunk[-1][1]}))


def build(history: Iterable[Recorded], run_id: str) -> Trace:
    """Fold ``history`` (``EventStore.history(run_id)``: a fork's inherited prefix first)
    into the run's trace. The end of the story is the run's last event."""
    f = _Fold(run_id)
    cp = ckp.initial(run_id)
    first = last = 0
    start_us = end_us = None
    for rec in history:
        e = rec.event
        before, cp = cp, ckp.evolve(cp, rec, e)
        if rec.run_id != run_id:
            continue  # a fork's inherited prefix: it is in the parent's trace
        first = first or rec.seq
        last = rec.seq
        start_us = rec.recorded_us if start_us is None else start_us
        end_us = rec.recorded_us if end_us is None else max(end_us, rec.recorded_us)
        f.add(rec, e, before, cp)
    if start_us is None or end_us is None:
        raise ValueError(f"run {run_id} has no events to trace")
    root = f.root
    root.start_us, root.end_us = start_us, end_us
    p = ckp.packet(cp, now_us=end_us)
    root.attributes.update({
        "handoff.seq.first": first, "handoff.seq.last": last, "handoff.progress_seq": cp.progress_seq,
        "handoff.state": cp.state, "handoff.health": p["health"]["classification"],
    })
    if cp.lease is not None:
        root.attributes["handoff.lease"] = cp.lease
    if cp.disposition in (T.FAILED, T.CANCELLED):
        root.status, root.status_message = "error", f"run {cp.state}" + (f": {cp.closed_reason}" if cp.closed_reason else "")
    elif cp.state in (T.SUCCEEDED, T.DELIVERED):
        root.status = "ok"
    for lease, held in f.leases.items():
        if "handoff.lease.end" not in held.span.attributes:
            held.span.end_us = end_us
            held.span.attributes["handoff.lease.end"] = "held"
            held.span.attributes["handoff.seq.last"] = last
        f.beats(held)
    for s in f.effects.values():  # still open at the end of the log
        s.end_us = end_us
    for span in f.spans:
        span.attributes.update(f.usage.get(span.span_id, {}))
    if f.remote_parent is not None:
        root.parent_id = f.remote_parent
    for span in f.spans:
        scrub(span, f.keys, f.digests)
    return Trace(run_id, f.trace_id or trace_id_for(run_id), f.remote_parent, f.spans, first, last)


def _windows(run: str) -> Iterable[tuple[int, int]]:
    """Where a lease secret may stand inside a run of URL-safe base64 characters: the whole
    run, and ``_SECRET_LEN`` characters from any start (a short run) or from its ends and
    each ``_``/``-`` in it (a long run: bounded work, and ``idem_<secret>`` still found)."""
    n = len(run)
    if n <= 128:
        yield 0, n
    if n <= _SECRET_LEN:
        return
    if n <= 256:
        starts: Iterable[int] = range(n - _SECRET_LEN + 1)
    else:
        cuts = [i for i, c in enumerate(run) if c in "_-"]
        starts = {0, n - _SECRET_LEN, *(i + 1 for i in cuts), *(i - _SECRET_LEN for i in cuts)}
    for a in starts:
        if 0 <= a <= n - _SECRET_LEN:
            yield a, a + _SECRET_LEN


def _lease_secrets(value: str, digests: frozenset[str]) -> str:
    """``value`` with each stretch that is the secret of one of the run's lease tokens
    (its digest is in ``digests``) replaced by the placeholder."""
    out, at = [], 0
    for m in _SECRETISH.finditer(value):
        run = m.group()
        hit = next(((a, b) for a, b in _windows(run) if lease_digest(run[a:b]) in digests), None)
        if hit is not None:
            out += [value[at:m.start() + hit[0]], REDACTED_TOKEN]
            at = m.start() + hit[1]
    return "".join(out) + value[at:] if out else value


def _clean(value: Attr, keys: re.Pattern[str] | None, digests: frozenset[str] = frozenset()) -> Attr:
    if not isinstance(value, str):
        return value
    if keys is not None:
        value = keys.sub(REDACTED_KEY, value)
    value = _TOKEN.sub(REDACTED_TOKEN, value)
    return _lease_secrets(value, digests) if digests else value


def scrub(span: Span, keys: set[str], digests: Iterable[str] = ()) -> None:
    """Replace every idempotency or side-effect key of the run, anything shaped like a
    lease token, and the secret of any of the run's lease tokens (``digests``: their
    ``token_digest``s) in the span's text (a worker may have written one into a detail).
    A key is matched as a value, wherever it stands (``key:K``, ``idem_K``, ``X-K``); one
    shorter than ``_SHORT_KEY`` only where no letter or digit touches it."""
    ordered = sorted((k for k in keys if k), key=len, reverse=True)  # the longest first
    pattern = (re.compile("|".join(
        re.escape(k) if len(k) >= _SHORT_KEY else rf"(?<![A-Za-z0-9]){re.escape(k)}(?![A-Za-z0-9])"
        for k in ordered)) if ordered else None)
    known = frozenset(digests)
    span.name = str(_clean(span.name, pattern, known))
    span.status_message = str(_clean(span.status_message, pattern, known))
    span.attributes = {k: _clean(v, pattern, known) for k, v in span.attributes.items()}
    span.events = [SpanEvent(x.name, x.at_us, {k: _clean(v, pattern, known) for k, v in x.attributes.items()})
                   for x in span.events]
