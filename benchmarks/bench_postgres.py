"""PostgreSQL scenarios: the durable command, batches, 16 writer processes, catch-up reads,
round trips per command and the cost of NOTIFY, each beside its references in the same run.

References: raw psycopg doing the least a program could do for the same durable result
(one autocommit INSERT per event, 100 rows per transaction, 16 writer processes, a
server-side cursor read plus decode), and eventsourcing's own PostgreSQL persistence
(``eventsourcing.postgres``: an ``Application`` saving an aggregate after each event, and
an aggregate's 100 pending events in one save), configured by its environment keys.

handoff-ledger's side uses the public API only: ``Ledger("postgresql://...")`` and its
commands, ``Ledger.store.append`` / ``read_all`` where the scenario is about the store.
Nothing here reaches into ledger/postgres/, so these scenarios keep measuring whatever
its write path becomes.

Every side works in a fresh schema of the run's own database (benchmarks/postgres_server.py),
at the server's own durability: ``synchronous_commit`` as the server has it (``on`` by
default), recorded in the report's header. Without a server every side reports
``no server`` and the run still exits 0, except under ``CI=true``.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from handoff.ledger import events as ev

from . import peers
from .common import WORKER, expect, raw_decoder, raw_encoder, run_events
from .common import spawn as common_spawn
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register
from .postgres_proxy import CountingProxy
from .postgres_server import CpuMeter, Schema, unavailable

AREA = "postgres"
ES_REQUIRES = ("eventsourcing", "psycopg")
ES_NOTE = ("eventsourcing Application, PERSISTENCE_MODULE=eventsourcing.postgres "
           "(its defaults: LOCK TABLE ... IN EXCLUSIVE MODE and a NOTIFY per save)")

RAW_SCHEMA = (
    "CREATE TABLE events (position bigserial PRIMARY KEY, run_id text NOT NULL, "
    "seq bigint NOT NULL, payload bytea NOT NULL, UNIQUE (run_id, seq))"
)
RAW_INSERT = "INSERT INTO events (run_id, seq, payload) VALUES (%s, %s, %s)"
_ENDINGS = (None, "delivered", "cancelled")


def _side(name: str, prepare: Any, *, note: str = "", requires: tuple[str, ...] = ()) -> Side:
    return Side(name, prepare, requires=requires, note=note, unavailable=unavailable)


def _progress_details(n: int) -> list[str]:
    return [f"step {i}: ran the test suite" for i in range(n)]


def _progress_payloads(n: int) -> list[bytes]:
    return [raw_encoder.encode(ev.ProgressRecorded(kind="tool_outcome", detail=d))
            for d in _progress_details(n)]


def _closing(*parts: Any):
    """A Trial.close that closes each part (a Ledger, a connection, an app), then drops
    the schema, even when one close fails."""

    def close() -> None:
        errors = []
        for p in parts:
            try:
                if isinstance(p, Schema):
                    p.drop()
                else:
                    p.close()
            except Exception as exc:  # report the first after trying them all
                errors.append(exc)
        if errors:
            raise errors[0]

    return close


def _ledger(schema: Schema) -> Any:
    from handoff.facade import Ledger

    return Ledger(schema.url)


def _working_run(lg: Any, run_id: str, worker: str = "w1") -> str:
    """Open a run, claim it and move it to executing; return its lease token. Each run
    has an owner of its own: an owner may hold only 10 active runs (the default cap),
    and pg-writers-16 works 16 at once."""
    owner = f"owner-{run_id}"
    lg.open(goal="benchmark run", target="file:out/result.json", owner=owner, run_id=run_id)
    lease = lg.claim(run_id, worker)
    lg.transition(run_id, lease, "planning", worker=worker)
    lg.transition(run_id, lease, "executing", worker=worker)
    return str(lease)


def _raw_conn(schema: Schema) -> Any:
    conn = schema.connect(autocommit=True)
    conn.execute(RAW_SCHEMA)
    return conn


def _raw_count(conn: Any) -> int:
    return conn.execute("SELECT count(*) FROM events").fetchone()[0]


def _es_app(schema: Schema) -> Any:
    return peers.es_classes()["Runs"](env=schema.es_env())


# --- 1. one durable command per event ------------------------------------------------


def _cmd_handoff(ctx: Ctx) -> Trial:
    n = ctx.params["n"]
    schema = Schema()
    lg = _ledger(schema)
    run_id = "run-cmd"
    lease = _working_run(lg, run_id)
    base = lg.checkpoint(run_id).progress_seq
    details = _progress_details(n)
    meter = CpuMeter(schema.db_url)

    def run() -> Measured:
        meter.start()
        progress = lg.progress
        t0 = time.perf_counter()
        for i, detail in enumerate(details):
            progress(run_id, lease, "tool_outcome", detail, key=f"step-{i}", worker="w1")
        seconds = time.perf_counter() - t0
        return Measured(seconds=seconds, metrics=meter.stop(n))

    def check() -> None:
        expect("progress_seq", lg.checkpoint(run_id).progress_seq, base + n)
        expect("the projected progress_seq", lg.status(run_id)["progress_seq"], base + n)

    return Trial(run, check, _closing(meter, lg, schema))


def _cmd_raw(ctx: Ctx) -> Trial:
    n = ctx.params["n"]
    schema = Schema()
    conn = _raw_conn(schema)
    payloads = _progress_payloads(n)
    meter = CpuMeter(schema.db_url)

    def run() -> Measured:
        meter.start()
        execute = conn.execute
        t0 = time.perf_counter()
        for seq, payload in enumerate(payloads, 1):
            execute(RAW_INSERT, ("run-cmd", seq, payload))
        seconds = time.perf_counter() - t0
        return Measured(seconds=seconds, metrics=meter.stop(n))

    return Trial(run, lambda: expect("row count", _raw_count(conn), n), _closing(meter, conn, schema))


def _cmd_es(ctx: Ctx) -> Trial:
    n = ctx.params["n"]
    schema = Schema()
    app = _es_app(schema)
    agg = peers.es_new_run()
    app.save(agg)
    details = _progress_details(n)
    meter = CpuMeter(schema.db_url)

    def run() -> Measured:
        meter.start()
        save, progress = app.save, agg.progress
        t0 = time.perf_counter()
        for d in details:
            progress("tool_outcome", d)
            save(agg)
        seconds = time.perf_counter() - t0
        return Measured(seconds=seconds, metrics=meter.stop(n))

    def check() -> None:
        expect("the aggregate's version", app.repository.get(agg.id).version, n + 1)

    return Trial(run, check, _closing(meter, app, schema))


register(
    Scenario(
        name="pg-command-single",
        area=AREA,
        title="PostgreSQL: one durable command per event (Ledger.progress under a lease, with a key)",
        measures=(
            "Ledger('postgresql://...').progress(run, lease, 'tool_outcome', detail, key=k) "
            "on a run in executing: the whole command (read the run, idempotency, fencing, "
            "decide, append with hash chains and inline projections through handoff_append), one COMMIT each at "
            "synchronous_commit as the server has it. Reference: raw psycopg, one autocommit "
            "INSERT of the same event's bytes per event (one statement, one commit, one "
            "round trip). Peer: eventsourcing.postgres, aggregate.progress() then app.save() "
            "per event."
        ),
        full={"n": 2_000},
        quick={"n": 40},
        subject=_side("handoff-ledger", _cmd_handoff,
                      note="Ledger.progress on PostgreSQL, one commit each"),
        reference=_side("raw psycopg", _cmd_raw, note="one autocommit INSERT per event"),
        peers=(
            _side("eventsourcing.postgres", _cmd_es, requires=ES_REQUIRES,
                  note=ES_NOTE + "; aggregate.progress() then app.save() per event"),
        ),
        goal=0.5,
        goals=(Goal("at least 2.0x eventsourcing.postgres per-event save", min_ratio=2.0,
                    against="eventsourcing.postgres"),),
        repeat=3,
        warmup=1,
    )
)


# --- 2. 100-event batches ----------------------------------------------------------------


def _batch_work(runs: int, per_run: int) -> list[tuple[str, list[ev.Event]]]:
    return [(f"run-{r:05d}", run_events(per_run, _ENDINGS[r % 3], f"r{r} ")) for r in range(runs)]


def _batch_handoff(ctx: Ctx) -> Trial:
    runs, per_run = ctx.params["runs"], ctx.params["per_run"]
    schema = Schema()
    lg = _ledger(schema)
    work = _batch_work(runs, per_run)

    def run() -> None:
        append = lg.store.append
        for run_id, events in work:
            append(run_id, events, actor=WORKER, expected_seq=0, idempotency_key=f"batch-{run_id}")

    def check() -> None:
        expect("the last position", lg.store.last_position(), runs * per_run)
        expect("checkpoint rows", sum(1 for _ in lg.runs(include_terminal=True)), runs)

    return Trial(run, check, _closing(lg, schema))


def _batch_raw(ctx: Ctx) -> Trial:
    runs, per_run = ctx.params["runs"], ctx.params["per_run"]
    schema = Schema()
    conn = _raw_conn(schema)
    conn.autocommit = False
    encode = raw_encoder.encode
    rows = [[(run_id, seq, encode(e)) for seq, e in enumerate(events, 1)]
            for run_id, events in _batch_work(runs, per_run)]

    def run() -> None:
        cur = conn.cursor()
        for batch in rows:
            cur.executemany(RAW_INSERT, batch)
            conn.commit()

    return Trial(run, lambda: expect("row count", _raw_count(conn), runs * per_run),
                 _closing(conn, schema))


def _batch_es(ctx: Ctx) -> Trial:
    runs, per_run = ctx.params["runs"], ctx.params["per_run"]
    schema = Schema()
    app = _es_app(schema)
    work = _batch_work(runs, per_run)
    ids: list[Any] = []

    def run() -> None:
        new, apply, save = peers.es_new_run, peers.es_apply, app.save
        for _run_id, events in work:
            agg = new()  # the aggregate's creation is its first event
            for e in events[1:]:
                apply(agg, e)
            save(agg)
            ids.append(agg.id)

    def check() -> None:
        expect("aggregates saved", len(ids), runs)
        expect("the last aggregate's version", app.repository.get(ids[-1]).version, per_run)

    return Trial(run, check, _closing(app, schema))


register(
    Scenario(
        name="pg-command-batch",
        area=AREA,
        title="PostgreSQL: 100-event batches, one run per batch, one commit each",
        measures=(
            "Ledger.store.append of one run's 100 events per call (opening, working body, "
            "and for two thirds of the runs a delivered or cancelled ending), a new run each "
            "time, expected_seq=0 and an idempotency key per batch, with the inline "
            "projections. Reference: raw psycopg executemany of the same 100 rows, one "
            "transaction per run. Peer: eventsourcing.postgres, one save() of an aggregate's "
            "100 pending events."
        ),
        full={"n": 30_000, "runs": 300, "per_run": 100},
        quick={"n": 500, "runs": 5, "per_run": 100},
        subject=_side("handoff-ledger", _batch_handoff,
                      note="Ledger.store.append, one run's 100 events per commit, inline projections"),
        reference=_side("raw psycopg", _batch_raw, note="executemany, one transaction per 100 rows"),
        peers=(
            _side("eventsourcing.postgres", _batch_es, requires=ES_REQUIRES,
                  note=ES_NOTE + "; one save() of an aggregate's 100 pending events"),
        ),
        goals=(Goal("at least 1.5x eventsourcing.postgres 100-event save", min_ratio=1.5,
                    against="eventsourcing.postgres"),),
        repeat=3,
        warmup=1,
    )
)


# --- 3. 16 writer processes --------------------------------------------------------------


def spawn(task: str, args: dict[str, Any]) -> subprocess.Popen:
    """``python -m benchmarks.postgres_child TASK ARGS`` from the repository root."""
    return common_spawn(task, args, stdin=True, module="benchmarks.postgres_child")


def _started(procs: list[subprocess.Popen]) -> list[subprocess.Popen]:
    for p in procs:
        line = p.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != b"ready":
            _kill(procs)
            raise RuntimeError(f"a benchmark child did not start: {line!r}")
    return procs


def _report(proc: subprocess.Popen) -> dict[str, Any]:
    out = proc.stdout.read()  # type: ignore[union-attr]
    proc.stdout.close()  # type: ignore[union-attr]
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {proc.args[3:5]} exited with {proc.returncode}")  # type: ignore[index]
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"benchmark child {proc.args[3:5]} printed no report")  # type: ignore[index]
    return json.loads(lines[-1])


def _release(procs: list[subprocess.Popen], total: int,
             listener: subprocess.Popen | None = None) -> Measured:
    """Start every writer at once; the window runs from the first start to the last end.
    ``cpu_busy``: the share of the machine's CPU time in use from the release to the last
    report (all processes, /proc/stat), which says whether the run was CPU-bound."""
    busy = _cpu_times()
    for p in procs:
        p.stdin.write(b"go\n")  # type: ignore[union-attr]
    for p in procs:
        p.stdin.close()  # type: ignore[union-attr]
    reports = [_report(p) for p in procs]
    busy_end = _cpu_times()
    done = sum(r["done"] for r in reports)
    if done != total:
        raise RuntimeError(f"the writers did {done} commands, expected {total}")
    window = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    metrics = {"lock_errors": float(sum(r["errors"] for r in reports))}
    if busy is not None and busy_end is not None and busy_end[0] > busy[0]:
        metrics["cpu_busy"] = 1 - (busy_end[1] - busy[1]) / (busy_end[0] - busy[0])
    if listener is not None:
        listener.stdin.close()  # type: ignore[union-attr]
        metrics["notifications"] = float(_report(listener)["received"])
    return Measured(seconds=window, metrics=metrics)


def _cpu_times() -> tuple[int, int] | None:
    """(all, idle) CPU ticks of the machine since boot, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(v), v[3] + v[4]  # idle + iowait


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _writers(kind: str, processes: int | None):
    """``processes`` writers on ``writers`` runs (None: one per run, the scenario's count)."""

    def prepare(ctx: Ctx) -> Trial:
        per, count = ctx.params["per_writer"], ctx.params["writers"]
        schema = Schema()
        if kind == "handoff":
            with _ledger(schema) as lg:
                runs = [[f"run-w{w}", _working_run(lg, f"run-w{w}")] for w in range(count)]
        else:
            _raw_conn(schema).close()
            runs = [[f"run-w{w}", ""] for w in range(count)]
        if processes == 1:
            groups = [{"url": schema.url, "kind": kind, "runs": runs, "n_each": per, "tag": "single"}]
        else:
            groups = [{"url": schema.url, "kind": kind, "runs": [r], "n_each": per, "tag": f"w{i}"}
                      for i, r in enumerate(runs)]
        procs = _started([spawn("writer", g) for g in groups])
        total = per * count

        def check() -> None:
            if kind == "handoff":
                with _ledger(schema) as lg:
                    expect("events appended", lg.store.last_position(),
                           total + 4 * count)  # open, claim and two transitions per run
            else:
                with schema.connect() as conn:
                    expect("row count", _raw_count(conn), total)

        def close() -> None:
            _kill(procs)
            schema.drop()

        return Trial(lambda: _release(procs, total), check, close)

    return prepare


