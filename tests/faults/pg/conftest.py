"""Fixtures of the PostgreSQL fault tests: a fresh ledger, per-worker proxies, a private cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.faults.conftest import ROOT, child_env

from .proxy import FaultProxy


@pytest.fixture
def pg_url() -> str:
    """A fresh, empty ledger on the shared server (its own schema; tests/pg.py)."""
    from tests.pg import fresh_url

    return fresh_url()


def upstream_port(url: str) -> int:
    import urllib.parse

    return urllib.parse.urlsplit(url).port or 5432


@pytest.fixture
def proxies():
    """``proxies(url)``: a new FaultProxy in front of the server ``url`` names; all closed after."""
    made: list[FaultProxy] = []

    def make(url: str) -> FaultProxy:
        p = FaultProxy(upstream_port(url))
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture(scope="session")
def private_cluster():
    """A PostgreSQL cluster of this session's own, which tests may crash and restart."""
    from . import cluster

    why = cluster.available()
    if why is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and no private PostgreSQL cluster can be made: {why}")
        pytest.skip(why)
    c = cluster.PrivateCluster(max_connections=20)
    try:
        c.start()
        yield c
    finally:
        c.destroy()


def pg_agent(role: str, *args: object, **popen: Any) -> subprocess.Popen[str]:
    """``python -m tests.faults.pg.agents ROLE ARGS...`` as a real process."""
    return subprocess.Popen([sys.executable, "-m", "tests.faults.pg.agents", role, *map(str, args)],
                            cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)
