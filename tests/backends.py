"""The storage backends the backend-neutral suites run on: one entry per backend.

Three suites are written once and run on every entry here, through the ``backend`` and
``backend_store`` fixtures of tests/conftest.py:

- the store conformance suite, tests/ledger/conformance.py (collected by
  tests/ledger/test_store_conformance.py): the whole ``EventStore`` interface;
- the projections suite, tests/projections/test_projection_backends.py: rebuild equals
  inline upkeep, check, catch-up, the view store's read vocabulary;
- the Ledger/CLI suite, tests/test_ledger_conformance.py: every verb through
  ``Ledger(store=...)``, and the ``handoff`` command through ``--db <address>``.

A new backend (``ledger/postgres.py``, next) adds one ``Backend`` to ``BACKENDS``: its
name, a function from a per-test temporary directory to the address of a fresh, empty
ledger (what a user would pass to ``Ledger(...)`` or ``--db``), and whether another
process can open that same address (the CLI tests need that; an in-memory store cannot).
Nothing else in the tests changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ledger.backends import open_store
from ledger.store import EventStore


@dataclass(frozen=True)
class Backend:
    """How the suites reach one backend."""

    name: str
    #: A fresh, empty ledger's address, given a per-test directory it may use. Called
    #: again for every further store a test asks for, so each call must name a new ledger.
    address: Callable[[Path], str]
    #: Can a second process open the same address and see the same ledger? (The CLI
    #: suite runs ``handoff --db <address>`` as real subprocesses only where it can.)
    shared: bool

    def open(self, address: str) -> EventStore:
        return open_store(address)


_n = itertools.count()


def _sqlite_file(tmp: Path) -> str:
    return f"sqlite://{tmp / f'ledger-{next(_n)}.db'}"


def _sqlite_memory(tmp: Path) -> str:
    return "sqlite::memory:"  # every open of it is a new, private store


BACKENDS: dict[str, Backend] = {
    "sqlite-file": Backend("sqlite-file", _sqlite_file, shared=True),
    "sqlite-memory": Backend("sqlite-memory", _sqlite_memory, shared=False),
}
