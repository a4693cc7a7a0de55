"""A private PostgreSQL cluster that a test may crash: never the shared server on 5432.

Stopping a server hard is only allowed on a cluster nobody else uses, so the tests that
do it make their own: ``initdb`` into a temporary directory, ``postgres`` on a free
port, run as the ``postgres`` OS user when the tests run as root (initdb refuses root).
It listens on 127.0.0.1 and keeps its socket in its own directory. The superuser
``postgres`` is trusted; every other role must give its password (scram-sha-256).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

BIN = os.environ.get("HANDOFF_TEST_PG_BIN", "/usr/lib/postgresql/15/bin")


def available() -> str | None:
    """Why a private cluster cannot be made here, or None if it can."""
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not os.access(os.path.join(BIN, tool), os.X_OK):
            return f"{BIN}/{tool} is missing (set HANDOFF_TEST_PG_BIN to PostgreSQL's bin directory)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' OS user to run initdb as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateCluster:
    """One throw-away PostgreSQL server: ``start()``, ``crash()``, ``stop_immediate()``."""

    def __init__(self, *, max_connections: int = 40) -> None:
        self.dir = tempfile.mkdtemp(prefix="handoff-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.max_connections = max_connections
        self.log = os.path.join(self.dir, "server.log")
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        self._run([f"{BIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                   "--no-sync", "--no-instructions"])
        # The superuser is trusted (the tests administer the cluster as it); every other
        # role must give its password, so a wrong one is refused as on a real server.
        hba = os.path.join(self.data, "pg_hba.conf")
        with open(hba, "w", encoding="utf-8") as f:
            f.write("local all all trust\n"
                    "host all postgres 127.0.0.1/32 trust\n"
                    "host all all 127.0.0.1/32 scram-sha-256\n")
        if self._user:
            os.chown(hba, self._user["user"], self._user["group"])
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str]) -> None:
        subprocess.run(argv, check=True, capture_output=True, timeout=120, cwd=self.dir, **self._user)

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it accepts connections."""
        opts = (f"-c port={self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir} "
                f"-c max_connections={self.max_connections} -c superuser_reserved_connections=0 "
                "-c fsync=on -c synchronous_commit=on")
        self._run([f"{BIN}/pg_ctl", "-D", self.data, "-l", self.log, "-o", opts, "-w", "-t", str(int(timeout)),
                   "start"])

    def postmaster_pid(self) -> int | None:
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def crash(self) -> None:
        """SIGKILL the postmaster, then its children (what a power cut leaves behind: the
        next start runs crash recovery from the WAL)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # a stale postmaster.pid: already gone
            return
        for c in children:
            try:
                os.kill(int(c), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: every backend quits at once, no checkpoint."""
        self._run([f"{BIN}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"])

    def destroy(self) -> None:
        if self.postmaster_pid() is not None:
            try:
                self._run([f"{BIN}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"])
            except Exception:
                self.crash()
        shutil.rmtree(self.dir, ignore_errors=True)
