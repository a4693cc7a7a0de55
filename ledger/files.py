"""Files the ledger writes beside the user's: exports, backups and head anchors.

One set of rules for all of them, so a copy is never easier to read or to hijack than
the ledger it came from: the new file is made under a random name that did not exist
before (created exclusively, so nothing planted there is followed), gets the ledger's own
permission bits before any byte is written, is synced, and is then renamed over the
target. A symbolic link at the target is refused rather than written through or replaced.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator

from .errors import InvalidInput, StoreUnavailable
from .inputs import check_path

#: The mode of a copy whose source has no file (an in-memory or server-side store).
PRIVATE_MODE = 0o600
#: Kernel pseudo-filesystems: their files claim a size (often 0) that is not their content,
#: some change or block when read (/proc/kmsg consumes the kernel log), and writing to
#: them does something else entirely (/proc/self/mem is the process's own memory).
PSEUDO_ROOTS = ("/proc", "/sys")


def file_kind(mode: int) -> str:
    """What a file is, in words, from its ``st_mode``: "a regular file", "a directory",
    "a FIFO (named pipe)", ..., for refusals that say what was found."""
    return ("a regular file" if stat.S_ISREG(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a symbolic link" if stat.S_ISLNK(mode) else "something else")


def pseudo_root(path: str, st: os.stat_result) -> str | None:
    """The kernel pseudo-filesystem (``PSEUDO_ROOTS``) that ``path``, whose stat is ``st``,
    lives on, or None: by device (procfs mounted elsewhere too) or by where the path
    resolves (the filesystems mounted under /sys, such as cgroups, have devices of their own)."""
    real = os.path.realpath(path)
    for root in PSEUDO_ROOTS:
        if real == root or real.startswith(root + "/"):
            return root
        try:
            if os.stat(root).st_dev == st.st_dev:
                return root
        except OSError:
            continue
    return None


def copy_mode(source: str | None) -> int:
    """The permission bits a copy of ``source`` gets: its read and write bits, never more.

    A source with no file on disk (``:memory:``, a database server) gives 0600.
    """
    if not source or source == ":memory:":
        return PRIVATE_MODE
    try:
        st = os.stat(source)
    except OSError:
        return PRIVATE_MODE
    return stat.S_IMODE(st.st_mode) & 0o666


def check_target(path: object, field: str) -> str:
    """A file name handoff may write to: not a link, a directory or a device; its directory exists.

    Returns the absolute path. Every refusal is ``InvalidInput`` naming ``field``.
    """
    p = check_path(path, field)
    full = os.path.abspath(p)
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        raise InvalidInput(f"{field}: the directory {parent} does not exist; create it or choose another place",
                           field=field)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return full
    except OSError as exc:
        raise InvalidInput(f"{field}: cannot inspect {p}: {exc.strerror}", field=field) from None
    if stat.S_ISLNK(st.st_mode):
        raise InvalidInput(
            f"{field}: {p} is a symbolic link (to {os.readlink(full)}); handoff never writes a copy "
            "through a link or over one. Remove the link, or name the file you mean directly",
            field=field,
        )
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InvalidInput(f"{field}: {p} is {kind}; name a regular file to write", field=field)
    return full


def _failed(target: str, exc: OSError) -> StoreUnavailable:
    return StoreUnavailable(
        f"could not write {target} ({exc.strerror or exc}); nothing was replaced, any earlier "
        "file there is as it was. Free space or fix the directory's permissions, then retry",
        cause=str(exc),
    )


def sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def place(tmp: str, target: str, field: str) -> None:
    """Rename ``tmp`` over ``target`` (same directory tree, so the move is atomic).

    The target is checked once more just before: a link that appeared since the first
    check is refused. One planted in the instant between this check and the rename is
    replaced, not followed: rename(2) never writes through a link at its destination.
    """
    check_target(target, field)
    try:
        os.replace(tmp, target)
    except OSError as exc:
        raise _failed(target, exc) from exc
    sync_dir(os.path.dirname(target))


def atomic_write(target: str, chunks: Iterable[bytes], *, mode: int, field: str = "output") -> int:
    """Write ``chunks`` to ``target`` through a private temporary file; return the bytes written.

    On any failure (a refused argument, an error raised by ``chunks``, a full disk) the
    temporary file is removed and ``target`` is left as it was.
    """
    target = check_target(target, field)
    directory, name = os.path.split(target)
    try:
        import tempfile  # here, not at the top: every short-lived CLI process imports this module

        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise _failed(target, exc) from exc
    size = 0
    try:
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                fd = -1
                for chunk in chunks:
                    f.write(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise _failed(target, exc) from exc
        place(tmp, target, field)
        tmp = ""
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return size


@contextlib.contextmanager
def private_dir(target: str) -> Iterator[str]:
    """A new directory only this user can enter, beside ``target``; removed afterwards.

    For files that another library names itself (SQLite adds -journal and -wal beside a
    database): inside a 0700 directory nobody else can plant anything at those names.
    """
    try:
        import tempfile

        d = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                             dir=os.path.dirname(target))
    except OSError as exc:
        raise _failed(target, exc) from exc
    try:
        yield d
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_no_replace(private: str, target: str) -> None:
    """Give a finished file its public name, failing if anything is at ``target`` by now.

    ``os.link`` never replaces an existing name; where hard links are not supported,
    ``renameat2(RENAME_NOREPLACE)`` does the same on Linux. There is no fallback that could
    replace a file that appeared meanwhile: FileExistsError when the name is taken, the
    link's OSError when neither call is available. The private name stays; the caller
    removes it.
    """
    try:
        os.link(private, target, follow_symlinks=False)
        return
    except FileExistsError:
        raise
    except OSError as exc:
        link_error = exc
    if not _rename_noreplace(private, target):
        raise link_error


def _rename_noreplace(src: str, dst: str) -> bool:
    """renameat2(..., RENAME_NOREPLACE) through libc; False when the call is unavailable."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_noreplace = -100, 1
    if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace) == 0:
        return True
    if ctypes.get_errno() == errno.EEXIST:
        raise FileExistsError(errno.EEXIST, "file exists", dst)
    return False
