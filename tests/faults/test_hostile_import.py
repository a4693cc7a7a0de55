"""Hostile export files: each refused with exit 2 and a sentence, the ledger untouched;
and memory that stays flat in the size of the file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger import jsonl
from handoff.ledger.store import GENESIS_HASH, Recorded, chain_hash

from .conftest import ROOT, child_env
from .test_hostile import invoke, no_traceback, snapshot, template, world  # noqa: F401 (fixtures)

T0 = 1_700_000_000_000_000


def line(run: str, seq: int, prev: bytes, event: ev.Event | bytes, *, actor: str = "owner:a",
         lease: int | None = None, key: str | None = None, at: int = T0) -> tuple[bytes, bytes]:
    payload = event if isinstance(event, bytes) else ev.encode(event)
    tag = ev.decode(payload).__struct_config__.tag if not isinstance(event, bytes) else "handoff_opened"
    h = chain_hash(prev, run, seq, tag, actor, lease, key, at, ev.SCHEMA_VERSION, payload)
    rec = Recorded(run, seq, 0, tag, actor, lease, key, at, ev.SCHEMA_VERSION, payload, prev, h)
    return jsonl.to_line(rec) + b"\n", h


OPEN = ev.HandoffOpened(goal="g", target="t", owner="a")


def _files(tmp) -> dict[str, bytes]:
    deep = b'{"run_id": "r1", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    big, _ = line("r1", 1, GENESIS_HASH, ev.HandoffOpened(goal="x" * 30_000_000, target="t", owner="a"))
    late, _ = line("r1", 1, GENESIS_HASH, OPEN, at=253_402_300_800_000_000)
    first, h1 = line("r1", 1, GENESIS_HASH, OPEN, key="k")
    second, _ = line("r1", 2, h1, ev.AuthorityTransferred(action="close", to="b"), key="k")
    dup_json, _ = line("r1", 1, GENESIS_HASH, b'{"type":"handoff_opened","goal":"g","goal":"evil","target":"t","owner":"a"}')
    return {"nested 100,000 deep": deep, "a 30 MB field": big, "a year-10000 time": late,
            "an idempotency key twice": first + second, "a key twice in the payload": dup_json}


@pytest.mark.parametrize("case", ["nested 100,000 deep", "a 30 MB field", "a year-10000 time",
                                  "an idempotency key twice", "a key twice in the payload"])
def test_hostile_import_files_are_malformed_input(world, tmp_path, case, evidence):
    path = tmp_path / "x.jsonl"
    path.write_bytes(_files(tmp_path)[case])
    before = snapshot(world["db"])
    res = invoke(["--db", world["db"], "import", str(path)])
    no_traceback(res)
    assert res.exit_code == 2, res.output + res.stderr
    assert snapshot(world["db"]) == before
    fresh = str(tmp_path / "fresh.db")
    assert invoke(["--db", fresh, "import", str(path)]).exit_code == 2 and not os.path.exists(fresh)
    evidence.add("hostile.import", case=case, exit=2, error=res.stderr.strip()[:160])


def test_one_payload_limit_for_both_paths(tmp_path):
    with Ledger(str(tmp_path / "a.db")) as lg:
        limit = lg.store.max_payload
    data, _ = line("r1", 1, GENESIS_HASH, ev.HandoffOpened(goal="x" * limit, target="t", owner="a"))
    with Ledger(str(tmp_path / "b.db")) as lg:
        with pytest.raises(Exception) as err:
            lg.import_lines([data])
    assert type(err.value).__name__ == "PayloadTooLarge" and str(limit) in err.value.message


def test_status_prints_a_time_outside_the_printable_years(tmp_path):
    """A time that got in by other means (here the store's own clock) must not crash status."""
    db = str(tmp_path / "l.db")
    with Ledger(db, clock=lambda: 253_402_300_800_000_123) as lg:
        lg.open(run_id="r1", goal="g", target="t", owner="a")
    res = invoke(["--db", db, "status", "r1", "--json"])
    no_traceback(res)
    assert res.exit_code == 0 and "us-since-1970" in res.stdout


_MEASURE = """
import sys
from handoff import cli
try:
    cli.main(["--db", sys.argv[1], "import", sys.argv[2]])
except SystemExit as exc:
    assert not exc.code, exc.code
print(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM")))
"""


def _peak_rss_kb(db: str, path: str) -> int:
    """The import's own peak RSS (VmHWM, which exec resets, unlike ru_maxrss)."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, db, path], env=child_env(), cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _export(path: str, mb: float) -> None:
    """Runs of open, claim, planning, then notes: valid history, about ``mb`` MB."""
    size, r, t = 0, 0, T0
    with open(path, "wb") as f:
        while size < mb * 1_000_000:
            r += 1
            prev, run = GENESIS_HASH, f"run-{r}"
            steps = [("owner:a", None, ev.HandoffOpened(goal="g", target="t", owner="a",
                                                        policy=ev.Policy(owner_cap=100_000))),
                     ("worker:w1", None, ev.LeaseGranted(worker="w1", lease=1)),
                     ("worker:w1", 1, ev.StateChanged(from_state="queued", to_state="planning"))]
            steps += [("worker:w1", 1, ev.ProgressRecorded(kind="note", detail="x" * 200, advances=False))] * 200
            for seq, (actor, lease, e) in enumerate(steps, 1):
                t += 1000
                data, prev = line(run, seq, prev, e, actor=actor, lease=lease, at=t)
                f.write(data)
                size += len(data)


def test_memory_stays_flat_in_the_size_of_the_file(tmp_path, evidence):
    small, large = str(tmp_path / "small.jsonl"), str(tmp_path / "large.jsonl")
    _export(small, 4)
    _export(large, 16)
    a = _peak_rss_kb(str(tmp_path / "a.db"), small)
    b = _peak_rss_kb(str(tmp_path / "b.db"), large)
    evidence.add("hostile.import", case="peak RSS of an import", small_mb=4, large_mb=16, small_kb=a, large_kb=b)
    assert b - a < 6_000, (a, b)  # 12 MB more file; before streaming this grew by ~15 MB
