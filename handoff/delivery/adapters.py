"""The adapters: send one bundle to one target and say what is known afterwards.

Each answer is one of three, and the difference is the whole point:

- ``confirmed``: the target acknowledged it (the receipt says how);
- ``failed``: it is known not to have arrived (refused, never connected);
- ``unknown``: it may have arrived (a timeout after the request left, a connection closed
  before the answer, a command killed mid-run). Only a target that honours the delivery
  key may be sent to again under that key (reducers.delivery.honours_keys).

Adapters never raise for what happens at the target; they raise (typed) only when the
target, the settings or this send (``prepare``: a key a header cannot carry) cannot be
used at all, and the ledger asks before it records the attempt. What fails after that but
before a byte leaves (the request cannot be built, a command's files cannot be written) is
``failed``: known not to have been sent. Secrets (a bearer token read from the
environment) go into the request only, never into a receipt or error.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput
from handoff.reducers import targets

from .bundle import Bundle
from .process_group import Group


class SendResult(msgspec.Struct, frozen=True):
    """What one send (with its own retries) came to."""

    outcome: str  # confirmed, failed, unknown
    receipt: str = ""
    error: str = ""
    tries: int = 1


#: Retried within one send: the request may or may not have acted, and the target
#: honours the key, so sending again under it cannot act twice.
_AGAIN = "again"

_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def _clean(text: str, limit: int = 120) -> str:
    return _PRINTABLE.sub("?", text)[:limit]


class Adapter:
    """Base: ``prepare`` checks a send before the attempt is recorded; ``send_once``
    answers (outcome, receipt, error); ``send`` adds retries."""

    honours_keys = True

    def prepare(self, bundle: Bundle, key: str, run_id: str) -> None:
        """Refuse (typed) what this send could never carry, before the attempt is recorded:
        a refusal here leaves the log unchanged and the key free."""

    def send_once(self, bundle: Bundle, key: str, run_id: str) -> tuple[str, str, str]:  # pragma: no cover
        raise NotImplementedError

    def send(self, bundle: Bundle, key: str, run_id: str, *, retries: int, backoff_s: float,
             sleep: Callable[[float], None] = time.sleep) -> SendResult:
        tries = 0
        while True:
            tries += 1
            outcome, receipt, error = self.send_once(bundle, key, run_id)
            if outcome not in (_AGAIN, "not_sent"):
                return SendResult(outcome, receipt, error, tries)
            if tries > retries or not self.honours_keys:
                final = "failed" if outcome == "not_sent" else "unknown"
                return SendResult(final, "", error + (f" (after {tries} tries)" if tries > 1 else ""), tries)
            sleep(backoff_s * (2 ** (tries - 1)))


# --- webhooks ------------------------------------------------------------------------


#: What a header value may hold here: visible ASCII with inner spaces. http.client would
#: send Latin-1 too, but a receiver may read those bytes as anything, so a key it keeps
#: could differ from the key the ledger holds.
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
#: A bearer token: visible ASCII, no space (RFC 6750's b64token is narrower still).
_TOKEN = re.compile(r"[\x21-\x7e]+")


def _unfit(value: str) -> str:
    """What in ``value`` a header cannot carry, said without showing any of it (the value
    may be a secret)."""
    if value != value.strip():
        return "a space or line break at its start or end"
    for ch in value:
        if ch in "\r\n":
            return "a line break"
        if ch < " " or ch == "\x7f":
            return "a control character"
        if ch > "\x7e":
            return "a non-ASCII character"
    return "a space"


def check_token(token: str, token_env: str) -> None:
    """Refuse a bearer token that an ``Authorization`` header cannot carry unchanged. The
    message names the variable and what is wrong, never the token or any part of it."""
    if not _TOKEN.fullmatch(token):
        raise InvalidInput(
            f"the bearer token in ${token_env} holds {_unfit(token)}, which an Authorization header cannot "
            f"carry; set ${token_env} to the token alone, exactly as the service issued it (visible ASCII "
            "characters). Nothing was recorded or sent", field="token_env")


class HttpAdapter(Adapter):
    """POST the bundle as JSON, with the key as ``Idempotency-Key``: a receiver that keeps
    keys answers a repeat without acting twice, which is what makes a retry safe.

    Every header is checked in ``prepare``, before the attempt is recorded; the request is
    then built (``putrequest``/``putheader``, which only buffer) before a byte is written,
    so anything that still goes wrong there is a failure known to have sent nothing."""

    def __init__(self, target: str, *, timeout_s: float, token: str | None = None, token_env: str = "") -> None:
        t = targets.parse(target)
        if not isinstance(t, targets.HttpTarget):
            raise InvalidInput(f"target {target[:200]!r} is not an http(s) URL", field="target")
        self.scheme, self.host, self.port, self.path = t.scheme, t.host, t.port, t.path
        self.timeout_s = timeout_s
        if token is not None:
            check_token(token, token_env or "the token variable")
        self._token = token

    def _connection(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def _headers(self, bundle: Bundle, key: str, run_id: str) -> dict[str, str]:
        if not _HEADER_VALUE.fullmatch(key):
            raise InvalidInput(
                f"delivery key {key[:80]!r} holds {_unfit(key)}, which a webhook's Idempotency-Key header "
                "cannot carry unchanged; choose a key of visible ASCII characters (letters, digits, "
                "punctuation, inner spaces), e.g. report-v1. Nothing was recorded or sent. An attempt "
                "already recorded under this key (by hand) is settled with 'handoff delivered' or "
                "'handoff delivery-failed'", field="delivery_key")
        headers = {
            "Content-Type": "application/json", "Idempotency-Key": key, "X-Handoff-Run": run_id,
            "X-Handoff-Bundle-Sha256": bundle.sha256, "Content-Length": str(len(bundle.data)),
        }
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def prepare(self, bundle: Bundle, key: str, run_id: str) -> None:
        self._headers(bundle, key, run_id)

    def send_once(self, bundle: Bundle, key: str, run_id: str) -> tuple[str, str, str]:
        conn = self._connection()
        try:
            try:
                conn.connect()
            except (OSError, ssl.SSLError) as exc:  # nothing left this machine
                return "not_sent", "", f"could not connect to {self.host}:{self.port} ({_oserror(exc)}); nothing was sent"
            try:  # buffered only: nothing is written before endheaders
                conn.putrequest("POST", self.path)
                for name, value in self._headers(bundle, key, run_id).items():
                    conn.putheader(name, value)
            except Exception as exc:  # noqa: BLE001 - no text of it: it may quote the token
                return "failed", "", f"the request could not be built ({type(exc).__name__}); nothing was sent"
            try:
                conn.endheaders(message_body=bundle.data)
                resp = conn.getresponse()
                answer = resp.read(65_536)
            except (TimeoutError, socket.timeout):
                return _AGAIN, "", f"no answer within {self.timeout_s:g}s after the request was sent"
            except (http.client.HTTPException, OSError) as exc:
                return _AGAIN, "", f"the connection ended before an answer ({_oserror(exc)})"
        finally:
            conn.close()
        code = resp.status
        if 200 <= code < 300:
            return "confirmed", _http_receipt(code, resp.getheader("X-Request-Id") or "", answer), ""
        if code in (408, 425, 429) or code >= 500:
            return _AGAIN, "", f"the target answered HTTP {code}; it may or may not have acted"
        return "failed", "", f"the target refused it: HTTP {code} {_clean(resp.reason or '')}"


def _oserror(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def _http_receipt(code: int, request_id: str, answer: bytes) -> str:
    ident = request_id
    if not ident:
        try:
            doc = json.loads(answer)
            if isinstance(doc, dict) and isinstance(doc.get("id"), (str, int)):
                ident = str(doc["id"])
        except ValueError:
            pass
    shown = f"; id {_clean(ident)}" if ident else ""
    return f"HTTP {code}{shown}; answer sha256 {hashlib.sha256(answer).hexdigest()}"


# --- directories ---------------------------------------------------------------------

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_name(run_id: str, key: str) -> str:
    """The bundle's name in the directory: the run, readable, then a digest of the run and
    the key (32 hex digits of sha256), never the key itself. The name is in the receipt,
    and from there in the log and a trace, where a delivery key must not be; the digest
    keeps it distinct for every (run, key), so a repeat under one key finds its file."""
    run = _SAFE.sub("_", run_id).lstrip(".")[:120] or "delivery"
    digest = hashlib.sha256(f"{run_id}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{run}.{digest}.json"


class FileAdapter(Adapter):
    """Write the bundle into a directory, atomically, under a name made of the run and a
    digest of the key (``file_name``): the file appears whole or not at all, and a repeat
    finds it there and writes nothing new. The directory itself must be a real directory (not a symbolic link), and
    every step works relative to the descriptor opened on it, so nothing is written
    through a link planted meanwhile."""

    def __init__(self, target: str) -> None:
        t = targets.parse(target)
        if not isinstance(t, targets.FileTarget):
            raise InvalidInput(f"target {target[:200]!r} must be file:///ABSOLUTE/DIR", field="target")
        self.dir = t.dir

    def _open_dir(self) -> int:
        try:
            st = os.lstat(self.dir)
        except OSError as exc:
            raise InvalidInput(f"target directory {self.dir} cannot be used ({exc.strerror}); create it "
                               "first", field="target") from None
        if stat.S_ISLNK(st.st_mode):
            raise InvalidInput(f"target directory {self.dir} is a symbolic link; handoff never delivers "
                               "through a link. Name the real directory", field="target")
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidInput(f"target {self.dir} is not a directory", field="target")
        try:
            return os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise InvalidInput(f"target directory {self.dir} cannot be opened ({exc.strerror})",
                               field="target") from None

    def check(self) -> None:
        os.close(self._open_dir())

    def _existing(self, dfd: int, name: str, want: str) -> tuple[str, str, str] | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "failed", "", f"{name} in {self.dir} is a symbolic link; nothing was written"
            return _AGAIN, "", f"{name} in {self.dir} cannot be read ({exc.strerror})"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "failed", "", f"{name} in {self.dir} is not a regular file; nothing was written"
            h = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                h.update(chunk)
        finally:
            os.close(fd)
        if h.hexdigest() == want:
            return "confirmed", f"file {name} sha256 {want} (already there)", ""
        return "failed", "", (f"{name} in {self.dir} already holds other content under this key; "
                              "nothing was written. Use another key, or remove that file")

    def send_once(self, bundle: Bundle, key: str, run_id: str) -> tuple[str, str, str]:
        name = file_name(run_id, key)
        dfd = self._open_dir()
        try:
            found = self._existing(dfd, name, bundle.sha256)
            if found is not None:
                return found
            tmp = f".{name}.tmp-{os.urandom(6).hex()}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
            except OSError as exc:
                return "failed", "", f"cannot create a file in {self.dir} ({exc.strerror}); nothing was written"
            try:
                try:
                    view = memoryview(bundle.data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                # link(2) never replaces: of two racing writers of one key, one places the file.
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                return self._existing(dfd, name, bundle.sha256) or (_AGAIN, "", f"{name} vanished meanwhile")
            except OSError as exc:
                return "failed", "", f"cannot write {name} in {self.dir} ({exc.strerror}); nothing was placed"
            finally:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
            try:
                os.fsync(dfd)
            except OSError:
                pass
            return "confirmed", f"file {name} sha256 {bundle.sha256}", ""
        finally:
            os.close(dfd)


# --- commands ------------------------------------------------------------------------


class CmdAdapter(Adapter):
    """Run a command once with the bundle and the artifacts as files; exit status 0 means
    delivered, any other that it delivered nothing. It runs in a process group of its own
    that ends with the sender (group.Group): killed at the timeout, or when the sender
    dies, it ends with everything it started. Killed at the timeout, its outcome is
    unknown, and since a command does not honour keys it is never run again for that key:
    a person settles it."""

    honours_keys = False

    def __init__(self, target: str, *, timeout_s: float, env: Mapping[str, str] | None = None) -> None:
        t = targets.parse(target)
        if not isinstance(t, targets.CmdTarget):
            raise InvalidInput(f"target {target[:200]!r} is not a cmd: target", field="target")
        self.argv = list(t.argv)
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)

    def send_once(self, bundle: Bundle, key: str, run_id: str) -> tuple[str, str, str]:
        # The work directory is removed even if the command left something it cannot
        # delete: that must not hide how the command ended.
        try:
            workdir = tempfile.TemporaryDirectory(prefix="handoff-deliver-", ignore_cleanup_errors=True)
        except OSError as exc:
            return "failed", "", f"the command's files could not be prepared ({_oserror(exc)}); nothing ran"
        with workdir as work:
            try:
                arts, path = _stage(work, bundle)
                out = tempfile.TemporaryFile(dir=work)
            except OSError as exc:  # before the command exists: known to have sent nothing
                return "failed", "", f"the command's files could not be prepared ({_oserror(exc)}); nothing ran"
            env = {**self.env, "HANDOFF_DELIVERY_KEY": key, "HANDOFF_RUN_ID": run_id, "HANDOFF_BUNDLE": path,
                   "HANDOFF_BUNDLE_SHA256": bundle.sha256, "HANDOFF_ARTIFACTS": arts}
            with out:
                try:
                    running = Group(self.argv, stdout=out, cwd=work, env=env)
                except (OSError, subprocess.SubprocessError) as exc:
                    return "failed", "", f"the command could not start ({_oserror(exc)}); nothing ran"
                with running:
                    try:
                        code = running.wait(self.timeout_s)
                    except subprocess.TimeoutExpired:
                        running.kill()
                        return _AGAIN, "", f"the command ran past {self.timeout_s:g}s and was killed"
                out.seek(0)
                digest = hashlib.sha256(out.read()).hexdigest()
        if code == 0:
            return "confirmed", f"exit 0; output sha256 {digest}", ""
        if code < 0:
            return _AGAIN, "", f"the command was killed by signal {-code} before it said"
        return "failed", "", f"the command exited {code} (output sha256 {digest[:16]})"


def _stage(work: str, bundle: Bundle) -> tuple[str, str]:
    """Write the artifacts (under their sent names, distinct by construction in
    bundle.py) and the bundle into ``work``; the directory and the file's paths."""
    arts = os.path.join(work, "artifacts")
    os.mkdir(arts, 0o700)
    for name, data in bundle.files:
        with open(os.path.join(arts, name), "xb") as f:
            f.write(data)
    path = os.path.join(work, "bundle.json")
    with open(path, "xb") as f:
        f.write(bundle.data)
    return arts, path


