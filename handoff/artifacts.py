"""An artifact measured by the ledger itself: its resolved path, size and sha256.

Only a regular file is read, through the descriptor that was checked, and no more than a
limit; what cannot be read as a finished file is refused with a reason (``Ledger.artifact``
records what ``measure`` found).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from handoff.ledger import files
from handoff.ledger.errors import InvalidInput

#: The largest artifact the ledger reads unless told otherwise: 1 GiB. Hashing is about
#: 4 s per GiB here, and a file that big is rarely the evidence a reviewer wants.
ARTIFACT_MAX_BYTES = 1 << 30
#: The environment variable that sets another limit for every call that does not give one.
ARTIFACT_MAX_ENV = "HANDOFF_ARTIFACT_MAX_BYTES"
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: object, field: str = "max_bytes") -> int:
    """A byte count: a whole number, or text such as ``1048576``, ``512K``, ``64M``, ``2G``
    (binary units: K is 1024 bytes; a trailing ``B``/``iB`` is allowed)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        text = value.strip().lower().removesuffix("ib").removesuffix("b")
        unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
        digits = text[: len(text) - len(unit)].strip()
        if digits.isdigit() and digits.isascii():
            return int(digits) * _SIZE_UNITS[unit]
    shown = repr(value)[:60]
    raise InvalidInput(f"{field} must be a number of bytes such as 1048576, 512K, 64M or 2G, got {shown}",
                       field=field)


def artifact_max_bytes(value: object = None) -> int:
    """The artifact size limit: ``value`` if given, else $HANDOFF_ARTIFACT_MAX_BYTES, else 1 GiB."""
    if value is not None:
        return parse_size(value)
    env = os.environ.get(ARTIFACT_MAX_ENV)
    return ARTIFACT_MAX_BYTES if env is None or not env.strip() else parse_size(env, ARTIFACT_MAX_ENV)


def _human(n: int, *, exact: bool = False) -> str:
    """1073741824 -> '1 GiB', 1536 -> '1.5 KiB'; with ``exact``, a size no unit divides stays in bytes."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
        if n >= size and not exact:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _not_regular(path: str, mode: int) -> InvalidInput | None:
    """The refusal for anything but a regular file, naming what it is, or None."""
    if stat.S_ISREG(mode):
        return None
    return InvalidInput(f"artifact {path} is {files.file_kind(mode)}, not a regular file, and the ledger reads only regular files "
                        "(reading this could wait forever or mean nothing); write what it holds to a regular "
                        "file and record that file",
                        field="path", reason="not_regular")


def _changed(path: str, what: str) -> InvalidInput:
    return InvalidInput(f"artifact {path} {what}; nothing was recorded. Record it again once it is "
                        "finished and nothing is writing to it", field="path", reason="changed")


def measure(path: str, *, root: str | None = None, max_bytes: object = None) -> tuple[str, int, str, bool]:
    """(resolved path, size, sha256, exists) of an artifact, read by the ledger itself.

    Only a regular file is read, and only what it held when opened: the descriptor that is
    read is the one checked (opened without blocking and without following a last-moment
    symlink), at most the size it reported, and no more than ``max_bytes`` (default
    ``artifact_max_bytes()``). A file that grows, shrinks or changes while read, or yields
    more than its size said (kernel pseudo-files), is refused. With ``root``, a path that
    resolves outside it (``..``, symlinks) is refused. A path that does not exist is
    measured as missing (``exists`` false), which the run's packet shows.
    """
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidInput("artifact path must be a non-empty path without NUL bytes", field="path")
    limit = artifact_max_bytes(max_bytes)
    real = os.path.realpath(path)
    if root is not None:
        base = os.path.realpath(root)
        if os.path.commonpath([base, real]) != base:
            raise InvalidInput(
                f"artifact {path} resolves to {real}, outside the declared root {base}", field="path"
            )
    try:  # refuse a device or a FIFO before anything opens it (opening some has effects)
        st = os.stat(real)
    except FileNotFoundError:
        return real, 0, "", False
    except OSError as exc:
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    if (refusal := _not_regular(path, st.st_mode)) is not None:
        raise refusal
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        return real, 0, "", False
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink after it was resolved
            raise _changed(path, f"was replaced by a symbolic link at {real} while being recorded") from None
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    try:
        return (real, *_read_bounded(path, fd, limit), True)  # type: ignore[return-value]
    finally:
        os.close(fd)


def _read_bounded(path: str, fd: int, limit: int) -> tuple[int, str]:
    """Size and sha256 of what the open descriptor ``fd`` holds, checked and bounded."""
    st = os.fstat(fd)  # what was opened, not what the path named a moment before
    if (refusal := _not_regular(path, st.st_mode)) is not None:
        raise refusal
    if (pseudo := files.pseudo_root(path, st)) is not None:
        raise InvalidInput(f"artifact {path} is a kernel pseudo-file under {pseudo}: its reported size is not "
                           "its content and reading it can wait or change it; copy what you need into a "
                           "regular file and record that", field="path", reason="pseudo_file")
    if st.st_size > limit:
        raise InvalidInput(
            f"artifact {path} is {st.st_size} bytes ({_human(st.st_size)}), over the {_human(limit, exact=True)} limit on "
            f"what the ledger reads; record a smaller file (an excerpt, an archive's digest), or raise the "
            f"limit with --max-bytes, ${ARTIFACT_MAX_ENV} or max_bytes= in Python",
            field="path", reason="too_large", size=st.st_size, limit=limit,
        )
    h = hashlib.sha256()
    left = st.st_size
    try:
        while left > 0:
            chunk = os.read(fd, min(1 << 20, left))
            if not chunk:
                raise _changed(path, f"shrank while being read (it said {st.st_size} bytes)")
            h.update(chunk)
            left -= len(chunk)
        if os.read(fd, 1):
            raise _changed(path, f"held more than the {st.st_size} bytes its size said (it grew while "
                                 "being read, or its size is not its content)")
    except BlockingIOError:
        raise InvalidInput(f"artifact {path} has no data ready and reading it would wait; it is not a "
                           "finished regular file on disk: record a regular file", field="path",
                           reason="not_regular") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read artifact {path}: {exc.strerror}", field="path") from exc
    after = os.fstat(fd)
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise _changed(path, "changed while being read")
    return st.st_size, h.hexdigest()
