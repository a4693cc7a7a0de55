"""Files that are not what a command expects: named for what they are, never echoed.

``--db`` naming a kernel pseudo-file, a device, a FIFO or a directory is refused as
not a ledger (``NotALedger``, exit 3) before SQLite touches it; it used to read as a
full or failing disk. A file given to ``head --write`` that does not hold a head digest
is refused by its size and kind, and none of its bytes appear in the error: it may be
someone's notes, a key, or a log.
"""

from __future__ import annotations

import json
import os

import pytest

from handoff import Ledger
from handoff.ledger.errors import InvalidInput, NotALedger

from .conftest import handoff
from .test_hostile import invoke, no_traceback, snapshot

SECRET = "hunter2-do-not-print-me"


def _pseudo_files() -> list[str]:
    candidates = ["/proc/self/mem", "/proc/self/status", "/proc/sys/kernel/hostname",
                  "/sys/kernel/uevent_seqnum", "/sys/fs/cgroup/cgroup.procs"]
    return [p for p in candidates if os.path.isfile(p)]


@pytest.mark.parametrize("path", _pseudo_files())
@pytest.mark.parametrize("verb", [["status", "--all"], ["init"], ["open", "--goal", "g", "--target", "t", "--owner", "a"]])
def test_a_kernel_pseudo_file_as_db_is_not_a_ledger(path, verb):
    """A real process: /proc/self/mem is then the child's memory, not the test's."""
    before = snapshot(path) if not path.startswith("/proc/self/") else None
    res = handoff(*verb, "--json", db=path)
    assert res.returncode == 3 and "Traceback" not in res.stderr, res.stderr
    err = json.loads(res.stderr)["error"]
    assert err["type"] == "NotALedger", err
    assert "not a regular file the ledger can use" in err["message"] and "pseudo" in err["message"], err
    assert "full" not in err["message"] and "failing" not in err["message"]
    if before is not None:
        assert snapshot(path) == before
    with pytest.raises(NotALedger):
        Ledger(path)


def _others(tmp_path) -> dict[str, str]:
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    sub = tmp_path / "dir"
    sub.mkdir()
    return {"a character device": "/dev/null", "a FIFO": fifo, "a directory": str(sub)}


@pytest.mark.parametrize("kind", ["a character device", "a FIFO", "a directory"])
def test_a_device_fifo_or_directory_as_db_is_named_for_what_it_is(tmp_path, kind):
    path = _others(tmp_path)[kind]
    with pytest.raises(NotALedger) as info:
        Ledger(path)
    assert kind in info.value.message and "not a regular file the ledger can use" in info.value.message
    assert "--db" in info.value.message  # says where the path came from and what to do
    if kind != "a directory":  # the CLI's --db refuses a directory itself, as a usage error
        res = invoke(["--db", path, "status", "--all"])
        no_traceback(res)
        assert res.exit_code == 3 and kind in res.stderr, res.stderr


def test_a_new_ledger_is_not_created_on_a_pseudo_filesystem():
    res = handoff("init", db="/proc/handoff-test.db")
    assert res.returncode == 3 and "pseudo" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not os.path.exists("/proc/handoff-test.db")


@pytest.mark.parametrize("content", [
    f"password={SECRET}\n".encode(),
    f"{SECRET} {SECRET}".encode(),
    b"\x7fELF\x02\x01" + SECRET.encode() + b"\x00" * 40,
    f"12:{SECRET}".encode(),
])
def test_head_write_never_echoes_a_file_that_is_not_a_digest(tmp_path, content):
    db, target = str(tmp_path / "l.db"), tmp_path / "notes.txt"
    with Ledger(db) as lg:
        lg.open(run_id="r1", goal="g", target="t", owner="a")
    target.write_bytes(content)
    before = snapshot(db)
    res = invoke(["--db", db, "head", "--write", str(target)])
    no_traceback(res)
    assert res.exit_code == 2, res.output + res.stderr
    assert SECRET not in res.output + res.stderr
    assert f"{len(content)} bytes" in res.stderr and "head digest" in res.stderr, res.stderr
    assert target.read_bytes() == content and snapshot(db) == before
    with Ledger(db) as lg, pytest.raises(InvalidInput) as info:
        lg.write_head(str(target))
    assert SECRET not in str(info.value) and info.value.field == "path"


def test_expect_head_never_echoes_what_it_was_given(tmp_path):
    """The documented idiom is --expect-head "$(cat FILE)": a wrong file must not be printed."""
    db = str(tmp_path / "l.db")
    with Ledger(db) as lg:
        lg.open(run_id="r1", goal="g", target="t", owner="a")
    res = invoke(["--db", db, "verify", "--expect-head", f"token={SECRET}"])
    no_traceback(res)
    assert res.exit_code == 2 and "head digest" in res.stderr, res.stderr
    assert SECRET not in res.output + res.stderr
