"""Where the hooks keep their own files: the journal of payloads and the 0600 state file.

Every ledger has one state directory (0700) beside it: ``<ledger file>.hooks/`` for an
SQLite file, ``~/.cache/handoff/hooks/<digest of the address>/`` for PostgreSQL. In it:

- ``journal.jsonl`` (0600): each hook's payload, read and bounded (``payloads.Hook``), one
  JSON line appended under ``journal.lock``. A hook writes here and nowhere else, so a
  locked or unreachable ledger never makes the agent wait more than an append.
- ``state.json`` (0600): each session's run, its lease token and what the replay has done
  so far (``offset``: how far into the journal it has written). The token is kept here and
  nowhere else: never in the agent's context, never printed. Replaced whole (a private
  temporary file renamed into place), by the replay only, which holds ``replay.lock``.
- ``hooks.log`` (0600): one line for each record the ledger refused, and why.

Standard library only: the hook process imports this module.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time

TYPE_CHECKING = False  # not typing's: a hook does not pay for importing typing
if TYPE_CHECKING:
    from typing import Any

JOURNAL = "journal.jsonl"
STATE = "state.json"
LOG = "hooks.log"


def state_dir(db: str) -> str:
    """The hooks' directory of the ledger at ``db`` (a path, a ``sqlite:`` address or a
    PostgreSQL URL)."""
    path = None
    if "://" not in db or db.startswith("sqlite:"):
        path = db.removeprefix("sqlite://").removeprefix("sqlite:").partition("?")[0]
    if path and path != ":memory:":
        return os.path.abspath(path) + ".hooks"
    import hashlib

    digest = hashlib.sha256(db.encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "handoff", "hooks", digest)


def ensure_dir(path: str) -> str:
    """The hooks' directory, private to this user: created 0700 with a .gitignore (it
    holds a lease token, prompts and tool inputs, and usually sits in the agent's own
    repository); an existing one is used only when it is a real directory of this user's
    that no one else may enter, else another local user could forge the journal."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"the hooks' directory {path} is not a private directory of this user (mode "
            f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}); nothing was recorded. Remove it, or "
            f"make it yours with 'chmod 700 {path}'")
    ignore = os.path.join(path, ".gitignore")
    if not os.path.lexists(ignore):
        try:
            fd = os.open(ignore, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                         0o600)
        except FileExistsError:
            pass
        else:
            try:
                os.write(fd, b"# handoff's hooks: a lease token, prompts and tool inputs; never commit them\n*\n")
            finally:
                os.close(fd)
    return path


def _open(path: str, flags: int) -> int:
    """A file of the hooks' directory: never through a link, never a FIFO or a device,
    never a file another user owns or that has another name (a hard link), and 0600."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            raise PermissionError(f"{path} is not a private regular file of this user; nothing was recorded. "
                                  "Remove it")
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


class locked:
    """``with locked(directory, name, wait_s=...) as got:`` holds the lock file ``name`` in
    ``directory``; ``got`` says whether it was got. ``wait_s`` None waits as long as it
    takes; 0 tries once. (A class, not contextlib's decorator: a hook does not pay for it.)"""

    def __init__(self, directory: str, name: str, *, wait_s: float | None = None) -> None:
        self.path = os.path.join(directory, name)
        self.wait_s = wait_s
        self.fd = -1

    def __enter__(self) -> bool:
        self.fd = _open(self.path, os.O_RDWR | os.O_CREAT)
        if self.wait_s is None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return True
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


def append(directory: str, record: dict[str, Any]) -> None:
    """Add one record to the journal, durably (the hook's only write)."""
    line = (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with locked(directory, "journal.lock"):
        fd = _open(os.path.join(directory, JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def journal_size(directory: str) -> int:
    try:
        return os.stat(os.path.join(directory, JOURNAL)).st_size
    except FileNotFoundError:
        return 0


def read_from(directory: str, offset: int) -> list[tuple[dict[str, Any], int]]:
    """The complete records after byte ``offset``, each with the offset just past it. A
    line not yet whole (a hook still writing) is left for the next read; a line that is
    not JSON is skipped (it is returned as None-free: the offset moves past it)."""
    try:
        fd = _open(os.path.join(directory, JOURNAL), os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    out: list[tuple[dict[str, Any], int]] = []
    at = 0
    while (nl := data.find(b"\n", at)) >= 0:
        line = data[at:nl]
        at = nl + 1
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        out.append((rec if isinstance(rec, dict) else {}, offset + at))
    return out


def truncate_if_done(directory: str, state: dict[str, Any]) -> bool:
    """Empty the journal when everything in it has been written (``state["offset"]`` is its
    end), under the journal's lock so no append is lost. The state is saved with offset 0
    first: a crash in between replays the journal again, which the idempotency keys make
    harmless, where the other order could skip the next records."""
    with locked(directory, "journal.lock"):
        offset = state.get("offset", 0)
        if offset == 0 or journal_size(directory) != offset:
            return False
        state["offset"] = 0
        save_state(directory, state)
        fd = _open(os.path.join(directory, JOURNAL), os.O_WRONLY)
        try:
            os.ftruncate(fd, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True


def load_state(directory: str) -> dict[str, Any]:
    try:
        fd = _open(os.path.join(directory, STATE), os.O_RDONLY)
    except FileNotFoundError:
        return {"offset": 0, "sessions": {}}
    try:
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read() or b"{}")
    except ValueError:
        doc = {}
    doc.setdefault("offset", 0)
    doc.setdefault("sessions", {})
    return doc


def save_state(directory: str, state: dict[str, Any]) -> None:
    """Replace the state file whole: a private 0600 file, fsynced, renamed into place."""
    tmp = os.path.join(directory, f".{STATE}.{os.getpid()}")
    with contextlib_suppress_missing():
        os.unlink(tmp)  # a crashed earlier process of this pid's: O_EXCL creates ours afresh
    fd = _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(fd, json.dumps(state, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, STATE))


class contextlib_suppress_missing:
    """``contextlib.suppress(FileNotFoundError)`` without importing contextlib in a hook."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return kind is not None and isinstance(exc, FileNotFoundError)


def log(directory: str, line: str) -> None:
    """One line in ``hooks.log`` (what the ledger refused; never a token)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    fd = _open(os.path.join(directory, LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{stamp} {line}\n".encode("utf-8", "replace"))
    finally:
        os.close(fd)
