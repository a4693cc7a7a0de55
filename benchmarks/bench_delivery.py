"""Delivery: the sanitization detectors' scan, and a send by the ledger against recording one.

``sanitize-scan`` runs every built-in detector over text shaped like a report (prose,
timestamps, a URL, a few paths and addresses), against one regular expression that
visits every character once in C: the floor of any scan. ``deliver-file`` times one
delivery through the file:// adapter (attempt recorded, bundle read and checked against
its recorded digest, written atomically, confirmation recorded) against recording a
delivery by hand (the attempt and the receipt, nothing sent): what sending itself costs.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

from .common import expect
from .harness import Ctx, Goal, Measured, Scenario, Side, Trial, register

AREA = "delivery"

_WORDS = ("the", "cache", "node", "was", "lost", "and", "recovered", "after", "flush", "alert",
          "timeline", "report", "10:04", "09:58", "https://status.example.com/inc/4711", "p95")
_PLANTED = ("/srv/app/logs/error.log", "10.2.3.4", "ops@example.com", "db1.internal")


def _text(kib: int) -> str:
    rnd = random.Random(4711)
    lines, size = [], 0
    while size < kib * 1024:
        words = [rnd.choice(_WORDS) for _ in range(12)]
        if rnd.random() < 0.02:
            words[rnd.randrange(12)] = rnd.choice(_PLANTED)
        line = " ".join(words)
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _scan_handoff(ctx: Ctx) -> Trial:
    from handoff.reducers import sanitize as sz

    text = _text(ctx.params["n"])
    out: list[Any] = []

    def run() -> None:
        out.append(sz.scan([("report", text)]))

    def check() -> None:
        if not out[-1]:
            raise RuntimeError("the scan found none of the planted values")

    return Trial(run, check)


def _scan_floor(ctx: Ctx) -> Trial:
    text = _text(ctx.params["n"])
    rx = re.compile(r"[@:/~]")
    out: list[int] = []

    def run() -> None:
        out.append(sum(1 for _ in rx.finditer(text)))

    return Trial(run, lambda: expect("floor matches", int(out[-1] > 0), 1))


register(Scenario(
    name="sanitize-scan",
    area=AREA,
    title="sanitization detectors over report-like text (KiB per second)",
    measures=(
        "reducers.sanitize.scan over n KiB of report-like text (prose, times, a URL, 2% of lines "
        "with a planted path, address, e-mail or internal host name): every built-in detector. "
        "Reference: one regular expression for the characters the detectors start from ([@:/~]), "
        "the floor of any scan that looks at every character."
    ),
    full={"n": 4096},
    quick={"n": 64},
    subject=Side("handoff-ledger", _scan_handoff, note="every built-in detector, findings by line"),
    reference=Side("one-pass regex floor", _scan_floor, note="re.finditer('[@:/~]') over the same text"),
    goals=(Goal("within 15x of a one-pass regex (>= 0.067x)", min_ratio=1 / 15),),
    unit="KiB",
))


def _ready_runs(ctx: Ctx, target_of: Any) -> tuple[Any, list[str]]:
    from handoff.facade import Ledger

    lg = Ledger(str(ctx.dir / "ledger.db"))
    art = ctx.dir / "report.md"
    art.write_text("# Report\n\n" + _text(4) + "\n")
    runs = []
    for i in range(ctx.params["n"]):
        run = lg.open(goal="g", target=target_of(i), owner="alice", run_id=f"d{i}", owner_cap=100_000)
        tok = lg.claim(run, "w1")
        for s in ("planning", "executing"):
            lg.transition(run, tok, s)
        lg.artifact(run, tok, str(art))
        lg.transition(run, tok, "verifying")
        lg.evidence(run, "tests", "pass", lease=tok)
        lg.submit(run, tok, "done")
        runs.append(run)
    return lg, runs


def _timed_each(runs: list[str], op: Any) -> Measured:
    lat = []
    for run in runs:
        t0 = time.perf_counter()
        op(run)
        lat.append(time.perf_counter() - t0)
    return Measured(seconds=sum(lat), latencies=lat)


def _deliver_send(ctx: Ctx) -> Trial:
    box = ctx.dir / "outbox"
    box.mkdir()
    lg, runs = _ready_runs(ctx, lambda i: f"file://{box}")

    def run() -> Measured:
        return _timed_each(runs, lambda r: lg.deliver(r, "v1", send=True, by="alice"))

    def check() -> None:
        expect("files delivered", len(list(box.iterdir())), len(runs))
        expect("runs delivered", sum(lg.checkpoint(r).state == "delivered" for r in runs), len(runs))

    return Trial(run, check, lg.close)


def _deliver_by_hand(ctx: Ctx) -> Trial:
    lg, runs = _ready_runs(ctx, lambda i: "chat:#ops")

    def both(r: str) -> None:
        lg.deliver(r, "v1", by="alice")
        lg.delivered(r, "v1", "chat message 1", by="alice")

    def check() -> None:
        expect("runs delivered", sum(lg.checkpoint(r).state == "delivered" for r in runs), len(runs))

    return Trial(lambda: _timed_each(runs, both), check, lg.close)


register(Scenario(
    name="deliver-file",
    area=AREA,
    title="one delivery sent by the ledger to file:// against one recorded by hand",
    measures=(
        "Ledger.deliver(run, send=True) to a file:// directory, one run after another: the attempt "
        "recorded, the 4 KiB artifact read and checked against its recorded sha256, the bundle "
        "written (temporary file, fsync, link, directory fsync), the receipt recorded. Reference: "
        "Ledger.deliver then Ledger.delivered by hand (the same two records, nothing sent). Time per "
        "delivery: median and p95."
    ),
    full={"n": 100},
    quick={"n": 5},
    subject=Side("handoff-ledger --send", _deliver_send, note="record, read, write atomically, record"),
    reference=Side("recorded by hand", _deliver_by_hand, note="deliver + delivered, nothing sent"),
    # Recording by hand is two commits (two fsyncs under synchronous=FULL); a send adds the
    # bundle file's fsync and its directory's, and reading the artifact: about twice the
    # syncs, so a budget of 3x leaves room for the reads and the checks, not for waste.
    goals=(Goal("sending costs at most 3x recording by hand (>= 0.33x)", min_ratio=1 / 3),),
    kind="latency",
    unit="deliveries",
    repeat=3,
))
