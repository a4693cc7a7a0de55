"""Hostile and malformed input, through the CLI and the Python API alike.

Every case is answered with a clear error that names the field, the documented exit
code (2 malformed input, 3 store problem, 1 refused by the rules) and a ledger file
whose bytes did not change. The bugs these tests found are pinned, fixed, near the end
of the file, and three hypothesis fuzzers check that no argv reaches a traceback and that
payload decoding and export parsing raise nothing but msgspec errors or InvalidInput.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import string
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import cli
from handoff.facade import Ledger
from handoff.ledger import events as ev
from handoff.ledger import jsonl
from handoff.ledger.errors import InvalidInput, LedgerError
from handoff.ledger.store import Actor, lease_digest
from handoff.reducers import commands as C

from .conftest import handoff, scale

#: The template's lease 1 is claimed with this secret; TOKEN is what its claim would print.
SECRET = "hostile-template-lease-secret-0001"
TOKEN = f"1.{SECRET}"
CLEAN_ENV = {"HANDOFF_DB": None, "HANDOFF_RUN": None, "HANDOFF_LEASE": None, "HANDOFF_WORKER": None,
             "HANDOFF_ACTOR": None}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("hostile")
    db = str(d / "template.db")
    with Ledger(db) as lg:
        lg.open(run_id="r1", goal="the goal", target="chat:#ops", owner="alice")
        # A claim with a known secret, so that the cases below can name the token.
        lg.execute("r1", C.Claim(worker="w1", token_digest=lease_digest(SECRET)), actor=Actor("worker", "w1"))
        lease = TOKEN
        lg.transition("r1", lease, "planning", worker="w1")
        lg.transition("r1", lease, "executing", worker="w1")
        lg.progress("r1", lease, "tool_outcome", "one step", key="s1", worker="w1")
    line = d / "export.jsonl"
    with Ledger(db, readonly=True) as lg:
        line.write_bytes(b"\n".join(lg.export(["r1"])) + b"\n")
    return {"db": db, "dir": str(d), "export": str(line)}


@pytest.fixture
def world(template, tmp_path) -> dict[str, str]:
    """A fresh copy of the ledger, an artifact root with traps, and hostile files."""
    db = str(tmp_path / "l.db")
    shutil.copy(template["db"], db)
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.txt").write_text("fine\n")
    (root / "sub").mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("outside the root\n")
    (root / "escape").symlink_to(outside)
    os.mkfifo(root / "fifo")
    return {"db": db, "root": str(root), "outside": str(outside), "tmp": str(tmp_path),
            "export": template["export"]}


def write(world: dict[str, str], name: str, data: bytes) -> str:
    path = os.path.join(world["tmp"], name)
    with open(path, "wb") as f:
        f.write(data)
    return path


# --- hostile database files ----------------------------------------------------------


def non_ledger(world: dict[str, str]) -> str:
    path = os.path.join(world["tmp"], "other.db")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ann')")
    conn.commit()
    conn.close()
    return path


def truncated(world: dict[str, str]) -> str:
    path = os.path.join(world["tmp"], "truncated.db")
    shutil.copy(world["db"], path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)
    return path


def flipped_header(world: dict[str, str]) -> str:
    path = os.path.join(world["tmp"], "flipped.db")
    shutil.copy(world["db"], path)
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"SQLite format 4\x00")
    return path


def newer_schema(world: dict[str, str]) -> str:
    path = os.path.join(world["tmp"], "newer.db")
    shutil.copy(world["db"], path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE handoff_meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    return path


def text_file(world: dict[str, str]) -> str:
    return write(world, "notes.db", b"these are my notes, not a database\n" * 200)


def a_directory(world: dict[str, str]) -> str:
    return world["root"]


def a_fifo(world: dict[str, str]) -> str:
    return os.path.join(world["root"], "fifo")


def missing(world: dict[str, str]) -> str:
    return os.path.join(world["tmp"], "typo.db")


# --- the cases -------------------------------------------------------------------------

Args = list[str] | Callable[[dict[str, str]], list[str]]
Api = Callable[[Ledger, dict[str, str]], Any]


@dataclasses.dataclass
class Case:
    category: str
    name: str
    cli: Args | None
    code: int
    says: str  # the CLI's error names this (case-insensitive)
    api: Api | None = None
    field: str | None = None  # InvalidInput.field the API names
    db: Callable[[dict[str, str]], str] | None = None  # a hostile ledger file instead of the good one
    env: dict[str, str] | None = None
    stdin: bytes | None = None
    api_code: int | None = None  # when the API answers with another code than the CLI


P = ["progress", "r1", "--lease", TOKEN, "--kind", "tool_outcome"]
OPEN = ["open", "--target", "chat:#ops", "--owner", "alice"]
NESTED = "[" * 900 + "]" * 900


def contract(world, data: bytes) -> list[str]:
    return ["open", "--contract", write(world, "contract.json", data)]


def good_contract(**kw: Any) -> bytes:
    return json.dumps({"goal": "g", "target": "chat:#ops", "owner": "alice", **kw}).encode()


def export_line(world: dict[str, str], **change: Any) -> bytes:
    line = json.loads(open(world["export"], "rb").readline())
    line.update(change)
    return json.dumps(line).encode() + b"\n"


CASES = [
    # 1 malformed JSON
    Case("malformed JSON", "contract cut short", lambda w: contract(w, b'{"goal": "g", "target": '), 2,
         "not valid JSON", lambda lg, w: lg.open_contract(b'{"goal": "g", "target": '), "contract"),
    Case("malformed JSON", "contract is a list", lambda w: contract(w, b"[1, 2]"), 2, "JSON object",
         lambda lg, w: lg.open_contract(b"[1, 2]"), "contract"),
    Case("malformed JSON", "contract with unknown field", lambda w: contract(w, good_contract(admin=True)), 2,
         "admin", lambda lg, w: lg.open_contract(good_contract(admin=True)), "admin"),
    Case("malformed JSON", "import line not JSON", lambda w: ["import", write(w, "x.jsonl", b"{not json\n")], 2,
         "line 1", lambda lg, w: lg.import_lines([b"{not json"]), "line 1"),
    Case("malformed JSON", "import line of the wrong shape", lambda w: ["import", write(w, "x.jsonl", b"[1,2]\n")],
         2, "line 1", lambda lg, w: lg.import_lines([b"[1,2]"]), "line 1"),
    Case("malformed JSON", "import line with a forged hash",
         lambda w: ["import", write(w, "x.jsonl", export_line(w, hash="00" * 32))], 2, "does not match its hash",
         lambda lg, w: lg.import_lines([export_line(w, hash="00" * 32)]), "line 1"),
    # 2 invalid UTF-8 (argv and import lines: see the pinned bugs below)
    Case("invalid UTF-8", "contract bytes", lambda w: contract(w, b'{"goal": "\xff\xfe", "target": "t", "owner": "o"}'),
         2, "UTF-8", lambda lg, w: lg.open_contract(b'{"goal": "\xff\xfe", "target": "t", "owner": "o"}'), "contract"),
    Case("invalid UTF-8", "contract via stdin", ["open", "--contract", "-"], 2, "UTF-8",
         lambda lg, w: lg.open_contract(b"\xc3\x28"), "contract", stdin=b"\xc3\x28"),
    # 3 NUL and control characters
    Case("NUL and control characters", "NUL in detail", [*P, "--detail", "a\x00b"], 2, "detail",
         lambda lg, w: lg.progress("r1", TOKEN, "tool_outcome", "a\x00b"), "detail"),
    Case("NUL and control characters", "terminal escape in goal", [*OPEN, "--goal", "\x1b[2Jgone"], 2, "goal",
         lambda lg, w: lg.open(goal="\x1b[2Jgone", target="t", owner="o"), "goal"),
    Case("NUL and control characters", "newline in a one-line target", ["open", "--goal", "g", "--target", "a\nb",
                                                                         "--owner", "o"], 2, "target",
         lambda lg, w: lg.open(goal="g", target="a\nb", owner="o"), "target"),
    Case("NUL and control characters", "bell in a worker name", ["claim", "r1", "--worker", "w\x07"], 2, "name",
         lambda lg, w: lg.claim("r1", "w\x07"), "actor.name"),
    Case("NUL and control characters", "NUL in an idempotency key", [*P, "--key", "k\x00"], 2, "idempotency key",
         lambda lg, w: lg.progress("r1", TOKEN, "tool_outcome", key="k\x00"), "idempotency_key"),
    Case("NUL and control characters", "NUL in a contract", lambda w: contract(w, good_contract(goal="a\u0000b")),
         2, "goal", lambda lg, w: lg.open_contract(good_contract(goal="a\u0000b")), "goal"),
    # 4 NaN and infinities
    Case("NaN and infinities", "heartbeat timeout nan", [*OPEN, "--goal", "g", "--heartbeat-timeout", "nan"], 2,
         "heartbeat_timeout", lambda lg, w: lg.open(goal="g", target="t", owner="o", heartbeat_timeout_s=float("nan")),
         "heartbeat_timeout"),
    Case("NaN and infinities", "progress timeout inf", [*OPEN, "--goal", "g", "--progress-timeout", "inf"], 2,
         "progress_timeout", lambda lg, w: lg.open(goal="g", target="t", owner="o", progress_timeout_s=float("inf")),
         "progress_timeout"),
    Case("NaN and infinities", "delivery timeout -inf", [*OPEN, "--goal", "g", "--delivery-timeout", "-inf"], 2,
         "delivery_timeout", lambda lg, w: lg.open(goal="g", target="t", owner="o", delivery_timeout_s=-float("inf")),
         "delivery_timeout"),
    Case("NaN and infinities", "NaN literal in a contract",
         lambda w: contract(w, b'{"goal": "g", "target": "t", "owner": "o", "policy": {"retry_budget": NaN}}'), 2,
         "NaN", lambda lg, w: lg.open_contract(b'{"goal":"g","target":"t","owner":"o","policy":{"retry_budget":NaN}}'),
         "contract"),
    # 5 huge numbers
    Case("huge numbers", "retry budget 10^30", [*OPEN, "--goal", "g", "--retry-budget", str(10**30)], 2,
         "retry_budget", lambda lg, w: lg.open(goal="g", target="t", owner="o", retry_budget=10**30), "retry_budget"),
    Case("huge numbers", "owner cap 10^30", [*OPEN, "--goal", "g", "--owner-cap", str(10**30)], 2, "owner_cap",
         lambda lg, w: lg.open(goal="g", target="t", owner="o", owner_cap=10**30), "owner_cap"),
    Case("huge numbers", "lease 10^30", ["heartbeat", "r1", "--lease", str(10**30)], 2, "lease",
         lambda lg, w: lg.heartbeat("r1", 10**30), "lease"),
    Case("huge numbers", "fork at seq 10^30", ["fork", "r1", "--at", str(10**30)], 2, "at_seq",
         lambda lg, w: lg.fork("r1", 10**30), "at_seq"),
    Case("huge numbers", "1e400 in a contract",
         lambda w: contract(w, b'{"goal": "g", "target": "t", "owner": "o", "policy": {"owner_cap": 1e400}}'), 2,
         "owner_cap", lambda lg, w: lg.open_contract(b'{"goal":"g","target":"t","owner":"o","policy":{"owner_cap":1e400}}'),
         "policy.owner_cap"),
    # 6 deeply nested detail
    Case("deeply nested detail", "nested arrays as a contract goal",
         lambda w: contract(w, b'{"goal": ' + NESTED.encode() + b', "target": "t", "owner": "o"}'), 2, "goal",
         lambda lg, w: lg.open_contract('{"goal": ' + NESTED + ', "target": "t", "owner": "o"}'), "goal"),
    Case("deeply nested detail", "nested payload in an import line",
         lambda w: ["import", write(w, "x.jsonl", export_line(w, payload=json.loads(NESTED[:400] + NESTED[-400:])))],
         2, "line 1", lambda lg, w: lg.import_lines([export_line(w, payload=[[[[[]]]]])]), "line 1"),
    Case("deeply nested detail", "a nested structure as detail (API)", None, 2, "",
         lambda lg, w: lg.progress("r1", TOKEN, "tool_outcome", [[[[["deep"]]]]]), "detail"),
    # 7 oversized payloads
    Case("oversized payloads", "detail of 20,000 characters", [*P, "--detail", "x" * 20_000], 2, "detail",
         lambda lg, w: lg.progress("r1", TOKEN, "tool_outcome", "x" * 20_000), "detail"),
    Case("oversized payloads", "goal of 100,000 characters", [*OPEN, "--goal", "g" * 100_000], 2, "goal",
         lambda lg, w: lg.open(goal="g" * 100_000, target="t", owner="o"), "goal"),
    Case("oversized payloads", "10 MB contract", lambda w: contract(w, good_contract(goal="x" * 10_000_000)), 2,
         "longer than", lambda lg, w: lg.open_contract(good_contract(goal="x" * 10_000_000)), "goal"),
    Case("oversized payloads", "2 MiB event appended to the raw store", None, 2, "",
         lambda lg, w: lg.store.append("r1", [ev.ProgressRecorded(kind="note", detail="x" * (2 << 20))],
                                       actor=Actor("operator", "x")), "events[0]"),
    # 8 empty run ids
    Case("empty run ids", "status of ''", ["status", ""], 2, "run_id", lambda lg, w: lg.checkpoint(""), "run_id"),
    Case("empty run ids", "progress on ''", ["progress", "", "--lease", TOKEN, "--kind", "note"], 2, "run_id",
         lambda lg, w: lg.progress("", TOKEN, "note"), "run_id"),
    Case("empty run ids", "contract run_id ''", lambda w: contract(w, good_contract(run_id="")), 2, "run_id",
         lambda lg, w: lg.open_contract(good_contract(run_id="")), "run_id"),
    # 9 overlong run ids
    Case("overlong run ids", "129-character run id", ["status", "r" * 129], 2, "run_id",
         lambda lg, w: lg.heartbeat("r" * 129, TOKEN), "run_id"),
    Case("overlong run ids", "open with a 4,000-character run id", [*OPEN, "--goal", "g", "--run-id", "r" * 4000], 2,
         "run_id", lambda lg, w: lg.open(goal="g", target="t", owner="o", run_id="r" * 4000), "run_id"),
    # 10 run ids that look like SQL
    Case("run ids that look like SQL", "quote injection", ["status", "r1' OR '1'='1"], 2, "run_id",
         lambda lg, w: lg.checkpoint("r1' OR '1'='1"), "run_id"),
    Case("run ids that look like SQL", "statement injection", ["log", "r1; DROP TABLE events;--"], 2, "run_id",
         lambda lg, w: list(lg.log("r1; DROP TABLE events;--")), "run_id"),
    # 11 run ids that look like paths
    Case("run ids that look like paths", "traversal", [*OPEN, "--goal", "g", "--run-id", "../../etc/passwd"], 2,
         "run_id", lambda lg, w: lg.open(goal="g", target="t", owner="o", run_id="../../etc/passwd"), "run_id"),
    Case("run ids that look like paths", "absolute path", ["status", "/etc/passwd"], 2, "run_id",
         lambda lg, w: lg.status("/etc/passwd"), "run_id"),
    Case("run ids that look like paths", "fork into a path", ["fork", "r1", "--at", "2", "--run-id", "a/b"], 2,
         "run id", lambda lg, w: lg.fork("r1", 2, new_run_id="a/b"), "new_run_id"),
    # 12 unknown states
    Case("unknown states", "transition to 'flying'", ["transition", "r1", "--lease", TOKEN, "--to", "flying"], 2,
         "to must be one of", lambda lg, w: lg.transition("r1", TOKEN, "flying"), "to"),
    Case("unknown states", "close as 'exploded'", ["close", "r1", "--by", "alice", "--disposition", "exploded"], 2,
         "--disposition",
         lambda lg, w: lg.close_run("r1", "exploded", by="alice"), "disposition"),
    # 13 unknown kinds
    Case("unknown kinds", "progress kind 'flying'", [*P[:4], "--kind", "flying"], 2, "kind",
         lambda lg, w: lg.progress("r1", TOKEN, "flying"), "kind"),
    Case("unknown kinds", "evidence outcome 'maybe'", ["evidence", "r1", "--kind", "tests", "--outcome", "maybe"], 2,
         "--outcome", lambda lg, w: lg.evidence("r1", "tests", "maybe", actor=Actor("operator", "x")), "outcome"),
    Case("unknown kinds", "actor kind 'god'", None, 2, "",
         lambda lg, w: lg.evidence("r1", "tests", "pass", actor=Actor("god", "x")), "actor"),
    Case("unknown kinds", "import line of an unknown event type",
         lambda w: ["import", write(w, "x.jsonl", export_line(w, type="made_up", payload={"type": "made_up"}))], 2,
         "line 1", lambda lg, w: lg.import_lines([export_line(w, type="made_up", payload={"type": "made_up"})]),
         "line 1"),
    Case("unknown kinds", "recovery action 'nuke'", None, 2, "",
         lambda lg, w: lg.recover("r1", "nuke", "stalled", 1, watcher="wd"), "action"),
    # 14 negative seqs
    Case("negative seqs", "replay --at -1", ["replay", "r1", "--at", "-1"], 2, "--at",
         lambda lg, w: lg.checkpoint("r1", at_seq=-1), "at"),
    Case("negative seqs", "log --after -5", ["log", "r1", "--after", "-5"], 2, "--after",
         lambda lg, w: lg.store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("operator", "x"),
                                       expected_seq=-5), "expected_seq"),
    Case("negative seqs", "fork --at 0", ["fork", "r1", "--at", "0"], 2, "--at",
         lambda lg, w: lg.fork("r1", 0), "at_seq"),
    # 15 non-integer seqs
    Case("non-integer seqs", "replay --at 1.5", ["replay", "r1", "--at", "1.5"], 2, "--at",
         lambda lg, w: lg.store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("operator", "x"),
                                       expected_seq=1.5), "expected_seq"),
    Case("non-integer seqs", "fork --at abc", ["fork", "r1", "--at", "abc"], 2, "--at",
         lambda lg, w: lg.fork("r1", 0.5), "at_seq"),
    Case("non-integer seqs", "unblock --blocker x", ["unblock", "r1", "--resolution", "r", "--blocker", "x"], 2,
         "--blocker", lambda lg, w: lg.observe("r1", "stalled", 1.5, watcher="wd"), "progress_seq"),
    # 16 negative or non-integer leases
    Case("negative or non-integer leases", "lease -1", ["heartbeat", "r1", "--lease", "-1"], 2, "--lease",
         lambda lg, w: lg.heartbeat("r1", -1), "lease"),
    Case("negative or non-integer leases", "lease 0", ["heartbeat", "r1", "--lease", "0"], 2, "--lease",
         lambda lg, w: lg.heartbeat("r1", 0), "lease"),
    Case("negative or non-integer leases", "lease 1.5", ["heartbeat", "r1", "--lease", "1.5"], 2, "--lease",
         lambda lg, w: lg.heartbeat("r1", 1.5), "lease"),
    Case("negative or non-integer leases", "lease 'abc' from the environment", ["heartbeat", "r1"], 2, "--lease",
         lambda lg, w: lg.heartbeat("r1", "1"), "lease", env={"HANDOFF_LEASE": "abc"}),
    Case("negative or non-integer leases", "lease True", None, 2, "", lambda lg, w: lg.heartbeat("r1", True), "lease"),
    Case("negative or non-integer leases", "raw store lease 0", None, 2, "",
         lambda lg, w: lg.store.append("r1", [ev.HeartbeatRecorded()], actor=Actor("worker", "w1"), lease=0), "lease"),
    # 17 unparseable times
    Case("unparseable times", "--now yesterday", ["status", "--now", "yesterday"], 2, "--now"),
    Case("unparseable times", "--as-of month 13", ["replay", "r1", "--as-of", "2026-13-45T00:00:00Z"], 2, "--as-of",
         lambda lg, w: lg.checkpoint("r1", as_of_us=-10**15), "as_of"),
    Case("unparseable times", "--now empty", ["stalls", "--now", ""], 2, "--now"),
    # 18 times in the future (accepted read-only and out of range are tested below)
    Case("times in the future", "--as-of beyond year 9999", ["replay", "r1", "--as-of", "10000-01-01T00:00:00Z"], 2,
         "--as-of"),
    # 19 artifact paths
    Case("artifact paths", "'..' out of the root",
         lambda w: ["artifact", "r1", "--lease", TOKEN, "--root", w["root"], os.path.join(w["root"], "..", "secret.txt")],
         2, "outside the declared root",
         lambda lg, w: lg.artifact("r1", TOKEN, os.path.join(w["root"], "..", "secret.txt"), root=w["root"]), "path"),
    Case("artifact paths", "absolute path outside the root",
         lambda w: ["artifact", "r1", "--lease", TOKEN, "--root", w["root"], "/etc/passwd"], 2, "outside the declared root",
         lambda lg, w: lg.artifact("r1", TOKEN, "/etc/passwd", root=w["root"]), "path"),
    Case("artifact paths", "symlink out of the root",
         lambda w: ["artifact", "r1", "--lease", TOKEN, "--root", w["root"], os.path.join(w["root"], "escape")], 2,
         "outside the declared root",
         lambda lg, w: lg.artifact("r1", TOKEN, os.path.join(w["root"], "escape"), root=w["root"]), "path"),
    Case("artifact paths", "a directory", lambda w: ["artifact", "r1", "--lease", TOKEN, os.path.join(w["root"], "sub")],
         2, "directory", lambda lg, w: lg.artifact("r1", TOKEN, os.path.join(w["root"], "sub")), "path"),
    Case("artifact paths", "a FIFO (must not hang)",
         lambda w: ["artifact", "r1", "--lease", TOKEN, os.path.join(w["root"], "fifo")], 2, "not a regular file",
         lambda lg, w: lg.artifact("r1", TOKEN, os.path.join(w["root"], "fifo")), "path"),
    Case("artifact paths", "a device", ["artifact", "r1", "--lease", TOKEN, "/dev/zero"], 2, "not a regular file",
         lambda lg, w: lg.artifact("r1", TOKEN, "/dev/zero"), "path"),
    Case("artifact paths", "NUL in the path", ["artifact", "r1", "--lease", TOKEN, "a\x00b"], 2, "path",
         lambda lg, w: lg.artifact("r1", TOKEN, "a\x00b"), "path"),
    # 20-23 hostile ledger files
    Case("a non-ledger SQLite file", "status", ["status"], 3, "not a handoff ledger",
         lambda lg, w: None, db=non_ledger),
    Case("a non-ledger SQLite file", "progress", [*P, "--detail", "x"], 3, "not a handoff ledger", db=non_ledger),
    Case("a non-ledger file", "plain text", ["log", "r1"], 3, "not a database", lambda lg, w: None, db=text_file),
    Case("a truncated database", "status", ["status", "r1"], 3, "damaged", lambda lg, w: None, db=truncated),
    Case("a truncated database", "verify", ["verify"], 3, "damaged", db=truncated),
    Case("a byte-flipped database", "header", ["status"], 3, "header is damaged", lambda lg, w: None, db=flipped_header),
    Case("a ledger with a newer schema", "status", ["status"], 3, "newer", lambda lg, w: None, db=newer_schema),
    Case("a ledger with a newer schema", "progress", [*P, "--detail", "x"], 3, "newer", db=newer_schema),
    # click refuses a directory for --db before the ledger is asked (usage, exit 2).
    Case("not a file", "--db is a directory", ["status"], 2, "--db", lambda lg, w: None, db=a_directory, api_code=3),
    Case("not a file", "--db is a FIFO", ["status"], 3, "not a regular file", lambda lg, w: None, db=a_fifo),
    Case("not a file", "--db is a device", ["status"], 3, "not a regular file", lambda lg, w: None, db=lambda w: "/dev/null"),
    Case("missing ledger", "a mistyped --db", ["status"], 3, "no ledger", lambda lg, w: None, db=missing),
    # usage
    Case("unknown verbs and options", "verb", ["frobnicate"], 2, "No such command"),
    Case("unknown verbs and options", "option", [*P, "--bogus"], 2, "No such option"),
    Case("unknown verbs and options", "negative busy timeout", ["--busy-timeout", "-1", "status"], 2,
         "--busy-timeout"),
    Case("unknown verbs and options", "run without a command", ["run", "--worker", "w", "--run", "r1"], 2, "CMD"),
]
CATEGORIES = sorted({c.category for c in CASES})


def snapshot(path: str) -> tuple[bool, bytes | None, bool]:
    if not os.path.exists(path) or not os.path.isfile(path):
        return (os.path.exists(path), None, os.path.exists(path + "-wal"))
    with open(path, "rb") as f:
        return (True, f.read(), os.path.exists(path + "-wal"))


def invoke(args: list[str], *, env: dict[str, str] | None = None, stdin: bytes | None = None) -> Any:
    return CliRunner().invoke(cli.main, args, env={**CLEAN_ENV, **(env or {})}, input=stdin)


def no_traceback(res: Any) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"uncaught {type(res.exception).__name__}: {res.exception}")
    assert "Traceback" not in res.output + res.stderr


def test_at_least_twenty_categories():
    assert len(CATEGORIES) >= 20, CATEGORIES


@pytest.mark.parametrize("case", [c for c in CASES if c.cli is not None], ids=lambda c: f"{c.category}: {c.name}")
def test_cli_refuses_hostile_input(world, case, evidence):
    path = case.db(world) if case.db else world["db"]
    args = case.cli(world) if callable(case.cli) else case.cli
    before = snapshot(path)
    res = invoke(["--db", path, *args], env=case.env, stdin=case.stdin)
    no_traceback(res)
    assert res.exit_code == case.code, f"exit {res.exit_code}, wanted {case.code}: {res.stderr}"
    assert case.says.lower() in res.stderr.lower(), res.stderr
    assert res.stdout == "" or case.code == 0
    assert snapshot(path) == before, "the ledger file changed"
    evidence.add("hostile.cli", category=case.category, case=case.name, exit=res.exit_code,
                 error=res.stderr.strip().splitlines()[-1][:160])


@pytest.mark.parametrize("case", [c for c in CASES if c.api is not None], ids=lambda c: f"{c.category}: {c.name}")
def test_api_refuses_hostile_input(world, case, evidence):
    path = case.db(world) if case.db else world["db"]
    before = snapshot(path)
    with pytest.raises(LedgerError) as info:
        if case.db:
            Ledger(path, create=False).close()
        else:
            with Ledger(path) as lg:
                case.api(lg, world)
    err = info.value
    assert err.exit_code == (case.api_code or case.code), (type(err).__name__, err.message)
    if case.field is not None:
        assert isinstance(err, InvalidInput) and err.field == case.field, (err.field, err.message)
    assert snapshot(path) == before, "the ledger file changed"
    evidence.add("hostile.api", category=case.category, case=case.name, error=err.type, field=getattr(err, "field", None),
                 exit=err.exit_code)


# --- the rest of the hostile list ------------------------------------------------------


def test_real_processes_get_the_same_exit_codes(world):
    """A few through the installed executable: what a shell agent really sees."""
    db = world["db"]
    before = snapshot(db)
    nan = handoff(*OPEN, "--goal", "g", "--heartbeat-timeout", "nan", db=db)
    sql = handoff("status", "r1' OR '1'='1", db=db)
    stale = handoff(*P, "--lease", f"7.{SECRET}", "--detail", "x", db=db)
    bare = handoff(*P, "--lease", "1", "--detail", "x", db=db)
    other = handoff("status", db=non_ledger(world))
    assert (nan.returncode, sql.returncode, stale.returncode, bare.returncode, other.returncode) == (2, 2, 1, 2, 3)
    assert "heartbeat_timeout" in nan.stderr and "run_id" in sql.stderr and "never issued" in stale.stderr
    assert "bare lease number" in bare.stderr
    assert "Traceback" not in nan.stderr + sql.stderr + stale.stderr + bare.stderr + other.stderr
    assert snapshot(db) == before


def test_missing_artifact_is_recorded_as_missing_and_blocks_submit(world, evidence):
    """A missing file is not an input error: it is recorded as MISSING (what the worker
    claimed, measured), and submit then refuses (exit 1) instead of trusting it."""
    gone = os.path.join(world["tmp"], "never-written.md")
    res = invoke(["--db", world["db"], "artifact", "r1", "--lease", TOKEN, gone, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["artifact"]["exists"] is False
    with Ledger(world["db"]) as lg:
        lg.transition("r1", TOKEN, "verifying", worker="w1")
    before = snapshot(world["db"])
    sub = invoke(["--db", world["db"], "submit", "r1", "--lease", TOKEN])
    assert sub.exit_code == 1 and "missing" in sub.stderr, sub.stderr
    assert snapshot(world["db"]) == before
    evidence.add("hostile.cli", category="artifact paths", case="missing file, then submit", exit=sub.exit_code,
                 error=sub.stderr.strip()[:160])


def test_times_in_the_future_are_read_only(world, evidence):
    """--now and --as-of in the future are allowed (audits, 'what will the watchdog say'),
    and a read never writes: the file is unchanged."""
    before = snapshot(world["db"])
    codes = []
    for args in (["status", "r1", "--now", "2999-01-01T00:00:00Z"], ["stalls", "--now", "2999-01-01T00:00:00Z"],
                 ["replay", "r1", "--as-of", "2999-01-01T00:00:00Z", "--json"]):
        res = invoke(["--db", world["db"], *args])
        no_traceback(res)
        codes.append(res.exit_code)
    assert codes == [0, 0, 0]
    assert snapshot(world["db"]) == before
    evidence.add("hostile.cli", category="times in the future", case="read verbs at 2999-01-01", exit=0,
                 error="accepted read-only; file unchanged")


def test_byte_flipped_event_is_found_by_verify(world, evidence):
    """A flipped byte inside a stored event (bit rot, a bad copy) is named by verify."""
    path = os.path.join(world["tmp"], "bitrot.db")
    shutil.copy(world["db"], path)
    data = bytearray(open(path, "rb").read())
    at = data.find(b"one step")
    assert at > 0
    data[at] ^= 0x20  # 'o' -> 'O': still valid UTF-8 and JSON, only the hash can tell
    open(path, "wb").write(bytes(data))
    with Ledger(path) as lg:
        problems = lg.verify()
        pos = next(r.position for r in lg.store.read_all() if r.type == "progress_recorded")
    assert [(p.kind, p.position) for p in problems] == [("bad_hash", pos)]
    res = invoke(["--db", path, "verify", "--json"])
    assert res.exit_code == 4 and json.loads(res.stdout)["problems"][0]["position"] == pos
    evidence.add("hostile.cli", category="a byte-flipped database", case="flipped byte inside an event", exit=4,
                 error=f"bad_hash at position {pos}")


def test_refused_import_into_a_new_file_leaves_nothing(world):
    target = os.path.join(world["tmp"], "fresh.db")
    res = invoke(["--db", target, "import", write(world, "bad.jsonl", b"{not json\n")])
    assert res.exit_code == 2
    assert not any(os.path.exists(target + s) for s in ("", "-wal", "-shm"))


# --- bugs found by these tests, now fixed: each test pins its fix ------------------------


def test_invalid_utf8_in_argv_is_refused_with_exit_2(world):
    """Lone surrogates (what Python makes of invalid UTF-8 in argv) used to reach the event
    encoder and die there; the CLI now refuses the option and the API the field (exit 2)."""
    before = snapshot(world["db"])
    r = handoff(*P, "--detail", b"bad \xff utf-8", db=world["db"])
    assert r.returncode == 2 and "detail" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with Ledger(world["db"]) as lg:
        with pytest.raises(InvalidInput):
            lg.progress("r1", TOKEN, "tool_outcome", "bad \udcff utf-8")
    assert snapshot(world["db"]) == before


def test_invalid_utf8_in_an_import_line_is_refused_with_exit_2(world):
    """Invalid UTF-8 inside a JSON string of an import line is InvalidInput naming the line,
    and a failed import into a new file leaves no file behind, whatever the error."""
    target = os.path.join(world["tmp"], "fresh.db")
    res = invoke(["--db", target, "import", write(world, "bad.jsonl", b'{"run_id": "\xff"}\n')])
    no_traceback(res)
    assert res.exit_code == 2 and not os.path.exists(target)


def test_huge_integers_in_an_import_line_are_refused_with_exit_2(world):
    """Integers of an export line are bounded to 64 bits when decoded: no OverflowError
    from the hash's msgpack header or from SQLite."""
    before = snapshot(world["db"])
    res = invoke(["--db", world["db"], "import", write(world, "x.jsonl", export_line(world, recorded_us=10**30))])
    no_traceback(res)
    assert res.exit_code == 2 and snapshot(world["db"]) == before


