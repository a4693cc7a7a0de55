"""What an adapter target means: the one parser of ``http(s)://``, ``file://`` and ``cmd:``.

``open`` calls it (through decide), so a target the ledger could never send to is refused
when the contract is written, naming the ``target`` field, instead of failing at every
send; the adapters call it again to get the parts they send with, so the rule that
accepted a target is the rule that uses it. Pure: no I/O.

A webhook URL must be what ``http.client`` can put on the request line unchanged: visible
ASCII only (no space, no control character, no non-ASCII letter: percent-encode the path
and write an international host name in its ``xn--`` form), a host, a valid port, and no
user name or password (the target is stored in the log in clear).
"""

from __future__ import annotations

import re
import shlex
import urllib.parse

import msgspec

from handoff.ledger.errors import InvalidInput

#: Visible ASCII, nothing else: what a request line and a Host header carry as they are.
_URL_CHARS = re.compile(r"[\x21-\x7e]+")
_SHOWN = 200
#: A user name or password before '@' in a URL of any letter case (``HTTPS://`` too, which
#: has no adapter but is stored all the same).
_USERINFO = re.compile(r"^https?://[^/?#]*@", re.I)
CREDENTIAL_REFUSED = ("target carries a user name or password before '@'; the target is stored in the log in "
                      "clear. Put the secret in an environment variable and name it with --token-env "
                      "(send.token_env in a contract file)")


def carries_credential(target: str) -> bool:
    return bool(_USERINFO.match(target))


#: How a bearer token's environment variable is named. The contract names the variable, and
#: a contract may come from anyone (a file from elsewhere, a model driving the MCP server);
#: only a variable the person running the sender filled on purpose may leave the machine,
#: never whatever else its environment holds (a cloud key, a database password).
TOKEN_ENV_PREFIX = "HANDOFF_TOKEN_"


def token_env_refusal(name: str) -> str | None:
    """Why the ledger will not send ``name``'s value as a bearer token, or None (it may; an
    empty name sends none). ``name`` is a checked variable name, safe to show."""
    if not name or (name.startswith(TOKEN_ENV_PREFIX) and len(name) > len(TOKEN_ENV_PREFIX)):
        return None
    return (f"send.token_env names ${name[:_SHOWN]}, and the ledger sends a bearer token only from a variable "
            f"whose name starts with {TOKEN_ENV_PREFIX}: the person running the sender chooses what may be "
            f"sent, not whoever wrote the contract. Put the webhook's token in e.g. {TOKEN_ENV_PREFIX}HOOK and "
            "name that variable (--token-env, or send.token_env in a contract file)")


class HttpTarget(msgspec.Struct, frozen=True):
    scheme: str
    host: str
    port: int
    path: str  # the path and query, as sent on the request line


class FileTarget(msgspec.Struct, frozen=True):
    dir: str  # absolute, percent-decoded


class CmdTarget(msgspec.Struct, frozen=True):
    argv: tuple[str, ...]


Target = HttpTarget | FileTarget | CmdTarget


def _bad(target: str, why: str) -> InvalidInput:
    return InvalidInput(f"target {target[:_SHOWN]!r} {why}", field="target")


def parse(target: str) -> Target | None:
    """The parts of an adapter target, or None for a target without an adapter (delivered
    by hand). Raises ``InvalidInput`` (field ``target``) for an adapter target that cannot
    be sent to, saying what to write instead."""
    if target.startswith(("http://", "https://")):
        return _http(target)
    if target.startswith("file://"):
        return _file(target)
    if target.startswith("cmd:"):
        return _cmd(target)
    return None


def _http(target: str) -> HttpTarget:
    if carries_credential(target):  # checked first: this message must not show the target
        raise InvalidInput(CREDENTIAL_REFUSED, field="target")
    if not _URL_CHARS.fullmatch(target):
        raise _bad(target, "holds a space, a control character or a non-ASCII character, which a request "
                           "cannot carry; percent-encode them (a space is %20) and write an international host "
                           "name in its xn-- form")
    try:
        u = urllib.parse.urlsplit(target)
        port = u.port
    except ValueError as exc:  # an unclosed "[", a port that is not a number from 0 to 65535
        raise _bad(target, f"is not a valid URL ({exc}); write it as http(s)://HOST[:PORT]/PATH") from None
    if not u.hostname:
        raise _bad(target, "names no host; write it as http(s)://HOST[:PORT]/PATH")
    if port == 0:
        raise _bad(target, "names port 0, which no server listens on")
    return HttpTarget(u.scheme, u.hostname, port or (443 if u.scheme == "https" else 80),
                      (u.path or "/") + (f"?{u.query}" if u.query else ""))


def _file(target: str) -> FileTarget:
    u = urllib.parse.urlsplit(target)
    if u.netloc not in ("", "localhost") or not u.path.startswith("/"):
        raise _bad(target, "must be file:///ABSOLUTE/DIR (three slashes, then an absolute directory)")
    path = urllib.parse.unquote(u.path)
    if "\x00" in path:
        raise _bad(target, "names a directory holding a NUL byte")
    return FileTarget(path)


def _cmd(target: str) -> CmdTarget:
    try:
        argv = shlex.split(target[len("cmd:"):])
    except ValueError as exc:
        raise _bad(target, f"cannot be split into a command and its arguments ({exc}); close every quote, "
                           "or escape the quote character") from None
    if not argv:
        raise _bad(target, "names no command; write it as cmd:PROGRAM ARGS")
    return CmdTarget(tuple(argv))
