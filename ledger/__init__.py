"""The ledger layer: event types, the storage interface, and its backends.

The SQLite store is loaded on first use (``ledger.SqliteStore``), not on import: the
reducers import ``ledger.events``, and a pure fold must not load a database driver.
"""

from typing import Any

from .errors import *  # noqa: F401,F403
from .events import SCHEMA_VERSION, Event
from .store import Actor, AppendResult, EventStore, Head, Recorded


def __getattr__(name: str) -> Any:
    if name == "SqliteStore":
        from .sqlite import SqliteStore

        return SqliteStore
    raise AttributeError(f"module 'ledger' has no attribute {name!r}")


__all__ = ["SCHEMA_VERSION", "Event", "Actor", "AppendResult", "EventStore", "Head", "Recorded", "SqliteStore"]
