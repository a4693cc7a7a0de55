"""The sqlite3 driver's errors, mapped to the library's in one place."""

from __future__ import annotations

import sqlite3

from ..errors import CorruptLedger, LedgerError, StoreUnavailable


def is_driver_error(exc: BaseException) -> bool:
    """An error from the sqlite3 driver itself (ledger.backends.is_driver_error asks)."""
    return isinstance(exc, sqlite3.Error)


def explain(exc: sqlite3.Error, doing: str, path: str) -> LedgerError:
    """Map a driver error to the library's own, in one place."""
    text = str(exc)
    low = text.lower()
    if "locked" in low or "busy" in low:
        return StoreUnavailable(
            f"the ledger {path} stayed locked by another process past the busy timeout while "
            f"{doing}; nothing was written. Retry, or raise the timeout (--busy-timeout)",
            cause=text,
        )
    if "readonly" in low or "read-only" in low:
        return StoreUnavailable(
            f"the ledger {path} is read-only, so {doing} wrote nothing. Check the file's "
            "permissions and the directory's (SQLite writes -wal and -shm files beside it)",
            cause=text,
        )
    if "disk is full" in low or "disk or i/o" in low or "i/o error" in low:
        return StoreUnavailable(
            f"the disk holding {path} is full or failing ({text}) while {doing}; nothing was "
            "written. Free space and retry; acknowledged events are intact",
            cause=text,
        )
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return CorruptLedger(
            f"{path} is damaged or not a database ({text}) while {doing}. Run "
            "'handoff verify' on a copy, and restore from a backup or export",
            cause=text,
        )
    if "unable to open" in low:
        return StoreUnavailable(
            f"cannot open {path} ({text}); check that the directory exists and is writable",
            cause=text,
        )
    return StoreUnavailable(f"SQLite failed while {doing} on {path}: {text}", cause=text)
