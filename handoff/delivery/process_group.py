"""A ``cmd:`` target's process group, tied to the life of the process that sends.

The command runs in a process group of its own, so a timeout ends it and everything it
started with one ``killpg``. That group must also end when the sender dies without
cleaning up (SIGKILL, a crash, an out-of-memory kill): a command left running after its
sender is gone may deliver with nobody recording it, and whoever settles the open attempt
would be looking at a target that is still changing.

Why a watcher and not ``PR_SET_PDEATHSIG``: the death signal reaches only the direct child
(a shell's own children live on), it fires when the *thread* that forked dies rather than
the process (a library caller's worker thread), and it is Linux-only. Here a small watcher
process is started first, as the leader of a new process group, and the command joins
that group. The watcher holds the read end of a pipe whose only write end is the
sender's; the kernel closes it however the sender ends. When the sender is done with the
command it writes ``done`` and closes the pipe, and the watcher leaves quietly. If the
pipe closes without ``done``, the sender died (or gave up on the command), and the watcher
kills its whole group, itself, the command and every process the command started. While
the watcher lives the group's id cannot be reused, so that kill never reaches a stranger.

Limits: a process that leaves the group on purpose (``setsid``, a daemon) is out of reach;
so is anything if the watcher itself is killed first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import IO, Any

#: The watcher: it ignores the terminal's signals (the sender's Ctrl-C must end the
#: sender, and then the group through the pipe, not the watcher first), reads until end
#: of file, and kills its process group unless the sender said ``done``.
_WATCH = """\
import os, signal
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
got = b""
while True:
    try:
        chunk = os.read(0, 16)
    except InterruptedError:
        continue
    if not chunk:
        break
    got += chunk
if got != b"done":
    os.killpg(0, signal.SIGKILL)
"""

#: How long to wait for a watcher told ``done`` to leave; it leaves at once unless stopped.
_WATCHER_EXIT_S = 10.0


class Group:
    """``argv`` running in a process group that ends if the sender dies. Use it as a
    context manager: leaving the block without ``wait`` having returned (an exception, an
    interrupt) kills the group too."""

    def __init__(self, argv: list[str] | tuple[str, ...], *, stdout: IO[Any], cwd: str,
                 env: Mapping[str, str]) -> None:
        r, self._w = os.pipe()  # both ends close-on-exec: the command never holds the write end
        try:
            self.watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCH], stdin=r,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
        except BaseException:
            os.close(self._w)
            raise
        finally:
            os.close(r)
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                                         cwd=cwd, env=dict(env), process_group=self.watcher.pid)
        except BaseException:
            self._settle(done=True)  # nothing joined the group: let the watcher go
            raise

    def wait(self, timeout: float) -> int:
        """The command's exit status (negative: the signal that killed it). On
        ``subprocess.TimeoutExpired`` it is still running: call ``kill``."""
        code = self.proc.wait(timeout=timeout)
        self._settle(done=True)
        return code

    def kill(self) -> None:
        """SIGKILL the whole group (the watcher, the command and what it started)."""
        try:
            os.killpg(self.watcher.pid, signal.SIGKILL)
        except OSError:
            self.proc.kill()
        self.proc.wait()
        self._settle(done=False)

    def _settle(self, *, done: bool) -> None:
        if self._w < 0:
            return
        try:
            if done:
                os.write(self._w, b"done")
        except OSError:
            pass  # the watcher is gone already
        finally:
            os.close(self._w)
            self._w = -1
        try:
            self.watcher.wait(_WATCHER_EXIT_S)
        except subprocess.TimeoutExpired:
            self.watcher.kill()
            self.watcher.wait()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._w >= 0:  # wait never returned: the command may still run
            self.kill()
