"""Runs as OpenTelemetry traces: to a collector over OTLP/HTTP, or to a JSON file.

The mapping is the pure fold ``handoff.reducers.trace`` (which spans, which events,
which attributes, which ids); this module turns its result into the SDK's spans and hands
them to an exporter, and keeps the follower's position. Needs the ``otel`` extra
(``pip install '.[otel]'`` in the checkout); nothing here is imported by the CLI until
``handoff otel`` runs.

Where the follower records how far it got: in a small state file of its own (``--state``),
never in the ledger. The exporter then only reads the ledger (it can follow a read-only
copy or a replica), it adds no events to the log for bookkeeping, and two followers
sending to two collectors keep two positions without a shared name. The file also holds
the ledger's own hash at that position, so a state file from another ledger, or a ledger
rebuilt since, is refused rather than silently skipping runs.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from handoff.ledger import files
from handoff.ledger.errors import CollectorUnavailable, InvalidInput, UnknownRun
from handoff.reducers import trace as tr

if TYPE_CHECKING:
    from handoff.facade import Ledger

#: Where an OpenTelemetry collector listens for OTLP over HTTP on this machine.
DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
SCOPE = InstrumentationScope("handoff-ledger", None)
RESOURCE = Resource.create({"service.name": "handoff-ledger"})
#: At most this many runs go into one export of ``follow``, so a long backlog is sent in
#: bounded requests and the position moves after each.
FOLLOW_BATCH = 50
STATE_VERSION = 1
_STATUS = {"unset": StatusCode.UNSET, "ok": StatusCode.OK, "error": StatusCode.ERROR}


# --- the run's trace as SDK spans ---------------------------------------------------------


def is_run(lg: Ledger, stream_id: str) -> bool:
    """Whether the stream is a handoff run (not a watcher's beats or another stream)."""
    first = next(iter(lg.store.read_run(stream_id, until_seq=1)), None)
    return first is not None and first.type in ("handoff_opened", "run_forked")


def trace_of(lg: Ledger, run_id: str) -> tr.Trace:
    """The run's trace (``reducers.trace.build`` over its history, a fork's prefix included)."""
    if lg.store.head(run_id) is None or not is_run(lg, run_id):
        raise UnknownRun(f"no run {run_id} in {lg.store.path}; list runs with 'handoff status --all'")
    return tr.build(lg.store.history(run_id), run_id)


def _ns(us: int) -> int:
    return us * 1000


def readable_spans(t: tr.Trace, *, resource: Resource = RESOURCE) -> list[ReadableSpan]:
    """The trace as finished SDK spans, ready for any ``SpanExporter``."""
    trace_id = int(t.trace_id, 16)
    out: list[ReadableSpan] = []
    for s in t.spans:
        ctx = SpanContext(trace_id, int(s.span_id, 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        parent = None
        if s.parent_id is not None:
            remote = s.parent_id == t.remote_parent
            parent = SpanContext(trace_id, int(s.parent_id, 16), is_remote=remote,
                                 trace_flags=TraceFlags(TraceFlags.SAMPLED))
        status = Status(_STATUS[s.status], s.status_message or None) if s.status == "error" else Status(_STATUS[s.status])
        out.append(ReadableSpan(
            name=s.name, context=ctx, parent=parent, resource=resource, attributes=dict(s.attributes),
            events=[Event(x.name, dict(x.attributes), _ns(x.at_us)) for x in s.events],
            kind=SpanKind.INTERNAL, status=status, start_time=_ns(s.start_us), end_time=_ns(s.end_us),
            instrumentation_scope=SCOPE))
    return out


def otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The spans as one OTLP/JSON ``ExportTraceServiceRequest`` (what a collector's
    ``otlpjsonfile`` receiver reads): the protobuf's JSON mapping, with ids in hex as the
    OTLP JSON encoding requires instead of base64."""
    doc = json_format.MessageToDict(encode_spans(spans))

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                    node[k] = base64.b64decode(v).hex()
                else:
                    fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)

    fix(doc)
    return doc


# --- exporters ----------------------------------------------------------------------------


def traces_url(endpoint: str) -> str:
    """``endpoint`` as the collector's traces URL: a base address gets ``/v1/traces``.

    An address holding ``@`` is refused first and never shown: a user name or password in
    it would reach the terminal, ``--json`` output and logs. A collector's credentials go in
    ``OTEL_EXPORTER_OTLP_TRACES_HEADERS``, which the exporter reads and nothing prints."""
    if isinstance(endpoint, str) and "@" in endpoint:
        raise InvalidInput("the collector's address holds '@', as a user name or password before the host does; "
                           "it is not shown here. Give the address without it (e.g. https://otlp.example.com) and "
                           "put the credentials in OTEL_EXPORTER_OTLP_TRACES_HEADERS (e.g. "
                           "'Authorization=Basic%20...'); write a '@' in the path as %40", field="endpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise InvalidInput(f"the collector's address must start with http:// or https://, got {str(endpoint)[:80]!r} "
                           f"(e.g. {DEFAULT_ENDPOINT})", field="endpoint")
    try:
        parts = urllib.parse.urlsplit(endpoint)
        host, _ = parts.hostname, parts.port  # a bad IPv6 literal or port raises here
    except ValueError as exc:
        raise InvalidInput(f"the collector's address {endpoint[:80]!r} is not a valid URL ({exc}); write it as "
                           f"{DEFAULT_ENDPOINT} or http://[::1]:4318", field="endpoint") from None
    if not host:
        raise InvalidInput(f"the collector's address {endpoint[:80]!r} names no host (e.g. {DEFAULT_ENDPOINT})",
                           field="endpoint")
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def otlp_exporter(endpoint: str = DEFAULT_ENDPOINT, *, timeout_s: float | None = None) -> SpanExporter:
    """The SDK's OTLP/HTTP (protobuf) exporter to ``endpoint`` (a base address or the full
    ``/v1/traces`` URL); the timeout, headers and certificates from the usual
    ``OTEL_EXPORTER_OTLP_TRACES_*`` variables unless ``timeout_s`` is given."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_url(endpoint), timeout=timeout_s)


class JsonLinesExporter(SpanExporter):
    """Appends each export to ``path`` as one line of OTLP/JSON, written with one call so a
    reader never sees half a line from a live exporter."""

    def __init__(self, path: str) -> None:
        self.path = files.check_target(path, "output")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = (json.dumps(otlp_json(spans), separators=(",", ":")) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def send(exporter: SpanExporter, spans: Sequence[ReadableSpan], where: str) -> None:
    try:
        result = exporter.export(spans)
    except Exception as exc:  # an exporter's own failure, whatever its type: the ledger is untouched
        raise CollectorUnavailable(f"the traces could not be sent to {where}: {type(exc).__name__}: {exc}; "
                                   "check that the collector runs there, then run the command again",
                                   where=where) from exc
    if result is not SpanExportResult.SUCCESS:
        raise CollectorUnavailable(f"the collector at {where} did not take the traces (unreachable or it answered "
                                   "with an error); check that it runs there (the default is an OpenTelemetry "
                                   f"collector's OTLP/HTTP port, {DEFAULT_ENDPOINT}), then run the command again",
                                   where=where)


def summary(traces: Iterable[tr.Trace]) -> list[dict[str, Any]]:
    return [{"run_id": t.run_id, "trace_id": t.trace_id, "spans": len(t.spans), "first_seq": t.first_seq,
             "last_seq": t.last_seq} for t in traces]


def export_runs(lg: Ledger, run_ids: Sequence[str], exporter: SpanExporter, *, where: str = "the exporter") -> dict[str, Any]:
    """Send each run's trace through ``exporter`` in one batch. Returns ``{"runs": [{"run_id",
    "trace_id", "spans", "first_seq", "last_seq"}], "spans"}`` (``handoff otel --json``)."""
    traces = [trace_of(lg, r) for r in run_ids]
    spans = [s for t in traces for s in readable_spans(t)]
    send(exporter, spans, where)
    return {"runs": summary(traces), "spans": len(spans)}


def write_json(lg: Ledger, run_ids: Sequence[str], path: str) -> dict[str, Any]:
    """The runs' traces as one OTLP/JSON document in ``path``, written whole under a private
    name with the ledger's permissions (a trace holds what the ledger holds), then moved
    into place; a link there is refused. Adds ``"output"`` to ``export_runs``'s document."""
    target = files.check_target(path, "output")
    traces = [trace_of(lg, r) for r in run_ids]
    spans = [s for t in traces for s in readable_spans(t)]
    data = (json.dumps(otlp_json(spans), separators=(",", ":")) + "\n").encode("utf-8")
    files.atomic_write(target, [data], mode=lg.copy_mode(), field="output")
    return {"runs": summary(traces), "spans": len(spans), "output": target}


# --- following the ledger -----------------------------------------------------------------


def read_state(lg: Ledger, path: str) -> int:
    """The position a follower resumes after: 0 for a state file not yet written. A file
    that is not this ledger's (its hash at that position differs) is refused."""
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise InvalidInput(f"the follower's state file {path} cannot be read ({exc.strerror})", field="state") from exc
    try:
        doc = json.loads(raw)
        position, digest = int(doc["position"]), str(doc["hash"])
        if doc.get("version") != STATE_VERSION or position < 0:
            raise ValueError
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"{path} is not a state file of 'handoff otel --follow'; give another --state file "
                           "(a new one starts from the beginning of the ledger)", field="state") from exc
    if position == 0:
        return 0
    have = lg.store.global_hash_at(position)
    if have is None or have.hex() != digest:
        raise InvalidInput(f"the state file {path} records position {position} of another ledger (or of this one "
                           "before it was rebuilt); give a new --state file to export every run again",
                           field="state")
    return position


def write_state(lg: Ledger, path: str, position: int) -> None:
    have = lg.store.global_hash_at(position) if position else b""
    doc = {"version": STATE_VERSION, "position": position, "hash": (have or b"").hex()}
    files.atomic_write(path, [json.dumps(doc).encode("utf-8")], mode=0o600, field="state")


def _changed_runs(lg: Ledger, after: int) -> tuple[list[str], int]:
    """The runs with events after position ``after`` (at most FOLLOW_BATCH of them) and the
    position read up to, in log order."""
    from handoff.ledger.store import WATCHER_PREFIX

    runs: dict[str, None] = {}
    last = after
    for rec in lg.events(since_position=after + 1):
        if rec.run_id not in runs and not rec.run_id.startswith(WATCHER_PREFIX) and is_run(lg, rec.run_id):
            if len(runs) == FOLLOW_BATCH:
                break
            runs[rec.run_id] = None
        last = rec.position
    return list(runs), last


def follow(lg: Ledger, exporter: SpanExporter, state_path: str, *, where: str = "the exporter", poll_s: float = 1.0,
           should_stop: Callable[[], bool] | None = None,
           on_export: Callable[[dict[str, Any]], None] | None = None,
           on_error: Callable[[CollectorUnavailable], None] | None = None) -> int:
    """Export every run as it changes, from the ledger-wide log, until ``should_stop()``.

    Resumes after the position in ``state_path`` (from the start without one) and records
    the position after each export that the exporter took, so a follower killed at any
    point and restarted sends nothing twice but what it had not yet recorded (a collector
    deduplicates it: the ids are the same). A failed export is retried every ``poll_s``
    (``on_error`` is told) while the position stays; without ``on_error`` it raises
    ``CollectorUnavailable``. Returns the last position recorded.
    """
    stop = should_stop or (lambda: False)
    position = read_state(lg, state_path)
    while True:
        runs, last = _changed_runs(lg, position)
        if runs:
            try:
                doc = export_runs(lg, runs, exporter, where=where)
            except CollectorUnavailable as exc:
                if on_error is None:
                    raise
                on_error(exc)
                if stop():
                    return position
                time.sleep(poll_s)
                continue
            doc["position"] = last
            write_state(lg, state_path, last)
            position = last
            if on_export is not None:
                on_export(doc)
            continue  # more may be waiting past the batch
        if last != position:  # only watchers' beats: move past them
            write_state(lg, state_path, last)
            position = last
        if stop():
            return position
        lg.store.wait_for_events(position, poll_s)
        if stop():
            return position


__all__ = ["DEFAULT_ENDPOINT", "JsonLinesExporter", "export_runs", "follow", "otlp_exporter", "otlp_json",
           "read_state", "readable_spans", "trace_of", "traces_url", "write_json", "write_state"]
