"""The bundle: exactly the bytes a delivery sends, built from the run's checkpoint.

It holds the run id, the submitted summary and each recorded artifact's metadata (its
file name only, never the local path), with the content inline or, when the contract says
``inline: false``, only the digest as a reference. Every artifact is read here, once, and
must still match the sha256 the log recorded for it: a file changed since it was recorded
(and reviewed) is refused, never sent. The sanitization check scans the parts of this very
bundle and records its digest, so the gate can prove nothing changed in between.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import stat
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import DeliveryRefused, InvalidInput
from handoff.reducers.checkpoint import Checkpoint

FORMAT = "handoff-delivery/1"


class SentArtifact(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    kind: str
    bytes: int
    sha256: str
    content: str | None = None  # UTF-8 text, inline
    content_base64: str | None = None  # anything else, inline


class BundleDoc(msgspec.Struct, frozen=True):
    """The JSON document a delivery sends (docs/delivery.md, "What is sent")."""

    format: str
    run_id: str
    summary: str
    artifacts: tuple[SentArtifact, ...]


class Bundle(msgspec.Struct, frozen=True):
    """What a delivery sends and what a sanitization check scans.

    ``data`` are the bytes sent; ``files`` the artifacts' own bytes by sent name (a
    ``cmd:`` target gets them as files); ``parts`` what the detectors read (text, or an
    artifact's bytes, which reducers.sanitize.readings decodes); ``items`` the digests a
    check records."""

    data: bytes
    sha256: str
    files: tuple[tuple[str, bytes], ...]
    parts: tuple[tuple[str, str | bytes | None], ...]
    items: tuple[ev.ScannedItem, ...]


def _read(path: str, want_sha: str, limit: int) -> bytes:
    """The artifact's bytes as recorded: a regular file, not through a symlink, within
    ``limit``, unchanged while read and still matching the recorded digest."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        why = ("is now a symbolic link" if exc.errno == errno.ELOOP else
               "no longer exists" if exc.errno == errno.ENOENT else f"cannot be read ({exc.strerror})")
        raise DeliveryRefused(f"artifact {path} {why}; nothing was sent. Restore it as recorded, or "
                              "record the result again", path=path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DeliveryRefused(f"artifact {path} is no longer a regular file; nothing was sent", path=path)
        if st.st_size > limit:
            raise InvalidInput(
                f"artifact {path} is {st.st_size} bytes, over the {limit} bytes a delivery may send "
                "(send.max_bytes); send a reference instead (send.inline false) or raise the limit",
                field="max_bytes")
        chunks, left = [], st.st_size + 1
        while left > 0:
            chunk = os.read(fd, min(1 << 20, left))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        after = os.fstat(fd)
    except BlockingIOError:
        raise DeliveryRefused(f"artifact {path} has no data ready; it is not a finished file", path=path) from None
    except OSError as exc:
        raise DeliveryRefused(f"artifact {path} cannot be read ({exc.strerror}); nothing was sent", path=path) from None
    finally:
        os.close(fd)
    if len(data) != st.st_size or (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise DeliveryRefused(f"artifact {path} changed while it was read; nothing was sent", path=path)
    got = hashlib.sha256(data).hexdigest()
    if got != want_sha:
        raise DeliveryRefused(
            f"artifact {path} no longer matches what the log recorded (sha256 {want_sha[:12]}, now "
            f"{got[:12]}): it changed after it was recorded and reviewed, so it is not sent. Restore it, "
            "or send the run back for a new result", path=path)
    return data


def _names(paths: list[str]) -> list[str]:
    """File names to send under, distinct by construction: each artifact keeps its base
    name unless an earlier one took it; a later one is numbered ``N-name`` with the
    smallest N that no artifact's own name and no name given so far uses. So ``a/r.md``,
    ``b/r.md``, ``c/1-r.md`` become ``r.md``, ``2-r.md``, ``1-r.md``. The same list
    always gives the same names, so a check and a delivery measure the same bundle."""
    bases = [os.path.basename(p) or "artifact" for p in paths]
    taken = set(bases)  # every artifact's own name, so a number never lands on a later one's
    given: set[str] = set()
    out = []
    for base in bases:
        name, n = base, 0
        while name in given or (n and name in taken):
            n += 1
            name = f"{n}-{base}"
        given.add(name)
        out.append(name)
    return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build(cp: Checkpoint, *, max_bytes: int | None = None, inline: bool | None = None) -> Bundle:
    """The bundle of ``cp``'s submitted result, read from disk now."""
    if cp.result is None:
        raise DeliveryRefused(f"run {cp.run_id} has no submitted result to send")
    send = cp.delivery.send
    limit = send.max_bytes if max_bytes is None else max_bytes
    inline = send.inline if inline is None else inline
    arts = [a for a in cp.artifacts if a.exists]
    names = _names([a.path for a in arts])
    sent: list[SentArtifact] = []
    files: list[tuple[str, bytes]] = []
    parts: list[tuple[str, str | bytes | None]] = [("run id", cp.run_id), ("summary", cp.result.summary)]
    items = [ev.ScannedItem("summary", _sha(cp.result.summary.encode()), len(cp.result.summary.encode()))]
    total = 0
    for a, name in zip(arts, names):
        data = _read(a.path, a.sha256, limit)
        total += len(data)
        if total > limit:
            raise InvalidInput(f"the artifacts of run {cp.run_id} come to more than the {limit} bytes a "
                               "delivery may send (send.max_bytes)", field="max_bytes")
        files.append((name, data))
        items.append(ev.ScannedItem(a.path, a.sha256, len(data)))
        extra: dict[str, Any] = {}
        if inline:
            try:
                extra["content"] = data.decode("utf-8")
            except UnicodeDecodeError:
                extra["content_base64"] = base64.b64encode(data).decode()
            parts.append((f"artifact {name}", data))  # the detectors read the bytes (UTF-16 too)
        sent.append(SentArtifact(name, a.kind, len(data), a.sha256, **extra))
    parts.append(("artifact names", "\n".join(f"{s.name} {s.kind}" for s in sent)))
    doc = BundleDoc(FORMAT, cp.run_id, cp.result.summary, tuple(sent))
    data = msgspec.json.encode(doc)
    return Bundle(data, _sha(data), tuple(files), tuple(parts), tuple(items))
