"""Matrix row 1: the lease holder is partitioned from the server mid-run.

The wrapper (``handoff run``) and its child run through a proxy of their own; the proxy
blackholes (the partition); the watchdog, on the server's side of it, revokes; another
worker claims; the partition heals and what the cut-off side had sent arrives late.
What must hold: every write of the cut-off worker after the revoke is refused
(StaleLease: its delayed heartbeat, and writes with its token through the CLI), the log
shows none of its writes after the revoke, the wrapper learns it lost the lease, and its
child had stopped before the watchdog could revoke (self-fencing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from msgspec import UNSET

from handoff import Ledger
from handoff.ledger.errors import LedgerError
from handoff.ledger.events import decode
from handoff.watchdog import watch_once
from handoff.worker import FENCED_EXIT
from tests.faults.conftest import ROOT, child_env, handoff, wait_until
from tests.support import executable

TIMEOUT_S = 2.0


def _actions(path: str) -> list[float]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [float(line.split()[0]) for line in f if line.endswith("\n")]


def test_partitioned_lease_holder_is_fenced_out_and_learns_it(pg_url, proxies, procs, tmp_path, evidence):
    with Ledger(pg_url) as lg:
        run = lg.open(goal="partition me", target="chat:#ops", owner="alice", heartbeat_timeout_s=TIMEOUT_S)
    proxy = proxies(pg_url)
    actions = str(tmp_path / "actions")
    wrapper = subprocess.Popen(
        [*executable(), "run", "--run", run, "--worker", "w1", "--heartbeat-every", "0.25", "--json", "--",
         sys.executable, "-m", "tests.faults.pg.agents", "actor", actions, "120"],
        cwd=ROOT, env=child_env(HANDOFF_DB=proxy.url(pg_url)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    procs.append(wrapper)
    wait_until(lambda: len(_actions(actions)) > 20 and os.path.exists(actions + ".token"), timeout=60,
               what="the child acting")
    old_token = open(actions + ".token").read()
    time.sleep(0.6)

    cut_at = time.time()
    proxy.blackhole()
    # The watchdog is on the server's side of the partition (this process, over its own
    # connection): a pass every 0.1 s revokes once the timeout has passed.
    # If the cut caught the wrapper inside a write, its transaction holds the run's lock until
    # the server ends the idle session (after the wrapper's lock timeout): a pass meanwhile
    # fails like any writer's and the next one tries again, as 'handoff watch' does.
    store_errors = []
    with Ledger(pg_url) as wd:
        def revoked() -> bool:
            try:
                acts = watch_once(wd, name="wd-server-side")
            except LedgerError as exc:
                store_errors.append(exc.type)
                return False
            return any(a.action == "revoke_lease" and a.outcome == "committed" for a in acts)

        wait_until(lambda: revoked() or time.sleep(0.1), timeout=30, what="the watchdog's revoke")
    claim = handoff("claim", run, "--worker", "w2", db=pg_url)
    assert claim.returncode == 0, claim.stderr
    assert wrapper.poll() is None or wrapper.returncode == FENCED_EXIT  # still cut off, or fenced

    proxy.heal()  # the held heartbeat now reaches the server, after the revoke
    out, err = wrapper.communicate(timeout=60)
    doc = json.loads(out)
    assert wrapper.returncode == FENCED_EXIT, err
    assert doc["fenced"] and doc["lease_lost"] and not doc["released"], doc
    # The cut-off worker writing with its own token after the heal: refused, exit 1.
    late = [handoff(verb, run, "--lease", old_token, *extra, db=proxy.url(pg_url))
            for verb, extra in (("heartbeat", ()), ("progress", ("--kind", "note", "--detail", "late")),
                                ("transition", ("--to", "planning")))]
    assert [r.returncode for r in late] == [1, 1, 1], [r.stderr for r in late]
    assert all("has ended" in r.stderr for r in late)

    with Ledger(pg_url) as lg:
        log = list(lg.log(run))
        (revoke,) = [r for r in log if r.type == "lease_revoked"]
        after = [r for r in log if r.seq > revoke.seq]
        assert all(r.actor != "worker:w1" for r in after), [(r.seq, r.actor, r.type) for r in after]
        # w1's last proof of life: its last logged write, or the later beat kept beside the log
        # that the watchdog judged from (recorded in its decision, so the log shows it).
        (decided,) = [decode(r.payload) for r in log if r.type == "recovery_decided" and r.seq < revoke.seq]
        assert decided.action == "revoke_lease" and decided.beat_us is not UNSET, decided
        last_proof_us = max([r.recorded_us for r in log if r.actor == "worker:w1" and r.seq < revoke.seq]
                            + [decided.beat_us])
        assert lg.checkpoint(run).worker == "w2"
        assert lg.verify() == []
    acts = _actions(actions)
    could_revoke = last_proof_us / 1e6 + TIMEOUT_S
    assert [a for a in acts if a >= cut_at], "the child never acted after the cut: the test proves nothing"
    assert max(acts) < could_revoke
    assert max(acts) < revoke.recorded_us / 1e6
    evidence.add("pg_row1_partitioned_lease_holder", heartbeat_timeout_s=TIMEOUT_S, wrapper_exit=wrapper.returncode,
                 lease_lost=doc["lease_lost"], late_writes_refused=len(late), late_writes_accepted=0,
                 w1_events_after_revoke=0, child_stopped_before_possible_revoke_s=round(could_revoke - max(acts), 3),
                 revoke_after_last_beat_s=round((revoke.recorded_us - last_proof_us) / 1e6, 3),
                 watchdog_passes_failed=store_errors, proxy=proxy.counts)
