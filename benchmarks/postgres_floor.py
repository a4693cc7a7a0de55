"""The floor under a durable command on PostgreSQL: its writes alone, sent as the store
sends them, with nothing else.

Why this exists: the command's goals (issue 12: at least 0.5x a raw INSERT, at least 2x
eventsourcing's save) are ratios of whole commands. Whether a goal is out of reach for
a write path that makes the ledger's writes as it makes them today is a question about
those writes alone (another schema would have a floor of its own): the event row with its run chain, the ledger-wide seal (position and
global chain, given by the insert's trigger), the run's head (fencing) and the inline
views (never behind the write). This side measures exactly those statements, in the
store's own message, with the store's own prepared statements and literals, and with
everything else taken away: no client-side decision, no fold, no encoding, no reads,
no checks (the head proof, the duplicate and step reads, the savepoint, the sealed
position's read, the wait for a queued seal).

How: a real ledger does the commands once, untimed, in a schema of its own, and the
messages it sends are captured at ``ledger.postgres._send`` (the one place every write
message passes; this is the only module of the benchmarks that reaches into the store,
and it fails loudly if that seam moves). A second ledger, made the same way so that its
run's seqs line up, then receives the captured writes, pre-built as text, each in one
message through libpq with no Python in between. Its log is not a valid chain (the
events carry the first ledger's hashes): this side measures cost, nothing else.
"""

from __future__ import annotations

import time
from typing import Any

from .common import expect
from .harness import Ctx, Measured, Trial
from .postgres_server import CpuMeter, Schema

RUN = "run-cmd"


def _dropped(p: Any) -> set[str]:
    """The statements of a guessed write that are not writes: reads for a refused guess,
    the proof of the head, the savepoint, the sealed position's read, the queued wait."""
    return {p._HEAD_IF_MOVED, p._HEAD_FOR_UPDATE, p._DUPLICATE, p._STEPS_IF_MOVED,
            p._SAVE_GUESS, p._EXPECT_HEAD, p._SEALED_AT, p._SEAL_IF_QUEUED}


def _kept(p: Any) -> set[str]:
    """The statements of a write the floor keeps, besides the view rows' own: the
    transaction, the write's locks and ids, the event rows (their insert seals them), the
    run's head, the views' lock."""
    return {"BEGIN", "COMMIT", p._BEGIN_WRITE, p._MOVE_HEAD, p._UPSERT_HEAD, p._INSERT,
            p._INSERT_MANY, p._LOCK_VIEWS_SHARED}


#: The view tables a progress command writes rows of (projections/views.py).
_VIEW_WRITES = ("INSERT INTO checkpoints ", "INSERT INTO stall_watch ", "INSERT INTO deliveries ",
                "INSERT INTO owner_load ", "DELETE FROM deliveries ", "DELETE FROM owner_load ",
                "UPDATE checkpoints ", "UPDATE stall_watch ", "UPDATE deliveries ",
                "UPDATE owner_load ")


def _writes(p: Any, batch: list[Any]) -> list[Any]:
    """``batch`` without the statements that are not writes. Every statement must be
    known as one or the other: a read or a check added to the write path later would
    otherwise be replayed and raise the floor unnoticed."""
    drop, keep = _dropped(p), _kept(p)
    out = []
    for q, a in batch:
        if q in drop:
            continue
        if q not in keep and not q.startswith(_VIEW_WRITES):
            raise RuntimeError(f"the floor does not know this statement of a write: {q[:120]!r}; "
                               "say in benchmarks/postgres_floor.py whether it is a write")
        out.append((q, a))
    return out


#: What the two ledgers must agree on after the same commands: the run's head (seq) and
#: the view rows the commands wrote (their bytes, the checkpoint's packet included).
_STATE = ("SELECT (SELECT last_seq FROM heads WHERE run_id = %(run)s), "
          "(SELECT row_to_json(c)::text FROM checkpoints c WHERE run_id = %(run)s), "
          "(SELECT row_to_json(s)::text FROM stall_watch s WHERE run_id = %(run)s)")


