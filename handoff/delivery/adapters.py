"""The adapters: send one bundle to one target and say what is known afterwards.

Each answer is one of three, and the difference is the whole point:

- ``confirmed``: the target acknowledged it (the receipt says how);
- ``failed``: it is known not to have arrived (refused, never connected);
- ``unknown``: it may have arrived (a timeout after the request left, a connection closed
  before the answer, a command killed mid-run). Only a target that honours the delivery
  key may be sent to again under that key (reducers.delivery.honours_keys).

Adapters never raise for what happens at the target; they raise (typed, before anything
is sent) only when the target or the settings cannot be used at all. Secrets (a bearer
token read from the environment) go into the request only, never into a receipt or error.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import shlex
import signal
import socket
import ssl
import stat
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Mapping

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.errors import InvalidInput

from .bundle import Bundle


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
    """Base: ``send_once`` answers (outcome, receipt, error); ``send`` adds retries."""

    honours_keys = True

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


class HttpAdapter(Adapter):
    """POST the bundle as JSON, with the key as ``Idempotency-Key``: a receiver that keeps
    keys answers a repeat without acting twice, which is what makes a retry safe."""

    def __init__(self, target: str, *, timeout_s: float, token: str | None = None) -> None:
        u = urllib.parse.urlsplit(target)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidInput(f"target {target[:200]} is not an http(s) URL with a host", field="target")
        if u.username or u.password:
            raise InvalidInput("the target URL carries a credential; use send.token_env", field="target")
        self.scheme, self.host = u.scheme, u.hostname
        try:
            self.port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            raise InvalidInput(f"target {target[:200]} has an invalid port", field="target") from None
        self.path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self.timeout_s = timeout_s
        self._token = token

    def _connection(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def send_once(self, bundle: Bundle, key: str, run_id: str) -> tuple[str, str, str]:
        headers = {
            "Content-Type": "application/json", "Idempotency-Key": key, "X-Handoff-Run": run_id,
            "X-Handoff-Bundle-Sha256": bundle.sha256,
        }
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        conn = self._connection()
        try:
            try:
                conn.connect()
            except (OSError, ssl.SSLError) as exc:  # nothing left this machine
                return "not_sent", "", f"could not connect to {self.host}:{self.port} ({_oserror(exc)}); nothing was sent"
            try:
                conn.request("POST", self.path, body=bundle.data, headers=headers)
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
    """The bundle's name in the directory: run and key, readable, and distinct for every
    (run, key) even where characters had to be replaced."""
    raw = f"{run_id}.{key}"
    safe = _SAFE.sub("_", raw).lstrip(".")[:150] or "delivery"
    if safe != raw:
        safe += "-" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return safe + ".json"


class FileAdapter(Adapter):
    """Write the bundle into a directory, atomically, under a name made of the run and the
    key: the file appears whole or not at all, and a repeat finds it there and writes
    nothing new. The directory itself must be a real directory (not a symbolic link), and
    every step works relative to the descriptor opened on it, so nothing is written
    through a link planted meanwhile."""

    def __init__(self, target: str) -> None:
        u = urllib.parse.urlsplit(target)
        if u.scheme != "file" or u.netloc not in ("", "localhost") or not u.path.startswith("/"):
            raise InvalidInput(f"target {target[:200]} must be file:///ABSOLUTE/DIR", field="target")
        self.dir = urllib.parse.unquote(u.path)
        if "\x00" in self.dir:
            raise InvalidInput("the target directory's name holds a NUL byte", field="target")

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
    delivered, any other that it delivered nothing. Killed at the timeout (with its whole
    process group), its outcome is unknown, and since a command does not honour keys it is
    never run again for that key: a person settles it."""

    honours_keys = False

    def __init__(self, target: str, *, timeout_s: float, env: Mapping[str, str] | None = None) -> None:
        try:
            self.argv = shlex.split(target[len("cmd:"):])
        except ValueError as exc:
            raise InvalidInput(f"target {target[:200]}: the command cannot be split into words ({exc})",
                               field="target") from None
        if not self.argv:
            raise InvalidInput("target cmd: names no command", field="target")
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)

    def send_once(self, bundle: Bundle, key: str, run_id: str) -> tuple[str, str, str]:
        with tempfile.TemporaryDirectory(prefix="handoff-deliver-") as work:
            arts = os.path.join(work, "artifacts")
            os.mkdir(arts, 0o700)
            for name, data in bundle.files:
                with open(os.path.join(arts, name), "xb") as f:
                    f.write(data)
            path = os.path.join(work, "bundle.json")
            with open(path, "xb") as f:
                f.write(bundle.data)
            env = {**self.env, "HANDOFF_DELIVERY_KEY": key, "HANDOFF_RUN_ID": run_id, "HANDOFF_BUNDLE": path,
                   "HANDOFF_BUNDLE_SHA256": bundle.sha256, "HANDOFF_ARTIFACTS": arts}
            with tempfile.TemporaryFile(dir=work) as out:
                try:
                    proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=work, env=env, start_new_session=True)
                except OSError as exc:
                    return "failed", "", f"the command could not start ({exc.strerror}); nothing ran"
                try:
                    code = proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    return _AGAIN, "", f"the command ran past {self.timeout_s:g}s and was killed"
                out.seek(0)
                digest = hashlib.sha256(out.read()).hexdigest()
        if code == 0:
            return "confirmed", f"exit 0; output sha256 {digest}", ""
        if code < 0:
            return _AGAIN, "", f"the command was killed by signal {-code} before it said"
        return "failed", "", f"the command exited {code} (output sha256 {digest[:16]})"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def adapter_for(target: str, send: ev.SendPolicy, *, timeout_s: float | None = None,
                env: Mapping[str, str] | None = None) -> Adapter:
    """The adapter for ``target``, checked before anything is recorded or sent. The bearer
    token is read here from the environment variable the contract names."""
    env = os.environ if env is None else env
    timeout = send.timeout_s if timeout_s is None else timeout_s
    if target.startswith(("http://", "https://")):
        token = None
        if send.token_env:
            token = env.get(send.token_env)
            if not token:
                raise InvalidInput(f"the contract sends a bearer token from ${send.token_env}, which is not "
                                   "set; set it in the environment of this command", field="token_env")
        return HttpAdapter(target, timeout_s=timeout, token=token)
    if target.startswith("file://"):
        adapter = FileAdapter(target)
        adapter.check()
        return adapter
    if target.startswith("cmd:"):
        return CmdAdapter(target, timeout_s=timeout, env=env)
    raise InvalidInput(
        f"target {target[:200]} has no adapter (http://, https://, file://, cmd:); send the result "
        "yourself, then record it with 'handoff deliver' and 'handoff delivered'", field="target")
