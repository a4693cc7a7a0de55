"""Store scenarios: durable appends (one event per commit, and batches) and reads.

Each handoff-ledger side goes through the public SqliteStore API exactly as a caller
would; each raw side does the least a program could do for the same durable result.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from handoff.ledger import events as ev

from .common import (
    RAW_INSERT,
    WORKER,
    expect,
    fill_round_robin,
    mean_payload_bytes,
    mixed_events,
    open_run,
    open_store,
    path_in,
    raw_connect,
    raw_batch,
    raw_count,
    raw_decoder,
    raw_encoder,
    step_events,
)
from .harness import Ctx, Scenario, Side, Trial, register

AREA = "store"
_PAYLOAD = mean_payload_bytes(step_events(1000))



# --- 1. one event per durable commit -------------------------------------------------


def _single_handoff(ctx: Ctx) -> Trial:
    n = ctx.params["n"]
    store = open_store(path_in(ctx.dir, "ledger.db"))
    run_id = "run-single"
    token = open_run(store, run_id, lease=1)
    events = step_events(n)
    keys = [f"step-{i}" for i in range(n)]

    def run() -> None:
        append = store.append
        for event, key in zip(events, keys):
            append(run_id, [event], actor=WORKER, lease=token, idempotency_key=key)

    def check() -> None:
        head = store.head(run_id)
        expect("the run's last seq", head.last_seq if head else 0, n + 2)

    return Trial(run, check, store.close)


def _single_raw(ctx: Ctx) -> Trial:
    n = ctx.params["n"]
    conn = raw_connect(path_in(ctx.dir, "raw.db"))
    run_id = "run-single"
    events = step_events(n)

    def run() -> None:
        execute, encode = conn.execute, raw_encoder.encode
        for seq, event in enumerate(events, 1):
            execute("BEGIN IMMEDIATE")
            execute(RAW_INSERT, (run_id, seq, encode(event)))
            execute("COMMIT")

    return Trial(run, lambda: expect("row count", raw_count(conn), n), conn.close)


register(
    Scenario(
        name="append-single",
        area=AREA,
        title="one event per durable commit (append under a lease, with an idempotency key)",
        measures=(
            "SqliteStore.append of one small ProgressRecorded event (~%d bytes) per call, "
            "to one run, under a lease (so the fencing check runs) and with a fresh "
            "idempotency key (so the duplicate lookup runs). Every call is its own "
            "BEGIN IMMEDIATE ... COMMIT with an fsync. Reference: the same payload bytes "
            "(msgspec-encoded) inserted into a (run_id, seq, payload) table with "
            "PRIMARY KEY (run_id, seq), one INSERT + COMMIT per event." % _PAYLOAD
        ),
        full={"n": 5_000},
        quick={"n": 300},
        subject=Side("handoff-ledger", _single_handoff),
        reference=Side(
            "raw sqlite3", _single_raw, note="BEGIN IMMEDIATE; one INSERT; COMMIT per event"
        ),
        goal=0.8,
    )
)


# --- 2. batches ------------------------------------------------------------------------
#
# SqliteStore.append writes one run per call (one transaction, one fsync). So a
# "batch" is honestly one append of one run's events; the raw reference commits the
# same number of rows per transaction, so both sides pay the same number of fsyncs and
# the ratio measures the library, not a different commit count. append-batch-100 also
# shows, as a second reference, what raw sqlite3 gets by committing 1,000 rows of ten
# runs together, which the per-run append cannot do.


def _batch_handoff(ctx: Ctx) -> Trial:
    runs, per_run = ctx.params["runs"], ctx.params["per_run"]
    store = open_store(path_in(ctx.dir, "ledger.db"))
    work = [(f"run-{r:05d}", step_events(per_run, f"r{r} "), f"batch-{r}") for r in range(runs)]

    def run() -> None:
        append = store.append
        for run_id, events, key in work:
            append(run_id, events, actor=WORKER, expected_seq=0, idempotency_key=key)

    def check() -> None:
        expect("the last position", store.last_position(), runs * per_run)

    return Trial(run, check, store.close)


def _step_work(runs: int, per_run: int) -> list[tuple[str, list[ev.Event]]]:
    return [(f"run-{r:05d}", step_events(per_run, f"r{r} ")) for r in range(runs)]


register(
    Scenario(
        name="append-batch-1000",
        area=AREA,
        title="1,000-event batches, one run per batch, one durable commit each",
        measures=(
            "SqliteStore.append of 1,000 events per call, each call a new run (200 runs, "
            "200,000 events), with expected_seq=0 and an idempotency key per batch. "
            "Reference: executemany of the same 1,000 rows in one transaction per batch. "
            "Both sides commit (and fsync) 200 times."
        ),
        full={"n": 200_000, "runs": 200, "per_run": 1_000},
        quick={"n": 10_000, "runs": 10, "per_run": 1_000},
        subject=Side("handoff-ledger", _batch_handoff),
        reference=Side(
            "raw sqlite3", raw_batch(_step_work), note="executemany, one transaction per 1,000 rows"
        ),
        goal=0.6,
    )
)

register(
    Scenario(
        name="append-batch-100",
        area=AREA,
        title="100-event batches, one run per batch, one durable commit each",
        measures=(
            "SqliteStore.append of 100 events per call, one call per run, 2,000 runs. "
            "Reference: executemany of the same 100 rows in one transaction per run, so "
            "both commit 2,000 times. A second reference commits 1,000 rows (ten runs) per "
            "transaction, as a raw program batching across runs could; handoff-ledger's "
            "append is per run, so that row shows what the per-run contract costs."
        ),
        full={"n": 200_000, "runs": 2_000, "per_run": 100},
        quick={"n": 10_000, "runs": 100, "per_run": 100},
        subject=Side("handoff-ledger", _batch_handoff),
        reference=Side(
            "raw sqlite3", raw_batch(_step_work), note="executemany, one transaction per run (100 rows)"
        ),
        peers=(
            Side(
                "raw sqlite3, 1,000 rows/txn",
                raw_batch(_step_work, 1_000),
                note="executemany, one transaction per 1,000 rows spanning 10 runs",
            ),
        ),
        goal=0.6,
    )
)


# --- 3. reads --------------------------------------------------------------------------


def _corpus(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Both databases holding the same runs, appended round-robin in batches so one run's
    rows are spread through the file as they would be in a live ledger."""
    runs = [f"run-{r:03d}" for r in range(params["runs"])]
    per_run, batch = params["per_run"], params["batch"]
    bodies = {r: mixed_events(per_run, f"{r} ") for r in runs}
    ledger_path, raw_path = path_in(d, "ledger.db"), path_in(d, "raw.db")
    store = open_store(ledger_path)
    conn = raw_connect(raw_path)
    try:
        fill_round_robin(store, conn, bodies, batch)
    finally:
        store.close()
        conn.close()
    return {"ledger": ledger_path, "raw": raw_path, "runs": runs, "total": len(runs) * per_run}


