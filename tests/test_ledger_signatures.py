"""Every public method of ``Ledger`` keeps the signature recorded in a fixture.

``Ledger`` is assembled from parts in several modules (handoff/facade.py says which); a move
between them must not change what a caller writes. tests/fixtures/ledger_signatures.json
holds ``str(inspect.signature(...))`` of each public method and of ``__init__``, so a
signature that changes shows as a diff of that file, made on purpose:
``python -m tests.test_ledger_signatures`` writes it again from the code.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ledger_signatures.json"


def signatures() -> dict[str, str]:
    from handoff.facade import Ledger

    names = [n for n, v in inspect.getmembers(Ledger) if callable(v) and (not n.startswith("_") or n == "__init__")]
    return {n: str(inspect.signature(getattr(Ledger, n))) for n in sorted(names)}


def test_every_public_method_keeps_its_recorded_signature():
    assert signatures() == json.loads(FIXTURE.read_text())


def test_ledger_is_one_class_under_both_names():
    import handoff
    from handoff.facade import Ledger

    assert handoff.Ledger is Ledger


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(signatures(), indent=1) + "\n")
