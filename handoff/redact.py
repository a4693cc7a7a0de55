"""A redacted export: runs as JSON lines that can leave the building.

What is kept is listed, not what is hidden. ``KEPT`` names, per event type and field, the
values that stay as they are, each with the test a value must pass to stay: a number, a
flag, a sha256, a state or outcome from the ledger's own fixed vocabulary. Every other
value, in every field, at any depth (nested structs, lists, maps), becomes a stable
salted digest: free text, names, paths, kinds, the owner's patterns, and any field or
event type added later, until someone adds it to ``KEPT``. A map's keys stay only when
they are field names of the ledger's own schema. The ledger's own sentences ("no
heartbeat from NAME") are free text like any other, so no name survives inside them.

Run ids are structure and stay, unless a built-in detector or the owner's own patterns
(the run's contract, a fork's inherited one) match them; then they are digested too, the
same way everywhere. A kept string is checked the same way.

The same salt gives the same file from the same ledger, so whoever keeps the salt and
the ledger can verify a redacted file by making it again and comparing; nobody else can
reverse a digest. A redacted file is never a ledger: its payloads no longer match any
hash. Every line says ``"redacted": true`` and import refuses it (RedactedExportRefused).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from handoff.ledger import events as ev
from handoff.ledger.inputs import ACTOR_KINDS, RUN_ID_RE
from handoff.reducers import sanitize as sz
from handoff.reducers import stall
from handoff.reducers import transitions as T

FORMAT = "handoff-redacted-export/2"

Keep = Callable[[Any], bool]


def _int(v: Any) -> bool:
    return type(v) is int


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _flag(v: Any) -> bool:
    return type(v) is bool


_HEX = re.compile(r"[0-9a-f]{64}")


def _sha256(v: Any) -> bool:
    return type(v) is str and (v == "" or _HEX.fullmatch(v) is not None)


def _one_of(values: Iterable[str]) -> Keep:
    known = frozenset(values)
    return lambda v: type(v) is str and v in known


def _literal(cls: type[ev.Event], field: str) -> Keep:
    """The values a ``Literal`` field of an event may take, read from the schema itself."""
    info = msgspec.inspect.type_info(cls)
    (f,) = (f for f in info.fields if f.name == field)  # type: ignore[attr-defined]
    return _one_of(f.type.values)


def _run_id(v: Any) -> bool:
    return type(v) is str and RUN_ID_RE.fullmatch(v) is not None


_PATTERN_DETECTOR = re.compile(r"pattern\[\d{1,2}\]")
_DETECTOR_NAMES = frozenset({*sz.DETECTORS, sz.UNSCANNABLE, sz.MORE})


#: The test a run id passes to be shown as it is (handoff/sqlite_export.py applies it too).
RUN_ID_KEPT = _run_id


def _detector(v: Any) -> bool:
    return type(v) is str and (v in _DETECTOR_NAMES or _PATTERN_DETECTOR.fullmatch(v) is not None)


_STATE = _one_of(T.STATES)
_CLASSIFICATION = _one_of(stall.CLASSIFICATIONS)

#: (event type, field path) -> the test a value must pass to be kept as it is. A path
#: names nested fields with ``.`` and list items with ``[]``. Anything not listed is
#: digested: this is the whole of what a redacted export shows verbatim.
KEPT: dict[str, dict[str, Keep]] = {
    "handoff_opened": {
        "require_review": _flag, "public": _flag,
        "policy.heartbeat_timeout_s": _number, "policy.progress_timeout_s": _number, "policy.retry_budget": _int,
        "policy.delivery_timeout_s": _number, "policy.owner_cap": _int,
        "send.timeout_s": _number, "send.retries": _int, "send.backoff_s": _number, "send.max_bytes": _int,
        "send.inline": _flag,
    },
    "lease_granted": {"lease": _int},
    "lease_released": {"lease": _int},
    "lease_revoked": {"lease": _int},
    "authority_transferred": {"action": _one_of(T.TRANSFERABLE)},
    "state_changed": {"from_state": _STATE, "to_state": _STATE},
    "progress_recorded": {"kind": _one_of(T.ALL_PROGRESS_KINDS | T.NOT_PROGRESS), "advances": _flag},
    "artifact_recorded": {"bytes": _int, "sha256": _sha256, "exists": _flag},
    "evidence_recorded": {"outcome": _literal(ev.EvidenceRecorded, "outcome")},
    "blocker_raised": {"blocker_id": _int},
    "blocker_cleared": {"blocker_id": _int},
    "side_effect_confirmed": {"outcome": _literal(ev.SideEffectConfirmed, "outcome")},
    "reconciliation_recorded": {"outcome": _literal(ev.ReconciliationRecorded, "outcome")},
    "review_decided": {"approved": _flag},
    "delivery_attempted": {"bundle_sha256": _sha256},
    "sanitization_checked": {
        "passed": _flag, "bundle_sha256": _sha256, "rules_sha256": _sha256,
        "items[].sha256": _sha256, "items[].bytes": _int,
        "findings[].detector": _detector, "findings[].line": _int, "findings[].count": _int,
    },
    "run_closed": {"disposition": _literal(ev.RunClosed, "disposition")},
    "watchdog_observed": {"classification": _CLASSIFICATION, "progress_seq": _int, "interval_s": _number},
    "recovery_decided": {"action": _one_of(T.RECOVERY_ACTIONS), "classification": _CLASSIFICATION,
                         "progress_seq": _int},
    "run_forked": {"parent": _run_id, "parent_seq": _int},
}
#: Every payload carries its event type under this key.
_TAG_KEPT = _one_of(ev.EVENT_TYPES)

#: Which digest a hidden value gets, by its field's name, so that one person, path or
#: key reads the same wherever it appears (``[name~...]`` as owner, worker or actor).
#: Only the label: a field not named here is digested all the same, as ``text``.
NAME_FIELDS = frozenset({"owner", "by", "worker", "watcher", "to", "target", "origin", "key"})
PATH_FIELDS = frozenset({"path", "result_path", "artifacts"})
RUN_FIELDS = frozenset({"run_id", "parent"})


def _field_names() -> frozenset[str]:
    """Every field name of the ledger's schema (events and the structs inside them): a
    map's key that is one of these says nothing about the run and stays."""
    names: set[str] = {"type"}
    todo = list(msgspec.inspect.multi_type_info(ev.AnyEvent.__args__))  # type: ignore[attr-defined]
    while todo:
        t = todo.pop()
        if isinstance(t, msgspec.inspect.StructType):
            for f in t.fields:
                names.add(f.encode_name)
                todo.append(f.type)
        elif isinstance(t, msgspec.inspect.UnionType):
            todo.extend(t.types)
        elif isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType, msgspec.inspect.SetType)):
            todo.append(t.item_type)
        elif isinstance(t, msgspec.inspect.TupleType):
            todo.extend(t.item_types)
        elif isinstance(t, msgspec.inspect.DictType):
            todo.extend((t.key_type, t.value_type))
    return frozenset(names)