def _capture(schema: Schema, details: list[str], ledger: Any,
             working_run: Any) -> tuple[list[list[Any]], tuple[Any, ...]]:
    """The message of each of ``details``' commands, as (statement, arguments) pairs,
    and the run's head and view rows after them."""
    import psycopg

    from handoff.ledger.postgres import store as p

    lg = ledger(schema)
    try:
        lease = working_run(lg, RUN)
        lg.progress(RUN, lease, "tool_outcome", "warm-up", key="warm", worker="w1")
        captured: list[list[Any]] = []
        send = p._send

        def tap(conn: Any, batch: Any) -> Any:
            captured.append(list(batch))
            return send(conn, batch)

        p._send = tap
        try:
            for i, detail in enumerate(details):
                lg.progress(RUN, lease, "tool_outcome", detail, key=f"step-{i}", worker="w1")
        finally:
            p._send = send
    finally:
        lg.close()
    expect("messages captured (one per command)", len(captured), len(details))
    guessed = sum(1 for b in captured if any(q == p._SAVE_GUESS for q, _ in b))
    expect("commands sent as one guessed message", guessed, len(details))
    with psycopg.connect(schema.url) as conn:
        state = conn.execute(_STATE, {"run": RUN}).fetchone()
    return captured, state


def floor_side(ledger: Any, working_run: Any, details_for: Any) -> Any:
    """The side's ``prepare``: given the scenario's own helpers (a Ledger on a schema, a
    run in executing, the commands' details), so that both sides do the same commands."""

    def prepare(ctx: Ctx) -> Trial:
        import psycopg

        n = ctx.params["n"]
        details = details_for(n)
        source = Schema()
        try:
            captured, expected = _capture(source, details, ledger, working_run)
        finally:
            source.drop()
        target = Schema()
        conn = meter = None
        try:
            lg = ledger(target)
            try:
                lease = working_run(lg, RUN)
                lg.progress(RUN, lease, "tool_outcome", "warm-up", key="warm", worker="w1")
            finally:
                lg.close()
            conn = target.connect(autocommit=True)
            base = conn.execute("SELECT last_seq FROM heads WHERE run_id = %s", (RUN,)).fetchone()[0]
            texts = _texts(conn, captured)
            meter = CpuMeter(target.db_url)
        except BaseException:
            for part in (meter, conn):
                if part is not None:
                    part.close()
            target.drop()
            raise
        pgconn = conn.pgconn
        fatal = psycopg.pq.ExecStatus.FATAL_ERROR

        def run() -> Measured:
            meter.start()
            t0 = time.perf_counter()
            for text in texts:
                pgconn.send_query(text)
                while (res := pgconn.get_result()) is not None:
                    if res.status == fatal:
                        raise RuntimeError(f"floor write refused: {res.error_message.decode()}")
            seconds = time.perf_counter() - t0
            return Measured(seconds=seconds, metrics=meter.stop(n))

        def check() -> None:
            got = conn.execute("SELECT max(seq) FROM events WHERE run_id = %s", (RUN,)).fetchone()[0]
            expect("the run's last seq", got, base + n)
            total, tail = conn.execute(
                "SELECT (SELECT count(*) FROM events), (SELECT position FROM ledger_tail)").fetchone()
            expect("events sealed by their inserts", tail, total)
            state = conn.execute(_STATE, {"run": RUN}).fetchone()
            expect("the run's head", state[0], expected[0])
            expect("the checkpoint row (as the real ledger left it)", state[1], expected[1])
            expect("the stall row (as the real ledger left it)", state[2], expected[2])

        def close() -> None:
            try:
                meter.close()
                conn.close()
            finally:
                target.drop()

        return Trial(run, check, close)

    return prepare


def _texts(conn: Any, captured: list[list[Any]]) -> list[bytes]:
    """Each captured message's writes as the store sends them: its prepared statements
    (prepared here, once) called with its literals, and what it quotes plainly, plain."""
    import psycopg

    from handoff.ledger.postgres import store as p

    quote = psycopg.ClientCursor(conn)
    prepared: set[str] = set()
    texts = []
    for batch in captured:
        body = []
        for q, a in _writes(p, batch):
            if a is None:
                body.append(q)
                continue
            if q not in p._PREPARED:  # as _send sends it: quoted by psycopg
                body.append(quote.mogrify(q, a))
                continue
            name, text, params = p._PREPARED[q]
            if name not in prepared:
                conn.execute(f"PREPARE {name} AS {text}")
                prepared.add(name)
            body.append(p._execute_call(conn, name, params, a))
        texts.append(";\n".join(body).encode())
    return texts
