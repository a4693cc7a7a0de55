"""The PostgreSQL dialect: one database shared by workers on many hosts.

``store`` holds the store (connection, sealing, the write's I/O), ``schema`` the
database's tables, functions and migrations, ``roles`` the least-privilege roles,
``verify`` its ledger-wide checks and ``views`` the projections' tables. The algorithms
every backend shares live one level up, in ledger/ (plan, folds, importing, verify).
"""

from .roles import roles_sql
from .postgres_schema import PG_SCHEMA_VERSION, notify_channel
from .connection import is_driver_error, redact
from .postgres_store import PostgresStore, PostgresTransaction

__all__ = ["PG_SCHEMA_VERSION", "PostgresStore", "PostgresTransaction", "is_driver_error", "notify_channel",
           "redact", "roles_sql"]
