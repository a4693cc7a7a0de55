"""Liveness kept beside the log, and how it joins what the log says. Pure: no I/O, no clock.

A heartbeat is an observation, not a fact of the work. Most beats only move the run's
liveness row (``ledger.store.Liveness``); the log keeps the ones that matter (the lease's
grant stands for its first): the first after a silence longer than ``quiet_us``, a beat whose attrs changed,
and one per summary window (``mark_us``), each with the beats counted so far and the beat
before it, so a run's timeline shows when its worker went quiet. The watchdog's decisions
record the liveness they saw. A reader of the run as it stands now joins the two with
``overlay``; a reader of the run as of an earlier seq reads the log alone.
"""

from __future__ import annotations

from msgspec.structs import replace

from handoff.ledger import events as ev
from handoff.ledger.store import Liveness

from .checkpoint import Checkpoint

#: A gap between two beats longer than this share of the heartbeat timeout is a silence:
#: the beat that ends it goes into the log. At the default policy (a beat every 20 s, a
#: 60 s timeout) that is one beat missed.
QUIET_SHARE = 0.5
#: Seconds between summary beats in the log while a worker only beats: four an hour.
DEFAULT_MARK_S = 900.0


def quiet_us(policy: ev.Policy) -> int:
    """The longest gap between beats that is not a silence worth logging, in µs."""
    return int(policy.heartbeat_timeout_s * QUIET_SHARE * 1_000_000)


def mark_us(mark_s: float) -> int:
    return int(mark_s * 1_000_000)


def current(cp: Checkpoint, live: Liveness | None) -> Liveness | None:
    """``live`` when it is of the run's current lease, else None (a row of an ended or
    earlier lease says nothing about the run)."""
    if live is None or cp.lease is None or live.lease != cp.lease:
        return None
    return live


def last_beat(logged: int | None, live: Liveness) -> int:
    """The run's last beat, from the log's last sign of life (``logged``: a logged beat, the
    grant, or a beat a watchdog recorded seeing) and the row of the current lease.

    A row that has seen the log's last logged beat or grant (its ``logged_us`` is not older)
    holds the lease's latest beat in order, even when the clock stepped back since: as the
    log alone did, the last beat is the last one sent, not the latest timestamp. A row that
    missed one (a crash between the logged beat and the row's update, or an unsynced row
    lost) is older than the log there: the later of the two stands."""
    if logged is None or live.logged_us >= logged:
        return live.beat_us
    return max(logged, live.beat_us)


def overlay(cp: Checkpoint, live: Liveness | None) -> Checkpoint:
    """The run as it stands: the log's checkpoint with the last beat kept beside it, when
    that row is of the current lease (``last_beat``)."""
    w = cp.watch
    beat = overlay_beat(cp.lease, w.last_heartbeat_us, live)
    return cp if beat == w.last_heartbeat_us else replace(cp, watch=replace(w, last_heartbeat_us=beat))


def overlay_beat(lease: int | None, beat_us: int | None, live: Liveness | None) -> int | None:
    """The same join for a stall-view row (its lease and the log's last beat)."""
    if live is None or lease is None or live.lease != lease:
        return beat_us
    return last_beat(beat_us, live)
