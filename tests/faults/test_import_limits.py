"""Endless and oversized input: refused with exit 2 while memory stays flat, the ledger untouched.

An import file, an import from stdin and a contract file are read in bounded chunks: a
line (or a contract) longer than anything the ledger could accept is refused as soon as
that is certain, naming the line and the limit, instead of being read whole into memory.
Every child here runs under an address-space limit, so a regression fails the test with
a MemoryError instead of taking the machine's memory (``handoff import /dev/zero`` grew
to 23.5 GB before it was killed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import pytest

from handoff import Ledger
from handoff.ledger import events as ev
from handoff.ledger import jsonl
from handoff.ledger.errors import InvalidInput
from handoff.ledger.store import DEFAULT_MAX_PAYLOAD, GENESIS_HASH, Recorded

from .conftest import ROOT, child_env
from .test_hostile import snapshot
from .test_hostile_import import line
from tests.support import executable

#: What a child may map at most: far above a healthy import (about 40 MB), far below
#: what the old code reached on an endless line.
ADDRESS_SPACE = 1 << 30
#: The bound on the importing process's peak RSS (the old code peaked at 422 MB here).
RSS_BOUND_KB = 150_000
STREAM_BYTES = 200_000_000
#: A ceiling for a child that must refuse early; only a hang reaches it.
DEADLINE_S = 300

#: Runs ``handoff ARGS`` with stdin fed ``STREAM_BYTES`` zeros through a pipe (never a
#: file on disk), and prints its exit code, stderr and peak RSS. A wrapper process of
#: its own, because RUSAGE_CHILDREN is the maximum over every child ever waited for: in
#: pytest's process it would include other tests' children.
_FEED = r"""
import json, resource, subprocess, sys
total, args = int(sys.argv[1]), sys.argv[2:]
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     preexec_fn=cap)
chunk, sent = b"\0" * (1 << 20), 0
try:
    while sent < total:
        p.stdin.write(chunk[: total - sent])
        sent += min(len(chunk), total - sent)
    p.stdin.close()
except BrokenPipeError:  # the child stopped reading: what a refusal looks like from here
    pass
try:
    p.stdin.close()
except BrokenPipeError:
    pass
