"""Export scenarios: the readable SQLite copy, against the JSON Lines export of the same ledger.

The handoff-ledger side is ``Ledger.export_sqlite(path)`` into a new file: every event as
a row (summary, detail, payload as JSON), the lease, artifact and delivery rows they
start and end, the runs' packets, indexes and full-text search (handoff/sqlite_export.py).
The reference is ``Ledger.export_to(path)``, the JSON Lines export of the same events
that moves a ledger: the ratio says what the readable tables cost on top of reading and
writing each event once. The ledger is 100,500 events in 2,010 runs of 50 (a third each
live, delivered and cancelled), the size the issue names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import WORKER, path_in, run_events
from .harness import Ctx, Goal, Scenario, Side, Trial, register

AREA = "exports"
_ENDINGS = (None, "delivered", "cancelled")


def _ledger(d: Path, params: dict[str, Any]) -> dict[str, Any]:
    from handoff.facade import Ledger

    path = path_in(d, "ledger.db")
    runs, per_run = params["runs"], params["per_run"]
    with Ledger(path, create=True, synchronous="NORMAL") as lg:
        for r in range(runs):
            rid = f"run-{r:05d}"
            lg.store.append(rid, run_events(per_run, _ENDINGS[r % 3], f"r{r} "), actor=WORKER, expected_seq=0)
    return {"ledger": path, "events": runs * per_run}


def _side(export: str):
    def prepare(ctx: Ctx) -> Trial:
        from handoff.facade import Ledger

        lg = Ledger(ctx.fixture["ledger"])
        out = path_in(ctx.dir, "copy")
        got: list[Any] = []

        def run() -> None:
            got.append(getattr(lg, export)(out))

        def check() -> None:
            n = got[-1]["events"] if export == "export_sqlite" else sum(1 for _ in open(out, "rb"))
            if n != ctx.fixture["events"]:
                raise RuntimeError(f"{export} wrote {n} events of {ctx.fixture['events']}")

        return Trial(run, check, lg.close)

    return prepare


register(
    Scenario(
        name="export-sqlite",
        area=AREA,
        title="a readable SQLite copy of a 100,500-event ledger, against its JSON Lines export",
        measures=(
            "Ledger.export_sqlite(path) into a new file, of a ledger of 2,010 runs x 50 events "
            "(quick: 201 runs): event rows with summary, detail and JSON payload, lease, artifact "
            "and delivery rows, the runs' packets, five indexes and two full-text indexes. "
            "Reference: Ledger.export_to(path), the JSON Lines export of the same events. Events "
            "per second of the whole export."
        ),
        full={"n": 100_500, "runs": 2_010, "per_run": 50},
        quick={"n": 10_050, "runs": 201, "per_run": 50},
        subject=Side("handoff-ledger", _side("export_sqlite"), note="Ledger.export_sqlite(path), a new copy"),
        reference=Side("JSON Lines export", _side("export_to"), note="Ledger.export_to(path)"),
        goals=(Goal("within 10x of the JSON Lines export (>= 0.10x)", min_ratio=0.1),),
        fixture=_ledger,
        fixture_key="export-ledger",
        repeat=2,
        warmup=0,
    )
)
