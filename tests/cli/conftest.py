"""The CLI tests' fixture ``h``: tests/support.py's ``Handoff`` bound to this test's ledger."""

from __future__ import annotations

import pytest

# ROOT and make_runner are imported from here by tests/cli/test_docs.py.
from tests.support import ROOT, Handoff, make_runner  # noqa: F401


@pytest.fixture
def h(tmp_path) -> Handoff:
    return Handoff(str(tmp_path / "ledger.db"))
