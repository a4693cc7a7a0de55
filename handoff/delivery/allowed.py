"""Which delivery targets the ledger may send to itself: the one matcher of an allow-list.

A target with an adapter (``http://``, ``https://``, ``file://``, ``cmd:``) is an order to
the process that sends: run this command, POST to this address, write into this
directory. Whoever writes the contract (a contract file from elsewhere, a model driving
the MCP server) chooses it. An allow-list lets the person who runs the sender say which
of those orders it takes. Two lists use this module: the ledger's own (kept in the ledger,
``Ledger.set_allowed_targets``, ``handoff targets``), checked by every send, and an MCP
server's ``--allow-target``, checked by its owner tools.

A pattern is a target written out in full (matched exactly), or a prefix ending in ``*``:

- ``https://*``, ``http://*``, ``file://*``, ``cmd:*``: every target of that scheme;
- ``https://hooks.example.com/services/*``: that scheme, host and port, and a path under
  the prefix's (the prefix's path ends with ``/``, so ``example.com.evil.net`` or
  ``/services-admin`` never match);
- ``file:///srv/outbox/*``: that directory and every directory below it (as the path
  names it and as it resolves on disk);
- ``cmd:/usr/local/bin/notify --channel *``: a command whose first arguments are exactly
  those words (compared as the arguments the command is run with, not as text).

A target whose path holds a ``.`` or ``..`` segment (percent-encoded too) never matches a
prefix: it could leave the prefix once resolved. Nor does a web target whose path holds a
backslash or a ``;`` (percent-encoded too): servers read a backslash as ``/`` and cut a path
at ``;`` (matrix parameters), so ``/services/..%5cadmin`` or ``/services/..;/admin`` could
reach ``/admin``.

A refusal never repeats a list's patterns (an exact webhook address is itself a secret),
nor a user name or password written into a pattern.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import urllib.parse
from collections.abc import Iterable

from handoff.ledger.errors import InvalidInput, TargetNotAllowed
from handoff.reducers import targets as tg
from handoff.reducers.delivery import ADAPTER_SCHEMES, has_adapter

#: The handoff_meta row (``setting.`` + this) that holds the ledger's list, as JSON.
SETTING = "delivery_targets"
#: The longest pattern kept; a target is shorter still in practice.
MAX_PATTERN = 2000
#: The most patterns one list holds (a list is read by every send).
MAX_PATTERNS = 200
_SHOWN = 200
#: A user name or password before '@' in a pattern of any scheme (checked before anything
#: else, so no refusal repeats it).
_USERINFO = re.compile(r"^(?!cmd:)[a-z][a-z0-9+.-]*:/+[^/?#]*@", re.I)


def _show(text: str) -> str:
    return repr(text[:_SHOWN])


def check_pattern(pattern: object, field: str = "target") -> str:
    """``pattern`` as kept, or ``InvalidInput`` saying how to write it."""
    if isinstance(pattern, str) and _USERINFO.match(pattern):  # first: no message may repeat it
        raise InvalidInput("an allowed target carries a user name or password before '@'; no target the ledger "
                           "sends to may (open refuses it: the target is stored in the log in clear), so write "
                           "the pattern without it", field=field)
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
        raise InvalidInput(f"an allowed target is a non-empty text of at most {MAX_PATTERN} characters, got "
                           f"{pattern!r:.{_SHOWN}}", field=field)
    if not pattern.startswith(ADAPTER_SCHEMES):
        raise InvalidInput(f"allowed target {_show(pattern)} names no scheme the ledger sends to itself; write a "
                           f"target starting with {', '.join(ADAPTER_SCHEMES)} (only those are ever refused)",
                           field=field)
    star = pattern.find("*")
    if star == -1:
        tg.parse(pattern)  # a target no send could use is refused the way open refuses it
        return pattern
    if star != len(pattern) - 1:
        raise InvalidInput(f"allowed target {_show(pattern)} has a '*' before its end; '*' may only end a "
                           "prefix (e.g. https://hooks.example.com/services/*)", field=field)
    _prefix(pattern, field)
    return pattern


def check_patterns(patterns: Iterable[object], field: str = "target") -> tuple[str, ...]:
    """Every pattern checked, duplicates dropped, in the order given."""
    if isinstance(patterns, str):
        raise InvalidInput("give the allowed targets as a list of patterns, not one text", field=field)
    out = tuple(dict.fromkeys(check_pattern(p, field) for p in patterns))
    if len(out) > MAX_PATTERNS:
        raise InvalidInput(f"an allow-list holds at most {MAX_PATTERNS} patterns, got {len(out)}; use a prefix "
                           "ending in '*' for a family of targets", field=field)
    return out


def _scheme(prefix: str) -> str | None:
    for scheme in ADAPTER_SCHEMES:
        if prefix == scheme:
            return scheme
    return None


def _prefix(pattern: str, field: str) -> tuple[str, object]:
    """A prefix pattern's kind and parts: ("scheme", s), ("http", HttpTarget), ("file",
    dir) or ("cmd", argv); InvalidInput for a prefix that could match more than it says."""
    prefix = pattern[:-1]
    scheme = _scheme(prefix)
    if scheme is not None:
        return "scheme", scheme
    if prefix.startswith(("http://", "https://")):
        parsed = tg.parse(prefix)
        assert isinstance(parsed, tg.HttpTarget)
        path = urllib.parse.urlsplit(prefix).path
        if not path.endswith("/") or "?" in prefix or "#" in prefix:
            raise InvalidInput(f"allowed target {_show(pattern)} must end its prefix with '/' after the host "
                               "and path (e.g. https://hooks.example.com/services/*), so it cannot match "
                               "another host or a longer path name", field=field)
        if _dotted(path) or _ambiguous(path):
            raise InvalidInput(f"allowed target {_show(pattern)} holds a '.' or '..' path segment, a '\\' or a "
                               "';'; write the path as it is, without them", field=field)
        return "http", parsed
    if prefix.startswith("file://"):
        parsed = tg.parse(prefix)
        assert isinstance(parsed, tg.FileTarget)
        if not parsed.dir.endswith("/") or _dotted(parsed.dir):
            raise InvalidInput(f"allowed target {_show(pattern)} must be file:///ABSOLUTE/DIR/* (the directory "
                               "ends with '/', no '.' or '..' segment), so it cannot match a sibling directory",
                               field=field)
        return "file", parsed.dir
    body = prefix[len("cmd:"):]
    if not body[-1:].isspace():
        raise InvalidInput(f"allowed target {_show(pattern)} must end its command prefix with a space before "
                           "the '*' (e.g. 'cmd:/usr/local/bin/notify *'), so it cannot match a longer program "
                           "name", field=field)
    try:
        argv = tuple(shlex.split(body))
    except ValueError as exc:
        raise InvalidInput(f"allowed target {_show(pattern)} cannot be split into words ({exc})",
                           field=field) from None
    if not argv:
        raise InvalidInput(f"allowed target {_show(pattern)} names no command; write cmd:* for every command",
                           field=field)
    return "cmd", argv


def _dotted(path: str) -> bool:
    segments = urllib.parse.unquote(path).split("/")
    return any(s in (".", "..") for s in segments)


def _ambiguous(path: str) -> bool:
    """A web path a server may read otherwise than as written: a backslash (read as '/')
    or a ';' (the path cut there, as matrix parameters), percent-encoded or not."""
    plain = urllib.parse.unquote(path)
    return "\\" in plain or ";" in plain


def _under(path: str, top: str) -> bool:
    """``path`` is the directory ``top`` (which ends with '/') or below it."""
    return path == top.rstrip("/") or path.startswith(top)


def matches(target: str, pattern: str) -> bool:
    """Whether ``pattern`` (as ``check_pattern`` keeps it) allows ``target``."""
    if not pattern.endswith("*"):
        return target == pattern
    kind, parts = _prefix(pattern, "target")
    if kind == "scheme":
        return target.startswith(str(parts))
    try:
        parsed = tg.parse(target)
    except InvalidInput:
        return False
    if kind == "http":
        assert isinstance(parts, tg.HttpTarget)
        path = urllib.parse.urlsplit(target).path
        if not isinstance(parsed, tg.HttpTarget) or _dotted(path) or _ambiguous(path):
            return False
        return (parsed.scheme == parts.scheme and parsed.host.lower() == parts.host.lower()
                and parsed.port == parts.port and parsed.path.startswith(parts.path))
    if kind == "file":
        top = str(parts)
        if not isinstance(parsed, tg.FileTarget) or _dotted(parsed.dir):
            return False
        path = posixpath.normpath(parsed.dir)
        if not _under(path, top):
            return False
        # As it resolves on disk too: a link below the prefix must not lead out of it.
        real_top = os.path.realpath(top.rstrip("/") or "/")
        real = os.path.realpath(path)
        return _under(real, real_top.rstrip("/") + "/")
    assert isinstance(parts, tuple)
    if not isinstance(parsed, tg.CmdTarget):
        return False
    return parsed.argv[:len(parts)] == parts


def allowed(target: str, patterns: Iterable[str]) -> bool:
    """``target`` needs no allowance (no adapter: a person sends it), or a pattern allows it."""
    return not has_adapter(target) or any(matches(target, p) for p in patterns)


def check(target: str, patterns: Iterable[str] | None, *, run_id: str | None, whose: str, how: str,
          see: str = "") -> None:
    """Refuse ``target`` unless ``patterns`` allow it (None: no list, anything goes).
    ``whose`` names the list in the message, ``how`` says what to do instead, ``see`` where
    the list can be read (the message says how many patterns it holds, never which)."""
    if patterns is None:
        return
    patterns = tuple(patterns)
    if allowed(target, patterns):
        return
    kind = "command" if target.startswith("cmd:") else "file write" if target.startswith("file://") else \
        "web request"
    # How many patterns, never which: an exact webhook address on the list is itself a secret,
    # and whoever is refused here (a model, a contract's author) need not be who keeps the list.
    held = ("it is empty" if not patterns else
            f"it holds {len(patterns)} pattern{'s' if len(patterns) != 1 else ''}, not shown here")
    shown = f"; {see}" if see else ""
    subject = f"run {run_id}'s target" if run_id else "the target"
    raise TargetNotAllowed(
        f"{subject} {_show(target)} is a {kind} the ledger would carry out itself, and {whose} does not allow "
        f"it ({held}{shown}); nothing was written, sent or run. {how}", run_id=run_id, target=target[:_SHOWN])


__all__ = ["TargetNotAllowed", "SETTING", "check", "check_pattern", "check_patterns", "matches", "allowed"]
