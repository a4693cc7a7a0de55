"""A run as one trace: the SDK's spans, an OTLP/HTTP collector, the report's lanes, --follow.

The story: a contract; agent-1 plans, starts a side effect and goes silent; the watchdog
revokes its lease (lost) and the effect's outcome is unknown; agent-2 claims, reconciles
it, works through more than HEARTBEAT_EVENTS heartbeats, submits; the owner delivers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GA  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from handoff import Ledger  # noqa: E402
from handoff.integrations import otel as ot  # noqa: E402
from handoff.ledger.errors import CollectorUnavailable, InvalidInput  # noqa: E402
from handoff.reducers import trace as tr  # noqa: E402
from handoff.watchdog import watch_once  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
WORKER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
WORKER_SPAN = "00f067aa0ba902b7"
BEATS = tr.HEARTBEAT_EVENTS + 7


def story(db: str, run_id: str = "r1", *, worker_trace: bool = False) -> dict:
    """Write the story; returns the keys and tokens that must never reach a trace.

    Every beat is logged (``beat_mark_s=0``: each is a summary mark), as a worker's beats
    over a long lease are: the trace draws the beats the log holds, and this story needs
    more of them than the trace lists one by one."""
    with Ledger(db, beat_mark_s=0) as lg:
        run = lg.open(goal="Post the summary", target="https://hooks.example/T0/B0/xoxb-secret", owner="alice",
                      run_id=run_id, heartbeat_timeout_s=30, key=f"open-key-{run_id}")
        t1 = lg.claim(run, "agent-1", key=f"claim-key-{run_id}")
        lg.transition(run, t1, "planning", worker="agent-1")
        attrs = {"gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 300, "model": "test-model",
                 "lease_token": str(t1)}
        if worker_trace:
            attrs |= {"trace_id": WORKER_TRACE, "span_id": WORKER_SPAN}
        lg.progress(run, t1, "plan_committed", f"plan; retry with claim-key-{run_id} and {t1}", worker="agent-1",
                    attrs=attrs, key=f"plan-key-{run_id}")
        lg.transition(run, t1, "executing", worker="agent-1")
        lg.effect_start(run, t1, f"fx-key-{run_id}", "post the link", worker="agent-1",
                        attrs={"gen_ai.tool.name": "post_link", "gen_ai.tool.call.id": "call-1"})
        later = lg.clock() + 120 * 1_000_000
        watch_once(lg, name="wd", now_us=later)  # agent-1 is silent: revoked (lost), the effect unknown
        t2 = lg.claim(run, "agent-2")
        lg.effect_confirm(run, f"fx-key-{run_id}", "done", note="the link is in the channel", lease=t2)
        for _ in range(BEATS):
            assert lg.heartbeat(run, t2, attrs={"gen_ai.usage.input_tokens": 10}).result.outcome == "committed"
        if lg.status(run)["state"] != "executing":
            lg.transition(run, t2, "executing")
        out = Path(db).parent / f"{run_id}-summary.md"
        out.write_text("# Summary\n")
        lg.artifact(run, t2, str(out))
        lg.evidence(run, "tests", "pass", "all green", lease=t2)
        lg.transition(run, t2, "verifying")
        lg.submit(run, t2, "done", key=f"submit-key-{run_id}")
        lg.release(run, t2, "finished")
        lg.deliver(run, f"deliver-key-{run_id}", by="alice")
        lg.delivered(run, f"deliver-key-{run_id}", "receipt-1")
        keys = [f"{k}-key-{run_id}" for k in ("open", "claim", "plan", "fx", "submit", "deliver")]
        return {"run": run, "keys": keys, "tokens": [str(t1), str(t2)], "secret": "xoxb-secret"}


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "l.db")


def exported(db: str, run_id: str = "r1"):
    mem = InMemorySpanExporter()
    with Ledger(db, readonly=True) as lg:
        doc = ot.export_runs(lg, [run_id], mem)
    return mem.get_finished_spans(), doc


def test_spans_follow_the_genai_conventions(db):
    story(db)
    spans, doc = exported(db)
    by_name = {s.name: s for s in spans}
    assert [s.name for s in spans] == ["invoke_workflow handoff", "invoke_agent agent-1", "execute_tool post_link",
                                       "invoke_agent agent-2"]
    root, a1, tool, a2 = (by_name[n] for n in ("invoke_workflow handoff", "invoke_agent agent-1",
                                               "execute_tool post_link", "invoke_agent agent-2"))
    assert doc["spans"] == 4 and doc["runs"][0]["run_id"] == "r1"
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert all(s.kind is SpanKind.INTERNAL for s in spans)
    # parents: the run's root has none; leases hang under it; the tool under the lease that started it
    assert root.parent is None
    assert a1.parent.span_id == root.context.span_id and a2.parent.span_id == root.context.span_id
    assert tool.parent.span_id == a1.context.span_id
    # the conventions' names and values
    Op = GA.GenAiOperationNameValues
    assert root.attributes[GA.GEN_AI_OPERATION_NAME] == Op.INVOKE_WORKFLOW.value
    assert root.attributes[GA.GEN_AI_WORKFLOW_NAME] == "handoff"
    assert a1.attributes[GA.GEN_AI_OPERATION_NAME] == Op.INVOKE_AGENT.value
    assert a1.attributes[GA.GEN_AI_AGENT_NAME] == "agent-1" and a2.attributes[GA.GEN_AI_AGENT_NAME] == "agent-2"
    assert tool.attributes[GA.GEN_AI_OPERATION_NAME] == Op.EXECUTE_TOOL.value
    assert tool.attributes[GA.GEN_AI_TOOL_NAME] == "post_link" and tool.attributes[GA.GEN_AI_TOOL_CALL_ID] == "call-1"
    assert a1.attributes[GA.GEN_AI_USAGE_INPUT_TOKENS] == 1200 and a1.attributes[GA.GEN_AI_USAGE_OUTPUT_TOKENS] == 300
    assert a1.attributes[GA.GEN_AI_REQUEST_MODEL] == "test-model"
    assert a2.attributes[GA.GEN_AI_USAGE_INPUT_TOKENS] == 10 * BEATS
    assert root.attributes[GA.GEN_AI_USAGE_INPUT_TOKENS] == 1200 + 10 * BEATS
    # the ledger's own facts, under handoff.*
    with Ledger(db, readonly=True) as lg:
        p = lg.status("r1")
    assert root.attributes["handoff.run_id"] == "r1"
    assert root.attributes["handoff.state"] == p["state"] == "delivered"
    assert root.attributes["handoff.progress_seq"] == p["progress_seq"]
    assert root.attributes["handoff.health"] == p["health"]["classification"]
    assert (root.attributes["handoff.seq.first"], root.attributes["handoff.seq.last"]) == (1, p["last_seq"])
    assert root.status.status_code is StatusCode.OK
    # how each lease ended, and the side effect's story
    assert a1.attributes["handoff.lease.end"] == "lost" and a1.status.status_code is StatusCode.ERROR
    assert a2.attributes["handoff.lease.end"] == "released" and a2.attributes["handoff.lease"] == 2
    assert tool.attributes["handoff.effect.outcome"] == "reconciled_done"
    assert [e.name for e in tool.events] == ["handoff.effect_unknown", "handoff.reconciliation_recorded"]
    # heartbeats past the bound are binned, every beat counted once
    bins = [e for e in a2.events if e.name == "handoff.heartbeats"]
    assert len(bins) <= tr.HEARTBEAT_EVENTS and sum(e.attributes["handoff.heartbeat.count"] for e in bins) == BEATS
    assert not [e for e in a2.events if e.name == "handoff.heartbeat_recorded"]
    # the rest as events where they belong
    names = [e.name for e in root.events]
    for name in ("handoff.handoff_opened", "handoff.delivery_attempted", "handoff.delivery_confirmed",
                 "handoff.recovery_decided"):
        assert name in names
    a2_names = [e.name for e in a2.events]
    for name in ("handoff.artifact_recorded", "handoff.evidence_recorded", "handoff.result_submitted"):
        assert name in a2_names
    progress = next(e for e in a1.events if e.name == "handoff.progress_recorded")
    assert progress.attributes["handoff.kind"] == "plan_committed"
    assert progress.attributes["handoff.progress_seq"] == 2


def test_no_key_token_or_delivery_address_is_exported(db):
    secrets = story(db)
    spans, _ = exported(db)
    text = json.dumps(ot.otlp_json(spans))
    with Ledger(db, readonly=True) as lg:
        digests = [r.event.token_digest for r in lg.log("r1") if r.type == "lease_granted"]
    for needle in [*secrets["keys"], *secrets["tokens"], *(t.split(".", 1)[1] for t in secrets["tokens"]),
                   *digests, secrets["secret"], "hooks.example"]:
        assert needle not in text, needle
    assert tr.REDACTED_KEY in text and tr.REDACTED_TOKEN in text  # the detail said them: replaced


def test_the_same_run_exports_the_same_trace_and_a_worker_trace_is_joined(db, tmp_path):
    story(db)
    first, _ = exported(db)
    again, _ = exported(db)
    ids = [(s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None) for s in first]
    assert ids == [(s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None) for s in again]
    assert first[0].context.trace_id == int(tr.trace_id_for("r1"), 16)
    other = str(tmp_path / "other.db")
    story(other, worker_trace=True)
    joined, _ = exported(other)
    assert {s.context.trace_id for s in joined} == {int(WORKER_TRACE, 16)}
    assert joined[0].parent.span_id == int(WORKER_SPAN, 16) and joined[0].parent.is_remote


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()
        self.wfile.write(b"")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector():
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, _Collector.received
    server.shutdown()
    server.server_close()


def test_the_cli_posts_otlp_protobuf_to_a_collector(db, collector):
    story(db)
    server, received = collector
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, "otel", "r1", "--endpoint", endpoint,
                           "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["endpoint"] == endpoint + "/v1/traces" and doc["spans"] == 4
    [(path, ctype, body)] = received
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    req = ExportTraceServiceRequest.FromString(body)
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for s in spans] == ["invoke_workflow handoff", "invoke_agent agent-1", "execute_tool post_link",
                                       "invoke_agent agent-2"]
    assert {s.trace_id.hex() for s in spans} == {doc["runs"][0]["trace_id"]} == {tr.trace_id_for("r1")}
    assert spans[1].parent_span_id == spans[0].span_id
    attrs = {kv.key: kv.value for kv in spans[0].attributes}
    assert attrs["handoff.run_id"].string_value == "r1"


def test_an_unreachable_collector_is_exit_3_and_the_ledger_is_untouched(db, collector):
    story(db)
    server, _ = collector
    port = server.server_address[1]
    server.shutdown()
    server.server_close()  # nothing listens there now
    with Ledger(db, readonly=True) as lg:
        before = lg.ledger_head_digest()
    env = dict(os.environ, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="2")
    proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, "otel", "r1", "--endpoint",
                           f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == CollectorUnavailable.exit_code == 3
    assert "Traceback" not in proc.stderr and "did not take the traces" in proc.stderr
    with Ledger(db, readonly=True) as lg:
        assert lg.ledger_head_digest() == before


def test_the_trace_tells_the_story_of_the_report(db):
    """Every lease span and side-effect span of the report's timeline is a span of the
    trace, over the same interval, ending the same way."""
    story(db)
    spans, _ = exported(db)
    with Ledger(db, readonly=True) as lg:
        tl = lg.report("r1")
    leases = [i for i in tl.items if i.lane.startswith("lease:")]
    agent_spans = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert len(leases) == len(agent_spans) == 2
    ends = {"lease-released": {"released"}, "lease-revoked": {"revoked", "lost"}, "lease-superseded": {"superseded"},
            "lease-held": {"held"}}
    for item, span in zip(leases, agent_spans, strict=True):
        assert item.lane == f"lease:{span.attributes[GA.GEN_AI_AGENT_NAME]}"
        assert (item.start_us * 1000, item.end_us * 1000) == (span.start_time, span.end_time)
        assert span.attributes["handoff.lease.end"] in ends[item.kind]
    effects = [i for i in tl.items if i.lane == "effects" and i.end_us is not None]
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert len(effects) == len(tools) == 1
    assert (effects[0].start_us * 1000, effects[0].end_us * 1000) == (tools[0].start_time, tools[0].end_time)
    assert effects[0].kind == "effect-reconciled" and tools[0].attributes["handoff.effect.outcome"].startswith(
        "reconciled_")
    unknown = [i for i in tl.items if i.kind == "effect-unknown"]
    marks = [e for e in tools[0].events if e.name == "handoff.effect_unknown"]
    assert [i.seq for i in unknown] == [e.attributes["handoff.seq"] for e in marks]
    # the state lane's bands are the state changes on the spans
    bands = [i.label for i in tl.items if i.lane == "state" and i.kind.startswith("state-")]
    changes = sorted((e for s in spans for e in s.events if e.name == "handoff.state_changed"),
                     key=lambda e: e.attributes["handoff.seq"])
    assert bands == ["queued", *(e.attributes["handoff.to_state"] for e in changes)]
    root = spans[0]
    assert (root.start_time, root.end_time) == (tl.start_us * 1000, tl.end_us * 1000)


def test_follow_resumes_from_its_state_file(db, tmp_path):
    story(db, "r1")
    state = str(tmp_path / "otel.state")
    sent: list[dict] = []
    mem = InMemorySpanExporter()
    with Ledger(db) as lg:
        pos = ot.follow(lg, mem, state, poll_s=0.05, should_stop=lambda: True, on_export=sent.append)
        assert pos == lg.store.last_position() and [d["runs"][0]["run_id"] for d in sent] == ["r1"]
        # a restart with nothing new sends nothing
        sent.clear()
        mem.clear()
        assert ot.follow(lg, mem, state, poll_s=0.05, should_stop=lambda: True, on_export=sent.append) == pos
        assert sent == [] and mem.get_finished_spans() == ()
        # a second run, then a change to the first: each exported once, in log order
        story(db, "r2")
        lg.watcher_beat("wd2", 5.0)  # a watcher's stream is not a run
        r3 = lg.open(goal="g", target="chat:#x", owner="o", run_id="r3")
        assert ot.follow(lg, mem, state, poll_s=0.05, should_stop=lambda: True,
                         on_export=sent.append) == lg.store.last_position()
        assert [r["run_id"] for d in sent for r in d["runs"]] == ["r2", r3]
        assert json.loads(Path(state).read_text())["position"] == lg.store.last_position()


def test_follow_does_not_move_on_when_the_collector_refuses(db, tmp_path):
    story(db)
    state = str(tmp_path / "otel.state")

    class Refusing(InMemorySpanExporter):
        def export(self, spans):
            from opentelemetry.sdk.trace.export import SpanExportResult
            return SpanExportResult.FAILURE

    errors: list[CollectorUnavailable] = []
    with Ledger(db) as lg:
        with pytest.raises(CollectorUnavailable):
            ot.follow(lg, Refusing(), state, poll_s=0.05, should_stop=lambda: True)
        assert not Path(state).exists()
        assert ot.follow(lg, Refusing(), state, poll_s=0.05, should_stop=lambda: len(errors) >= 2,
                         on_error=errors.append) == 0
        assert len(errors) == 2 and not Path(state).exists()


def test_a_state_file_of_another_ledger_is_refused(db, tmp_path):
    story(db)
    other = str(tmp_path / "other.db")
    story(other, "x1")
    state = str(tmp_path / "otel.state")
    with Ledger(other) as lg:
        ot.follow(lg, InMemorySpanExporter(), state, poll_s=0.05, should_stop=lambda: True)
    kept = Path(state).read_text()
    with Ledger(db) as lg, pytest.raises(InvalidInput, match="another ledger"):
        ot.follow(lg, InMemorySpanExporter(), state, poll_s=0.05, should_stop=lambda: True)
    assert Path(state).read_text() == kept
    Path(state).write_text("not json")
    with Ledger(db) as lg, pytest.raises(InvalidInput, match="not a state file"):
        ot.follow(lg, InMemorySpanExporter(), state, poll_s=0.05, should_stop=lambda: True)


def test_cli_follow_writes_json_lines_and_resumes(db, tmp_path):
    story(db)
    out, state = tmp_path / "traces.jsonl", tmp_path / "otel.state"
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "handoff.cli", "--db", db, "otel", "--follow", "--state", str(state),
                             "-o", str(out), "--poll", "0.05", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = json.loads(proc.stdout.readline())
        assert line["runs"][0]["run_id"] == "r1" and line["output"] == str(out)
        with Ledger(db) as lg:
            lg.open(goal="g", target="chat:#x", owner="o", run_id="r2")
        line = json.loads(proc.stdout.readline())
        assert [r["run_id"] for r in line["runs"]] == ["r2"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()
    docs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(docs) == 2 and all("resourceSpans" in d for d in docs)
    assert docs[1]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == tr.trace_id_for("r2")


def test_cli_usage_errors_name_the_fix(db):
    story(db)
    for args, says in ((["otel"], "name at least one RUN"), (["otel", "--follow"], "--follow needs --state"),
                       (["otel", "r1", "-o", "x.json", "--endpoint", "http://h"], "not both")):
        proc = subprocess.run([sys.executable, "-m", "handoff.cli", "--db", db, *args], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
