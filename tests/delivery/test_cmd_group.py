"""A ``cmd:`` delivery's command, and everything it starts, ends with the send: at the
send's timeout, and when the sending process is killed with SIGKILL (real process, real
signal). A command left running after its sender died could deliver with nobody to
record it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from handoff.facade import Ledger
from handoff.ledger.events import SendPolicy

from .conftest import log_types, ready_run
from .test_kill import deliver, kill, wait_for

#: Starts a grandchild that would outlive a killed shell, records both pids, then waits.
SCRIPT = """\
sleep 1000 &
echo $! > "$PIDS/grandchild.tmp" && mv "$PIDS/grandchild.tmp" "$PIDS/grandchild"
echo $$ > "$PIDS/child.tmp" && mv "$PIDS/child.tmp" "$PIDS/child"
wait
"""

#: How long a process may take to disappear once its group was killed: generous, since
#: the machine may be loaded; the test ends as soon as they are gone.
GONE_WITHIN_S = 60.0


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), or None when it is gone or
    a zombie: with the start time a reused pid is never taken for the same process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]


def read_pids(pids_dir) -> dict[str, tuple[int, str | None]]:
    wait_for(lambda: (pids_dir / "child").exists() and (pids_dir / "grandchild").exists(),
             "the command to start its grandchild", timeout=GONE_WITHIN_S)
    out = {}
    for name in ("child", "grandchild"):
        pid = int((pids_dir / name).read_text())
        out[name] = (pid, start_time(pid))
        assert out[name][1] is not None, f"the {name} ended before the test could see it"
    return out


def assert_all_gone(procs: dict[str, tuple[int, str | None]]) -> None:
    try:
        wait_for(lambda: all(start_time(pid) != started for pid, started in procs.values()),
                 "the command's process group to end", timeout=GONE_WITHIN_S)
    finally:
        for pid, started in procs.values():  # never leave them running, even on failure
            if start_time(pid) == started:
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cmd_run(tmp_path):
    script = tmp_path / "deliver.sh"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    db = str(tmp_path / "ledger.db")
    lg = Ledger(db)
    yield db, lg, script, pids
    lg.close()


def test_a_sigkilled_sender_takes_its_command_and_grandchild_with_it(cmd_run, tmp_path):
    db, lg, script, pids = cmd_run
    run = ready_run(lg, tmp_path, f"cmd:/bin/sh {script}", send=SendPolicy(timeout_s=3600.0, retries=0))
    sender = deliver(db, run, env={"PIDS": str(pids)})
    try:
        procs = read_pids(pids)
    except BaseException:
        sender.kill()
        sender.wait()
        raise
    kill(sender)  # SIGKILL: the sender runs no cleanup at all
    assert_all_gone(procs)
    # The attempt stays open (the command may have acted): a person settles it.
    assert log_types(lg, run)[-1] == "delivery_attempted"


def test_a_send_past_its_timeout_kills_the_whole_group(cmd_run, tmp_path):
    db, lg, script, pids = cmd_run
    run = ready_run(lg, tmp_path, f"cmd:/bin/sh {script}", send=SendPolicy(timeout_s=1.0, retries=0))
    # A first send that times out before the pids are written would leave nothing to
    # check: retry the whole send (new key each time) until the command got that far.
    deadline = time.monotonic() + GONE_WITHIN_S
    for n in range(1, 100):
        sent = lg.send_delivery(run, f"v{n}", env={**os.environ, "PIDS": str(pids)}, by="alice")
        assert sent.status == "unknown" and "killed" in sent.error
        if (pids / "grandchild").exists() and (pids / "child").exists():
            break
        assert time.monotonic() < deadline, "the command never got as far as starting its grandchild"
        lg.delivery_failed(run, f"v{n}", "killed before it did anything", by="alice")
    gone = [int((pids / name).read_text()) for name in ("child", "grandchild")]
    # SIGKILLed as one group before send_delivery returned; the kernel may still be
    # tearing the grandchild down, so wait (bounded) until neither pid is a live process.
    wait_for(lambda: all(start_time(pid) is None for pid in gone), "the killed group to end", timeout=GONE_WITHIN_S)


def test_a_command_that_ends_by_itself_leaves_no_watcher_behind(cmd_run, tmp_path):
    db, lg, script, pids = cmd_run
    run = ready_run(lg, tmp_path, "cmd:/bin/true", send=SendPolicy(timeout_s=60.0, retries=0))
    before = _children()
    assert lg.deliver(run, "v1", send=True, by="alice").status == "confirmed"
    assert _children() == before


def _children() -> set[int]:
    """This process's live children, from /proc."""
    me = str(os.getpid())
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2:].split()[1] == me:
                out.add(int(entry))
    return out
