"""The ledger layer: event types, the storage interface, and its backends.

Names other than the typed errors are loaded on first use (``ledger.SqliteStore``,
``ledger.Actor``), not on import: the reducers import ``ledger.events``, and a pure fold
must not load a database driver; and importing the errors (as ``handoff`` does) must not
load msgspec, so that the command line can choose how msgspec is loaded (cli.py).
"""

import importlib
from typing import Any

from .errors import *  # noqa: F401,F403

_LAZY = {
    "SCHEMA_VERSION": ".events", "Event": ".events", "Actor": ".store", "AppendResult": ".store",
    "EventStore": ".store", "Head": ".store", "Recorded": ".store", "SqliteStore": ".sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["SCHEMA_VERSION", "Event", "Actor", "AppendResult", "EventStore", "Head", "Recorded", "SqliteStore"]
