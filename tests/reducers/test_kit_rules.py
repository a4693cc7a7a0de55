"""A user of handoff.testing chooses which built-in rules run, and how often their own do.

Before the groups existed, a subclass's two rules were drawn among 32 built-in ones, so
they ran in a few steps out of a hundred and could not be run alone.
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from handoff.testing import RULE_GROUPS, WATCHDOG, LedgerMachine
from handoff.reducers import commands as C

QUICK = settings(max_examples=20, stateful_step_count=20, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


def counting_machine(groups, weight: int = 1):
    """A user's machine with one rule of its own; returns (class, tally of calls)."""
    tally = {"mine": 0, "steps": 0, "accepted": set()}

    class Mine(LedgerMachine):
        builtin_rules = groups
        own_rule_weight = weight

        @rule(run=LedgerMachine.runs)
        def look_at_it(self, run: str) -> None:
            tally["mine"] += 1
            seq = self.model.runs[run].progress_seq
            self.issue(run, WATCHDOG, C.Observe(classification="healthy", progress_seq=seq))

        @invariant()
        def count_steps(self) -> None:
            tally["steps"] += 1
            tally["accepted"] |= set(self.accepted)

    return Mine, tally


def test_a_machine_with_only_its_own_rules_runs_them_at_every_step():
    machine, tally = counting_machine(())
    run_state_machine_as_test(machine, settings=QUICK)
    # every step but the checks after the two opening runs is the user's rule
    assert tally["mine"] >= 0.8 * tally["steps"] and tally["mine"] >= 100, tally
    assert tally["accepted"] <= {"open", "observe"}, "a built-in rule ran though none was chosen"


def test_weights_make_a_users_rule_common_among_built_in_ones():
    default, plain = counting_machine(LedgerMachine.builtin_rules)
    weighted, heavy = counting_machine({"lease": 1, "sensible": 1}, weight=10)
    # the user's rule is listed 10 times beside 6 built-in ones, 1 time beside 32 by default
    assert [r.function.__name__ for r in weighted.setup_state().rules].count("look_at_it") == 10
    run_state_machine_as_test(default, settings=QUICK)
    run_state_machine_as_test(weighted, settings=QUICK)
    # hypothesis also turns random subsets of rules off for a whole example (swarm testing),
    # so the shares are noisy (about 0.1-0.2 against 0.25-0.5): the bounds are wide on purpose
    share = {name: t["mine"] / t["steps"] for name, t in (("plain", plain), ("heavy", heavy))}
    assert share["plain"] < 0.3, plain
    assert share["heavy"] > share["plain"], (share, heavy)
    assert heavy["accepted"] & {"claim", "heartbeat", "transition"}, "the chosen groups did not run"


def rule_names(machine: type) -> list[str]:
    return sorted(r.function.__name__ for r in machine.setup_state().rules)


def test_groups_select_and_weight_the_built_in_rules():
    class LeaseTwice(LedgerMachine):
        builtin_rules = {"lease": 2, "watchdog": 0}

    assert rule_names(LeaseTwice) == sorted(2 * list(RULE_GROUPS["lease"]))

    class AlsoEnds(LeaseTwice):  # a subclass of a subclass chooses afresh
        builtin_rules = ("end",)

    assert rule_names(AlsoEnds) == sorted(RULE_GROUPS["end"])
    assert rule_names(LeaseTwice) == sorted(2 * list(RULE_GROUPS["lease"])), "the parent changed"


def test_a_rule_left_out_stays_callable_and_a_redefined_one_is_the_users():
    class Mine(LedgerMachine):
        builtin_rules = ()

        @rule(run=LedgerMachine.runs)
        def close(self, run: str) -> None:  # same name as a built-in rule: this one is the user's
            pass

    assert rule_names(Mine) == ["close"]
    assert inspect.isfunction(Mine.block) and inspect.isfunction(Mine.take_sensible_steps)
    m = Mine()
    try:
        run = m.first_run()
        m.block(run, whom="owner")  # a built-in rule, used as a method
        assert m.model.runs[run].state == "blocked"
    finally:
        m.teardown()


@pytest.mark.parametrize(("choice", "error", "words"), [
    (("lease", "nope"), ValueError, "no such group: nope"),
    ("lease", TypeError, "not the string 'lease'"),
    ({"lease": -1}, ValueError, "whole number of 0 or more"),
    ({"lease": True}, ValueError, "whole number of 0 or more"),
])
def test_a_wrong_choice_of_groups_is_refused_when_the_class_is_made(choice, error, words):
    with pytest.raises(error, match=words) as info:
        type("Bad", (LedgerMachine,), {"builtin_rules": choice})
    assert all(g in str(info.value) for g in RULE_GROUPS) or error is not ValueError or "group" not in words


def test_own_rule_weight_must_be_at_least_one():
    with pytest.raises(ValueError, match="own_rule_weight must be a whole number of 1 or more"):
        type("Bad", (LedgerMachine,), {"own_rule_weight": 0})


def test_every_built_in_rule_is_in_exactly_one_group():
    grouped = [name for names in RULE_GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped))
    assert sorted(grouped) == rule_names(LedgerMachine)