register(
    Scenario(
        name="pg-writers-16",
        area=AREA,
        title="PostgreSQL: 16 writer processes on 16 runs at once",
        measures=(
            "16 processes, each its own Ledger (its own connection) on the same database, "
            "each appending durable Ledger.progress commands (with keys) to its own run, "
            "released together; total events/s over the window from the first start to the "
            "last end, and the lock errors that reached a caller (each retried). Reference: "
            "16 raw psycopg processes, one autocommit INSERT per event. Peer: one process "
            "of ours doing the same 16 x N commands round-robin. --quick uses 4 writers."
        ),
        full={"n": 16 * 150, "writers": 16, "per_writer": 150},
        quick={"n": 4 * 5, "writers": 4, "per_writer": 5},
        subject=_side("handoff-ledger, 16 writers", _writers("handoff", None),
                      note="16 processes x Ledger.progress, one commit each"),
        reference=_side("raw psycopg, 16 writers", _writers("raw", None),
                        note="16 processes x one autocommit INSERT per event"),
        peers=(
            _side("handoff-ledger, 1 writer", _writers("handoff", 1),
                  note="1 process, the same total, round-robin over the 16 runs"),
        ),
        goal=0.5,
        goals=(
            Goal("at least 2.5x one writer of ours", min_ratio=2.5, against="handoff-ledger, 1 writer"),
            Goal("no lock error reaches a caller", metric="lock_errors", max_value=0.0),
        ),
        repeat=3,
        warmup=0,
    )
)


