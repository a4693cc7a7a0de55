"""The EventStore contract (tests/ledger/conformance.py) on PostgreSQL."""

from __future__ import annotations

from ledger.postgres import PostgresStore
from tests.ledger.conformance import StoreConformance
from tests.pg import fresh_url


class TestPostgresStore(StoreConformance):
    def make_store(self):
        return PostgresStore(fresh_url())