@pytest.mark.parametrize("doc", [
    b'{"goal": ' + b"[" * 100_000 + b"]" * 100_000 + b', "target": "t", "owner": "o"}',
    b'{"goal": "g", "target": "t", "owner": "o", "policy": {"owner_cap": 1' + b"0" * 5000 + b"}}",
], ids=["nested 100,000 deep", "5,001-digit integer"])
def test_pathological_contract_json_is_refused_with_exit_2(world, doc):
    """contract.load turns RecursionError and the integer-digits ValueError into InvalidInput."""
    before = snapshot(world["db"])
    res = invoke(["--db", world["db"], *contract(world, doc)])
    no_traceback(res)
    assert res.exit_code == 2 and snapshot(world["db"]) == before


@pytest.mark.parametrize("args", [
    ["stalls", "--now", "0001-01-01T00:00:00+14:00"],
    ["stalls", "--now", "9999-12-31T23:59:59-14:00", "--json"],
    ["replay", "r1", "--as-of", "9999-12-31T23:59:59-14:00"],
], ids=["before year 1", "after year 9999", "replay after year 9999"])
def test_times_out_of_range_are_refused_with_exit_2(world, args):
    """A time whose UTC value falls outside years 1..9999 could not be printed; IsoTime
    converts to UTC and refuses it as a usage error naming the option."""
    res = invoke(["--db", world["db"], *args])
    no_traceback(res)
    assert res.exit_code == 2 and "--" in res.stderr


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_busy_timeout_nan_or_inf_is_refused_with_exit_2(world, value):
    """FloatRange lets nan through; the option refuses non-finite values (and the API too)."""
    res = invoke(["--db", world["db"], "--busy-timeout", value, "status"])
    no_traceback(res)
    assert res.exit_code == 2


