"""Matrix rows 5 and 6: two watchdogs on two hosts at once, and clocks that disagree.

Two hosts are two processes with distinct watcher names, started together and released at
the same instant (a file both wait for). Clock skew is a process whose wall clock is
minutes off (time.time and time.time_ns moved before anything runs; the monotonic clock
untouched), as on a host without NTP.

Which clock judges health: the server's. With no clock injected, a PostgreSQL ledger
stamps every event with the server's clock and the watchdog's "now" is read from it
(PostgresStore.server_clock), so a worker's and a watchdog's own clocks play no part.
"""

from __future__ import annotations

import time
from collections import Counter

from msgspec import UNSET

from handoff import Ledger
from handoff.ledger.events import decode
from tests.faults.conftest import read_jsonl, scale, wait_until

from .conftest import pg_agent

SKEW_S = 300  # five minutes


def test_two_watchdogs_on_two_hosts_record_each_recovery_once(pg_url, tmp_path, procs, evidence):
    n = scale(4, 12)
    with Ledger(pg_url) as lg:
        runs = []
        for i in range(n):
            run = lg.open(goal=f"dead worker {i}", target="chat:#ops", owner=f"owner{i}", heartbeat_timeout_s=0.5)
            lg.claim(run, f"w{i}")
            runs.append(run)
    time.sleep(0.8)  # every worker is now silent past its timeout
    go = str(tmp_path / "go")
    outs = [str(tmp_path / f"wd{i}.jsonl") for i in range(2)]
    for i in range(2):
        procs.append(pg_agent("watch", pg_url, f"host{i}-watchdog", outs[i], go))
    time.sleep(1.5)  # both connected and waiting
    open(go, "w").close()
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    acts = [a for out in outs for a in read_jsonl(out) if a["action"] == "revoke_lease"]
    outcomes = Counter(a["outcome"] for a in acts)
    with Ledger(pg_url) as lg:
        for run in runs:
            log = list(lg.log(run))
            assert sum(r.type == "recovery_decided" for r in log) == 1, [r.type for r in log]
            assert sum(r.type == "lease_revoked" for r in log) == 1
            assert lg.checkpoint(run).lease is None
        assert lg.verify() == []
    assert outcomes["committed"] == n, outcomes  # each recovery by exactly one of the two
    assert sum(outcomes.values()) >= n
    evidence.add("pg_row5_two_watchdogs", runs=n, outcomes=dict(outcomes), recoveries_per_run=1)


def _revoke_gap(lg: Ledger, run: str) -> tuple[float, float, float, int] | None:
    """(seconds from the last heartbeat to the revoke, by the ledger's stamps; the revoke's
    stamp; seconds from the grant to the last heartbeat; the lease's beats), or None if not
    revoked. Most beats are kept beside the log, so the last one is the beat the watchdog's
    decision records it judged from (``beat_us``, ``beats``), or a logged one if later."""
    log = list(lg.log(run))
    rev = [r for r in log if r.type == "lease_revoked"]
    if not rev:
        return None
    (decided,) = [decode(r.payload) for r in log if r.type == "recovery_decided" and r.seq < rev[0].seq]
    assert decided.beat_us is not UNSET and decided.beats is not UNSET, decided
    granted = max(r.recorded_us for r in log if r.type == "lease_granted" and r.seq < rev[0].seq)
    logged = [r.recorded_us for r in log if r.type == "heartbeat_recorded" and r.seq < rev[0].seq]
    last = max([granted, decided.beat_us, *logged])
    return (rev[0].recorded_us - last) / 1e6, rev[0].recorded_us / 1e6, (last - granted) / 1e6, decided.beats


def test_skewed_clocks_neither_revoke_early_nor_keep_late(pg_url, tmp_path, procs, evidence):
    """Four workers heartbeat every 0.3 s for 2.5 s, then stop; two watchdogs, one on a host
    five minutes ahead, pass every 0.2 s throughout. Three workers use the default (the
    server's clock): one five minutes behind, one ahead, one right. The fourth is five
    minutes behind and stamps its own host's clock (``Ledger(clock=now_us)``, the old way):
    the contrast that shows the test can fail."""
    timeout = 1.5
    cases = {"worker_behind": (-SKEW_S, "store"), "worker_ahead": (SKEW_S, "store"),
             "worker_right": (0, "store"), "host_clock_worker_behind": (-SKEW_S, "host")}
    runs, beats = {}, {}
    with Ledger(pg_url) as lg:
        for name in cases:
            runs[name] = lg.open(goal=name, target="chat:#ops", owner="alice", heartbeat_timeout_s=timeout)
    watch = [str(tmp_path / f"watch{i}.jsonl") for i in range(2)]
    for i, skew in enumerate((0, SKEW_S)):
        procs.append(pg_agent("skewed", skew, "watchloop", pg_url, f"wd{i}", watch[i], 60, 0.2))
    tokens = {name: "claim:w-" + name.replace("_", "-") for name in cases}
    workers = []
    for name, (skew, clock) in cases.items():
        beats[name] = str(tmp_path / f"beats-{name}.jsonl")
        workers.append(pg_agent("skewed", skew, "beat", pg_url, runs[name], tokens[name], 2.5, 0.3, beats[name], clock))
    procs.extend(workers)
    for p in workers:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    # The watchdogs go on until every run whose worker stamps the store's clock is revoked
    # (the host-clock one was refused while beating), then a timeout more: no late second act.
    with Ledger(pg_url) as lg:
        wait_until(lambda: all(_revoke_gap(lg, runs[name]) is not None for name, (_, c) in cases.items() if c == "store"),
                   timeout=20 * (timeout + 0.2), what="the watchdogs revoking every silent worker")
    time.sleep(timeout)
    for w in watch:
        open(w + ".stop", "w").close()
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    results = {}
    with Ledger(pg_url) as lg:
        for name, (skew, clock) in cases.items():
            lines = read_jsonl(beats[name])
            ok = sum(b["status"] == "ok" for b in lines)
            refused = [b["error"] for b in lines if b["status"] != "ok"]
            gap = _revoke_gap(lg, runs[name])
            results[name] = {"worker_skew_s": skew, "stamps": clock, "beats_ok": ok, "refused_while_beating": refused,
                             "revoked_after_silence_s": None if gap is None else round(gap[0], 3)}
            if clock == "host":
                continue
            # Not early: never refused while it beat, over a span of beats longer than the
            # timeout (so an early revoke had its chance), and revoked only after a full
            # timeout of silence. Not late: well inside the skew (a watchdog trusting the
            # skewed host's clock would wait five minutes more); a starved watchdog on a busy
            # machine may pass late, so the bound is the wait above, not "a few passes".
            # The span runs from the claim (the first beat follows it at once) to the last beat
            # the ledger accepted, kept or logged; the watchdog counted every beat it judged.
            assert gap is not None, (name, "never revoked")
            results[name]["beats_span_s"], results[name]["beats_judged"] = round(gap[2], 3), gap[3]
            assert refused == [] and ok >= 2 and gap[2] > timeout, (name, results[name])
            assert gap[3] == ok, (name, results[name])
            assert timeout <= gap[0] <= timeout + 20 * (timeout + 0.2) < SKEW_S, (name, results[name])
        old = results["host_clock_worker_behind"]
        assert old["refused_while_beating"] == ["StaleLease"], old
        assert lg.verify() == []
    evidence.add("pg_row6_clock_skew", skew_s=SKEW_S, heartbeat_timeout_s=timeout, watch_every_s=0.2,
                 watchdog_skews_s=[0, SKEW_S], **results)
