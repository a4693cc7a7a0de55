"""Write amplification of one durable command: WAL bytes, pages and statements per command,
on SQLite and on PostgreSQL, beside the raw INSERT and each peer's per-event save.

Why this and not only time: on a busy two-core machine a commit's wall time moves with
everything else, while the bytes a command makes the database write (and fsync) do not.
They say how much of a command's cost is the schema's (events, indexes, view rows) rather
than Python's, and which b-tree each page belongs to says which row to cut.

Each side runs its commands in groups of M (``n``): on one run, and spread over a fleet
of ``fleet`` runs (a command per run, in a shuffled order, so each touches the pages of
its own run's rows, as a fleet does). handoff-ledger's groups are ``progress``
(``Ledger.progress(run, token, "tool_outcome", detail, key=k)``) and ``heartbeat``
(``Ledger.heartbeat(run, token)``); the raw side's ``insert``; eventsourcing's ``save``;
LangGraph's ``put``. A group's figures are metrics named ``<group>[_fleet]_<figure>``:

SQLite (``wal-per-command``), read from the ``-wal`` file after every command
(:class:`WalFrames`): ``pages`` = WAL frames per command (one frame = one page image of
the page size + 24 bytes, written and fsynced at the commit), ``bytes`` = frames x
(page size + 24), ``commits`` = commit frames per command, ``stmts`` = statements per
command, counted with ``sqlite3.Connection.set_trace_callback`` on the side's own
connections (``Ledger.store.conn``; eventsourcing's pooled connections; the LangGraph
saver's). The file is read frame by frame with the salts of its header, so the count
stays right across the WAL restarts the ledger's own checkpoints (RESTART past 8 MiB) and
SQLite's automatic ones (the peers') cause. ``<group>@<b-tree>`` is the breakdown: the
frames per command of each b-tree, each frame's page number mapped through ``dbstat``
after the group (page 1 is the file header), and "(internal)" where the page image in
the frame is an interior page.

PostgreSQL (``pg-wal-per-command``): ``pg_current_wal_insert_lsn()`` before and after
the group, from a separate connection; ``lsn_bytes`` is their ``pg_wal_lsn_diff`` per
command, which counts the whole server's WAL (any other database's writes in the
window too). With ``pg_walinspect`` (a contrib extension,
created in the run's own database) the records between the two are read and only this
database's are kept (a block of this database, or the transaction of one; a temporary
replication slot keeps the server from recycling the WAL before it is read):
``wal_bytes`` (their 8-byte-aligned lengths), ``nofpi_bytes`` (the same without
full-page images, which depend on when the server last checkpointed: the goals judge
this one), ``records`` and ``commits`` per command, and ``<group>@<relation>`` the
bytes (without full-page images) of each relation's records per command. ``stmts``
counts the statements the side's connections send, by wrapping ``psycopg.Cursor.execute``
and ``executemany`` for the group (a simple-query message of several statements counts
each of its results); neither the BEGIN and COMMIT psycopg sends itself for a
``transaction()`` block nor statements run inside a server-side function are seen (the
server here does not load pg_stat_statements).

The speed column is the one-run group's commands per second with the instrumentation on
(a trace callback and a WAL read after every command, the read outside the clock); it
compares with nothing else in the report.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from handoff.ledger import events as ev

from . import peers
from .common import RAW_INSERT, SYNCHRONOUS, _check, expect, path_in, raw_connect, raw_count, raw_encoder
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "wal"

#: SQLite's WAL file header and frame header, in bytes (https://sqlite.org/fileformat.html#walformat).
WAL_HEADER = 32
FRAME_HEADER = 24
#: A run's events before the measured commands: opened, claimed, planning, executing.
OPENING_EVENTS = 4


# --- SQLite: what the WAL gained -----------------------------------------------------


class WalFrames:
    """The frames a database's ``-wal`` file gains, read incrementally by salt.

    SQLite appends frames to the WAL and, after a checkpoint, starts it again from the
    top with new salts in its header (a "restart"); the file does not shrink, so its size
    says nothing once that has happened. Here a frame counts when its header carries the
    WAL header's salts, and only up to the last commit frame (frames after it belong to a
    transaction not yet committed, or to one rolled back). Call :meth:`mark` to start
    from the current end, then :meth:`scan` after every commit (at least once per
    restart: a second restart between two scans would hide the frames before it).
    """

    def __init__(self, db_path: str) -> None:
        self.path = db_path + "-wal"
        self.salt: bytes | None = None
        self.offset = WAL_HEADER
        self.page_size = 0
        #: (page number, is a commit frame) of every frame counted since :meth:`mark`.
        self.frames: list[tuple[int, bool]] = []
        #: The b-tree page kind of each counted frame, read from the page image itself
        #: ("leaf", "internal", or "" for a page that is no b-tree page: overflow, free).
        self.kinds: list[str] = []

    def mark(self) -> None:
        self._read(record=False)
        self.frames, self.kinds = [], []

    def scan(self) -> None:
        self._read(record=True)

    def _read(self, *, record: bool) -> None:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:  # no WAL yet (or truncated away): nothing written
            self.salt, self.offset = None, WAL_HEADER
            return
        with f:
            header = f.read(WAL_HEADER)
            if len(header) < WAL_HEADER:
                self.salt, self.offset = None, WAL_HEADER
                return
            if int.from_bytes(header[0:4], "big") not in (0x377F0682, 0x377F0683):
                raise RuntimeError(f"{self.path} is not a SQLite WAL file (magic {header[0:4].hex()})")
            self.page_size = int.from_bytes(header[8:12], "big")
            salt = header[16:24]
            if salt != self.salt:  # a restart: the frames start again at the top
                self.salt, self.offset = salt, WAL_HEADER
            f.seek(self.offset)
            pending: list[tuple[int, bool]] = []
            kinds: list[str] = []
            pos = self.offset
            while True:
                fh = f.read(FRAME_HEADER)
                if len(fh) < FRAME_HEADER or fh[8:16] != salt:
                    break
                page = f.read(self.page_size)
                if len(page) < self.page_size:
                    break
                pgno = int.from_bytes(fh[0:4], "big")
                commit = int.from_bytes(fh[4:8], "big") != 0
                pending.append((pgno, commit))
                # The b-tree page header's first byte (after the 100-byte file header
                # on page 1): 2/5 interior index/table, 10/13 leaf index/table.
                kinds.append(_PAGE_KINDS.get(page[100 if pgno == 1 else 0], ""))
                pos += FRAME_HEADER + self.page_size
                if commit:
                    if record:
                        self.frames.extend(pending)
                        self.kinds.extend(kinds)
                    pending, kinds = [], []
                    self.offset = pos

    @property
    def frame_bytes(self) -> int:
        return self.page_size + FRAME_HEADER


_PAGE_KINDS = {2: "internal", 5: "internal", 10: "leaf", 13: "leaf"}


class StatementCounter:
    """A ``set_trace_callback`` target counting the statements a connection runs.

    SQLite calls the trace hook again for each trigger program a statement fires, and
    Python's sqlite3 passes the statement's own text each time; a run of identical texts
    is therefore one statement (two identical statements in a row, same values, would
    count once: none of the sides measured here does that).
    """

    def __init__(self) -> None:
        self.count = 0
        self._last: str | None = None

    def __call__(self, sql: str) -> None:
        if sql != self._last:
            self.count += 1
        self._last = sql


def page_names(db_path: str) -> dict[int, tuple[str, str]]:
    """{page number: (the b-tree it belongs to, dbstat's page type)} from ``dbstat``, on
    a read-only connection of its own (it sees the committed WAL). Page 1 is the file
    header (and the schema's root); pages dbstat does not list are free or pointer-map
    pages. Read after the writes: a page freed and reused by another b-tree meanwhile
    would be named after the second (appends free no pages)."""
    conn = sqlite3.connect(f"file:{os.path.abspath(db_path)}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT pageno, name, pagetype FROM dbstat").fetchall()
    except sqlite3.OperationalError as exc:
        raise RuntimeError(f"this SQLite ({sqlite3.sqlite_version}) has no dbstat table: {exc}") from exc
    finally:
        conn.close()
    out = {pageno: (name, kind) for pageno, name, kind in rows}
    out[1] = ("page 1: file header", "")
    return out


def frame_label(names: dict[int, tuple[str, str]], pgno: int, kind: str) -> str:
    """A frame's b-tree, and its kind when not a leaf. The kind comes from the page
    image the frame holds, not from dbstat: a b-tree's root page is a leaf until the
    tree grows a level, after which dbstat calls it internal."""
    name, listed = names.get(pgno, ("free/other", ""))
    if pgno == 1:
        return name
    kind = kind or listed
    return name if kind in ("leaf", "") else f"{name} ({kind})"


def _sqlite_group(group: str, db_path: str, conns: Sequence[sqlite3.Connection],
                  ops: Sequence[Callable[[], object]], metrics: dict[str, float]) -> float:
    """Run ``ops`` (one durable command each), reading the WAL after each; add the
    group's figures to ``metrics``; return the seconds the commands took."""
    n = len(ops)
    wal = WalFrames(db_path)
    wal.mark()
    counter = StatementCounter()
    for c in conns:
        c.set_trace_callback(counter)
    seconds = 0.0
    clock = time.perf_counter
    try:
        for op in ops:
            t0 = clock()
            op()
            seconds += clock() - t0
            wal.scan()
    finally:
        for c in conns:
            c.set_trace_callback(None)
    frames = len(wal.frames)
    metrics[f"{group}_pages"] = frames / n
    metrics[f"{group}_bytes"] = frames * wal.frame_bytes / n
    metrics[f"{group}_commits"] = sum(1 for _, commit in wal.frames if commit) / n
    metrics[f"{group}_stmts"] = counter.count / n
    names = page_names(db_path)
    labels = Counter(frame_label(names, p, k) for (p, _), k in zip(wal.frames, wal.kinds))
    for name, count in sorted(labels.items(),
                              key=lambda kv: (-kv[1], kv[0])):
        metrics[f"{group}@{name}"] = count / n
    return seconds


def _fleet_order(fleet: int, n: int) -> list[int]:
    """Which fleet run each of ``n`` commands goes to: every run once before any twice,
    in a fixed shuffled order, so consecutive commands touch unrelated pages."""
    order = list(range(fleet))
    random.Random(44).shuffle(order)
    return [order[i % fleet] for i in range(n)]


def _details(n: int, tag: str) -> list[str]:
    return [f"{tag}step {i}: ran the test suite" for i in range(n)]


def _payloads(n: int, tag: str) -> list[bytes]:
    return [raw_encoder.encode(ev.ProgressRecorded(kind="tool_outcome", detail=d)) for d in _details(n, tag)]


def _working_run(lg: Any, run_id: str, worker: str = "w1") -> str:
    """Open a run (an owner of its own: an owner may hold only 10 active runs), claim
    it, and move it to executing; return its lease token."""
    lg.open(goal="benchmark run", target="file:out/result.json", owner=f"owner-{run_id}", run_id=run_id)
    lease = lg.claim(run_id, worker)
    lg.transition(run_id, lease, "planning", worker=worker)
    lg.transition(run_id, lease, "executing", worker=worker)
    return str(lease)


# --- SQLite sides --------------------------------------------------------------------


def _sqlite_ledger(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    n, fleet = ctx.params["n"], ctx.params["fleet"]
    one_path, fleet_path = path_in(ctx.dir, "one.db"), path_in(ctx.dir, "fleet.db")
    with Ledger(fleet_path, synchronous="NORMAL") as setup:  # untimed set-up: no fsync per command
        runs = [(f"run-{r:05d}", _working_run(setup, f"run-{r:05d}")) for r in range(fleet)]
        setup.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    one, many = Ledger(one_path, synchronous=SYNCHRONOUS), Ledger(fleet_path, synchronous=SYNCHRONOUS)
    _check(one.store.conn, "handoff-ledger")
    _check(many.store.conn, "handoff-ledger")
    lease = _working_run(one, "run-one")
    order = _fleet_order(fleet, n)
    details = _details(n, "")

    def progress(lg: Any, run_id: str, token: str, i: int) -> Callable[[], object]:
        return lambda: lg.progress(run_id, token, "tool_outcome", details[i], key=f"k-{i}", worker="w1")

    def heartbeat(lg: Any, run_id: str, token: str) -> Callable[[], object]:
        return lambda: lg.heartbeat(run_id, token, worker="w1")

    def run() -> Measured:
        m: dict[str, float] = {}
        conn1, connf = one.store.conn, many.store.conn
        secs = _sqlite_group("progress", one_path, [conn1],
                             [progress(one, "run-one", lease, i) for i in range(n)], m)
        _sqlite_group("heartbeat", one_path, [conn1], [heartbeat(one, "run-one", lease)] * n, m)
        _sqlite_group("progress_fleet", fleet_path, [connf],
                      [progress(many, *runs[r], i) for i, r in enumerate(order)], m)
        _sqlite_group("heartbeat_fleet", fleet_path, [connf], [heartbeat(many, *runs[r]) for r in order], m)
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("the one run's last seq", one.store.head("run-one").last_seq, OPENING_EVENTS + n)
        touched = Counter(order)
        for r, times in list(touched.items())[:5]:
            expect(f"{runs[r][0]}'s last seq", many.store.head(runs[r][0]).last_seq, OPENING_EVENTS + times)

    def close() -> None:
        one.close()
        many.close()

    return Trial(run, check, close)


def _sqlite_raw(ctx: Ctx) -> Trial:
    n, fleet = ctx.params["n"], ctx.params["fleet"]
    one_path, fleet_path = path_in(ctx.dir, "one.db"), path_in(ctx.dir, "fleet.db")
    one, many = raw_connect(one_path), raw_connect(fleet_path)
    prefill = _payloads(OPENING_EVENTS, "opening ")
    many.execute("BEGIN IMMEDIATE")
    many.executemany(RAW_INSERT, [(f"run-{r:05d}", s + 1, p) for r in range(fleet) for s, p in enumerate(prefill)])
    many.execute("COMMIT")
    many.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    payloads = _payloads(n, "")
    order = _fleet_order(fleet, n)

    def insert(conn: sqlite3.Connection, run_id: str, seq: int, payload: bytes) -> Callable[[], object]:
        def op() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(RAW_INSERT, (run_id, seq, payload))
            conn.execute("COMMIT")
        return op

    def run() -> Measured:
        m: dict[str, float] = {}
        secs = _sqlite_group("insert", one_path, [one],
                             [insert(one, "run-one", i + 1, p) for i, p in enumerate(payloads)], m)
        seqs = dict.fromkeys(range(fleet), OPENING_EVENTS)
        ops = []
        for i, r in enumerate(order):
            seqs[r] += 1
            ops.append(insert(many, f"run-{r:05d}", seqs[r], payloads[i]))
        _sqlite_group("insert_fleet", fleet_path, [many], ops, m)
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("rows in the one-run table", raw_count(one), n)
        expect("rows in the fleet table", raw_count(many), fleet * OPENING_EVENTS + n)

    def close() -> None:
        one.close()
        many.close()

    return Trial(run, check, close)


def _es_connections(app: Any) -> list[sqlite3.Connection]:
    """The sqlite3 connections eventsourcing's pool holds, idle ones included; the pool
    keeps its connections in ``_pool`` (eventsourcing 9), which is read, not changed."""
    pool = app.recorder.datastore.pool
    held = list(getattr(pool, "_pool", ())) + list(getattr(pool, "_in_use", {}).values())
    conns = [c._sqlite_conn for c in held]
    if not conns:
        raise RuntimeError("eventsourcing's connection pool holds no connection to trace "
                           "(its internals changed?): the statement count would be 0")
    return conns


def _sqlite_es(ctx: Ctx) -> Trial:
    n, fleet = ctx.params["n"], ctx.params["fleet"]
    one_path, fleet_path = path_in(ctx.dir, "es-one.db"), path_in(ctx.dir, "es-fleet.db")
    one, many = peers.es_app(one_path), peers.es_app(fleet_path)
    agg = peers.es_new_run()
    one.save(agg)
    aggs = []
    for start in range(0, fleet, 100):
        batch = [peers.es_new_run() for _ in range(min(100, fleet - start))]
        for a in batch:
            for i in range(OPENING_EVENTS - 1):
                a.progress("opening", f"opening {i}")
        many.save(*batch)
        aggs.extend(batch)
    order = _fleet_order(fleet, n)
    details = _details(n, "")

    def save(app: Any, a: Any, detail: str) -> Callable[[], object]:
        def op() -> None:
            a.progress("tool_outcome", detail)
            app.save(a)
        return op

    def run() -> Measured:
        m: dict[str, float] = {}
        secs = _sqlite_group("save", one_path, _es_connections(one), [save(one, agg, d) for d in details], m)
        _sqlite_group("save_fleet", fleet_path, _es_connections(many),
                      [save(many, aggs[r], details[i]) for i, r in enumerate(order)], m)
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("the one aggregate's version", one.repository.get(agg.id).version, n + 1)
        r = order[0]
        expect("a fleet aggregate's version", many.repository.get(aggs[r].id).version,
               OPENING_EVENTS + order.count(r))

    def close() -> None:
        one.close()
        many.close()

    return Trial(run, check, close)


def _sqlite_lg(ctx: Ctx) -> Trial:
    n, fleet = ctx.params["n"], ctx.params["fleet"]
    one_path, fleet_path = path_in(ctx.dir, "lg-one.db"), path_in(ctx.dir, "lg-fleet.db")
    saver1, conn1 = peers.lg_saver(one_path)
    saverf, connf = peers.lg_saver(fleet_path, synchronous="NORMAL")  # set-up without an fsync per put
    states = [peers.LgState() for _ in range(fleet)]
    configs: list[Any] = []
    opening = ev.ProgressRecorded(kind="opening", detail="opened")
    for t, st in enumerate(states):
        st.apply(opening)
        configs.append(saverf.put(peers.lg_config(f"run-{t:05d}"), *st.graph_checkpoint()))
    connf.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    _check(connf, "LangGraph's saver")
    connf.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    events = [ev.ProgressRecorded(kind="tool_outcome", detail=d) for d in _details(n, "")]
    order = _fleet_order(fleet, n)
    one_state = peers.LgState()
    one_config: list[Any] = [peers.lg_config("run-one")]

    def put_one(e: ev.Event) -> Callable[[], object]:
        def op() -> None:
            one_state.apply(e)
            one_config[0] = saver1.put(one_config[0], *one_state.graph_checkpoint())
        return op

    def put_fleet(t: int, e: ev.Event) -> Callable[[], object]:
        def op() -> None:
            states[t].apply(e)
            configs[t] = saverf.put(configs[t], *states[t].graph_checkpoint())
        return op

    def run() -> Measured:
        m: dict[str, float] = {}
        secs = _sqlite_group("put", one_path, [conn1], [put_one(e) for e in events], m)
        _sqlite_group("put_fleet", fleet_path, [connf], [put_fleet(r, events[i]) for i, r in enumerate(order)], m)
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("checkpoints of the one thread", conn1.execute("SELECT count(*) FROM checkpoints").fetchone()[0], n)
        expect("checkpoints of the fleet", connf.execute("SELECT count(*) FROM checkpoints").fetchone()[0], fleet + n)

    def close() -> None:
        conn1.close()
        connf.close()

    return Trial(run, check, close)


_SQLITE_GOALS = tuple(
    Goal(f"at most 3 WAL pages per {what}", metric=f"{group}_pages", max_value=3.0)
    for group, what in (
        ("progress", "progress command, one run"),
        ("heartbeat", "heartbeat command, one run"),
        ("progress_fleet", "progress command, spread over the fleet"),
        ("heartbeat_fleet", "heartbeat command, spread over the fleet"),
    )
)

register(
    Scenario(
        name="wal-per-command",
        area=AREA,
        title="SQLite: WAL pages, bytes and statements per durable command, one run and a fleet",
        measures=(
            "Per command: the frames the -wal file gains (read after each command, by salt, "
            "so WAL restarts do not hide any), as pages (frames), bytes (frames x (page size "
            "+ 24)) and commit frames, and the statements the side's connections run "
            "(set_trace_callback); M commands on one run, then M spread over a fleet of "
            "runs (1,000 in a full run). Ours: Ledger.progress with a key, Ledger.heartbeat. "
            "Reference: BEGIN IMMEDIATE; INSERT; COMMIT. Peers: eventsourcing save per "
            "event, LangGraph SqliteSaver.put. <group>@<b-tree>: the frames per command of "
            "each b-tree (dbstat): which pages a command writes."
        ),
        full={"n": 300, "fleet": 1_000},
        quick={"n": 20, "fleet": 30},
        subject=Side("handoff-ledger", _sqlite_ledger,
                     note="groups progress, heartbeat (one run) and *_fleet; <group>@<b-tree> = WAL "
                          "frames per command of that b-tree (dbstat; page 1 = file header)"),
        reference=Side("raw sqlite3", _sqlite_raw, note="BEGIN IMMEDIATE; INSERT; COMMIT per event"),
        peers=(
            Side("eventsourcing", _sqlite_es, requires=peers.ES_REQUIRES,
                 note=peers.ES_NOTE + "; aggregate.progress() then app.save() per event"),
            Side("langgraph SqliteSaver", _sqlite_lg, requires=peers.LG_REQUIRES, note=peers.LG_NOTE),
        ),
        goals=_SQLITE_GOALS,
        unit="commands",
        repeat=1,
        warmup=0,
    )
)


# --- PostgreSQL: the WAL a group writes ----------------------------------------------

_REL = re.compile(r"rel (\d+)/(\d+)/(\d+)")


def aligned(length: int) -> int:
    """A WAL record's room in the log: records start on 8-byte (MAXALIGN) boundaries."""
    return (length + 7) & ~7


class PgWal:
    """The WAL between two points of the server's log, from a connection of its own to
    the run's database; with pg_walinspect, this database's records only."""

    def __init__(self, db_url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(db_url, autocommit=True)
        self.db_oid = self.conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            self.conn.execute("CREATE TABLE IF NOT EXISTS wal_meter_flush (x int)")
            # A checkpoint during a group (timed, or another database's load) would let
            # the server recycle the segments the group's records are in before they are
            # read. A temporary physical slot reserves the WAL from here on; the server
            # drops it when this session ends, however the run ends.
            self.conn.execute("SELECT pg_create_physical_replication_slot("
                              "'handoff_wal_meter_' || pg_backend_pid(), true, true)")
            self.inspect = True
        except psycopg.Error:  # not a superuser, contrib not installed, no slots: LSN difference only
            self.inspect = False
        self._start = ""

    def close(self) -> None:
        self.conn.close()

    def start(self) -> None:
        self._start = self.conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]

    def stop(self, group: str, n: int, metrics: dict[str, float]) -> None:
        """The group's figures per command into ``metrics``."""
        conn = self.conn
        end = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
        diff = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, self._start)).fetchone()[0]
        metrics[f"{group}_lsn_bytes"] = float(diff) / n
        if not self.inspect:
            return
        if diff > 0 and conn.execute(
                "SELECT pg_current_wal_flush_lsn() < %s::pg_lsn", (end,)).fetchone()[0]:
            # A commit made with synchronous_commit=off may not be flushed yet, and
            # pg_walinspect reads only up to the flush point: a durable write of ours
            # (at the server's synchronous_commit, on by default) flushes everything
            # before it. Its records come after ``end``, unread.
            conn.execute("INSERT INTO wal_meter_flush VALUES (1)")
        rows = [] if diff <= 0 else conn.execute(
            "SELECT xid::text::bigint, resource_manager, record_type, record_length, fpi_length, block_ref "
            "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)", (self._start, end)).fetchall()
        mine = f"/{self.db_oid}/"
        xids = {xid for xid, _, _, _, _, ref in rows if xid and ref and mine in ref}
        ours = [r for r in rows if (r[5] and mine in r[5]) or (r[0] and r[0] in xids)]
        names = dict(conn.execute(
            "SELECT pg_relation_filenode(oid)::bigint, relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL").fetchall())
        metrics[f"{group}_wal_bytes"] = sum(aligned(r[3]) for r in ours) / n
        metrics[f"{group}_nofpi_bytes"] = sum(aligned(r[3] - r[4]) for r in ours) / n
        metrics[f"{group}_records"] = len(ours) / n
        metrics[f"{group}_commits"] = sum(1 for r in ours if r[1] == "Transaction" and r[2].startswith("COMMIT")) / n
        by_rel: Counter[str] = Counter()
        for _xid, rmgr, _kind, length, fpi, ref in ours:
            m = _REL.search(ref or "")
            rel = names.get(int(m.group(3)), f"relfilenode {m.group(3)}") if m else rmgr.lower()
            by_rel[rel] += aligned(length - fpi)
        for rel, b in sorted(by_rel.items(), key=lambda kv: (-kv[1], kv[0])):
            metrics[f"{group}@{rel}"] = b / n


@contextlib.contextmanager
def counting_statements(exclude: Any) -> Iterator[list[int]]:
    """Count the statements sent through psycopg cursors (every connection of this
    process but ``exclude``) while the block runs: ``execute`` counts the results of its
    query (a simple-query message of several statements has one each, at least one),
    ``executemany`` one per parameter set. The class methods are restored afterwards."""
    import psycopg

    count = [0]
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counted_execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        out = execute(self, query, params, **kw)
        if self.connection is not exclude:
            count[0] += max(1, len(getattr(self, "_results", ()) or ()))
        return out

    def counted_executemany(self: Any, query: Any, params_seq: Any, **kw: Any) -> Any:
        params_seq = list(params_seq)
        if self.connection is not exclude:
            count[0] += len(params_seq)
        return executemany(self, query, params_seq, **kw)

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = counted_executemany  # type: ignore[method-assign]
    try:
        yield count
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]


def _pg_group(group: str, meter: PgWal, ops: Sequence[Callable[[], object]], metrics: dict[str, float]) -> float:
    n = len(ops)
    clock = time.perf_counter
    meter.start()
    with counting_statements(meter.conn) as count:
        t0 = clock()
        for op in ops:
            op()
        seconds = clock() - t0
    meter.stop(group, n, metrics)
    metrics[f"{group}_stmts"] = count[0] / n
    return seconds


# --- PostgreSQL sides ----------------------------------------------------------------


def _pg_raw_groups(meter: PgWal, schema_one: Any, schema_fleet: Any, n: int, fleet: int,
                   metrics: dict[str, float], prefix: str = "insert") -> tuple[float, Any, Any]:
    """The raw reference's two groups (autocommit INSERT per event), on the given schemas."""
    from .bench_postgres import RAW_INSERT as PG_INSERT
    from .bench_postgres import _raw_conn

    one, many = _raw_conn(schema_one), _raw_conn(schema_fleet)
    prefill = _payloads(OPENING_EVENTS, "opening ")
    with many.cursor().copy("COPY events (run_id, seq, payload) FROM STDIN") as copy:
        for r in range(fleet):
            for s, p in enumerate(prefill):
                copy.write_row((f"run-{r:05d}", s + 1, p))
    payloads = _payloads(n, "")
    order = _fleet_order(fleet, n)
    seqs = dict.fromkeys(range(fleet), OPENING_EVENTS)
    fleet_rows = []
    for i, r in enumerate(order):
        seqs[r] += 1
        fleet_rows.append((f"run-{r:05d}", seqs[r], payloads[i]))

    def insert(conn: Any, row: tuple[Any, ...]) -> Callable[[], object]:
        return lambda: conn.execute(PG_INSERT, row)

    secs = _pg_group(prefix, meter, [insert(one, ("run-one", i + 1, p)) for i, p in enumerate(payloads)], metrics)
    _pg_group(f"{prefix}_fleet", meter, [insert(many, row) for row in fleet_rows], metrics)
    return secs, one, many


def _pg_sides_unavailable() -> str | None:
    from .postgres_server import unavailable

    return unavailable()


def _pg_ledger(ctx: Ctx) -> Trial:
    from handoff.facade import Ledger

    from .postgres_server import Schema

    n, fleet = ctx.params["n"], ctx.params["fleet"]
    schemas = [Schema("wal") for _ in range(4)]  # ours: one run, fleet; raw: one run, fleet
    meter = PgWal(schemas[0].db_url)
    one, many = Ledger(schemas[0].url), Ledger(schemas[1].url)
    lease = _working_run(one, "run-one")
    runs = [(f"run-{r:05d}", _working_run(many, f"run-{r:05d}")) for r in range(fleet)]
    order = _fleet_order(fleet, n)
    details = _details(n, "")
    raw_conns: list[Any] = []

    def progress(lg: Any, run_id: str, token: str, i: int) -> Callable[[], object]:
        return lambda: lg.progress(run_id, token, "tool_outcome", details[i], key=f"k-{i}", worker="w1")

    def heartbeat(lg: Any, run_id: str, token: str) -> Callable[[], object]:
        return lambda: lg.heartbeat(run_id, token, worker="w1")

    def run() -> Measured:
        m: dict[str, float] = {}
        secs = _pg_group("progress", meter, [progress(one, "run-one", lease, i) for i in range(n)], m)
        _pg_group("heartbeat", meter, [heartbeat(one, "run-one", lease)] * n, m)
        _pg_group("progress_fleet", meter, [progress(many, *runs[r], i) for i, r in enumerate(order)], m)
        _pg_group("heartbeat_fleet", meter, [heartbeat(many, *runs[r]) for r in order], m)
        # The raw INSERT in the same trial, for the goals' ratios (the reference side
        # measures it again on its own; here it shares this trial's server state).
        raw: dict[str, float] = {}
        _, c1, c2 = _pg_raw_groups(meter, schemas[2], schemas[3], n, fleet, raw)
        raw_conns.extend((c1, c2))
        if meter.inspect:
            for ours, theirs in (("progress", "insert"), ("heartbeat", "insert"),
                                 ("progress_fleet", "insert_fleet"), ("heartbeat_fleet", "insert_fleet")):
                base = raw[f"{theirs}_nofpi_bytes"]
                m[f"{ours}_x_raw"] = m[f"{ours}_nofpi_bytes"] / base if base else float("inf")
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("the one run's last seq", one.store.head("run-one").last_seq, OPENING_EVENTS + n)
        r = order[0]
        expect(f"{runs[r][0]}'s last seq", many.store.head(runs[r][0]).last_seq,
               OPENING_EVENTS + order.count(r))

    def close() -> None:
        errors = []
        closers = [c.close for c in (*raw_conns, one, many, meter)] + [s.drop for s in schemas]
        for close_one in closers:
            try:
                close_one()
            except Exception as exc:  # try them all, then report the first
                errors.append(exc)
        if errors:
            raise errors[0]

    return Trial(run, check, close)


def _pg_raw(ctx: Ctx) -> Trial:
    from .postgres_server import Schema

    n, fleet = ctx.params["n"], ctx.params["fleet"]
    schemas = [Schema("wal"), Schema("wal")]
    meter = PgWal(schemas[0].db_url)
    conns: list[Any] = []

    def run() -> Measured:
        m: dict[str, float] = {}
        secs, c1, c2 = _pg_raw_groups(meter, schemas[0], schemas[1], n, fleet, m)
        conns.extend((c1, c2))
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("rows of the one run", conns[0].execute("SELECT count(*) FROM events").fetchone()[0], n)
        expect("rows of the fleet", conns[1].execute("SELECT count(*) FROM events").fetchone()[0],
               fleet * OPENING_EVENTS + n)

    def close() -> None:
        for c in conns:
            c.close()
        meter.close()
        for s in schemas:
            s.drop()

    return Trial(run, check, close)


def _pg_es(ctx: Ctx) -> Trial:
    from .postgres_server import Schema

    n, fleet = ctx.params["n"], ctx.params["fleet"]
    schemas = [Schema("wal"), Schema("wal")]
    meter = PgWal(schemas[0].db_url)
    runs_cls = peers.es_classes()["Runs"]
    one, many = runs_cls(env=schemas[0].es_env()), runs_cls(env=schemas[1].es_env())
    agg = peers.es_new_run()
    one.save(agg)
    aggs = []
    for start in range(0, fleet, 100):
        batch = [peers.es_new_run() for _ in range(min(100, fleet - start))]
        for a in batch:
            for i in range(OPENING_EVENTS - 1):
                a.progress("opening", f"opening {i}")
        many.save(*batch)
        aggs.extend(batch)
    order = _fleet_order(fleet, n)
    details = _details(n, "")

    def save(app: Any, a: Any, detail: str) -> Callable[[], object]:
        def op() -> None:
            a.progress("tool_outcome", detail)
            app.save(a)
        return op

    def run() -> Measured:
        m: dict[str, float] = {}
        secs = _pg_group("save", meter, [save(one, agg, d) for d in details], m)
        _pg_group("save_fleet", meter, [save(many, aggs[r], details[i]) for i, r in enumerate(order)], m)
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        expect("the one aggregate's version", one.repository.get(agg.id).version, n + 1)

    def close() -> None:
        one.close()
        many.close()
        meter.close()
        for s in schemas:
            s.drop()

    return Trial(run, check, close)


def _pg_lg(ctx: Ctx) -> Trial:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    from .postgres_server import Schema

    n, fleet = ctx.params["n"], ctx.params["fleet"]
    schemas = [Schema("wal"), Schema("wal")]
    meter = PgWal(schemas[0].db_url)
    conns = [psycopg.connect(s.url, autocommit=True, prepare_threshold=0, row_factory=dict_row) for s in schemas]
    saver1, saverf = PostgresSaver(conns[0]), PostgresSaver(conns[1])  # type: ignore[arg-type]
    saver1.setup()
    saverf.setup()
    states = [peers.LgState() for _ in range(fleet)]
    configs: list[Any] = []
    opening = ev.ProgressRecorded(kind="opening", detail="opened")
    for t, st in enumerate(states):
        st.apply(opening)
        configs.append(saverf.put(peers.lg_config(f"run-{t:05d}"), *st.graph_checkpoint()))
    events = [ev.ProgressRecorded(kind="tool_outcome", detail=d) for d in _details(n, "")]
    order = _fleet_order(fleet, n)
    one_state = peers.LgState()
    one_config: list[Any] = [peers.lg_config("run-one")]

    def put_one(e: ev.Event) -> Callable[[], object]:
        def op() -> None:
            one_state.apply(e)
            one_config[0] = saver1.put(one_config[0], *one_state.graph_checkpoint())
        return op

    def put_fleet(t: int, e: ev.Event) -> Callable[[], object]:
        def op() -> None:
            states[t].apply(e)
            configs[t] = saverf.put(configs[t], *states[t].graph_checkpoint())
        return op

    def run() -> Measured:
        m: dict[str, float] = {}
        secs = _pg_group("put", meter, [put_one(e) for e in events], m)
        _pg_group("put_fleet", meter, [put_fleet(r, events[i]) for i, r in enumerate(order)], m)
        return Measured(seconds=secs, metrics=m)

    def check() -> None:
        count = conns[0].execute("SELECT count(*) AS c FROM checkpoints").fetchone()["c"]
        expect("checkpoints of the one thread", count, n)

    def close() -> None:
        for c in conns:
            c.close()
        meter.close()
        for s in schemas:
            s.drop()

    return Trial(run, check, close)


def _pg_side(name: str, prepare: Any, *, note: str = "", requires: tuple[str, ...] = ()) -> Side:
    return Side(name, prepare, requires=requires, note=note, unavailable=_pg_sides_unavailable)


register(
    Scenario(
        name="pg-wal-per-command",
        area=AREA,
        title="PostgreSQL: WAL bytes and statements per durable command, one run and a fleet",
        measures=(
            "Per command: pg_wal_lsn_diff of pg_current_wal_insert_lsn() before and after "
            "the group, from a separate connection "
            "(lsn_bytes: the whole server's WAL); with pg_walinspect this database's records "
            "only (wal_bytes; nofpi_bytes without full-page images, which depend on when the "
            "server last checkpointed), records, commits, and <group>@<relation> bytes; "
            "statements sent through psycopg cursors (stmts). M commands on one run, then M "
            "spread over a fleet (1,000 runs in a full run). Ours: Ledger.progress with a key, "
            "Ledger.heartbeat, and the raw INSERT again in the same trial for the x_raw "
            "ratios. Reference: raw psycopg autocommit INSERT. Peers: eventsourcing.postgres "
            "save per event, LangGraph PostgresSaver.put."
        ),
        full={"n": 300, "fleet": 1_000},
        quick={"n": 10, "fleet": 20},
        subject=_pg_side("handoff-ledger", _pg_ledger,
                         note="groups progress, heartbeat (one run) and *_fleet; *_x_raw = nofpi_bytes "
                              "over the raw INSERT's in the same trial; <group>@<relation> = bytes "
                              "per command without full-page images"),
        reference=_pg_side("raw psycopg", _pg_raw, note="one autocommit INSERT per event"),
        peers=(
            _pg_side("eventsourcing.postgres", _pg_es, requires=("eventsourcing", "psycopg"),
                     note="aggregate.progress() then app.save() per event"),
            _pg_side("langgraph PostgresSaver", _pg_lg, requires=("langgraph.checkpoint.postgres",),
                     note="PostgresSaver.put of a checkpoint per event (autocommit connection)"),
        ),
        goals=tuple(
            Goal(f"WAL bytes per {what} at most 3x the raw INSERT's (no full-page images)",
                 metric=f"{group}_x_raw", max_value=3.0)
            for group, what in (("progress", "progress, one run"), ("heartbeat", "heartbeat, one run"),
                                ("progress_fleet", "progress, fleet"), ("heartbeat_fleet", "heartbeat, fleet"))
        ),
        unit="commands",
        repeat=1,
        warmup=0,
    )
)