def test_watch_interval_nan_is_refused_before_the_loop(world):
    """A nan interval would never wait and fail every pass: refused once, before the loop."""
    import subprocess as sp

    from .conftest import child_env, executable

    p = sp.Popen([*executable(), "--db", world["db"], "watch", "--name", "wd", "--interval", "nan"],
                 env=child_env(), stdout=sp.PIPE, stderr=sp.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=3)
    except sp.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    assert p.returncode == 2 and err.count("\n") <= 2, err[:300]


def test_watch_without_a_name_works(world):
    """The default name was watchdog@<host>, and '@' is not allowed in the stream
    watcher:<name>; it is now watchdog-<host>, the host kept to the run-id alphabet."""
    res = invoke(["--db", world["db"], "watch", "--once"])
    assert res.exit_code == 0, res.stderr


def test_verify_of_an_unknown_run_is_a_clear_error(world):
    """An unknown RUN is UnknownRun (exit 1) naming it, not an AttributeError."""
    res = invoke(["--db", world["db"], "verify", "nosuchrun"])
    no_traceback(res)
    assert res.exit_code == 1 and "nosuchrun" in res.stderr


def test_empty_run_id_on_open_is_refused(world):
    """'' is refused by check_run_id, not silently replaced by a generated id."""
    before = snapshot(world["db"])
    res = invoke(["--db", world["db"], *OPEN, "--goal", "g", "--run-id", ""])
    assert res.exit_code == 2 and "run_id" in res.stderr
    with Ledger(world["db"]) as lg, pytest.raises(InvalidInput):
        lg.open(goal="g", target="t", owner="o", run_id="")
    assert snapshot(world["db"]) == before


