"""The property-testing kit: check that your agents' use of the ledger keeps its rules.

Like ``hypothesis.extra``, it lives outside the pure core and needs hypothesis, a test
dependency (``pip install '.[test]'`` in the checkout); nothing in the library imports it.

- ``handoff.testing.strategies``: actors, commands, events and store envelopes;
- ``handoff.testing.model``: ``Model``, what each command should do, in plain Python;
- ``handoff.testing.machine``: ``LedgerMachine``, the RuleBasedStateMachine that runs
  commands on a real ledger and on the model and fails when they disagree.

Everything public is re-exported here; docs/testing.md shows how to use it.
"""

from .machine import RULE_GROUPS, FakeClock, LedgerMachine
from .model import COMPARED, Expect, Model, RunModel, model_value
from .strategies import (
    CLAIM_DIGEST, KEYS, OPERATOR, OWNERS, PROGRESS_KINDS, STRANGER, TRANSFEREES, WATCHDOG, WORKERS,
    actors, as_records, commands, events, issued, machine_secret,
)

__all__ = [
    "OWNERS", "WORKERS", "WATCHDOG", "OPERATOR", "STRANGER", "TRANSFEREES", "CLAIM_DIGEST",
    "KEYS", "PROGRESS_KINDS", "machine_secret", "actors", "commands", "issued", "events", "as_records",
    "Model", "RunModel", "Expect", "COMPARED", "model_value",
    "LedgerMachine", "FakeClock", "RULE_GROUPS",
]
