"""export --redact shows only what handoff/redact.py's KEPT lists; every other value, of
every event type and field, at any depth, is a digest (docs/delivery.md, "Sharing a run
outside"). The walk below fills every field the schema has with a marker of its own, so a
field or event type added later is covered without anyone remembering this test."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from handoff import redact
from handoff.facade import Ledger
from handoff.ledger import events as ev
from handoff.reducers import stall
from handoff.watchdog import watch_once
from tests.support import S, Clock

SALT = b"0123456789abcdef-salt"


class Markers:
    """Values no redaction could produce by chance: strings, integers and floats."""

    def __init__(self) -> None:
        self.n = itertools.count(1)

    def string(self) -> str:
        return f"mark{next(self.n):04d}zq"

    def fill(self, t: Any) -> Any:
        mi = msgspec.inspect
        if isinstance(t, mi.StructType):
            return {f.encode_name: self.fill(f.type) for f in t.fields}
        if isinstance(t, mi.UnionType):
            return self.fill(next((x for x in t.types if not isinstance(x, mi.NoneType)), t.types[0]))
        if isinstance(t, (mi.ListType, mi.VarTupleType)):
            return [self.fill(t.item_type), self.fill(t.item_type)]
        if isinstance(t, mi.TupleType):
            return [self.fill(x) for x in t.item_types]
        if isinstance(t, mi.DictType):
            return {self.string(): self.fill(t.value_type), self.string(): self.fill(t.value_type)}
        if isinstance(t, mi.BoolType):
            return True
        if isinstance(t, mi.IntType):
            return 7_000_000_000 + next(self.n)
        if isinstance(t, mi.FloatType):
            return 0.25 + next(self.n)
        return self.string()  # str, Literal and anything else: a marker


def leaves(v: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(v, dict):
        return [x for k, y in v.items() for x in leaves(y, f"{path}.{k}" if path else k)]
    if isinstance(v, list):
        return [x for y in v for x in leaves(y, path + "[]")]
    return [(path, v)]


def at(doc: Any, path: str) -> list[Any]:
    """The values at ``path`` in ``doc`` (a list: ``[]`` fans out)."""
    found = [doc]
    for part in path.split("."):
        many = part.endswith("[]")
        key = part.removesuffix("[]")
        found = [d[key] for d in found if isinstance(d, dict) and key in d]
        if many:
            found = [x for d in found if isinstance(d, list) for x in d]
    return found


def line(run_id: str, etype: str, payload: dict[str, Any], mk: Markers) -> bytes:
    return json.dumps({
        "run_id": run_id, "seq": 1, "type": etype, "actor": f"worker:{mk.string()}", "lease": 1,
        "idempotency_key": mk.string(), "recorded_us": 1, "schema_version": ev.SCHEMA_VERSION,
        "payload": payload, "prev_hash": "0" * 64, "hash": "0" * 64, "position": 1,
    }).encode()


#: Structured attributes as someone may add them to an event: string keys, string,
#: number and flag values. The redactor knows nothing of them.
def attrs(mk: Markers) -> dict[str, Any]:
    return {mk.string(): mk.string(), mk.string(): 7_123_456_789, mk.string(): True, "worker": mk.string(),
            "nested": {mk.string(): [mk.string(), {"deep": mk.string()}]}}


CASES = sorted(ev.EVENT_TYPES) + ["a_type_added_later"]


@pytest.mark.parametrize("etype", CASES)
def test_no_value_survives_redaction_unless_the_allow_list_keeps_it(etype):
    mk = Markers()
    cls = ev.EVENT_TYPES.get(etype)
    payload = mk.fill(msgspec.inspect.type_info(cls)) if cls else {"type": etype, "note": mk.string(), "n": 7_000_000_999}
    payload["type"] = etype
    payload["attrs"] = attrs(mk)
    run_id = mk.string()
    redactor = redact.Redactor(SALT)
    out = json.loads(redactor.line(line(run_id, etype, payload, mk)))
    kept = redact.KEPT.get(etype, {})

    # A value found unchanged at its own place must be one the allow-list keeps.
    for path, value in leaves(payload):
        if any(type(o) is type(value) and o == value for o in at(out["payload"], path)):
            assert path in kept or (path == "type" and cls is not None), (etype, path, value)
    # And no marker turns up anywhere else (a map's keys, a value moved): only the run id
    # (structure) and a fork's parent (a run id too) survive.
    text = json.dumps(out)
    survivors = {m for m in (f"mark{i:04d}zq" for i in range(1, next(mk.n))) if m in text}
    allowed = {run_id} | ({payload["parent"]} if etype == "run_forked" else set())
    assert survivors <= allowed, (etype, survivors - allowed)
    for n in (7_123_456_789, 7_000_000_999):
        assert str(n) not in text
    # An unknown event type keeps nothing of its own, not even its name.
    if cls is None:
        assert out["type"].startswith("[text~") and etype not in text


def test_the_allow_list_names_real_fields():
    """A typo in KEPT would keep nothing and hide the mistake: every path must exist."""
    for etype, paths in redact.KEPT.items():
        info = msgspec.inspect.type_info(ev.EVENT_TYPES[etype])
        for path in paths:
            t: Any = info
            for part in path.split("."):
                name = part.removesuffix("[]")
                (f,) = [f for f in t.fields if f.encode_name == name]
                t = f.type
                while isinstance(t, msgspec.inspect.UnionType):
                    t = next(x for x in t.types if not isinstance(x, msgspec.inspect.NoneType))
                if part.endswith("[]"):
                    t = t.item_type
            if isinstance(t, msgspec.inspect.StrType) and (etype, path) != ("run_forked", "parent"):
                # text is kept only from a known set (or a sha256), never as written
                assert not paths[path]("written by someone"), f"{etype}.{path} keeps free text"


def test_classifications_lists_every_classification_the_stall_reducer_gives():
    tree = ast.parse(Path(stall.__file__).read_text())
    given = {call.args[0].value for call in ast.walk(tree)
             if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Health"
             and call.args and isinstance(call.args[0], ast.Constant)}
    assert given and given == stall.CLASSIFICATIONS


# --- on a real ledger ------------------------------------------------------------------

def exported(lg: Ledger, runs: list[str] | None = None, **kw: Any) -> tuple[list[dict[str, Any]], str]:
    out = [json.loads(x) for x in lg.export_redacted(runs, salt=SALT, **kw)]
    return out, json.dumps(out)


def test_the_ledgers_own_sentences_carry_no_worker_or_watcher_name(tmp_path):
    """The watchdog writes "no heartbeat from WORKER (lease 1)" into recovery_decided and
    lease_revoked: names inside the ledger's own text must go with the text."""
    clock = Clock(step_us=0)
    with Ledger(str(tmp_path / "w.db"), clock=clock) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice", heartbeat_timeout_s=10)
        tok = lg.claim("r1", "bob.smith-laptop")
        lg.transition("r1", tok, "planning")
        clock.now += 11 * S
        acts = watch_once(lg, name="wd-1.build-host")
        assert [a.action for a in acts if a.outcome == "committed"] == ["revoke_lease"]
        assert "bob.smith-laptop" in json.dumps([json.loads(x) for x in lg.export(["r1"])])  # it was there
        events, text = exported(lg, ["r1"])
    for name in ("bob.smith-laptop", "smith", "build-host", "wd-1"):
        assert name not in text, name
    types = [e.get("type") for e in events[1:]]
    assert "recovery_decided" in types and "lease_revoked" in types
    decided = next(e for e in events[1:] if e["type"] == "recovery_decided")["payload"]
    assert decided["action"] == "revoke_lease" and decided["classification"] == "unavailable"


