"""The public state machine (handoff/testing/machine.py) run against the real SQLite ledger."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from handoff.testing import LedgerMachine

TestLedger = LedgerMachine.TestCase
TestLedger.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
