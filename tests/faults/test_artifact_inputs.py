"""Artifacts are read from a filesystem someone else controls: refused promptly, never hung on.

Real FIFOs, real /proc files, a real writer process growing a file while it is read. Every
refusal is an InvalidInput (exit 2) and leaves the log exactly as it was. Each call runs in
a thread with a deadline, so a regression shows as a failure, not as a test run that hangs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from handoff import facade
from handoff.facade import Ledger
from handoff.ledger.errors import InvalidInput
from tests.support import Handoff, working_run
from tests.ledger.conformance import assert_unchanged, snapshot

PROMPT_S = 5.0


def _within(seconds: float, fn: Any, *, unblock: Any = None) -> Any:
    """fn() in a daemon thread; its result or its exception, or a failure if it is still
    running after ``seconds`` (``unblock`` is then called to free the thread)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(seconds)
    if t.is_alive():
        if unblock is not None:
            unblock()
        pytest.fail(f"still blocked after {seconds} s")
    box["elapsed"] = time.monotonic() - start
    return box


@pytest.fixture
def ledger(tmp_path):
    lg = Ledger(str(tmp_path / "ledger.db"))
    lease = working_run(lg)
    yield lg, lease
    lg.close()


def _swap_after_stat(monkeypatch, target: str, swap: Any) -> None:
    """Make the race happen every time: right after the ledger's stat of ``target`` (which
    sees a regular file), replace the file with something else, as another process could."""
    real_stat = os.stat
    done = []

    def stat(path: Any, *a: Any, **kw: Any) -> Any:
        st = real_stat(path, *a, **kw)
        if not done and os.fspath(path) == target:
            done.append(True)
            os.unlink(target)
            swap(target)
        return st

    monkeypatch.setattr(facade.os, "stat", stat)


def _refused(box: dict[str, Any], *words: str) -> InvalidInput:
    err = box.get("error")
    assert isinstance(err, InvalidInput), f"expected a refusal, got {box}"
    assert err.exit_code == 2 and err.field == "path"
    for w in words:
        assert w in err.message, err.message
    return err


def test_a_file_swapped_for_a_fifo_after_its_check_is_refused_promptly(ledger, tmp_path, monkeypatch, evidence):
    lg, lease = ledger
    path = str(tmp_path / "report.md")
    with open(path, "w") as f:
        f.write("draft\n")
    _swap_after_stat(monkeypatch, path, os.mkfifo)
    before = snapshot(lg.store)

    def unblock() -> None:  # a writer lets a blocked open(2) go on
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    box = _within(PROMPT_S, lambda: lg.artifact("r1", lease, path, worker="w1"), unblock=unblock)
    err = _refused(box, "FIFO", "not a regular file", path)
    assert_unchanged(lg.store, before)
    evidence.add("artifact_fifo_swap", seconds=round(box["elapsed"], 4), message=err.message)


def test_a_file_swapped_for_a_symlink_after_resolution_is_not_followed(ledger, tmp_path, monkeypatch):
    lg, lease = ledger
    root = tmp_path / "out"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the root\n")
    path = str(root / "report.md")
    with open(path, "w") as f:
        f.write("draft\n")
    _swap_after_stat(monkeypatch, path, lambda p: os.symlink(secret, p))
    before = snapshot(lg.store)
    box = _within(PROMPT_S, lambda: lg.artifact("r1", lease, path, root=str(root), worker="w1"))
    _refused(box, "symbolic link", "again")
    assert_unchanged(lg.store, before)


@pytest.mark.parametrize("pseudo", ["/proc/self/pagemap", "/proc/kmsg", "/proc/self/status"])
def test_proc_pseudo_files_are_refused_promptly(ledger, pseudo, evidence):
    if not os.path.exists(pseudo):
        pytest.skip(f"{pseudo} does not exist here")
    lg, lease = ledger
    before = snapshot(lg.store)
    box = _within(PROMPT_S, lambda: lg.artifact("r1", lease, pseudo, worker="w1"))
    err = _refused(box)
    # Unreadable to this user (kmsg when not root) is refused too; otherwise by what it is.
    assert "pseudo-file under /proc" in err.message or "cannot read" in err.message, err.message
    assert_unchanged(lg.store, before)
    evidence.add("artifact_proc", path=pseudo, seconds=round(box["elapsed"], 4), message=err.message)


def test_a_file_over_the_limit_is_refused_naming_the_limit_and_how_to_raise_it(ledger, tmp_path):
    lg, lease = ledger
    path = tmp_path / "big.log"
    path.write_bytes(b"x" * 4096)
    before = snapshot(lg.store)
    with pytest.raises(InvalidInput) as info:
        lg.artifact("r1", lease, str(path), max_bytes="1K", worker="w1")
    msg = info.value.message
    assert "4096 bytes" in msg and "1 KiB limit" in msg and "--max-bytes" in msg and facade.ARTIFACT_MAX_ENV in msg
    assert info.value.details["limit"] == 1024 and info.value.details["size"] == 4096
    assert_unchanged(lg.store, before)
    out = lg.artifact("r1", lease, str(path), max_bytes=4096, worker="w1")  # at the limit: read
    assert out.checkpoint.artifacts[-1].bytes == 4096


