"""Fixtures for the integrations: the backends another process can share (the MCP server
runs as a real subprocess on the same ledger as the test)."""

from __future__ import annotations

import pytest

from tests.backends import BACKENDS, OnBackend


@pytest.fixture(params=sorted(name for name, b in BACKENDS.items() if b.shared))
def shared_backend(request, tmp_path):
    on = OnBackend(BACKENDS[request.param], tmp_path)
    yield on
    on.close()
