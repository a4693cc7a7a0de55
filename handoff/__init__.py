"""handoff-ledger's Python API: ``from handoff import Ledger``.

The distribution installs one top-level name, ``handoff``; the layers live under it
(``handoff.ledger``, ``handoff.reducers``, ``handoff.projections``, ``handoff.cli``). Names
are loaded when first used, so importing a pure layer (``handoff.reducers``) does not load
the API, the SQLite store or the command line.
"""

from __future__ import annotations

import importlib
from typing import Any

from handoff.ledger import errors as _errors
from handoff.ledger.errors import *  # noqa: F401,F403  (pure: the typed errors only)

_LAZY = {
    "Ledger": "handoff.facade", "Outcome": "handoff.results", "import_into": "handoff.facade",
    "measure": "handoff.artifacts", "Actor": "handoff.ledger.store", "Sent": "handoff.results",
    "AsyncLedger": "handoff.aio",
}

__all__ = ["Ledger", "AsyncLedger", "Outcome", "Sent", "Actor", "measure", "import_into",
           *sorted(n for n, v in vars(_errors).items() if isinstance(v, type) and issubclass(v, Exception))]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'handoff' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
