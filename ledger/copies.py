"""A whole ledger copied into a new file, through the interface alone.

What a backend without a file of its own (PostgreSQL) does for ``backup_to``: one read
snapshot of the source, imported verbatim into a new SQLite ledger (positions and both
chains carry over, so the copy's head digest is the source's). The new file is an
SQLite ledger, opened here, in the core, with the SQLite backend: no backend package
imports another, and opening by address (``ledger.backends``, which reaches every
backend) is not needed, so no import leads back to the PostgreSQL store.
"""

from __future__ import annotations

from .store import EventStore


def copy_to_file(source: EventStore, path: str) -> tuple[int, bytes, int]:
    """Copy ``source`` into the new ledger file ``path``; its last position, ledger-wide
    hash there, and run count."""
    from .sqlite import SqliteStore  # loaded only when a copy is made

    dst = SqliteStore(path)
    try:
        with source.read_transaction():
            dst.import_records(source.read_for_export())
        position, ghash = dst.ledger_head()
        return position, ghash, dst.count_runs()
    finally:
        dst.close()