SCHEMA_FIELDS = _field_names()


def salt_id(salt: bytes) -> str:
    """Names the salt without revealing it: two files with the same id used the same salt."""
    return hmac.new(salt, b"handoff salt id", hashlib.sha256).hexdigest()[:16]


def header(salt: bytes, runs: list[str] | None) -> dict[str, Any]:
    return {
        "redacted": True, "format": FORMAT, "salt_id": salt_id(salt), "detectors": sz.DETECTORS_VERSION,
        "runs": "all" if runs is None else len(runs),
        "note": ("a sanitized derivative for reading, not a ledger: only structure (types, seqs, times, states, "
                 "outcomes, numbers, content digests) is shown, every other value is a salted digest; "
                 "'handoff import' refuses it. Verify it by exporting again with the same salt and comparing"),
    }


class Redactor:
    """Redacts one export, line by line, in the export's order: a run's contract (or its
    parent's, for a fork) comes before the run's other events, so its patterns are known
    by the time they are needed."""

    def __init__(self, salt: bytes, *, fields: Iterable[str] = ()) -> None:
        self.salt = salt
        #: Fields the caller wants digested even where KEPT would show them.
        self.hidden = frozenset(fields)
        self.patterns: dict[str, tuple[str, ...]] = {}
        self._clean: dict[tuple[str, tuple[str, ...]], bool] = {}

    def digest(self, field: str, v: Any) -> str:
        kind = ("name" if field in NAME_FIELDS or field in self.hidden else "path" if field in PATH_FIELDS
                else "run" if field in RUN_FIELDS else "text" if type(v) is str else "value")
        return sz.salted(self.salt, v if type(v) is str else msgspec.json.encode(v).decode(), kind)

    def clean(self, text: str, run_id: str) -> bool:
        """Whether no built-in detector and none of the run's own patterns match ``text``."""
        patterns = self.patterns.get(run_id, ())
        memo = (text, patterns)
        if memo not in self._clean:
            self._clean[memo] = not sz.scan([("value", text)], patterns)
        return self._clean[memo]

    def keep(self, test: Keep | None, field: str, v: Any, run_id: str) -> Any:
        """``v`` as it is when ``test`` passes it (and a string is clean), else its digest."""
        if test is not None and field not in self.hidden and test(v) and (type(v) is not str or self.clean(v, run_id)):
            return v
        return self.digest(field, v)

    def key(self, k: str) -> str:
        return k if k in SCHEMA_FIELDS else sz.salted(self.salt, k, "field")

    def value(self, etype: str, path: str, v: Any, run_id: str) -> Any:
        if isinstance(v, dict):
            return {self.key(k): self.value(etype, f"{path}.{k}" if path else k, x, run_id) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(etype, path + "[]", x, run_id) for x in v]
        if v is None or v == "":  # nothing to hide in nothing
            return v
        test = _TAG_KEPT if path == "type" else KEPT.get(etype, {}).get(path)
        return self.keep(test, path.rsplit(".", 1)[-1].removesuffix("[]"), v, run_id)

    def actor(self, actor: str) -> str:
        kind, _, name = actor.partition(":")
        if kind not in ACTOR_KINDS:
            kind = sz.salted(self.salt, kind, "text")
        return f"{kind}:{sz.salted(self.salt, name, 'name')}"

    def learn(self, run_id: str, etype: str, payload: dict[str, Any]) -> None:
        """Remember the patterns that apply to ``run_id``: its contract's, or, for a fork,
        its parent's (the contract a fork continues under)."""
        if etype == "handoff_opened":
            pats = payload.get("sanitize_patterns") or ()
            self.patterns[run_id] = tuple(p for p in pats if isinstance(p, str))
        elif etype == "run_forked" and isinstance(payload.get("parent"), str):
            self.patterns[run_id] = self.patterns.get(payload["parent"], ())

    def line(self, exported: bytes) -> bytes:
        doc = msgspec.json.decode(exported)
        rid, etype, payload = doc["run_id"], doc["type"], doc["payload"]
        if not isinstance(payload, dict):
            payload = {"payload": payload}
        self.learn(rid, etype, payload)
        out: dict[str, Any] = {"redacted": True, "run_id": self.keep(_run_id, "run_id", rid, rid)}
        for name in ("seq", "type", "actor", "lease", "idempotency_key", "recorded_us", "schema_version", "position"):
            v = doc.get(name)
            out[name] = (None if v is None else self.actor(v) if name == "actor" else
                         sz.salted(self.salt, v, "key") if name == "idempotency_key" else
                         self.keep(_TAG_KEPT if name == "type" else _int, name, v, rid))
        out["payload"] = {self.key(k): self.value(etype, k, x, rid) for k, x in payload.items()}
        return msgspec.json.encode(out)


def lines(exported: Iterable[bytes], salt: bytes, runs: list[str] | None, *,
          fields: Iterable[str] = ()) -> Iterator[bytes]:
    r = Redactor(salt, fields=fields)
    yield msgspec.json.encode(header(salt, runs))
    for line in exported:
        yield r.line(line)