@pytest.mark.parametrize("call", [
    lambda lg: lg.checkpoint("r1", at_seq="3"),
    lambda lg: lg.checkpoint("r1", at_seq=1.5),
    lambda lg: lg.status("r1", now="x"),
    lambda lg: lg.stalls(now=10**30),
    lambda lg: list(lg.store.read_run("r1", after_seq=10**30)),
    lambda lg: Ledger("a\x00b"),
    lambda lg: lg.fork("r1", "abc"),
], ids=["at_seq str", "at_seq float", "now str", "now 10^30", "after_seq 10^30", "NUL in path", "fork at 'abc'"])
def test_api_number_and_path_arguments_are_validated(world, call):
    """Numbers (ints, not bools, within range; times within years 1..9999) and the ledger
    path are checked like handoff.ledger.inputs.count does, with InvalidInput naming the field."""
    with Ledger(world["db"]) as lg, pytest.raises(InvalidInput):
        call(lg)


# --- fuzzing --------------------------------------------------------------------------

#: Values the fuzzer draws option values from, besides random text: among them ISO times
#: at and beyond the ends of years 1..9999 in UTC, nan and infinities (for --interval and
#: the global --busy-timeout too) and invalid UTF-8 as Python decodes it from argv (lone
#: surrogates; hypothesis text() never makes them, so random bytes are decoded the same
#: way below). NUL is left out: a real argv cannot carry one (execve), and the table
#: above sends it where the CLI reads text.
INTERESTING = ["", "0", "1", "-1", "1.5", "nan", "inf", "-inf", "1e400", str(10**30), str(2**63), "r1", "w1",
               "alice", "../x", "/etc/passwd", "-", "--", "2026-05-01T12:00:00Z", "2999-01-01", "yesterday",
               "\x1b[2J", "\t", "x" * 300, "note", "tool_outcome", "executing", "done", "pass", "no-op", "{}",
               "'; DROP TABLE events;--", "0001-01-01T00:00:00+14:00", "0001-01-01T00:00:00Z",
               "9999-12-31T23:59:59-14:00", "9999-12-31T23:59:59.999999Z", "bad \udcff utf-8", "\udcc3\udc28",
               "nosuchrun"]
