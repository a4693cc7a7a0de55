"""The web view's actions against the table of operations: each action names a row, its
fields are that row's parameters, the server fills only who acts, and every parameter the
row requires is asked for or filled. An action the table does not know cannot exist."""

from __future__ import annotations

import inspect

from handoff import Ledger
from handoff.operations import BY_NAME
from handoff.reducers.authority import RULES
from handoff.serve import actions as act


def test_each_action_is_a_row_and_its_fields_are_the_rows_parameters() -> None:
    assert {a.id for a in act.ACTIONS} == {"revoke", "pause", "unblock", "close", "approve", "reject"}
    for a in act.ACTIONS:
        row = BY_NAME[a.verb]  # a KeyError here: an action naming no row
        params = {p.name for p in row.params}
        fields = {f.name for f in a.fields}
        filled = {k for k, _ in a.fill}
        assert fields <= params, (a.id, fields - params)
        assert filled <= params, (a.id, filled - params)
        assert act.SERVER_FILLS & fields == set(), a.id
        required = {p.name for p in row.params if p.required}
        assert required <= fields | filled | act.SERVER_FILLS, (a.id, required - fields - filled - act.SERVER_FILLS)
        for f in a.fields:
            if f.kind == "choice":
                assert f.choices == row.param(f.name).choices, (a.id, f.name)
        # Who acts is a person the row's authority rule admits by name: by=, never a lease.
        assert "by" in params and row.caller in ("person", "owner", "lease_or_person"), a.id
        assert row.command in RULES, a.id
        # The Ledger method of the row takes exactly these keywords.
        sig = inspect.signature(getattr(Ledger, a.verb))
        assert (fields | filled | {"by"}) <= set(sig.parameters), a.id


def test_as_operator_only_where_the_row_has_it() -> None:
    for a in act.ACTIONS:
        if dict(a.fill).get("as_operator"):
            assert "as_operator" in {p.name for p in a.row.params}
