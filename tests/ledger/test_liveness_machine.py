"""A stateful Hypothesis machine for heartbeats kept beside the log (reducers/liveness.py).

Against a model, on a real SQLite file with a clock the machine moves (forward, and now
and then a little back): leases granted, revoked and replaced, beats from the current
holder with and without attrs, beats from stale and forged tokens. It proves:

- a beat under any token but the current lease's is refused (``StaleLease``) and changes
  neither the log nor the liveness row;
- an accepted beat is logged exactly when the model says it matters (the first beat past
  half the heartbeat timeout of silence, other attrs, the summary window), else kept beside
  the log with no event;
- the run as it stands shows the latest accepted beat of its lease (or the grant), and a
  logged beat carries the lease's beat count and the beat before it;
- folding the log alone never shows a beat the log does not hold.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from handoff import Ledger
from handoff.ledger.errors import StaleLease
from handoff.ledger.store import encode_beat_attrs
from handoff.reducers import liveness
from handoff.reducers.checkpoint import AGGREGATE

S = 1_000_000
TIMEOUT_S = 60.0
MARK_S = 300.0
QUIET_US = int(TIMEOUT_S * liveness.QUIET_SHARE * S)
MARK_US = int(MARK_S * S)
# Gaps on each side of the silence limit (30 s here) and the window (300 s), and a clock
# stepping back a little.
GAPS = st.sampled_from([0, 1 * S, 20 * S, 29 * S, 30 * S, 30 * S + 1, 45 * S, 299 * S, 301 * S, -2 * S])
ATTRS = st.sampled_from([None, None, None, {"model": "a"}, {"model": "b"}])


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000 * S

    def __call__(self) -> int:
        return self.now


class LivenessMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="liveness-machine-")
        self.clock = Clock()
        self.lg = Ledger(os.path.join(self.dir, "l.db"), clock=self.clock, synchronous="NORMAL",
                         beat_mark_s=MARK_S)
        self.run = self.lg.open(goal="g", target="file:///tmp/liveness-machine", owner="alice",
                                heartbeat_timeout_s=TIMEOUT_S)
        self.old_tokens: list[str] = []
        self.token: str | None = None
        self.model: dict | None = None  # the current lease's row as the model keeps it

    def teardown(self) -> None:
        self.lg.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _grant_time(self) -> int:
        return self.lg.store.fold(self.run, AGGREGATE).watch.lease_since_us

    @precondition(lambda self: self.token is None)
    @rule()
    def claim(self) -> None:
        self.token = self.lg.claim(self.run, "w")
        at = self._grant_time()
        self.model = {"beat": at, "logged": at, "beats": 0, "attrs": b""}

    @precondition(lambda self: self.token is not None)
    @rule(reason=st.sampled_from(["stuck", "operator"]))
    def revoke(self, reason: str) -> None:
        self.lg.revoke(self.run, reason, by="alice")
        self.old_tokens.append(self.token)
        self.token, self.model = None, None

    @rule(gap=GAPS)
    def tick(self, gap: int) -> None:
        self.clock.now += gap

    @precondition(lambda self: self.token is not None)
    @rule(gap=GAPS, attrs=ATTRS)
    def beat(self, gap: int, attrs: dict | None) -> None:
        self.clock.now += gap
        m, now = self.model, self.clock.now
        encoded = encode_beat_attrs(attrs)
        kept = (encoded == m["attrs"] and now - QUIET_US <= m["beat"] <= now  # a clock stepped back: logged
                and m["logged"] > now - MARK_US)
        events = self._log()
        out = self.lg.heartbeat(self.run, self.token, attrs=attrs)
        m["beats"] += 1
        if kept:
            assert out.result.outcome == "unchanged" and self._log() == events
            m["beat"] = now  # the lease's latest beat, even when the clock stepped back
        else:
            assert out.result.outcome == "committed"
            new = self._log()[len(events):]
            assert [r.type for r in new] == ["heartbeat_recorded"]
            e = new[0].event
            assert e.beats == m["beats"]
            assert e.previous_us == m["beat"]  # the beat before it, kept or logged
            m["beat"], m["logged"], m["attrs"] = now, now, encoded

    @precondition(lambda self: self.token is not None)
    @rule(n=st.integers(min_value=1, max_value=14))
    def beat_steadily(self, n: int) -> None:
        """A worker beating on time for a while: the summary window comes round."""
        for _ in range(n):
            self.beat(29 * S, None)

    @rule(which=st.sampled_from(["old", "forged"]), attrs=ATTRS)
    def stale_beat(self, which: str, attrs: dict | None) -> None:
        if which == "old" and not self.old_tokens:
            return
        lease = self.token.lease if self.token is not None else (self.old_tokens[-1].lease if self.old_tokens else 1)
        token = self.old_tokens[-1] if which == "old" else f"{lease}.{'Z' * 43}"
        events, rows = self._log(), self.lg.store.liveness([self.run])
        with pytest.raises(StaleLease):
            self.lg.heartbeat(self.run, token, attrs=attrs)
        assert self._log() == events and self.lg.store.liveness([self.run]) == rows

    def _log(self) -> list:
        return list(self.lg.log(self.run))

    @invariant()
    def the_run_as_it_stands_shows_the_latest_beat(self) -> None:
        cp = self.lg.checkpoint(self.run)
        if self.token is None:
            assert cp.lease is None
            return
        # The last beat sent under the lease (the grant before any), whatever the clock did;
        # the log alone holds the last logged one.
        assert cp.watch.last_heartbeat_us == self.model["beat"]
        assert self.lg.store.fold(self.run, AGGREGATE).watch.last_heartbeat_us == self.model["logged"]


LivenessMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
test_liveness_machine = LivenessMachine.TestCase
