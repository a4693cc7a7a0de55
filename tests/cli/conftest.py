"""The CLI tests' fixture ``h``: tests/support.py's ``Handoff`` bound to this test's ledger."""

from __future__ import annotations

import pytest

from tests.support import Handoff


@pytest.fixture
def h(tmp_path) -> Handoff:
    return Handoff(str(tmp_path / "ledger.db"))
