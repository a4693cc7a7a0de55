"""Whole ledgers copied into new files, and what a copy must never overwrite.

``copy_to_file`` is what a backend without a file of its own (PostgreSQL) does for
``backup_to``: one read snapshot of the source, imported verbatim into a new SQLite ledger
(positions and both chains carry over, so the copy's head digest is the source's). The new
file is an SQLite ledger, opened here, in the core, with the SQLite backend: no backend
package imports another, and opening by address (``ledger.backends``, which reaches every
backend) is not needed, so no import leads back to the PostgreSQL store.

The rest is the file work of the facade's copies (handoff/copies.py, handoff/facade.py):
SQLite keeps a -wal, -shm or -journal file beside a database, so a copy written over one
of the ledger's would drop commits, a backup placed where one lies would have SQLite apply
a stranger's journal to it, and a new ledger is published only once its WAL is merged.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator

from . import files
from .errors import InvalidInput, StoreUnavailable, TargetAppeared
from .store import EventStore

#: The files SQLite keeps beside a database while it is open (or after an unclean close).
SIDE = ("-wal", "-shm", "-journal")


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


def refuse_the_ledger(ledger_path: str, target: str, given: object, field: str, verb: str) -> None:
    """Refuse to write a copy over the ledger at ``ledger_path`` itself or one of the files
    SQLite keeps beside it (-wal, -shm, -journal): replacing the WAL silently drops every
    commit still in it. ``target`` is the resolved path, ``given`` what the caller named."""
    if not ledger_path or ledger_path == ":memory:" or "://" in ledger_path:
        return
    base = os.path.abspath(ledger_path)
    names = {base, *(base + x for x in SIDE)}
    same = target in names or any(
        os.path.exists(n) and os.path.exists(target) and os.path.samefile(n, target) for n in names)
    if same:
        raise InvalidInput(f"{field}: {given} is the ledger itself or one of its files ({os.path.basename(base)}, "
                           f"its -wal, -shm or -journal); {verb} to another name", field=field)


def backup_file(store: EventStore, target: str, dest: object, *, replace: bool, mode: int) -> tuple[int, bytes, int, int]:
    """Take ``store.backup_to`` into a private directory beside ``target`` and rename it into
    place with ``mode``; (last position, ledger-wide hash, runs, bytes) of the copy.

    Refused (InvalidInput, nothing written): a file that is a live database (its -wal or
    -shm beside it), any existing file unless ``replace``, and even then one that is not
    an SQLite database, or one that appeared while the backup was taken. ``dest`` is the
    name the caller gave, for the messages."""
    if os.path.exists(target):
        if not replace:
            raise InvalidInput(f"dest: {dest} already exists; pass --replace (replace=True) to "
                               "overwrite it, or name a new file", field="dest")
        head = read_small(target, 16, "dest")
        if head and head != b"SQLite format 3\x00":
            raise InvalidInput(f"dest: {dest} exists and is not an SQLite database; --replace only "
                               "overwrites an earlier backup. Name a new file", field="dest")
    live = [target + x for x in SIDE if os.path.lexists(target + x)]
    if live:
        raise InvalidInput(
            f"dest: {live[0]} exists beside {dest}, so that name belongs to a database in use "
            "(or one that was not closed cleanly), whose leftover journal SQLite would apply to "
            "the copy. Choose another name",
            field="dest",
        )
    with files.private_dir(target) as d:
        tmp = os.path.join(d, "backup.db")
        position, ghash, runs = store.backup_to(tmp)
        try:
            os.chmod(tmp, mode)
            files.fsync_file(tmp)
            size = os.stat(tmp).st_size
        except OSError as exc:
            raise files._failed(target, exc) from exc
        if not replace and os.path.lexists(target):
            raise InvalidInput(f"dest: {dest} appeared while the backup was taken; nothing was "
                               "replaced. Name a new file", field="dest")
        files.place(tmp, target, "dest")
    return position, ghash, runs, size


@contextlib.contextmanager
def built_beside(path: str) -> Iterator[str]:
    """A private, unpredictable file name in ``path``'s directory (created exclusively,
    mode 0600) to build a new ledger under; once the block ends without error and the
    ledger is closed, it is linked into place at ``path``.

    A file that appeared at ``path`` meanwhile is never replaced (``TargetAppeared``, and
    nothing of the build stays behind); a build whose WAL was not merged into the file on
    close is not published. Only the private names are removed at the end, never the
    target: once published, the target is a second link to the same file (or the private
    name was renamed away)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, private = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.import-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise StoreUnavailable(
            f"cannot create a file in {directory} to build the new ledger: {exc.strerror}; "
            "check that the directory exists and is writable"
        ) from exc
    os.close(fd)
    try:
        yield private
        # The last connection closed: SQLite copied the WAL into the file and removed it.
        if os.path.exists(private + "-wal") and os.path.getsize(private + "-wal") > 0:
            raise StoreUnavailable(
                f"the new ledger {private} still has unmerged WAL content after closing; "
                "nothing was published at the target. Retry the import"
            )
        files.fsync_file(private)
        try:
            files.publish_no_replace(private, path)
        except FileExistsError:
            raise TargetAppeared(
                f"a file appeared at {path} while the import ran; it was left alone and nothing "
                f"was imported. If it is a ledger, import into it again ('handoff --db {path} import')",
                field="db",
            ) from None
        except OSError as exc:
            raise StoreUnavailable(
                f"cannot put the new ledger at {path}: {exc.strerror} (this filesystem supports "
                "neither hard links nor a rename that refuses to replace); nothing was imported"
            ) from exc
        files.sync_dir(directory)
    finally:
        for suffix in (*SIDE, ""):
            try:
                os.remove(private + suffix)
            except FileNotFoundError:
                pass


def read_small(path: str, limit: int, field: str) -> bytes:
    """Up to ``limit`` bytes of a regular file, opened without following a link or
    blocking on a FIFO swapped in since it was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise InvalidInput(f"{field}: cannot read {path}: {exc.strerror}", field=field) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(f"{field}: {path} is not a regular file", field=field)
        return os.read(fd, limit)
    finally:
        os.close(fd)