#: Every verb but 'run' (it starts the command it is given) and 'demo' (ten seconds of
#: real processes); 'watch' always gets --once.
#: Not fuzzed here: 'run' and 'demo' start processes, and 'serve' serves until it is stopped
#: (its arguments and requests are tested in tests/serve).
VERBS = sorted(set(cli.main.commands) - {"run", "demo", "serve"})
GOOD = ["r1", "1", "w1", "alice", "executing", "verifying", "tool_outcome", "note", "pass", "done", "k1",
        "2026-05-01T12:00:00Z"]
#: A sensible value per option, so that most invocations get past click to the ledger.
SENSIBLE = {"--lease": TOKEN, "--to": "verifying", "--kind": "tool_outcome", "--outcome": "pass", "--as": "no-op",
            "--disposition": "no-op",
            "--action": "deliver", "--at": "2", "--after": "1", "--now": "2026-05-01T12:00:00Z",
            "--as-of": "2999-01-01T00:00:00Z", "--worker": "w1", "--by": "alice", "--key": "k1", "--owner": "alice",
            "--goal": "g", "--target": "chat:#ops", "--run-id": "r2", "--heartbeat-timeout": "30",
            "--progress-timeout": "60", "--retry-budget": "2", "--owner-cap": "3", "--delivery-timeout": "60",
            "--type": "progress_recorded", "--state": "executing", "--projection": "checkpoints", "--blocker": "1",
            "--interval": "1", "--name": "fuzz", "-o": "out.jsonl", "--output": "out.jsonl", "--contract": "-",
            "--busy-timeout": "5", "--write": "anchor.head"}
