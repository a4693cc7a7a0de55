"""The ledger layer: event types, the storage interface, and the SQLite store."""

from .errors import *  # noqa: F401,F403
from .events import SCHEMA_VERSION, Event
from .store import Actor, AppendResult, EventStore, Head, Recorded
from .sqlite import SqliteStore

__all__ = ["SCHEMA_VERSION", "Event", "Actor", "AppendResult", "EventStore", "Head", "Recorded", "SqliteStore"]