def test_a_fork_exported_alone_hides_what_its_parents_contract_names(tmp_path):
    """A fork's first event is run_forked, not the contract: the owner's patterns, which
    the fork inherits, still apply, to the parent's events it brings and to the run ids."""
    with Ledger(str(tmp_path / "f.db")) as lg:
        lg.open(run_id="ACME-7", goal="ship ACME-1234 to the client", target="chat:#ops", owner="alice",
                sanitize_patterns=(r"ACME-\d+",))
        tok = lg.claim("ACME-7", "w1")
        lg.transition("ACME-7", tok, "planning")
        lg.progress("ACME-7", tok, "plan_committed", "plan for ACME-1234")
        child = lg.fork("ACME-7", 3, new_run_id="ACME-7.retry", by="alice")
        assert "ACME-1234" in json.dumps([json.loads(x) for x in lg.export([child])])  # the parent's events come too
        events, text = exported(lg, [child])
    assert "ACME-" not in text and r"ACME-\\d+" not in text
    ids = {e["run_id"] for e in events[1:]}
    assert len(ids) == 2 and all(i.startswith("[run~") for i in ids)
    forked = next(e for e in events[1:] if e["type"] == "run_forked")
    assert forked["payload"]["parent"] in ids and forked["payload"]["parent"] != forked["run_id"]


def test_kinds_classifications_watchers_and_patterns_are_digested(tmp_path):
    art = tmp_path / "dump.txt"
    art.write_text("x\n")
    with Ledger(str(tmp_path / "k.db")) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice", sanitize_patterns=(r"\bproject-falcon\b",))
        tok = lg.claim("r1", "w1")
        lg.transition("r1", tok, "planning")
        lg.transition("r1", tok, "executing")
        lg.artifact("r1", tok, str(art), kind="customer-globex-dump")
        lg.evidence("r1", "globex-audit", "pass", lease=tok)
        lg.observe("r1", "stalled", 1, watcher="watch.globex-dc1")
        events, text = exported(lg, ["r1"])
    for hidden in ("globex", "falcon"):
        assert hidden not in text, hidden
    observed = [e["payload"]["classification"] for e in events[1:] if e["type"] == "watchdog_observed"]
    # A classification outside the fixed set cannot be recorded at all (decide refuses it);
    # one from the set stays readable. The schema walk above digests any other value.
    assert observed == ["stalled"]
    recorded = next(e for e in events[1:] if e["type"] == "artifact_recorded")["payload"]
    assert recorded["kind"].startswith("[text~") and recorded["bytes"] == 2 and len(recorded["sha256"]) == 64


def test_one_name_reads_the_same_wherever_it_appears(tmp_path):
    """A digest is stable across fields, so a reader can still follow who did what."""
    with Ledger(str(tmp_path / "n.db")) as lg:
        lg.open(run_id="r1", goal="g", target="chat:#ops", owner="alice")
        lg.claim("r1", "carol")
        events, _ = exported(lg, ["r1"])
    granted = next(e for e in events[1:] if e["type"] == "lease_granted")
    assert granted["actor"] == "worker:" + granted["payload"]["worker"]