argv_bytes = st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape").replace("\x00", ""))
value = st.one_of(st.sampled_from(INTERESTING), st.sampled_from(GOOD), st.text(alphabet=string.printable, max_size=12),
                  argv_bytes)


def option_value(name: str) -> Any:
    sensible = SENSIBLE.get(name, "x")
    return st.integers(0, 9).flatmap(lambda r: st.just(sensible) if r < 6 else value)


@st.composite
def invocations(draw: Any) -> list[str]:
    """A verb with its own arguments and options, the values hostile about half the time."""
    import click

    verb = draw(st.sampled_from(VERBS))
    cmd = cli.main.commands[verb]
    argv = [verb]
    for p in cmd.params:
        if isinstance(p, click.Argument) and draw(st.integers(0, 9)) > 0:
            argv.append(draw(st.integers(0, 9).flatmap(lambda r: st.just("r1") if r < 6 else value)))
    opts = [p for p in cmd.params if isinstance(p, click.Option) and p.name not in ("help",)]
    chosen = [p for p in opts if p.required and draw(st.integers(0, 9)) > 0]
    for p in chosen + (draw(st.lists(st.sampled_from(opts), max_size=5)) if opts else []):
        name = draw(st.sampled_from(p.opts + p.secondary_opts))
        argv.append(name)
        if not p.is_flag:
            argv.append(draw(option_value(name)))
    if draw(st.integers(0, 4)) == 0:
        argv.insert(draw(st.integers(1, len(argv))), draw(value))
    if verb == "watch":
        argv += ["--once"]  # never the endless loop
    if draw(st.integers(0, 9)) == 0:  # the global option, before the verb
        argv = ["--busy-timeout", draw(option_value("--busy-timeout")), *argv]
    return argv


