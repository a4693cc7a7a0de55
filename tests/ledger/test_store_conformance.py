"""The store conformance suite (tests/ledger/conformance.py) on every backend in
tests/backends.py, and a check that it exercises the whole interface in ledger/store.py.

The check reads the suite's source: every public name of ``EventStore`` must be used
(called or read) on a store by some ``test_*`` method, and every public name of
``Transaction`` on a transaction handle (a name bound by ``with store.write_transaction(...)
as txn`` / ``read_transaction()``, or the first parameter of a hook passed to ``attach``).
A name added to the interface without a test fails here until the suite uses it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from handoff.ledger.store import EventStore, Transaction
from tests.ledger import conformance
from tests.ledger.conformance import StoreConformance


class TestStoreConformance(StoreConformance):
    """Runs once per entry of tests/backends.py (the ``backend`` fixture)."""


def public_names(cls: type) -> set[str]:
    """Every public method, property and attribute a class defines or inherits from the interface."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ not in ("ledger.store",) and klass is not cls:
            continue
        names.update(n for n in vars(klass) if not n.startswith("_"))
    return names


TXN_OPENERS = {"write_transaction", "read_transaction"}


def uses(source: str, suite: str = "StoreConformance") -> tuple[set[str], set[str]]:
    """(names used on stores, names used on transactions) by the suite's ``test_*`` methods."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == suite)
    on_store: set[str] = set()
    on_txn: set[str] = set()
    for fn in cls.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")):
            continue
        txn_names = _transaction_names(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute):
                base = node.value
                if isinstance(base, ast.Name) and base.id in txn_names:
                    on_txn.add(node.attr)
                else:
                    on_store.add(node.attr)
    return on_store, on_txn


def _transaction_names(fn: ast.FunctionDef) -> set[str]:
    names: set[str] = set()
    hooks: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr in TXN_OPENERS and isinstance(item.optional_vars, ast.Name)):
                    names.add(item.optional_vars.id)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "attach"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Name)):
            hooks.add(node.args[1].id)
    for node in ast.walk(fn):
        if isinstance(node, ast.FunctionDef) and node.name in hooks and node.args.args:
            names.add(node.args.args[0].arg)
    return names


SUITE = Path(inspect.getfile(conformance)).read_text()


def test_the_suite_exercises_every_public_name_of_the_store_interface():
    on_store, _ = uses(SUITE)
    missing = sorted(public_names(EventStore) - on_store)
    assert missing == [], (
        f"EventStore's {missing} are used by no test in tests/ledger/conformance.py: add a test "
        "there that calls each on a store, so every backend proves it")


def test_the_suite_exercises_every_public_name_of_a_transaction():
    _, on_txn = uses(SUITE)
    missing = sorted(public_names(Transaction) - on_txn)
    assert missing == [], (
        f"Transaction's {missing} are used by no test in tests/ledger/conformance.py on a "
        "transaction handle (with store.write_transaction(...) as txn, or an attach hook's txn)")


def test_the_check_would_notice_a_name_without_a_test():
    class Wider(EventStore):
        def frobnicate(self) -> None: ...

    on_store, on_txn = uses(SUITE)
    assert public_names(Wider) - on_store == {"frobnicate"}
    assert "append" in public_names(EventStore) and "state" in public_names(Transaction)
    # A name used only on a store does not count for the transaction, nor the reverse.
    toy = (
        "class StoreConformance:\n"
        "    def test_a(self, store):\n"
        "        store.runs_since(0)\n"
        "        with store.read_transaction() as txn:\n"
        "            txn.append('r', [])\n"
        "    def helper(self, store):\n"
        "        store.verify()\n"
    )
    s, t = uses(toy)
    assert "runs_since" in s and "runs_since" not in t
    assert "append" in t and "append" not in s
    assert "verify" not in s  # helpers do not count: a test must use the name itself
