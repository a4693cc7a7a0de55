"""handoff-ledger's benchmark harness: ``python -m benchmarks`` (see docs/performance.md).

Scenarios live one module per area, ``bench_<area>.py`` (so no module here shares a
name with one of the library's), and register themselves on import: ``store``
(SqliteStore appends and reads), ``commands`` (the Ledger's durable command path and
batched appends, beside eventsourcing and LangGraph), ``folds`` (one run's state from its
log), ``reports`` (an incident report of a 100,000-event run), ``exports`` (the readable
SQLite copy of a 100,500-event ledger beside its JSON Lines export), ``projections``
(full rebuild with peak RSS, status lookup and stall scan at
100,000 runs), ``cli`` (``handoff progress`` as a process), ``hooks`` (one coding agent's hook process beside ``python -c pass``), ``serve`` (the fleet page at
100,000 runs; 50 SSE clients following one run) and
``concurrency`` (8 writer processes) and ``postgres`` (the PostgreSQL backend beside raw
psycopg and eventsourcing.postgres, in a database of the run's own; ``no server`` when
there is none) and ``delivery`` (the sanitization scan; a send to
file:// against recording a delivery by hand) and ``langgraph`` (a graph whose state grows
1 KiB a step under LedgerSaver and LangGraph's own savers) and ``wal`` (WAL pages and bytes
and statements per command, SQLite and PostgreSQL) and ``fleet`` (10,000 live runs beating
and stepping at the default policy, with the watchdog's scan). ``--only AREA`` selects one. To
add an area, write ``benchmarks/bench_<area>.py`` calling ``harness.register(Scenario(...))``
and add its module name to ``AREAS``. A peer side names the modules it needs in
``Side(requires=...)``; when they are not importable the report says "peer not
installed" and the scenario still runs against raw sqlite3. Peers come from the optional
extra: ``pip install -e '.[bench]'``; their set-up is in ``peers.py``, work that runs in
a child process in ``child.py``.
"""

from __future__ import annotations

import importlib

from .harness import REGISTRY, Goal, Measured, Scenario, Side, Trial, register

#: Scenario modules, in report order.
AREAS: tuple[str, ...] = (
    "benchmarks.bench_store",
    "benchmarks.bench_commands",
    "benchmarks.bench_folds",
    "benchmarks.bench_reports",
    "benchmarks.bench_exports",
    "benchmarks.bench_projections",
    "benchmarks.bench_cli",
    "benchmarks.bench_hooks",
    "benchmarks.bench_serve",
    "benchmarks.bench_concurrency",
    "benchmarks.bench_postgres",
    "benchmarks.bench_delivery",
    "benchmarks.bench_langgraph",
    "benchmarks.bench_fleet",
    "benchmarks.bench_wal",
)


def load() -> dict[str, Scenario]:
    """Import every area module (each registers its scenarios) and return the registry."""
    for name in AREAS:
        importlib.import_module(name)
    return REGISTRY


__all__ = ["AREAS", "REGISTRY", "Goal", "Measured", "Scenario", "Side", "Trial", "load", "register"]
