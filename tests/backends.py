"""The storage backends the backend-neutral suites run on: one entry per backend.

A new backend (ledger/postgres.py, next) adds one entry to ``BACKENDS``: a function from
a per-test temporary directory to a fresh, empty store. The ``backend_store`` fixture
(tests/conftest.py) then runs the projections suite
(tests/projections/test_projection_backends.py) and the Ledger-level tests in
tests/test_backends.py on it; its conformance class is one more subclass of
``tests.ledger.conformance.StoreConformance`` whose ``make_store`` calls the same entry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ledger.store import EventStore


def _sqlite_file(tmp: Path) -> EventStore:
    from ledger.sqlite import SqliteStore

    return SqliteStore(tmp / "ledger.db")


def _sqlite_memory(tmp: Path) -> EventStore:
    from ledger.sqlite import SqliteStore

    return SqliteStore.memory()


def _postgres(tmp: Path) -> EventStore:
    from ledger.postgres import PostgresStore
    from tests.pg import fresh_url

    return PostgresStore(fresh_url())


BACKENDS: dict[str, Callable[[Path], EventStore]] = {
    "sqlite-file": _sqlite_file,
    "sqlite-memory": _sqlite_memory,
    "postgres": _postgres,
}