def adapter_for(target: str, send: ev.SendPolicy, *, timeout_s: float | None = None,
                env: Mapping[str, str] | None = None) -> Adapter:
    """The adapter for ``target``, checked before anything is recorded or sent. The bearer
    token is read here from the environment variable the contract names, and only from one
    named ``HANDOFF_TOKEN_...`` (a run opened before that rule is refused here)."""
    env = os.environ if env is None else env
    timeout = send.timeout_s if timeout_s is None else timeout_s
    if target.startswith(("http://", "https://")):
        token = None
        if (refusal := targets.token_env_refusal(send.token_env)) is not None:
            raise InvalidInput(f"this run's contract cannot be sent as it is: {refusal}. Nothing was recorded or "
                               "sent; deliver it by hand ('handoff deliver' without --send, send it, then 'handoff "
                               "delivered'), or open a new run that names such a variable", field="send.token_env")
        if send.token_env:
            token = env.get(send.token_env)
            if not token:
                raise InvalidInput(f"the contract sends a bearer token from ${send.token_env}, which is not "
                                   "set; set it in the environment of this command", field="token_env")
        return HttpAdapter(target, timeout_s=timeout, token=token, token_env=send.token_env)
    if target.startswith("file://"):
        adapter = FileAdapter(target)
        adapter.check()
        return adapter
    if target.startswith("cmd:"):
        return CmdAdapter(target, timeout_s=timeout, env=env)
    raise InvalidInput(
        f"target {target[:200]} has no adapter (http://, https://, file://, cmd:); send the result "
        "yourself, then record it with 'handoff deliver' and 'handoff delivered'", field="target")
