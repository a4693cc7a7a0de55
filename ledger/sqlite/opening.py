"""What a path must be before SQLite opens it, and what a file that will not open was.

A file that never was a ledger needs a different path; a ledger that was damaged needs
a backup: the bytes tell them apart (the SQLite header, the ledger's marker row).
"""

from __future__ import annotations

import os
import sqlite3
import stat

from .. import files
from ..errors import CorruptLedger, LedgerError, NotALedger
from ..store import FORMAT_NAME


#: The first 16 bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"
#: The ledger's marker row (handoff_meta: format = handoff-ledger) as SQLite stores it:
#: the two values side by side. The table is created first, so the row sits on an early
#: page; the bytes are too specific to turn up in a text file that merely names the project.
_MARKER = b"format" + FORMAT_NAME.encode()
_MARKER_SCAN = 1 << 20


def sniff(path: str) -> LedgerError | None:
    """Why an existing file cannot be opened as a ledger, judged from its bytes, or None.

    Tells a file that never was a ledger (no SQLite header, no marker table) from a
    ledger that was damaged (the marker is there behind a broken header): the first
    needs a different path, the second a backup. Empty files and unreadable ones are
    left to SQLite and the schema check.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
            if not head or head == SQLITE_HEADER:
                return None
            marked = _MARKER in head + f.read(_MARKER_SCAN)
    except OSError:
        return None
    if marked:
        return CorruptLedger(
            f"{path} is a handoff ledger whose SQLite header is damaged (its first bytes "
            "are not SQLite's), so it cannot be opened. Restore it from a backup or an "
            "export; keep this copy for inspection",
        )
    return NotALedger(_not_a_ledger(path, "it is not a database at all: its first bytes are not SQLite's header"))


def unusable_path(path: str) -> NotALedger | None:
    """Why ``path`` can never hold a ledger, judged before SQLite opens it, or None.

    Only a regular file on a disk can: opening a FIFO or a device can block or have
    effects, a directory is no file, and a kernel pseudo-file's size and bytes are not
    stored data (SQLite's writes to /proc/self/mem fail as I/O errors, which would read as
    a failing disk). A path that does not exist is judged by its directory."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        try:
            root = files.pseudo_root(parent, os.stat(parent))
        except OSError:
            return None  # no such directory: creating the file says so
        if root is None:
            return None
        return NotALedger(
            f"{path} would be a new file on the kernel pseudo-filesystem {root}, which holds no "
            "regular file the ledger can use. Check the path given by --db or HANDOFF_DB, and name "
            "a file on a disk"
        )
    except OSError:
        return None  # unreadable: opening it reports why
    if not stat.S_ISREG(st.st_mode):
        return NotALedger(_not_usable(path, files.file_kind(st.st_mode)))
    root = files.pseudo_root(path, st)
    if root is not None:
        return NotALedger(_not_usable(path, f"a kernel pseudo-file under {root} (its size and bytes are "
                                            "not stored data, and writing to it acts on the system)"))
    return None


def _not_usable(path: str, kind: str) -> str:
    return (
        f"{path} is {kind}, not a regular file the ledger can use. Check the path given by --db or "
        "HANDOFF_DB, or name a new file and create it with 'handoff --db FILE init'"
    )


def _not_a_ledger(path: str, why: str) -> str:
    return (
        f"{path} is not a handoff ledger; {why}. Check the path given by --db or "
        "HANDOFF_DB, or name a new file and create it with 'handoff --db FILE init'"
    )


def unreadable_schema(path: str, exc: sqlite3.Error) -> LedgerError:
    """SQLite's header is there but its schema cannot be read: damage if the marker shows."""
    try:
        with open(path, "rb") as f:
            marked = _MARKER in f.read(_MARKER_SCAN)
    except OSError:
        marked = False
    if marked:
        return CorruptLedger(
            f"{path} is a handoff ledger that SQLite cannot read ({exc}); it was damaged. "
            "Restore it from a backup or an export; keep this copy for inspection",
            cause=str(exc),
        )
    return NotALedger(_not_a_ledger(path, f"SQLite cannot read it ({exc}) and it carries no ledger marker"))
