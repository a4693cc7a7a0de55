"""Who acted is logged under a real name, never the actor's kind repeated.

With ``USER`` unset, ``handoff revoke`` used to log ``operator:operator``, which says
nothing about who took the lease away. The name comes from ``--by``, then
``$HANDOFF_ACTOR``, then ``$USER`` / ``$LOGNAME``, then the uid's entry in the password
database (``uid-N`` if it has none); a worker writing without ``$HANDOFF_WORKER`` is
logged as the lease's holder, else as the login name.
"""

from __future__ import annotations

import os
import pwd
import subprocess

import pytest

from handoff import names
from handoff.facade import Ledger
from handoff.ledger.errors import InvalidInput
from tests.support import executable, working_run


ME = pwd.getpwuid(os.getuid()).pw_name
NAME_VARS = ("USER", "LOGNAME", "HANDOFF_ACTOR", "HANDOFF_WORKER", "HANDOFF_DB", "HANDOFF_RUN", "HANDOFF_LEASE")


def _env(**set_: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NAME_VARS}
    env.update(set_)
    return env


def _last_actor(db: str, run: str) -> str:
    with Ledger(db) as lg:
        return list(lg.log(run))[-1].actor


@pytest.fixture
def db(tmp_path) -> str:
    path = str(tmp_path / "l.db")
    with Ledger(path) as lg:
        TOKENS[path] = working_run(lg, "r1")
    return path


#: The lease token of each test ledger's run r1, as its claim returned it.
TOKENS: dict[str, str] = {}


@pytest.mark.parametrize("env, expected", [
    ({}, f"operator:{ME}"),  # no USER, no LOGNAME: the password database
    ({"LOGNAME": "carol"}, "operator:carol"),
    ({"USER": "dave", "LOGNAME": "carol"}, "operator:dave"),
    ({"HANDOFF_ACTOR": "oncall-bot", "USER": "dave"}, "operator:oncall-bot"),
])
def test_revoke_by_the_real_executable_names_who_acted(db, env, expected):
    before = _last_actor(db, "r1")
    proc = subprocess.run([*executable(), "--db", db, "revoke", "r1", "--reason", "host drained"],
                          capture_output=True, text=True, env=_env(**env))
    assert proc.returncode == 0, proc.stderr
    actor = _last_actor(db, "r1")
    assert actor == expected and actor != before
    assert actor != "operator:operator"


def test_by_wins_and_an_empty_by_is_refused_writing_nothing(db):
    with Ledger(db) as lg:
        n = len(list(lg.log("r1")))
    proc = subprocess.run([*executable(), "--db", db, "revoke", "r1", "--reason", "x", "--by", ""],
                          capture_output=True, text=True, env=_env(USER="dave"))
    assert proc.returncode == 2 and "--by" in proc.stderr, proc.stderr
    with Ledger(db) as lg:
        assert len(list(lg.log("r1"))) == n
    proc = subprocess.run([*executable(), "--db", db, "revoke", "r1", "--reason", "x", "--by", "erin"],
                          capture_output=True, text=True, env=_env(USER="dave"))
    assert proc.returncode == 0 and _last_actor(db, "r1") == "operator:erin"


def test_the_api_picks_the_same_names(db, monkeypatch):
    for var in NAME_VARS:
        monkeypatch.delenv(var, raising=False)
    with Ledger(db) as lg:
        lg.block("r1", "needs a token", "ask alice")
        assert list(lg.log("r1"))[-1].actor == f"operator:{ME}"
        lg.unblock("r1", "token given")
        child = lg.fork("r1", 2)
        assert list(lg.log(child))[0].actor == f"operator:{ME}"
        # no worker= and no HANDOFF_WORKER: the holder, as in the CLI (attrs, so the log records the beat)
        assert lg.heartbeat("r1", TOKENS[db], attrs={"step": "api"}).result.outcome == "committed"
        assert list(lg.log("r1"))[-1].actor == "worker:w1"  # was the login name: API and CLI differed
        with pytest.raises(InvalidInput) as info:
            lg.fork("r1", 2, by="  ")
        assert info.value.field == "by"


def test_a_uid_without_a_name_is_logged_by_number(monkeypatch):
    for var in NAME_VARS:
        monkeypatch.delenv(var, raising=False)

    def no_entry(uid: int) -> None:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert names.login_name() == f"uid-{os.getuid()}"
    assert names.operator_name() == f"uid-{os.getuid()}"


def test_a_cli_worker_without_handoff_worker_is_logged_as_the_holder(db):
    proc = subprocess.run([*executable(), "--db", db, "heartbeat", "r1", "--lease", TOKENS[db]],
                          capture_output=True, text=True, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert _last_actor(db, "r1") == "worker:w1"
