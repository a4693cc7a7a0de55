"""A redacted export: runs as JSON lines that can leave the building.

Structure stays (run ids, seqs, event types, states, times, leases, outcomes, numbers);
what can identify a person, a machine or a secret goes: names (actors, owners, targets,
and any field the caller names) and paths become stable salted digests, every other piece
of free text goes through the sanitization detectors (reducers.sanitize), and the ledger's
own hashes and idempotency keys are dropped or digested. The same salt gives the same file
from the same ledger, so whoever keeps the salt and the ledger can verify a redacted file
by making it again and comparing; nobody else can reverse a digest.

A redacted file is never a ledger: its payloads no longer match any hash. Every line says
``"redacted": true`` and import refuses it (RedactedExportRefused), whole or cut.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from handoff.reducers import sanitize as sz

FORMAT = "handoff-redacted-export/1"
#: Fields holding a name or a caller's key: replaced by a salted digest whole, so equal
#: values stay equal (a key used twice is still seen as one). Run ids (``run_id``,
#: ``parent``) are structure and stay as they are.
NAME_FIELDS = frozenset({"owner", "by", "worker", "watcher", "to", "target", "origin", "key", "token_digest"})
#: Fields holding a local path (or a list of them).
PATH_FIELDS = frozenset({"path", "result_path", "artifacts", "name", "item"})
#: Fields kept as they are: the structure (states, outcomes, kinds, numbers, digests of content).
KEPT_FIELDS = frozenset({"type", "from_state", "to_state", "outcome", "disposition", "classification",
                         "action", "kind", "detector", "sha256", "bundle_sha256", "rules_sha256", "approved",
                         "passed", "exists", "advances"})
#: Fields holding a map under the caller's own names (a record's ``attrs``): a key there may
#: read like a kept field (``kind``) without being one, so no value in it is kept as
#: structure. Its keys are free text; a key named like a name or path field (or in
#: ``--redact-field``) is digested as one; numbers and booleans stay.
FREE_MAPS = frozenset({"attrs"})


def salt_id(salt: bytes) -> str:
    """Names the salt without revealing it: two files with the same id used the same salt."""
    return hmac.new(salt, b"handoff salt id", hashlib.sha256).hexdigest()[:16]


def header(salt: bytes, runs: list[str] | None) -> dict[str, Any]:
    return {
        "redacted": True, "format": FORMAT, "salt_id": salt_id(salt), "detectors": sz.DETECTORS_VERSION,
        "runs": "all" if runs is None else len(runs),
        "note": ("a sanitized derivative for reading, not a ledger: names and paths are salted digests, "
                 "free text passed the sanitization detectors; 'handoff import' refuses it. Verify it "
                 "by exporting again with the same salt and comparing"),
    }


class Redactor:
    def __init__(self, salt: bytes, *, fields: Iterable[str] = (), patterns: Iterable[str] = ()) -> None:
        self.salt = salt
        self.names = NAME_FIELDS | frozenset(fields)
        self.patterns = tuple(patterns)

    def value(self, field: str, v: Any) -> Any:
        if field in FREE_MAPS and isinstance(v, dict):
            return {sz.redact(k, self.salt, self.patterns): self.value("" if k in KEPT_FIELDS else k, x)
                    for k, x in v.items()}
        if isinstance(v, dict):
            return {k: self.value(k, x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(field, x) for x in v]
        if not isinstance(v, str):
            return v
        if field in self.names:
            return sz.salted(self.salt, v, "name") if v else v
        if field in PATH_FIELDS:
            return sz.salted(self.salt, v, "path") if v else v
        if field in KEPT_FIELDS:
            return v
        return sz.redact(v, self.salt, self.patterns)

    def actor(self, actor: str) -> str:
        kind, _, name = actor.partition(":")
        return f"{kind}:{sz.salted(self.salt, name, 'name')}"

    def line(self, exported: bytes) -> bytes:
        doc = msgspec.json.decode(exported)
        payload = doc["payload"]
        out = {
            "redacted": True,
            "run_id": doc["run_id"], "seq": doc["seq"], "type": doc["type"],
            "actor": self.actor(doc["actor"]), "lease": doc["lease"],
            "idempotency_key": None if doc["idempotency_key"] is None else
            sz.salted(self.salt, doc["idempotency_key"], "key"),
            "recorded_us": doc["recorded_us"], "schema_version": doc["schema_version"],
            "position": doc.get("position"),
            "payload": {k: self.value(k, x) for k, x in payload.items()},
        }
        return msgspec.json.encode(out)


def lines(exported: Iterable[bytes], salt: bytes, runs: list[str] | None, *, fields: Iterable[str] = (),
          patterns: Iterable[str] = ()) -> Iterator[bytes]:
    r = Redactor(salt, fields=fields, patterns=patterns)
    yield msgspec.json.encode(header(salt, runs))
    for line in exported:
        yield r.line(line)
