"""The PostgreSQL server the benchmarks run against: one database per run, one schema per trial.

The server is named by ``HANDOFF_BENCH_PG`` (else ``HANDOFF_TEST_PG``, else the local
server, user postgres, trust authentication). The first PostgreSQL scenario of a run
creates a database with a random name (``handoff_bench_<hex>``); the run's end drops it
(atexit), so a run leaves nothing behind and two runs at once never meet. Every trial
gets a fresh schema of its own in that database, dropped when the trial closes: much
cheaper than a database per trial, and each side starts from empty tables.

No server: the PostgreSQL scenarios report ``no server`` and the run goes on (exit 0),
except under ``CI=true``, where a run that cannot reach the server stops with an error,
because CI must never pass by skipping the backend (as the tests do, tests/pg.py).
"""

from __future__ import annotations

import atexit
import os
import secrets
import urllib.parse
from typing import Any

SERVER = (
    os.environ.get("HANDOFF_BENCH_PG")
    or os.environ.get("HANDOFF_TEST_PG")
    or "postgresql://postgres@127.0.0.1:5432/postgres"
)

#: What the header records of the server: the settings a durable commit's cost depends on.
SETTINGS = (
    "server_version", "synchronous_commit", "fsync", "wal_sync_method", "full_page_writes",
    "commit_delay", "wal_level", "shared_buffers", "max_connections",
)

_state: dict[str, Any] = {"db": None, "error": None, "checked": False}


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        user = urllib.parse.quote(parts.username or "")
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    return url


def _with_db(url: str, db: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + db))


def _admin() -> Any:
    import psycopg

    return psycopg.connect(SERVER, autocommit=True, connect_timeout=3)


def unavailable() -> str | None:
    """Why the PostgreSQL scenarios cannot run here (None when they can).

    Checked once per run. Under ``CI=true`` a missing driver or server stops the run."""
    if not _state["checked"]:
        _state["checked"] = True
        try:
            import psycopg  # noqa: F401 - the extra may be missing
        except ImportError:
            _state["error"] = "psycopg not installed"
            detail = "psycopg is not installed (pip install -e '.[postgres]')"
        else:
            detail = ""
            try:
                with _admin() as conn:
                    conn.execute("SELECT 1")
            except Exception as exc:  # psycopg.OperationalError and friends
                _state["error"] = "no server"
                detail = f"PostgreSQL at {_redact(SERVER)} is unreachable: {str(exc).strip()[:200]}"
        if _state["error"] and os.environ.get("CI", "").lower() == "true":
            raise SystemExit(
                f"CI=true and {detail}: the PostgreSQL benchmarks must run in CI. Start the "
                "server, or name it with HANDOFF_BENCH_PG=postgresql://user@host:port/db"
            )
    return _state["error"]


def database_url() -> str:
    """The run's own database, created on first use and dropped when the run ends."""
    if _state["db"] is None:
        name = "handoff_bench_" + secrets.token_hex(6)
        with _admin() as conn:
            conn.execute(f"CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0")  # the store needs UTF8
        _state["db"] = name
        atexit.register(drop_database)
    return _with_db(SERVER, _state["db"])


def drop_database() -> None:
    name = _state["db"]
    if name is None:
        return
    _state["db"] = None
    try:
        with _admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    except Exception as exc:  # report, never hide: the database would be left behind
        import sys

        print(f"warning: could not drop the benchmark database {name}: {exc}", file=sys.stderr)


def with_search_path(url: str, schema: str) -> str:
    """An address whose sessions work in ``schema`` (libpq ``options=-csearch_path=``)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=" + urllib.parse.quote(f"-csearch_path={schema}")


class Schema:
    """A fresh schema in the run's database: ``url`` opens sessions working in it."""

    def __init__(self, prefix: str = "t") -> None:
        import psycopg

        self.name = f"{prefix}_{secrets.token_hex(6)}"
        self.db_url = database_url()
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.name}")
        self.url = with_search_path(self.db_url, self.name)

    def connect(self, **kwargs: Any) -> Any:
        import psycopg

        return psycopg.connect(self.url, **kwargs)

    def es_env(self) -> dict[str, str]:
        """eventsourcing's PostgreSQL persistence, configured by its environment keys."""
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(self.db_url)
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": str(info.get("dbname", "postgres")),
            "POSTGRES_HOST": str(info.get("host", "127.0.0.1")),
            "POSTGRES_PORT": str(info.get("port", "5432")),
            "POSTGRES_USER": str(info.get("user", "postgres")),
            "POSTGRES_PASSWORD": str(info.get("password", "")),
            "POSTGRES_SCHEMA": self.name,
        }

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.db_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.name} CASCADE")