def test_the_default_limit_is_one_gib_and_refuses_without_reading(ledger, tmp_path, monkeypatch):
    lg, lease = ledger
    monkeypatch.delenv(facade.ARTIFACT_MAX_ENV, raising=False)
    path = tmp_path / "sparse.img"
    with open(path, "wb") as f:
        f.truncate((1 << 30) + 1)  # sparse: no disk used, but reading it all took seconds
    before = snapshot(lg.store)
    box = _within(PROMPT_S, lambda: lg.artifact("r1", lease, str(path), worker="w1"))
    _refused(box, "1 GiB limit")
    assert box["elapsed"] < 1.0
    assert_unchanged(lg.store, before)


def test_the_limit_from_the_cli_option_and_the_environment(tmp_path):
    h = Handoff(str(tmp_path / "ledger.db"))
    with h.ledger() as lg:
        lease = working_run(lg)
        before = snapshot(lg.store)
    path = tmp_path / "out.txt"
    path.write_bytes(b"y" * 2048)
    r = h("artifact", "r1", str(path), "--lease", lease, "--max-bytes", "1K", code=2)
    assert "1 KiB limit" in r.stderr
    r = h("artifact", "r1", str(path), "--lease", lease, code=2, env={facade.ARTIFACT_MAX_ENV: "2047"})
    assert "2047 bytes limit" in r.stderr
    r = h("artifact", "r1", str(path), "--lease", lease, "--max-bytes", "lots", code=2)
    assert "max_bytes must be a number of bytes" in r.stderr
    r = h("artifact", "r1", str(path), "--lease", lease, code=2, env={facade.ARTIFACT_MAX_ENV: "-5"})
    assert facade.ARTIFACT_MAX_ENV in r.stderr
    with h.ledger() as lg:
        assert_unchanged(lg.store, before)
    doc = h.json("artifact", "r1", str(path), "--lease", lease, "--max-bytes", "2K")
    assert doc["artifact"]["bytes"] == 2048


WRITER = r"""
import sys
with open(sys.argv[1], "ab", buffering=0) as f:
    f.write(b"w" * (1 << 20))
    print("ready", flush=True)
    for line in sys.stdin:  # one append per request, so the test decides when it lands
        f.write(b"w" * 4096)
        print("appended", flush=True)
"""


def test_a_file_growing_while_read_is_refused(ledger, tmp_path, monkeypatch, evidence):
    """A separate process appends while the ledger reads. To make the interleaving certain
    rather than likely, the ledger's first read of each call asks the writer to append and
    waits until it has: the file then grows under a read already in progress."""
    lg, lease = ledger
    path = str(tmp_path / "growing.log")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdin is not None and writer.stdout is not None
    real_read = os.read
    armed = []

    def read(fd: int, n: int) -> bytes:
        if armed:
            armed.clear()
            writer.stdin.write("append\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "appended"
        return real_read(fd, n)

    try:
        assert writer.stdout.readline().strip() == "ready"
        monkeypatch.setattr(facade.os, "read", read)
        before = snapshot(lg.store)
        refusals = []
        for _ in range(3):
            armed.append(True)
            box = _within(PROMPT_S, lambda: lg.artifact("r1", lease, path, worker="w1"))
            refusals.append(_refused(box, "again once it is finished").message)
        assert_unchanged(lg.store, before)
    finally:
        monkeypatch.undo()
        writer.kill()
        writer.wait()
    # Once nothing writes to it, the same file is recorded, whole.
    out = lg.artifact("r1", lease, path, worker="w1")
    assert out.checkpoint.artifacts[-1].bytes == os.path.getsize(path) == (1 << 20) + 3 * 4096
    evidence.add("artifact_growing", refusals=refusals)


def test_a_missing_file_is_still_recorded_as_missing(ledger, tmp_path):
    lg, lease = ledger
    out = lg.artifact("r1", lease, str(tmp_path / "not-yet.md"), worker="w1")
    art = out.checkpoint.artifacts[-1]
    assert not art.exists and art.bytes == 0 and art.sha256 == ""


@pytest.mark.parametrize("value,want", [(0, 0), ("1048576", 1 << 20), ("512K", 512 << 10), ("64M", 64 << 20),
                                        ("2G", 2 << 30), ("2GiB", 2 << 30), (" 3 kb ", 3 << 10)])
def test_sizes_are_read_in_binary_units(value, want):
    assert facade.parse_size(value) == want


@pytest.mark.parametrize("value", [-1, True, 1.5, "", "K", "1.5G", "12Q", "١٢", None])
def test_malformed_sizes_are_refused(value):
    with pytest.raises(InvalidInput, match="number of bytes"):
        facade.parse_size(value)
