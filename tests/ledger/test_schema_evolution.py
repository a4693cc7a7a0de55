"""Payloads written by schema version 1 still decode, with later fields at their defaults.

Schema 1 predates ``ProgressRecorded.advances``, ``ArtifactRecorded.exists``,
``WatchdogObserved.interval_s`` and the policy's ``delivery_timeout_s`` / ``owner_cap``.
"""

import json
import os

import msgspec
import pytest

from handoff.ledger import events as ev

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "schema_v1.jsonl")


def _rows():
    with open(FIXTURE) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_fixture_is_older_than_the_current_schema():
    assert all(r["schema_version"] < ev.SCHEMA_VERSION for r in _rows())


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r["payload"]["type"])
def test_v1_payload_decodes(row):
    event = ev.decode(json.dumps(row["payload"]).encode())
    assert ev.tag_of(event) == row["payload"]["type"]


def test_v1_defaults_are_filled_in():
    events = {ev.tag_of(e): e for e in (ev.decode(json.dumps(r["payload"]).encode()) for r in _rows())}
    assert events["progress_recorded"].advances is True
    assert events["artifact_recorded"].exists is True
    assert events["watchdog_observed"].interval_s == 0.0
    policy = events["handoff_opened"].policy
    assert policy.delivery_timeout_s == ev.Policy().delivery_timeout_s
    assert policy.owner_cap == 10


def test_v1_history_folds_to_a_checkpoint():
    from handoff.ledger.store import Recorded
    from handoff.reducers.checkpoint import fold

    recs = [
        Recorded("r1", i + 1, i + 1, r["payload"]["type"], "worker:w1", None, None, 1_000_000 * (i + 1),
                 r["schema_version"], json.dumps(r["payload"]).encode(), b"", b"")
        for i, r in enumerate(_rows())
    ]
    cp = fold(recs, "r1")
    assert cp.state == "planning" and cp.lease == 1 and cp.progress_seq == 3


def test_a_changed_field_type_is_refused_not_misread():
    # The evolution rule forbids changing a stored field's type; if it happened, decoding
    # must fail loudly rather than yield a wrong value.
    bad = b'{"type": "lease_granted", "worker": "w1", "lease": "one"}'
    with pytest.raises(msgspec.ValidationError, match="lease"):
        ev.decode(bad)
