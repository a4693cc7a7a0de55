"""The SQLite dialect: one file, WAL, every write under BEGIN IMMEDIATE.

``store`` holds the store (connection, reads, the write's I/O), ``schema`` the file's
layout and its life (create, check, upgrade), ``opening`` what a path must be,
``driver`` the error mapping, ``group`` group commit and ``views`` the projections'
tables. The algorithms every backend shares live one level up, in ledger/ (plan,
folds, importing, verify).
"""

from ..store import global_link
from .driver import is_driver_error
from .sqlite_schema import APPEND_ONLY_TRIGGERS, STORE_SCHEMA_VERSION, UNKEPT
from .sqlite_store import WAL_CHECKPOINT_BYTES, SqliteStore, SqliteTransaction

__all__ = ["APPEND_ONLY_TRIGGERS", "STORE_SCHEMA_VERSION", "UNKEPT", "WAL_CHECKPOINT_BYTES", "SqliteStore",
           "SqliteTransaction", "global_link", "is_driver_error"]