p.stdin = None
out, err = p.communicate()
print(json.dumps({"rc": p.returncode, "sent": sent, "stderr": err.decode("utf-8", "replace"),
                  "stdout": out.decode("utf-8", "replace"),
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""".replace("ADDRESS_SPACE", str(ADDRESS_SPACE))


def _fed_zeros(*args: str, db: str, total: int = STREAM_BYTES) -> dict:
    done = subprocess.run([sys.executable, "-c", _FEED, str(total), *executable(), *args],
                          env=child_env(HANDOFF_DB=db), cwd=ROOT, capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _capped(*args: str, db: str, stdin: object = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """``handoff ARGS`` under the address-space limit."""
    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    return subprocess.run([*executable(), *args], env=child_env(HANDOFF_DB=db), cwd=ROOT, stdin=stdin,
                          capture_output=True, text=True, errors="replace", timeout=DEADLINE_S, preexec_fn=cap)


@pytest.fixture
def ledger_with_a_run(tmp_path) -> str:
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        lg.open(run_id="r1", goal="g", target="t", owner="a")
    return db


def _limit() -> int:
    return jsonl.line_limit(DEFAULT_MAX_PAYLOAD)


def test_a_200_mb_stream_of_zeros_is_refused_with_flat_memory(ledger_with_a_run, evidence):
    db = ledger_with_a_run
    before = snapshot(db)
    got = _fed_zeros("import", "-", db=db)
    evidence.add("import.limits", case="200 MB of zeros on stdin", **{k: got[k] for k in ("rc", "sent", "maxrss_kb")},
                 error=got["stderr"].strip()[:200])
    assert got["rc"] == 2, got
    assert "Traceback" not in got["stderr"]
    assert "line 1" in got["stderr"] and f"{_limit():,}" in got["stderr"], got["stderr"]
    assert got["maxrss_kb"] < RSS_BOUND_KB, got
    assert snapshot(db) == before


def test_import_of_dev_zero_is_refused(tmp_path, ledger_with_a_run, evidence):
    fresh = str(tmp_path / "fresh.db")
    for db in (ledger_with_a_run, fresh):
        before = snapshot(db)
        res = _capped("import", "/dev/zero", db=db)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        assert "line 1" in res.stderr and f"{_limit():,}" in res.stderr, res.stderr
        assert snapshot(db) == before
    assert sorted(os.listdir(tmp_path)) == ["l.db"]  # the fresh ledger's private file is gone too
    evidence.add("import.limits", case="import /dev/zero", exit=2, error=res.stderr.strip()[:200])


def test_a_long_line_after_good_ones_is_refused_by_its_number(tmp_path, ledger_with_a_run):
    """The refusal names the line the reader was on, after lines that were fine."""
    first, h1 = line("r2", 1, GENESIS_HASH, ev.HandoffOpened(goal="g", target="t", owner="a"))
    src = tmp_path / "x.jsonl"
    with open(src, "wb") as f:
        f.write(first + b"\n" + b" " * (_limit() + 1))
    before = snapshot(ledger_with_a_run)
    res = _capped("import", str(src), db=ledger_with_a_run)
    assert res.returncode == 2 and "line 3" in res.stderr, res.stderr
    assert snapshot(ledger_with_a_run) == before


def test_the_python_api_reads_a_stream_in_bounded_chunks(tmp_path, ledger_with_a_run):
    """``import_lines`` given a file object reads it in chunks, with the same limit as the
    CLI. (A file one byte over the limit: an endless source here would take the test
    process's own memory on a regression.)"""
    src = tmp_path / "zeros"
    src.write_bytes(b"\0" * (_limit() + 1))
    before = snapshot(ledger_with_a_run)
    with Ledger(ledger_with_a_run) as lg, open(src, "rb") as zeros:
        with pytest.raises(InvalidInput) as err:
            lg.import_lines(zeros)
    assert err.value.field == "line 1" and f"{_limit():,}" in err.value.message, err.value.message
    assert snapshot(ledger_with_a_run) == before


def test_a_line_as_long_as_any_payload_the_ledger_accepts_is_read_whole(tmp_path):
    """The limit derives from the payload limit: a line whose payload is exactly at it is
    read and judged on its content (no live command writes a 1 MiB goal: the rules refuse
    it), and one a byte over is refused for its payload size, as a live write would be.
    Neither is cut off as too long."""
    opened = ev.HandoffOpened(goal="", target="t", owner="a")
    room = DEFAULT_MAX_PAYLOAD - len(ev.encode(opened))
    for extra, words in ((0, "goal is"), (1, "over the limit of 1048576")):
        data, _ = line("r1", 1, GENESIS_HASH, ev.HandoffOpened(goal="x" * (room + extra), target="t", owner="a"))
        src = tmp_path / f"plus{extra}.jsonl"
        src.write_bytes(data)
        res = _capped("import", str(src), db=str(tmp_path / f"plus{extra}.db"))
        assert res.returncode == 2 and words in res.stderr and "longer than" not in res.stderr, res.stderr


def test_the_envelope_room_holds_the_largest_envelope():
    """Every field of a line other than the payload, at its largest valid size and worst
    encoding (4-byte characters, escaped quotes), fits in the room the limit leaves."""
    wide = "\U0010ffff" * 128
    rec = Recorded(run_id="r" * 128, seq=-(2**63), position=-(2**63), type=max(ev.EVENT_TYPES, key=len),
                   actor="operator:" + wide, lease=-(2**63), idempotency_key='"' * 64 + wide[:64],
                   recorded_us=-(2**63), schema_version=-(2**63), payload=b"{}",
                   prev_hash=b"\xff" * 32, hash=b"\xff" * 32)
    encoded = jsonl.to_line(rec, b"\xff" * 32, batch_size=-(2**63), db_role='"' * 63 + "\x01" * 63)
    assert len(encoded) - len(rec.payload) <= jsonl.ENVELOPE_BYTES, len(encoded)
    assert msgspec.json.decode(encoded)["payload"] == {}


def test_a_contract_from_an_endless_stream_is_refused(tmp_path, evidence):
    db = str(tmp_path / "l.db")
    got = _fed_zeros("open", "--contract", "-", db=db)
    assert got["rc"] == 2, got
    assert "Traceback" not in got["stderr"] and "contract" in got["stderr"], got["stderr"]
    assert got["maxrss_kb"] < RSS_BOUND_KB, got
    res = _capped("open", "--contract", "/dev/zero", db=db)
    assert res.returncode == 2 and "contract" in res.stderr, res.stderr
    assert not os.path.exists(db)  # nothing is created for a contract that was never read whole
    evidence.add("import.limits", case="open --contract from 200 MB of zeros", rc=got["rc"],
                 maxrss_kb=got["maxrss_kb"], error=got["stderr"].strip()[:200])
