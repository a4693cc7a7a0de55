"""The storage backends the backend-neutral suites run on: one entry per backend.

Three suites are written once and run on every entry here, through the ``backend`` and
``backend_store`` fixtures of tests/conftest.py:

- the store conformance suite, tests/ledger/conformance.py (collected by
  tests/ledger/test_store_conformance.py): the whole ``EventStore`` interface;
- the projections suite, tests/projections/test_projection_backends.py: rebuild equals
  inline upkeep, check, catch-up, the view store's read vocabulary;
- the Ledger/CLI suite, tests/test_ledger_conformance.py: every verb through
  ``Ledger(store=...)``, and the ``handoff`` command through ``--db <address>``.

A new backend (as ``ledger/postgres/postgres_store.py`` did) adds one ``Backend`` to ``BACKENDS``: its
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

from handoff import Ledger
from handoff.ledger.backends import open_store
from handoff.ledger.store import EventStore


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

    def open(self, address: str, **options: object) -> EventStore:
        """A store on ``address``; ``options`` are ``open_store``'s (``clock=`` for the
        store's own clock, so two backends can record the very same history)."""
        return open_store(address, **options)


_n = itertools.count()


def _sqlite_file(tmp: Path) -> str:
    return f"sqlite://{tmp / f'ledger-{next(_n)}.db'}"


def _sqlite_memory(tmp: Path) -> str:
    return "sqlite::memory:"  # every open of it is a new, private store


def _postgres(tmp: Path) -> str:
    """A new, empty schema in the test session's own database (tests/pg.py): the test
    fails under CI=true, and skips elsewhere, when no PostgreSQL server answers."""
    from tests.pg import fresh_url

    return fresh_url()


BACKENDS: dict[str, Backend] = {
    "sqlite-file": Backend("sqlite-file", _sqlite_file, shared=True),
    "sqlite-memory": Backend("sqlite-memory", _sqlite_memory, shared=False),
    "postgres": Backend("postgres", _postgres, shared=True),
}


class OnBackend:
    """One backend of tests/backends.py, bound to a test's temporary directory.

    ``new_store()`` opens a fresh, empty store; ``address()`` names a fresh ledger for
    ``Ledger(...)`` or ``handoff --db``, and ``open(address)`` gives another handle on it
    (``ledger(clock)`` a Ledger on a fresh one)
    (``shared`` says whether a second handle or process sees the same ledger there).
    Every store opened through it is closed after the test.
    """

    def __init__(self, backend: Backend, tmp_path: Path) -> None:
        self.backend, self.tmp_path = backend, tmp_path
        self.name, self.shared = backend.name, backend.shared
        self._opened: list[EventStore] = []

    def address(self) -> str:
        return self.backend.address(self.tmp_path)

    def new_store(self) -> EventStore:
        return self.open(self.address())

    def open(self, address: str, **options: object) -> EventStore:
        """Another handle on the ledger at ``address`` (closed after the test)."""
        store = self.backend.open(address, **options)
        self._opened.append(store)
        return store

    def ledger(self, clock: Callable[[], int], address: str | None = None) -> Ledger:
        """A Ledger on a fresh store here (or on ``address``), it and its store on ``clock``:
        two backends given the same steps record the very same history."""
        return Ledger(store=self.open(address or self.address(), clock=clock), clock=clock)

    def close(self) -> None:
        for store in self._opened:
            store.close()
