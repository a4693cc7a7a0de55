"""Shared fixtures: real SQLite files in a temporary directory, never a mocked store."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from handoff import Ledger  # noqa: E402
from handoff.ledger.sqlite import SqliteStore  # noqa: E402
from tests.support import Clock  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        default=False,
        help="run the long soak and fault-injection tests at full size",
    )


def pytest_configure(config: pytest.Config) -> None:
    # Fault and soak tests read this to choose their size: full with --slow,
    # a bounded version otherwise (what CI runs).
    os.environ["HANDOFF_TEST_SCALE"] = "full" if config.getoption("--slow") else "bounded"


@pytest.fixture(scope="session", autouse=True)
def _postgres_session_database():
    """Drop the PostgreSQL database a test of this session created (tests/pg.py), if any."""
    yield
    from tests import pg

    pg.drop_database()


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "ledger.db")


@pytest.fixture
def clock() -> Clock:
    """A still clock (tests/support.py): time moves only when the test advances it."""
    return Clock(step_us=0)


@pytest.fixture
def lg(db_path):
    """A Ledger on a fresh SQLite file (``db_path``) and the real clock, closed afterwards."""
    with Ledger(db_path) as ledger:
        yield ledger


@pytest.fixture
def clocked_lg(db_path, clock):
    """``lg`` on the still ``clock``: time passes only when the test advances it."""
    with Ledger(db_path, clock=clock) as ledger:
        yield ledger


@pytest.fixture
def store(db_path):
    s = SqliteStore(db_path)
    yield s
    s.close()


@pytest.fixture(params=sorted(__import__("tests.backends", fromlist=["BACKENDS"]).BACKENDS))
def backend(request, tmp_path):
    """Each backend in tests/backends.py in turn: the one fixture a new backend fills in."""
    from tests.backends import BACKENDS, OnBackend

    on = OnBackend(BACKENDS[request.param], tmp_path)
    yield on
    on.close()


@pytest.fixture
def backend_store(backend):
    """A fresh, empty store of each backend in tests/backends.py, closed afterwards."""
    return backend.new_store()
