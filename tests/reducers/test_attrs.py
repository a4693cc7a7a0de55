"""A worker's attributes on its records, and the progress kinds a contract declares.

Through a real ledger file: every verb that takes ``attrs`` stores them; every map past
the bounds is refused with InvalidInput naming the key and the log unchanged; an imported
history holding such a map is refused the same way. Declared kinds count only in their
state, are fixed at open, and an unknown kind's refusal names the run's own kinds.
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import Ledger
from handoff.ledger import errors as E
from handoff.ledger import events as ev
from handoff.ledger import inputs
from handoff.ledger.inputs import CONTROL_RE
from handoff.reducers import transitions as T
from tests.support import Clock

from .helpers import OPERATOR, OWNER, bring, log, new_ledger, refused

ATTRS = {"model": "claude-sonnet", "gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 310,
         "cost_usd": 0.0123, "tool": "pytest", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
         "span_id": "00f067aa0ba902b7", "cached": False}


def _last(lg: Ledger, run_id: str) -> ev.Event:
    return list(lg.log(run_id))[-1].event


# --- every verb stores them ------------------------------------------------------------


def test_every_verb_that_takes_attrs_stores_them(tmp_path):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.EXECUTING)
    kw = dict(worker=run.worker, attrs=ATTRS)
    lg.heartbeat(run.id, run.lease, **kw)
    assert ev.attrs_of(_last(lg, run.id)) == ATTRS
    lg.progress(run.id, run.lease, "tool_outcome", "ran", **kw)
    assert ev.attrs_of(_last(lg, run.id)) == ATTRS
    lg.artifact(run.id, run.lease, run.result, **kw)
    assert ev.attrs_of(_last(lg, run.id)) == ATTRS
    lg.evidence(run.id, "tests", "pass", lease=run.lease, attrs=ATTRS)
    assert ev.attrs_of(_last(lg, run.id)) == ATTRS
    lg.effect_start(run.id, run.lease, "deploy-1", "deploy v1", **kw)
    assert ev.attrs_of(_last(lg, run.id)) == ATTRS
    lg.effect_confirm(run.id, "deploy-1", "done", lease=run.lease, attrs={"receipt_ms": 41})
    last = _last(lg, run.id)
    assert isinstance(last, ev.SideEffectConfirmed) and ev.attrs_of(last) == {"receipt_ms": 41}
    # A reconciliation (the starting worker is gone) carries them too.
    lg.effect_start(run.id, run.lease, "deploy-2", "deploy v2", worker=run.worker)
    lg.revoke(run.id, "replaced", actor=OWNER)
    lg.effect_confirm(run.id, "deploy-2", "absent", note="not live", actor=OPERATOR, attrs={"checked": True})
    rec = next(r for r in lg.log(run.id) if r.type == "reconciliation_recorded")
    assert ev.attrs_of(rec.event) == {"checked": True}


def test_no_attrs_writes_the_event_as_before(tmp_path):
    clock = Clock(step_us=0)
    lg = Ledger(os.path.join(str(tmp_path), "ledger.db"), synchronous="NORMAL", clock=clock)
    run = bring(lg, tmp_path, T.EXECUTING)
    granted = clock()  # the claim's grant: the lease's liveness starts there
    lg.progress(run.id, run.lease, "tool_outcome", worker=run.worker, attrs={})
    clock.advance(31)  # a silence longer than half the 60 s timeout: the beat is logged
    assert lg.heartbeat(run.id, run.lease, worker=run.worker).result.outcome == "committed"
    payloads = [r.payload for r in lg.log(run.id)][-2:]
    # No attrs key on either; a logged beat carries only its count and the beat before it.
    assert payloads == [b'{"type":"progress_recorded","kind":"tool_outcome","detail":"","advances":true}',
                        b'{"type":"heartbeat_recorded","beats":1,"previous_us":%d}' % granted]


# --- the bounds ----------------------------------------------------------------------------

BAD = {
    "too many entries": ({f"k{i}": i for i in range(inputs.MAX_ATTRS + 1)}, "over the limit"),
    "a key with a space": ({"bad key": 1}, "bad key"),
    "an empty key": ({"": 1}, "''"),
    "a key too long": ({"k" * (inputs.MAX_ATTR_KEY + 1): 1}, "k" * 20),
    "a key that is not text": ({7: 1}, "7"),
    "text too long": ({"note": "x" * (inputs.MAX_ATTR_TEXT + 1)}, "attrs[note]"),
    "a control character": ({"note": "a\x1bb"}, "attrs[note]"),
    "a NUL": ({"note": "a\x00b"}, "attrs[note]"),
    "a lone surrogate": ({"note": "a\udcffb"}, "attrs[note]"),
    "NaN": ({"cost": math.nan}, "attrs[cost]"),
    "infinity": ({"cost": -math.inf}, "attrs[cost]"),
    "an integer above 64 bits": ({"tokens": 2**63}, "attrs[tokens]"),
    "an integer below 64 bits": ({"tokens": -(2**63) - 1}, "attrs[tokens]"),
    "a nested map": ({"usage": {"in": 1}}, "attrs[usage]"),
    "a list": ({"tools": ["a", "b"]}, "attrs[tools]"),
    "None as a value": ({"model": None}, "attrs[model]"),
    "not a map": ([("model", "x")], "map"),
}


@pytest.mark.parametrize("bad, named", list(BAD.values()), ids=list(BAD))
def test_attrs_past_the_bounds_are_refused_naming_the_key(tmp_path, bad, named):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.EXECUTING)
    for call in (
        lambda: lg.progress(run.id, run.lease, "tool_outcome", worker=run.worker, attrs=bad),
        lambda: lg.heartbeat(run.id, run.lease, worker=run.worker, attrs=bad),
        lambda: lg.artifact(run.id, run.lease, run.result, worker=run.worker, attrs=bad),
        lambda: lg.evidence(run.id, "tests", "pass", lease=run.lease, attrs=bad),
        lambda: lg.effect_start(run.id, run.lease, "e1", "x", worker=run.worker, attrs=bad),
        lambda: lg.effect_confirm(run.id, "e1", "done", actor=OPERATOR, attrs=bad),
    ):
        exc = refused(lg, E.InvalidInput, call, named)
        assert exc.field.startswith("attrs")


def test_the_bounds_themselves_are_accepted(tmp_path):
    lg = new_ledger(tmp_path)
    run = bring(lg, tmp_path, T.EXECUTING)
    edge = {f"k{i}": i for i in range(inputs.MAX_ATTRS - 6)}
    edge.update({"k" * inputs.MAX_ATTR_KEY: "x" * inputs.MAX_ATTR_TEXT, "big": 2**63 - 1, "small": -(2**63),
                 "tiny": 5e-324, "multi": "line one\n\tline two", "dotted.name:with-all_chars": True})
    assert len(edge) == inputs.MAX_ATTRS
    lg.progress(run.id, run.lease, "tool_outcome", worker=run.worker, attrs=edge)
    assert ev.attrs_of(_last(lg, run.id)) == edge


# --- declared progress kinds -----------------------------------------------------------------


def _declared(lg: Ledger, tmp_path, kinds: dict, *, run_id: str = "d1") -> tuple[str, str]:
    lg.open(goal="g", target="chat:#ops", owner="alice", run_id=run_id, progress_kinds=kinds)
    lease = lg.claim(run_id, "w1")
    lg.transition(run_id, lease, "planning")
    return run_id, lease


def test_a_declared_kind_counts_in_its_state_only(tmp_path):
    lg = new_ledger(tmp_path)
    run, lease = _declared(lg, tmp_path, {"executing": ["llm_step"]})
    assert lg.checkpoint(run).progress_kinds == {"executing": ("llm_step",)}
    refused(lg, E.IllegalProgress, lambda: lg.progress(run, lease, "llm_step"), "progress in executing", "planning")
    lg.transition(run, lease, "executing")
    before = lg.checkpoint(run).progress_seq
    out = lg.progress(run, lease, "llm_step", attrs={"model": "m"})
    assert out.checkpoint.progress_seq == before + 1
    assert _last(lg, run) == ev.ProgressRecorded(kind="llm_step", advances=True, attrs={"model": "m"})


def test_an_unknown_kind_is_refused_with_the_run_s_own_kinds(tmp_path):
    lg = new_ledger(tmp_path)
    run, lease = _declared(lg, tmp_path, {"executing": ["llm_step", "judge_scored"]})
    lg.transition(run, lease, "executing")
    exc = refused(lg, E.InvalidInput, lambda: lg.progress(run, lease, "did_stuff"),
                  "unknown progress kind 'did_stuff'", "tool_outcome", "llm_step", "judge_scored", "--progress-kind")
    assert exc.field == "kind"
    # Another run without declarations does not accept this run's kinds.
    other = bring(lg, tmp_path, T.EXECUTING, run_id="plain")
    exc = refused(lg, E.InvalidInput, lambda: lg.progress(other.id, other.lease, "llm_step", worker="w1"),
                  "unknown progress kind 'llm_step'", "tool_outcome")
    assert "judge_scored" not in exc.message


DECLARATIONS = {
    "a state that is not a working state": ({"blocked": ["waiting_on_human"]}, "not a working state"),
    "an unknown state": ({"flying": ["x"]}, "not a working state"),
    "noise declared as progress": ({"executing": ["note"]}, "never counts"),
    "a built-in kind of another state": ({"executing": ["plan_committed"]}, "built-in"),
    "a name with capitals": ({"executing": ["LLMStep"]}, "kind name"),
    "a name too long": ({"executing": ["k" * 65]}, "kind name"),
    "a bare string instead of a list": ({"executing": "llm_step"}, "list"),
    "too many": ({"executing": [f"k{i}" for i in range(T.MAX_DECLARED_KINDS + 1)]}, "over the limit"),
    "not a map": (["executing:llm_step"], "map"),
}


@pytest.mark.parametrize("kinds, words", list(DECLARATIONS.values()), ids=list(DECLARATIONS))
def test_bad_declarations_are_refused_at_open(tmp_path, kinds, words):
    lg = new_ledger(tmp_path)
    exc = refused(lg, E.InvalidInput, lambda: lg.open(goal="g", target="t", owner="alice", run_id="d1",
                                                       progress_kinds=kinds), words)
    assert exc.field == "progress_kinds"
    assert lg.store.head("d1") is None
    # The contract file meets the same rule, with the field named.
    exc = refused(lg, E.InvalidInput, lambda: lg.open_contract({"goal": "g", "target": "t", "owner": "alice",
                                                                 "run_id": "d1", "progress_kinds": kinds}),
                  "progress_kinds")


def test_declarations_are_stored_in_lifecycle_order_once_each(tmp_path):
    lg = new_ledger(tmp_path)
    lg.open(goal="g", target="t", owner="alice", run_id="d1",
            progress_kinds={"verifying": ["judge"], "planning": ["sketch", "sketch"], "executing": []})
    opened = _last(lg, "d1")
    assert opened.progress_kinds == {"planning": ("sketch",), "verifying": ("judge",)}
    assert list(lg.log("d1"))[0].payload.endswith(b',"progress_kinds":{"planning":["sketch"],"verifying":["judge"]}}')


def test_a_fork_keeps_its_parent_s_kinds(tmp_path):
    lg = new_ledger(tmp_path)
    run, lease = _declared(lg, tmp_path, {"executing": ["llm_step"]})
    lg.transition(run, lease, "executing")
    child = lg.fork(run, lg.checkpoint(run).last_seq, new_run_id="child", by="alice")
    assert lg.checkpoint(child).progress_kinds == {"executing": ("llm_step",)}
    lease2 = lg.claim(child, "w2")
    lg.progress(child, lease2, "llm_step", worker="w2")
    assert _last(lg, child).advances is True


# --- imports meet the same rules -----------------------------------------------------------


def _forge_with(event: ev.Event) -> list[bytes]:
    from tests.ledger.test_import_rules import CLAIM, OPEN, forge, to

    return forge("forged", [OPEN, CLAIM, to("queued", "planning"), to("planning", "executing"),
                            ("worker:w1", 1, event)])


@pytest.mark.parametrize("attrs", [{"bad key": 1}, {"n": 2**63}, {"note": "x" * (inputs.MAX_ATTR_TEXT + 1)},
                                   {f"k{i}": i for i in range(inputs.MAX_ATTRS + 1)}, {"note": "a\x07"}],
                         ids=["key", "int64", "long text", "count", "control"])
def test_an_imported_event_with_a_bad_map_is_refused(tmp_path, attrs):
    lg = new_ledger(tmp_path)
    lg.open(goal="here", target="t", owner="bob", run_id="keep")
    bad = ev.ProgressRecorded(kind="tool_outcome", attrs=attrs)
    exc = refused(lg, E.InvalidInput, lambda: lg.import_lines(_forge_with(bad)), "line 5", "attrs")
    assert lg.store.head("forged") is None
    good = ev.ProgressRecorded(kind="tool_outcome", attrs={"model": "m"})
    assert lg.import_lines(_forge_with(good))["imported"] == 5
    assert exc.field


def test_an_imported_empty_map_is_not_the_form_the_rules_write(tmp_path):
    # {} and "absent" mean the same; only the absent form is written, so only it is admitted.
    lg = new_ledger(tmp_path)
    lines = _forge_with(ev.ProgressRecorded(kind="tool_outcome", attrs={}))
    refused(lg, E.HistoryRefused, lambda: lg.import_lines(lines), "line 5")


def test_an_imported_undeclared_kind_is_refused(tmp_path):
    lg = new_ledger(tmp_path)
    refused(lg, E.InvalidInput, lambda: lg.import_lines(_forge_with(ev.ProgressRecorded(kind="llm_step"))),
            "line 5", "unknown progress kind")


# --- property: within bounds round-trips, past them writes nothing ---------------------------

_KEY = st.from_regex(inputs.ATTR_KEY, fullmatch=True)
# Any text the ledger accepts: no surrogate, none of its one set of control characters.
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)).filter(lambda c: not CONTROL_RE.match(c)),
                max_size=40)
_VALUE = st.one_of(_TEXT, st.booleans(), st.integers(-(2**63), 2**63 - 1),
                   st.floats(allow_nan=False, allow_infinity=False))
GOOD_MAPS = st.dictionaries(_KEY, _VALUE, max_size=inputs.MAX_ATTRS)
BAD_MAPS = st.one_of(
    st.dictionaries(_KEY, _VALUE, min_size=inputs.MAX_ATTRS + 1, max_size=inputs.MAX_ATTRS + 4),
    st.builds(lambda m, k, v: {**m, k: v}, GOOD_MAPS.map(lambda m: dict(list(m.items())[:5])),
              st.text(max_size=3).filter(lambda k: not inputs.ATTR_KEY.fullmatch(k)), _VALUE),
    st.builds(lambda m, v: {**m, "bad": v}, GOOD_MAPS.map(lambda m: dict(list(m.items())[:5])),
              st.one_of(st.just(math.nan), st.just(math.inf), st.integers(min_value=2**63, max_value=2**70),
                        st.text(min_size=1, max_size=3).map(lambda t: t + "\x01"), st.lists(st.integers()))),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(maps=st.lists(GOOD_MAPS, min_size=1, max_size=4), bad=BAD_MAPS)
def test_maps_within_bounds_round_trip_and_others_write_nothing(tmp_path_factory, maps, bad):
    tmp = tmp_path_factory.mktemp("prop")
    with Ledger(os.path.join(tmp, "a.db"), synchronous="NORMAL") as lg:
        run = bring(lg, tmp, T.EXECUTING)
        for m in maps:
            lg.progress(run.id, run.lease, "tool_outcome", worker=run.worker, attrs=m)
        before = log(lg)
        with pytest.raises(E.InvalidInput):
            lg.heartbeat(run.id, run.lease, worker=run.worker, attrs=bad)
        assert log(lg) == before
        stored = [ev.attrs_of(r.event) for r in lg.log(run.id) if r.type == "progress_recorded"]
        assert stored == [m for m in maps]
        exported = list(lg.export())
    with Ledger(os.path.join(tmp, "b.db"), synchronous="NORMAL") as other:
        other.import_lines(exported)
        assert list(other.export()) == exported
        again = [ev.attrs_of(r.event) for r in other.log(run.id) if r.type == "progress_recorded"]
        assert again == stored
        for m, got in zip(maps, again):  # the same types, not only equal values (True == 1)
            assert [type(v) for v in got.values()] == [type(v) for v in m.values()]


def test_attrs_and_declared_kinds_on_every_backend(backend):
    # The same bytes on every backend: PostgreSQL stores the payload as written, and its
    # export imports into a SQLite file unchanged.
    with Ledger(backend.address()) as lg:
        lg.open(goal="g", target="chat:#ops", owner="alice", run_id="b1", progress_kinds={"executing": ["llm_step"]})
        lease = lg.claim("b1", "w1")
        lg.transition("b1", lease, "planning")
        lg.transition("b1", lease, "executing")
        lg.progress("b1", lease, "llm_step", attrs=ATTRS)
        before = log(lg)
        refused(lg, E.InvalidInput, lambda: lg.progress("b1", lease, "llm_step", attrs={"x": math.inf}), "attrs[x]")
        refused(lg, E.InvalidInput, lambda: lg.progress("b1", lease, "other_step"), "llm_step")
        assert log(lg) == before
        last = list(lg.log("b1"))[-1]
        assert ev.attrs_of(last.event) == ATTRS and last.event.advances is True
        assert lg.checkpoint("b1").progress_kinds == {"executing": ("llm_step",)}
        exported = list(lg.export())
    with Ledger(os.path.join(str(backend.tmp_path), "copy.db")) as copy:
        copy.import_lines(exported)
        assert [r.payload for r in copy.log("b1")] == [r.payload for r in before if r.run_id == "b1"]
