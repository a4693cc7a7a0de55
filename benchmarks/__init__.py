"""handoff-ledger's benchmark harness: ``python -m benchmarks`` (see docs/performance.md).

Scenarios live one module per area and register themselves on import. To add an area
(reducer fold, projection rebuild, CLI startup, peers such as eventsourcing or
langgraph-checkpoint-sqlite), write ``benchmarks/<area>.py`` calling
``harness.register(Scenario(...))`` and add its module name to ``AREAS``. A peer side
names the modules it needs in ``Side(requires=...)``; when they are not importable the
report says "peer not installed" and the scenario still runs against raw sqlite3.
Peers come from the optional extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import importlib

from .harness import REGISTRY, Scenario, Side, Trial, register

#: Scenario modules, in report order.
AREAS: tuple[str, ...] = (
    "benchmarks.store",
    "benchmarks.commands",
    "benchmarks.folds",
    "benchmarks.projections",
    "benchmarks.cli_startup",
    "benchmarks.concurrency",
)


def load() -> dict[str, Scenario]:
    """Import every area module (each registers its scenarios) and return the registry."""
    for name in AREAS:
        importlib.import_module(name)
    return REGISTRY


__all__ = ["AREAS", "REGISTRY", "Scenario", "Side", "Trial", "load", "register"]