@pytest.mark.slow  # scaled: bounded by default, full size with --slow
@settings(max_examples=scale(400, 4000), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(args=invocations())
def test_fuzz_cli_arguments_never_reach_a_traceback(template, tmp_path_factory, args):
    work = tmp_path_factory.mktemp("fuzz")
    db = str(work / "l.db")
    shutil.copy(template["db"], db)
    cwd = os.getcwd()
    os.chdir(work)  # export -o and friends write here
    try:
        res = CliRunner().invoke(cli.main, ["--db", db, *args], env=CLEAN_ENV, input=b"")
    finally:
        os.chdir(cwd)
    no_traceback(res)
    assert res.exit_code in (0, 1, 2, 3, 4), (args, res.exit_code, res.stderr)


#: The payload decoder and the export parser may refuse with these, and nothing else.
ALLOWED = (msgspec.DecodeError, msgspec.ValidationError, InvalidInput)
#: Integers of any size (an export line bounds its own to 64 bits), and text with lone
#: surrogates, which json.dumps writes as \udXXX escapes.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**30, 10**400])
    | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
event_like = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(ev.EVENT_TYPES) + ["nope", ""])},
    optional={k: json_values for k in ("kind", "detail", "lease", "worker", "goal", "target", "owner", "policy",
                                      "outcome", "key", "advances", "artifacts", "bytes", "reason")},
)