# --- 4. catch-up read ------------------------------------------------------------------------


def _catch_up_fixture(_d: Any, params: dict[str, Any]) -> dict[str, Any]:
    """One ledger and one raw table holding the same events in the same order, built once
    (untimed) and kept until the run's database is dropped."""
    if unavailable():  # the sides will say why; there is nothing to build on
        return None
    runs, per_run = params["runs"], params["per_run"]
    ours, raw = Schema("catchup"), Schema("catchup_raw")
    with _ledger(ours) as lg, raw.connect(autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        encode = raw_encoder.encode
        for r in range(runs):
            run_id = f"run-{r:06d}"
            events = run_events(per_run, _ENDINGS[r % 3], f"r{r} ")
            lg.store.append(run_id, events, actor=WORKER, expected_seq=0)
            with conn.cursor().copy("COPY events (run_id, seq, payload) FROM STDIN") as copy:
                for seq, e in enumerate(events, 1):
                    copy.write_row((run_id, seq, encode(e)))
        conn.execute("VACUUM ANALYZE events")
    return {"ours": ours.url, "raw": raw.url, "events": runs * per_run}


def _catch_up_handoff(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    fx = ctx.fixture
    lg = Ledger(fx["ours"])
    counts: dict[type, int] = {}

    def run() -> None:
        counts.clear()
        for rec in lg.store.read_all(after_position=0):
            t = type(rec.event)
            counts[t] = counts.get(t, 0) + 1

    return Trial(run, lambda: expect("events read", sum(counts.values()), fx["events"]), lg.close)


def _catch_up_raw(ctx: Ctx) -> Trial:
    import psycopg

    fx = ctx.fixture
    conn = psycopg.connect(fx["raw"])
    counts: dict[type, int] = {}

    def run() -> None:
        counts.clear()
        decode = raw_decoder.decode
        with conn.transaction(), conn.cursor(name="catch_up") as cur:
            cur.itersize = 10_000
            cur.execute("SELECT payload FROM events ORDER BY position")
            for (payload,) in cur:
                t = type(decode(payload))
                counts[t] = counts.get(t, 0) + 1

    return Trial(run, lambda: expect("events read", sum(counts.values()), fx["events"]), conn.close)


register(
    Scenario(
        name="pg-catch-up",
        area=AREA,
        title="PostgreSQL: catch-up read of the whole log from position 0, with decode",
        measures=(
            "Ledger.store.read_all(after_position=0) over 1,000,000 events (1,000 runs x "
            "1,000, realistic bodies), decoding every event (Recorded.event) and counting by "
            "type, as a projection's catch-up or a tailing reader starting from scratch does. "
            "Reference: raw psycopg server-side cursor (itersize 10,000) over the same "
            "payloads in a (position, run_id, seq, payload) table, msgspec decode, count by "
            "type. The log is built once, untimed."
        ),
        full={"n": 1_000_000, "runs": 1_000, "per_run": 1_000},
        quick={"n": 3_000, "runs": 3, "per_run": 1_000},
        subject=_side("handoff-ledger", _catch_up_handoff, note="Ledger.store.read_all + decode"),
        reference=_side("raw psycopg, server-side cursor", _catch_up_raw,
                        note="named cursor, itersize 10,000, msgspec decode"),
        goal=0.5,
        fixture=_catch_up_fixture,
        repeat=3,
        warmup=1,
    )
)


# --- 5. round trips per command ----------------------------------------------------------------


def _rt_handoff(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    each = ctx.params["each"]
    schema = Schema()
    proxy = CountingProxy(schema.url)
    lg = Ledger(proxy.url(schema.url))
    run_id = "run-rt"
    lease = _working_run(lg, run_id)
    appends = [ev.ProgressRecorded(kind="tool_outcome", detail=d) for d in _progress_details(each)]

    def run() -> Measured:
        metrics: dict[str, float] = {}
        proxy.mark()
        for i in range(each):
            lg.progress(run_id, lease, "tool_outcome", f"step {i}", key=f"p-{i}", worker="w1")
        turns, ready = proxy.since_mark()
        metrics["round_trips_progress"] = turns / each
        metrics["ready_progress"] = ready / each
        proxy.mark()
        for _ in range(each):
            lg.heartbeat(run_id, lease, worker="w1")
        turns, ready = proxy.since_mark()
        metrics["round_trips_heartbeat"] = turns / each
        metrics["ready_heartbeat"] = ready / each
        proxy.mark()
        for i, e in enumerate(appends):
            lg.store.append(run_id, [e], actor=WORKER, lease=lease, idempotency_key=f"a-{i}")
        turns, ready = proxy.since_mark()
        metrics["round_trips_append"] = turns / each
        metrics["ready_append"] = ready / each
        return Measured(metrics=metrics)

    def check() -> None:
        # The heartbeats are kept beside the log (no event each): counted in the liveness row.
        expect("the run's last seq", lg.store.head(run_id).last_seq, 4 + 2 * each)
        expect("the lease's beats", lg.store.liveness([run_id])[run_id].beats, each)

    return Trial(run, check, _closing(lg, proxy, schema))


def _rt_raw(ctx: Ctx) -> Trial:
    import psycopg

    n = ctx.params["n"]
    schema = Schema()
    _raw_conn(schema).close()
    proxy = CountingProxy(schema.url)
    conn = psycopg.connect(proxy.url(schema.url), autocommit=True)
    payloads = _progress_payloads(n)

    def run() -> Measured:
        proxy.mark()
        for seq, p in enumerate(payloads, 1):
            conn.execute(RAW_INSERT, ("run-rt", seq, p))
        turns, ready = proxy.since_mark()
        return Measured(metrics={"round_trips_insert": turns / n, "ready_insert": ready / n})

    return Trial(run, lambda: expect("row count", _raw_count(conn), n), _closing(conn, proxy, schema))


def _rt_es(ctx: Ctx) -> Trial:
    n = ctx.params["n"]
    schema = Schema()
    proxy = CountingProxy(schema.url)
    env = schema.es_env()
    env.update(POSTGRES_HOST="127.0.0.1", POSTGRES_PORT=str(proxy.port))
    app = peers.es_classes()["Runs"](env=env)
    agg = peers.es_new_run()
    app.save(agg)
    details = _progress_details(n)

    def run() -> Measured:
        proxy.mark()
        for d in details:
            agg.progress("tool_outcome", d)
            app.save(agg)
        turns, ready = proxy.since_mark()
        return Measured(metrics={"round_trips_save": turns / n, "ready_save": ready / n})

    def check() -> None:
        expect("the aggregate's version", app.repository.get(agg.id).version, n + 1)

    return Trial(run, check, _closing(app, proxy, schema))


register(
    Scenario(
        name="pg-round-trips",
        area=AREA,
        title="PostgreSQL: client-server round trips per command, counted by a proxy on the wire",
        measures=(
            "A counting TCP proxy (benchmarks/postgres_proxy.py) between the client and the "
            "server counts request->response turns: each client burst that follows a server "
            "reply is one round trip; ReadyForQuery messages are counted as a cross-check. "
            "Ours: N Ledger.progress, then N Ledger.heartbeat, then N Ledger.store.append of "
            "one event (lease, key), counted per group. Reference: raw psycopg autocommit "
            "INSERT. Peer: eventsourcing.postgres save per event. Speeds here include the "
            "proxy (a thread of the harness) and are not comparable with other rows."
        ),
        full={"n": 600, "each": 200},
        quick={"n": 30, "each": 10},
        subject=_side("handoff-ledger via proxy", _rt_handoff,
                      note="progress, heartbeat, store.append: N of each, round trips per call"),
        reference=_side("raw psycopg via proxy", _rt_raw, note="autocommit INSERT per event"),
        peers=(
            _side("eventsourcing.postgres via proxy", _rt_es, requires=ES_REQUIRES,
                  note="app.save() per event"),
        ),
        goals=(
            Goal("at most 2 round trips per progress command", metric="round_trips_progress",
                 max_value=2.0),
            Goal("at most 2 round trips per heartbeat command", metric="round_trips_heartbeat",
                 max_value=2.0),
        ),
        unit="commands",
        repeat=1,
        warmup=0,
    )
)


# --- 6. the cost of NOTIFY -------------------------------------------------------------------


def _notify(notify: bool):
    def prepare(ctx: Ctx) -> Trial:
        per, count = ctx.params["per_writer"], ctx.params["writers"]
        schema = Schema()
        _raw_conn(schema).close()
        channel = f"bench_{schema.name}"
        listener = _started([spawn("listen", {"url": schema.url, "channel": channel})])[0] if notify else None
        procs = _started([
            spawn("notify-writer", {"url": schema.url, "run_id": f"run-w{w}", "n_each": per,
                                    "channel": channel, "notify": notify})
            for w in range(count)
        ])
        total = per * count

        def check() -> None:
            with schema.connect() as conn:
                expect("row count", _raw_count(conn), total)

        def close() -> None:
            _kill(procs + ([listener] if listener else []))
            schema.drop()

        return Trial(lambda: _release(procs, total, listener), check, close)

    return prepare


def _notify_scenario(name: str, writers: int, per_full: int, per_quick: int, quick_writers: int) -> None:
    register(
        Scenario(
            name=name,
            area=AREA,
            title=f"PostgreSQL: the cost of NOTIFY in the append transaction, {writers} writer"
                  f"{'s' if writers > 1 else ''}",
            measures=(
                f"{writers} raw psycopg process{'es, each' if writers > 1 else ''} sending "
                "BEGIN; INSERT; NOTIFY channel; COMMIT as one pipeline (one round trip) per "
                "event, with one LISTEN session draining the channel. Reference: the same "
                "without the NOTIFY. Ratio = with / without: what the notification costs "
                "(NOTIFY takes a cluster-wide lock from its commit's pre-commit step to the "
                f"end of the commit). --quick: {quick_writers} writer"
                f"{'s' if quick_writers > 1 else ''}, {per_quick} events each."
            ),
            full={"n": writers * per_full, "writers": writers, "per_writer": per_full},
            quick={"n": quick_writers * per_quick, "writers": quick_writers, "per_writer": per_quick},
            subject=_side("raw psycopg + NOTIFY", _notify(True),
                          note="BEGIN; INSERT; NOTIFY; COMMIT, one pipeline per event; a listener"),
            reference=_side("raw psycopg, no NOTIFY", _notify(False),
                            note="BEGIN; INSERT; COMMIT, one pipeline per event"),
            repeat=3,
            warmup=0,
        )
    )


_notify_scenario("pg-notify", 1, 2_000, 30, 1)
_notify_scenario("pg-notify-16", 16, 150, 5, 4)
