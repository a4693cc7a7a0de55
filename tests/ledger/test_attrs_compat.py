"""Attributes and declared kinds change nothing already stored.

The fixture ledger (fixtures/ledger_file1.sql) was written by an earlier version, at
event schema 3, before ``attrs`` and ``progress_kinds`` existed. Each of its payloads must
decode and encode again to the very bytes stored, so its hashes, chains and exports stay
what they were, and an import of its export must still demand that canonical form.
"""

from __future__ import annotations

import json
import os
import sqlite3

import msgspec
import pytest

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger import jsonl
from handoff.ledger.store import chain_hash
from tests.support import file_from_dump

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "ledger_file1.sql")


@pytest.fixture
def old_file(tmp_path) -> str:
    return file_from_dump(FIXTURE, tmp_path / "old.db")


def _rows(path: str) -> list[tuple[str, int, bytes]]:
    conn = sqlite3.connect(path)
    try:
        return [(t, v, bytes(p)) for t, v, p in
                conn.execute("SELECT type, schema_version, payload FROM events ORDER BY position")]
    finally:
        conn.close()


def test_the_fixture_predates_attrs():
    assert ev.SCHEMA_VERSION == 4 and ev.CANONICAL_SINCE == 3


def test_every_stored_payload_encodes_again_to_its_bytes(old_file):
    rows = _rows(old_file)
    assert {v for _, v, _ in rows} == {3}
    concerned = {"heartbeat_recorded", "progress_recorded", "artifact_recorded", "evidence_recorded",
                 "side_effect_started", "handoff_opened"}
    assert concerned <= {t for t, _, _ in rows}  # the events that gained a field are all there
    for tag, _, payload in rows:
        event = ev.decode(payload)
        assert ev.attrs_of(event) == {}
        assert ev.encode(event) == payload, tag
        assert b"attrs" not in payload and b"progress_kinds" not in payload


#: Runs of the fixture that no version imports, attrs or not: ``lost-effect``'s release wrote
#: the move to unknown under the lease it had just released, which the import's fencing
#: refuses; ``bare-run`` was written by a bare store with no contract.
NOT_IMPORTABLE = {"lost-effect", "bare-run"}


def test_the_old_ledger_verifies_and_its_export_imports_byte_for_byte(old_file, tmp_path):
    with Ledger(old_file) as lg:
        assert lg.verify() == []
        runs = [h.run_id for h in lg.store.list_runs() if h.run_id not in NOT_IMPORTABLE]
        exported = list(lg.export(runs))
    assert len(exported) > 30
    with Ledger(str(tmp_path / "copy.db")) as other:
        other.import_lines(exported)
        assert other.verify() == []
        again = list(other.export())

    def unplaced(line: bytes) -> bytes:  # positions are the importing ledger's own
        doc = msgspec.json.decode(line)
        doc.pop("position")
        return msgspec.json.encode(doc)

    assert [unplaced(x) for x in again] == [unplaced(x) for x in exported]


def test_a_reformatted_schema_3_payload_is_still_refused(old_file, tmp_path):
    # Schema 3 is no longer the current version; its payloads must keep meeting the
    # canonical-form check on import all the same (extra spacing reads differently in
    # different JSON parsers, and would hide a second meaning behind a valid hash).
    with Ledger(old_file) as lg:
        lines = [msgspec.json.decode(x) for x in lg.export()]
    first = lines[0]
    assert first["seq"] == 1 and first["schema_version"] == 3
    spaced = json.dumps(first["payload"], separators=(", ", ": ")).encode()
    assert ev.decode(spaced) == ev.decode(json.dumps(first["payload"], separators=(",", ":")).encode())
    first["hash"] = chain_hash(bytes.fromhex(first["prev_hash"]), first["run_id"], 1, first["type"], first["actor"],
                               first["lease"], first["idempotency_key"], first["recorded_us"], 3, spaced).hex()
    line = (json.dumps({k: v for k, v in first.items() if k != "payload"})[:-1]
            + ', "payload": ' + spaced.decode() + "}").encode()
    assert next(jsonl.parse_lines([line]))[1].payload == spaced  # the chain itself is valid
    with Ledger(str(tmp_path / "target.db")) as target:
        with pytest.raises(E.InvalidInput, match="not in the form this library writes"):
            target.import_lines([line])
        assert list(target.export()) == []
