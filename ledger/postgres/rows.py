"""How the PostgreSQL ledger's rows look to the client: the columns a reader selects,
the statements that read a page, a head or a run, and the decoding of what comes back."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any


from ..store import Head, Recorded

COLUMNS = (
    "e.run_id, e.seq, {pos}, e.type, e.actor, e.lease, e.idem_key, e.recorded_us, "
    "e.schema_version, e.payload, e.prev_hash, e.hash"
)
SEALED_COLUMNS = COLUMNS.format(pos="o.position")
#: The events at positions (after, stop]: the page's write ids bound a range scan of the
#: events, joined to the page by hash, in place of one index descent per event (which
#: cost the server twice as much). A page's write ids are close together (a write's
#: events are numbered in its own block, and writes seal soon after they commit), so
#: the range holds little beyond the page: only the events that committed between a
#: write taking its ids and its seal. "+ 0": min() and max() of the bare column would be
#: planned as a walk of the event_id index from one end, filtering on the position,
#: past every page before this one. Unordered: a sort on the client costs less than on
#: the server.
PAGE_SQL = (
    "WITH page AS MATERIALIZED (SELECT min(event_id + 0) AS low, max(event_id + 0) AS high "
    "FROM ledger_order WHERE position > %(after)s AND position <= %(stop)s) "
    f"SELECT {SEALED_COLUMNS} FROM ledger_order o JOIN events e ON e.id = o.event_id "
    "WHERE o.position > %(after)s AND o.position <= %(stop)s "
    "AND e.id >= (SELECT low FROM page) AND e.id <= (SELECT high FROM page)"
)
POSITION = operator.itemgetter(2)
#: Where a reader stops: the last sealed position, and whether committed events wait
#: for theirs. The position is read from the order itself (one descent of its key), not
#: from the tail row: sealers commit positions in order, so what is visible is always
#: 1..max, and a tail row that was lost or set back (damage verify reports) neither
#: stops a reader short nor fails it untyped.
TAIL_AND_QUEUE = ("SELECT coalesce((SELECT max(position) FROM ledger_order), 0), "
                   "EXISTS (SELECT 1 FROM unsealed)")
RUN_COLUMNS = COLUMNS.format(pos="coalesce(o.position, 0)")
INSERT = (
    "INSERT INTO events (id, run_id, seq, type, actor, lease, idem_key, idem_digest, "
    "batch_size, recorded_us, schema_version, payload, prev_hash, hash, viewed) "
    "VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
)
UPSERT_HEAD = (
    "INSERT INTO heads (run_id, last_seq, last_hash, lease, lease_holder, max_lease, "
    "first_position, last_position) VALUES (%s,%s,%s,%s,%s,%s,%s,%s) "
    "ON CONFLICT (run_id) DO UPDATE SET last_seq=excluded.last_seq, "
    "last_hash=excluded.last_hash, lease=excluded.lease, "
    "lease_holder=excluded.lease_holder, max_lease=excluded.max_lease, "
    "last_position=excluded.last_position"
)
HEAD_SELECT = (
    "SELECT run_id, last_seq, last_hash, lease, lease_holder, first_position, "
    "last_position, max_lease, lease_digest FROM heads WHERE run_id=%s"
)
#: A head as the interface shows it: its span in ledger positions (the heads table keeps
#: write ids; 0 for an event still waiting for its position).
PUBLIC_HEAD = (
    "SELECT h.run_id, h.last_seq, h.last_hash, h.lease, h.lease_holder, "
    "coalesce(f.position, 0), coalesce(l.position, 0) FROM heads h "
    "LEFT JOIN ledger_order f ON f.event_id = h.first_position "
    "LEFT JOIN ledger_order l ON l.event_id = h.last_position"
)
RUNS_SINCE = (
    "SELECT h.run_id FROM heads h WHERE h.run_id IN (SELECT e.run_id FROM ledger_order o "
    "JOIN events e ON e.id = o.event_id WHERE o.position > %s) ORDER BY h.first_position"
)

def as_bytes(v: Any) -> Any:
    return bytes(v) if isinstance(v, (memoryview, bytearray)) else v


def recorded_row(r: Sequence[Any]) -> Recorded:
    return Recorded(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                    as_bytes(r[9]), as_bytes(r[10]), as_bytes(r[11]))


def head_of(row: Sequence[Any] | None, *, digest: bool = False) -> Any:
    """(Head or None, highest lease[, token digest]) from a HEAD_SELECT row."""
    if row is None:
        return (None, 0, None) if digest else (None, 0)
    head = Head(row[0], row[1], as_bytes(row[2]), row[3], row[4], row[5], row[6])
    return (head, row[7], row[8]) if digest else (head, row[7])