_CORPUS_FULL = {"runs": 10, "per_run": 10_000, "batch": 1_000}
_CORPUS_QUICK = {"runs": 2, "per_run": 2_000, "batch": 500}


def _read_run_handoff(ctx: Ctx) -> Trial:
    store = open_store(ctx.fixture["ledger"])
    run_id = ctx.fixture["runs"][len(ctx.fixture["runs"]) // 2]
    out: list[int] = []

    def run() -> None:
        decode = ev.decode
        records = list(store.read_run(run_id))
        events = [decode(r.payload) for r in records]
        out.append(len(events))

    return Trial(run, lambda: expect("events read", out[0], ctx.params["n"]), store.close)


def _read_run_raw(ctx: Ctx) -> Trial:
    conn = raw_connect(ctx.fixture["raw"])
    run_id = ctx.fixture["runs"][len(ctx.fixture["runs"]) // 2]
    out: list[int] = []

    def run() -> None:
        decode = raw_decoder.decode
        rows = conn.execute(
            "SELECT seq, payload FROM events WHERE run_id=? ORDER BY seq", (run_id,)
        ).fetchall()
        events = [decode(p) for _, p in rows]
        out.append(len(events))

    return Trial(run, lambda: expect("events read", out[0], ctx.params["n"]), conn.close)


register(
    Scenario(
        name="read-run",
        area=AREA,
        title="read and decode one whole run",
        measures=(
            "list(store.read_run(run_id)) (pages of 1,000, full envelope as Recorded "
            "structs) then ledger.events.decode of every payload, on a ledger of 10 runs x "
            "10,000 mixed events written round-robin in 1,000-event batches. Reference: "
            "SELECT seq, payload ... WHERE run_id=? ORDER BY seq on the same data, "
            "msgspec-decoded into the same event types."
        ),
        full={"n": 10_000, **_CORPUS_FULL},
        quick={"n": 2_000, **_CORPUS_QUICK},
        subject=Side("handoff-ledger", _read_run_handoff),
        reference=Side(
            "raw sqlite3", _read_run_raw, note="one SELECT of (seq, payload), fetchall, decode"
        ),
        fixture=_corpus,
        fixture_key="store-corpus",
    )
)


def _read_all_handoff(ctx: Ctx) -> Trial:
    store = open_store(ctx.fixture["ledger"])
    out: list[int] = []

    def run() -> None:
        decode = ev.decode
        count = 0
        for rec in store.read_all():
            decode(rec.payload)
            count += 1
        out.append(count)

    return Trial(run, lambda: expect("events read", out[0], ctx.params["n"]), store.close)


def _read_all_raw(ctx: Ctx) -> Trial:
    conn = raw_connect(ctx.fixture["raw"])
    out: list[int] = []

    def run() -> None:
        decode = raw_decoder.decode
        count = 0
        for _rowid, _run_id, _seq, payload in conn.execute(
            "SELECT rowid, run_id, seq, payload FROM events ORDER BY rowid"
        ):
            decode(payload)
            count += 1
        out.append(count)

    return Trial(run, lambda: expect("events read", out[0], ctx.params["n"]), conn.close)


register(
    Scenario(
        name="read-all",
        area=AREA,
        title="catch-up: read_all from position 0 and decode every event",
        measures=(
            "Iterate store.read_all() over the whole 100,000-event ledger (pages of 1,000 "
            "by position, each page under the store lock) and decode every payload, as a "
            "projection catching up from scratch would. Reference: one streaming "
            "SELECT rowid, run_id, seq, payload ORDER BY rowid, msgspec-decoded."
        ),
        full={"n": _CORPUS_FULL["runs"] * _CORPUS_FULL["per_run"], **_CORPUS_FULL},
        quick={"n": _CORPUS_QUICK["runs"] * _CORPUS_QUICK["per_run"], **_CORPUS_QUICK},
        subject=Side("handoff-ledger", _read_all_handoff),
        reference=Side(
            "raw sqlite3", _read_all_raw, note="one streaming SELECT in rowid order, decode"
        ),
        fixture=_corpus,
        fixture_key="store-corpus",
    )
)
