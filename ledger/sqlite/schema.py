"""The SQLite file's layout: its version, format mark, and the statements that make it.

One home for what the store, its views and its checks compare a file against: the
append-only triggers (``verify`` and ``doctor`` report one dropped or rewritten), the
table of writes that did not keep every projection, and the heads index.
"""

from __future__ import annotations

#: Layout version of the file itself (tables, indexes, triggers). 2: the views_unkept
#: table (writes that did not keep every projection inline), and inline writes no longer
#: move the tracking rows; a file of schema 1 is upgraded by its first writable open.
STORE_SCHEMA_VERSION = 2
#: Each write that did not keep every projection inline (a bare store, a projector of some
#: views only, an older tool) records its first position here, with the projections it did
#: keep (comma-separated; '' for none). A projection is current up to the log's end but
#: for the first such write after its tracking position that did not keep it: so a write
#: that keeps them all, the usual one, writes no tracking row (SqliteViewStore.lagging).
UNKEPT = "views_unkept"
CREATE_UNKEPT = f"CREATE TABLE IF NOT EXISTS {UNKEPT} (position INTEGER PRIMARY KEY, kept TEXT NOT NULL)"
# Written only once projection tables exist: before that, a view made later is built
# from the whole log anyway (its tracking row starts unbuilt), so nothing need be marked.
MARK_UNKEPT = (
    f"INSERT INTO {UNKEPT} (position, kept) SELECT ?, '' "
    "WHERE EXISTS (SELECT 1 FROM sqlite_master WHERE type='table' AND name='projection_positions')"
)
FORMAT_NAME = "handoff-ledger"
# Runs in the order they first appeared, a page at a time: list_runs and a rebuild walk
# every run without holding them all in memory. A run's first position never changes,
# so head updates never touch this index; only a run's first append adds an entry.
HEADS_FIRST = "CREATE INDEX IF NOT EXISTS heads_first ON heads(first_position)"
#: The triggers that make the events table append-only, exactly as created. verify and
#: doctor compare the file's triggers with these: one dropped or rewritten is reported.
APPEND_ONLY_TRIGGERS = {
    "events_no_update": (
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: UPDATE refused'); END"
    ),
    "events_no_overwrite": (
        "CREATE TRIGGER events_no_overwrite BEFORE INSERT ON events WHEN EXISTS ("
        "SELECT 1 FROM events WHERE position = NEW.position "
        "OR (run_id = NEW.run_id AND seq = NEW.seq)) BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: overwrite refused'); END"
    ),
    "events_no_delete": (
        "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN "
        "SELECT RAISE(ABORT, 'handoff ledger events are append-only: DELETE refused'); END"
    ),
}
