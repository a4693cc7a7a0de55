"""deliver --send to a directory (file://) and to a command (cmd:)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from handoff.facade import Ledger
from handoff.delivery.adapters import file_name
from handoff.ledger.errors import InvalidInput, ResendRefused
from handoff.ledger.events import SendPolicy
from handoff.watchdog import watch_once

from .conftest import log_types, outbox, ready_run


def test_a_directory_gets_the_bundle_whole_under_run_and_key(lg, tmp_path):
    box = outbox(tmp_path)
    run = ready_run(lg, tmp_path, f"file://{box}")
    sent = lg.deliver(run, "v1", send=True, by="alice")
    assert sent.status == "confirmed"
    name = file_name(run, "v1")
    assert os.listdir(box) == [name]  # no temporary file left behind
    doc = json.loads((box / name).read_bytes())
    assert doc["run_id"] == run and doc["artifacts"][0]["name"] == "report.md"
    assert f"file {name} sha256" in sent.receipt


def test_a_repeat_into_a_directory_writes_nothing_new(lg, tmp_path):
    box = outbox(tmp_path)
    run = ready_run(lg, tmp_path, f"file://{box}")
    # As after a crash between the write and its record: the attempt is open, the file there.
    lg.deliver(run, "v1", by="alice")
    from handoff.delivery import adapters, bundle

    cp = lg.checkpoint(run)
    adapters.FileAdapter(f"file://{box}").send_once(bundle.build(cp), "v1", run)
    st = os.stat(box / file_name(run, "v1"))
    sent = lg.deliver(run, "v1", send=True, by="alice")
    assert sent.status == "confirmed" and "(already there)" in sent.receipt
    assert os.stat(box / file_name(run, "v1")).st_ino == st.st_ino and len(os.listdir(box)) == 1


def test_other_content_under_the_key_is_a_failure_and_is_left_alone(lg, tmp_path):
    box = outbox(tmp_path)
    run = ready_run(lg, tmp_path, f"file://{box}")
    (box / file_name(run, "v1")).write_text("someone else's")
    sent = lg.deliver(run, "v1", send=True, by="alice")
    assert sent.status == "failed" and "other content" in sent.error
    assert (box / file_name(run, "v1")).read_text() == "someone else's"


def test_odd_keys_make_safe_distinct_names():
    assert file_name("r", "../../etc/passwd") != file_name("r", "__.._etc_passwd")
    assert "/" not in file_name("r", "../../etc/passwd") and not file_name("r", "x").startswith(".")
    assert file_name("r", "a/b") != file_name("r", "a_b")


@pytest.mark.parametrize("what", ["symlink", "file", "missing"])
def test_a_target_directory_that_is_not_one_is_refused_with_the_log_unchanged(lg, tmp_path, what):
    real = outbox(tmp_path)
    target = tmp_path / "box"
    if what == "symlink":
        target.symlink_to(real)
    elif what == "file":
        target.write_text("x")
    run = ready_run(lg, tmp_path, f"file://{target}")
    before = log_types(lg, run)
    with pytest.raises(InvalidInput, match="symbolic link|not a directory|cannot be used"):
        lg.deliver(run, "v1", send=True, by="alice")
    assert log_types(lg, run) == before and os.listdir(real) == []


def _cmd(tmp_path, body: str) -> str:
    script = tmp_path / "hook.py"
    script.write_text(body)
    return f"cmd:{sys.executable} {script}"


RECORDER = """
import os, sys, json
out = os.environ["OUT"]
with open(os.path.join(out, os.environ["HANDOFF_DELIVERY_KEY"]), "w") as f:
    json.dump({"run": os.environ["HANDOFF_RUN_ID"], "files": sorted(os.listdir(os.environ["HANDOFF_ARTIFACTS"])),
               "bundle": json.load(open(os.environ["HANDOFF_BUNDLE"]))["format"]}, f)
print("posted")
"""


def test_a_command_gets_the_key_and_files_and_its_exit_status_is_the_receipt(lg, tmp_path):
    box = outbox(tmp_path)
    run = ready_run(lg, tmp_path, _cmd(tmp_path, RECORDER))
    sent = lg.send_delivery(run, "v1", env={**os.environ, "OUT": str(box)}, by="alice")
    assert sent.status == "confirmed" and sent.receipt.startswith("exit 0; output sha256 ")
    assert json.loads((box / "v1").read_text()) == {"run": run, "files": ["report.md"], "bundle": "handoff-delivery/1"}


def test_a_failing_command_is_a_failure(lg, tmp_path):
    run = ready_run(lg, tmp_path, _cmd(tmp_path, "import sys; sys.exit(3)"))
    sent = lg.deliver(run, "v1", send=True, by="alice")
    assert sent.status == "failed" and "exited 3" in sent.error


def test_a_command_past_its_timeout_is_unknown_never_rerun_and_flagged_at_once(tmp_path):
    lg = Ledger(str(tmp_path / "l.db"))
    box = outbox(tmp_path)
    slow = RECORDER + "import time; time.sleep(30)\n"
    run = ready_run(lg, tmp_path, _cmd(tmp_path, slow), send=SendPolicy(timeout_s=2.0, retries=3))
    env = {**os.environ, "OUT": str(box)}
    sent = lg.send_delivery(run, "v1", env=env, by="alice")
    assert sent.status == "unknown" and sent.tries == 1 and "killed" in sent.error
    assert os.listdir(box) == ["v1"]  # it acted before it was killed: only a person can know
    before = log_types(lg, run)
    with pytest.raises(ResendRefused, match="do not honour delivery keys"):
        lg.send_delivery(run, "v1", env=env, by="alice")
    assert log_types(lg, run) == before
    st = lg.status(run)
    assert st["delivery"]["status"] == "ambiguous" and st["health"]["action"] == "reconcile_delivery"
    assert [d["run_id"] for d in lg.deliveries(status="ambiguous")] == [run]  # the view agrees
    assert lg.check() == []
    acts = watch_once(lg, name="wd")
    assert [(a.run_id, a.action, a.outcome) for a in acts] == [(run, "reconcile_delivery", "committed")]
    # A person looked at the target and settles it.
    lg.delivered(run, "v1", "found posted by hand", by="alice")
    assert lg.checkpoint(run).state == "delivered" and log_types(lg, run).count("delivery_confirmed") == 1
    lg.close()