def describe() -> dict[str, Any]:
    """The server's address (password hidden) and the settings in :data:`SETTINGS`."""
    reason = unavailable()
    if reason:
        return {"server": _redact(SERVER), "error": reason}
    with _admin() as conn:
        out: dict[str, Any] = {"server": _redact(SERVER)}
        for name in SETTINGS:
            out[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return out


def describe_line(info: dict[str, Any]) -> str:
    if "error" in info:
        return f"postgresql: {info['server']}: {info['error']}"
    rest = ", ".join(f"{k}={info[k]}" for k in SETTINGS if k != "server_version")
    line = f"postgresql: {info['server_version']} at {info['server']}; {rest}"
    if not durable(info):
        line += ("\nwarning: this server acknowledges commits before their WAL is flushed "
                 "(synchronous_commit or fsync off): these are not durable figures, and the "
                 "issue's goals are stated at synchronous_commit=on")
    return line


def durable(info: dict[str, Any]) -> bool:
    """Whether a commit on this server returns only once its WAL is on disk (the
    default), as every goal assumes."""
    return info.get("fsync") == "on" and info.get("synchronous_commit") != "off"


class CpuMeter:
    """CPU time spent per unit of work, on both sides of the wire: the client process's
    (``time.process_time``) and the server backends' of this database (each backend's
    ``/proc/<pid>/schedstat``, so only when the server runs on this machine).

    Why CPU and not only wall time: wall time on a shared two-core machine moves with
    whatever else runs, and hides where a command's time goes; CPU per event is what
    bounds a CPU-bound run (many writers on two cores), and what a write path can shave.

    A pid is counted only if this machine's process of that pid is a postgres process
    that started when the server says that backend did (a server elsewhere, or in
    another pid namespace, has pids that name unrelated processes here). A backend that
    starts during the window counts whole; one that ends during it is lost (none of the
    scenarios that use this meter closes a connection while timed). The meter's own
    connection, opened here and kept, is left out; reading the backends costs it one
    query at each end, outside the window the scenario times itself.
    """

    def __init__(self, db_url: str) -> None:
        import psycopg

        self._conn = psycopg.connect(db_url, autocommit=True)
        self._client = 0.0
        self._server: dict[int, int] | None = None

    def close(self) -> None:
        self._conn.close()

    def _backends(self) -> dict[int, int] | None:
        """{pid: CPU ns} of the database's client backends, or None when any of them is
        not a process of this machine (then nothing of the server is counted)."""
        rows = self._conn.execute(
            "SELECT pid, extract(epoch FROM backend_start)::float8 FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' "
            "AND pid <> pg_backend_pid()").fetchall()
        out = {}
        for pid, started in rows:
            ns = _local_backend_cpu(pid, started)
            if ns is None:
                if _gone(pid):
                    continue  # ended between the query and the read: nothing to count
                return None
            out[pid] = ns
        return out

    def start(self) -> None:
        """Read both clocks; the server's only if its backends are processes here."""
        import time

        self._server = self._backends()
        self._client = time.process_time()

    def stop(self, units: int) -> dict[str, float]:
        """Microseconds of CPU per unit since :meth:`start`: ``client_cpu_us`` always,
        ``server_cpu_us`` when the server's backends are processes of this machine."""
        import time

        client = (time.process_time() - self._client) / units * 1e6
        after = self._backends()
        metrics = {"client_cpu_us": client}
        if after and self._server is not None:
            ns = sum(v - self._server.get(pid, 0) for pid, v in after.items())
            metrics["server_cpu_us"] = ns / 1000 / units
        return metrics


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _gone(pid: int) -> bool:
    import os

    return not os.path.exists(f"/proc/{pid}")


def _local_backend_cpu(pid: int, started: float) -> int | None:
    """The CPU nanoseconds of this machine's process ``pid`` if it is the backend that
    the server says started at ``started`` (epoch seconds), else None."""
    import os

    boot = _boot_time()
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if not f.read().startswith(b"postgres"):
                return None
        with open(f"/proc/{pid}/stat") as f:
            # the fields after the command's closing parenthesis; starttime is field 22
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open(f"/proc/{pid}/schedstat") as f:
            ns = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if boot is None or abs(boot + ticks / os.sysconf("SC_CLK_TCK") - started) > 2.0:
        return None
    return ns