@pytest.mark.slow  # scaled: bounded by default, full size with --slow
@settings(max_examples=scale(500, 5000), deadline=None, derandomize=True)
@given(payload=st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    event_like.map(lambda v: json.dumps(v).encode()),
    event_like.map(lambda v: json.dumps(v).encode().replace(b'"type"', b'"\xff"', 1)),
))
def test_fuzz_event_payload_decoding_raises_only_msgspec_errors(payload):
    """msgspec errors, and UnicodeDecodeError only for invalid UTF-8 inside a JSON string:
    ev.decode lets that one through, so its callers that read foreign bytes (the export
    parser, verify) turn it into InvalidInput or a problem, as the fuzz below checks."""
    try:
        ev.decode(payload)
    except ALLOWED:
        pass
    except UnicodeDecodeError:
        assert _has_bad_utf8_string(payload), payload


def _has_bad_utf8_string(b: bytes) -> bool:
    """Random bytes that msgspec would scan as a JSON string with invalid UTF-8 inside."""
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return b'"' in b


@pytest.mark.slow  # scaled: bounded by default, full size with --slow
@settings(max_examples=scale(300, 3000), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_export_lines_parse_or_raise_invalid_input(template, data):
    good = [json.loads(x) for x in open(template["export"], "rb").read().splitlines()]
    lines = []
    for line in data.draw(st.lists(st.sampled_from(good), min_size=1, max_size=4)):
        line = dict(line)
        if data.draw(st.booleans()):
            field = data.draw(st.sampled_from(sorted(line)))
            line[field] = data.draw(json_values | event_like)
        lines.append(json.dumps(line).encode())
    if data.draw(st.booleans()):  # invalid UTF-8 inside a string of a line, or anywhere
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = lines[i].replace(b'"', b'"\xff', data.draw(st.integers(1, 3)))
    if data.draw(st.booleans()):
        lines.append(data.draw(st.binary(max_size=80)))
    try:
        list(jsonl.parse_lines(lines))
    except ALLOWED:
        pass
