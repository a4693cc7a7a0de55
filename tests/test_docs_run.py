"""Every shell and Python block of README.md and docs/*.md runs as written.

A copy of the repository's tracked files (as they are in the working tree) is the user's
checkout; one fresh virtual environment, made for this module, is the user's Python. Each
page runs top to bottom in a scratch directory of its own, so a block may use what an
earlier block of the same page made. Install lines are run like everything else: a shell
block holding ``pip install`` runs in the checkout, where the docs say to install from.

What a block is comes from its fence:

- ```` ```python ````: saved as a file and run with the environment's ``python`` (a
  ``test_*.py`` example with ``pytest``); it must exit 0.
- ```` ```sh ````, ```` ```bash ````, ```` ```shell ````: run by ``bash`` with ``set -euo
  pipefail``; every line must succeed.
- ```` ```console ````: a transcript. The ``$ `` lines run in order in one shell; each must
  exit 0 (a transcript that shows a refusal ends the line with ``; echo "exit $?"``), and
  the output shown must be the output printed, line for line, with times and lease tokens
  masked; a line written ``<like this>`` stands for any one line.
- any other language (``text``, ``json``, ``sql``, ``mermaid``) is output or data, never
  run. A bare fence is refused, except in docs/cli.md, which is generated from ``--help``
  (tests/cli/test_docs.py) and whose bare fences are help text.

A block that cannot run as written (a placeholder such as ``RUN``, a server that runs until
stopped, a real API key or network, tens of minutes) says so on the line just above its
fence, visibly: ``*Sketch: why it is not run as is.*``. A sketch is still compiled
(``compile()``, ``bash -n``).

The addresses the PostgreSQL page writes for a server of the reader's own are replaced by
the test server's (``PLACES`` below, ``HANDOFF_TEST_PG``), in a database this module creates
and drops; and the README's ``python -m pytest`` only asks pytest its version (``INSTEAD``):
CI runs that line itself.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import pg

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "shell")
TRANSCRIPT = "console"
NOT_RUN = ("text", "json", "sql", "mermaid", "toml", "yaml", "html")
SKETCH = re.compile(r"^\*Sketch: (?P<why>\S.*)\*$")
EXAMPLE = re.compile(r"^<!-- example: (?P<path>\S+) -->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
#: A block must finish within this: the slowest (the demo, an agent example) take seconds,
#: an install of the extras under a minute; a block that never ends (a server) fails here.
BLOCK_TIMEOUT_S, INSTALL_TIMEOUT_S = 120, 600

_PG = urllib.parse.urlsplit(pg.SERVER)
DB = "handoff_docs_" + secrets.token_hex(5)
LOCAL = urllib.parse.urlunsplit(_PG._replace(path="/" + DB))
#: The reader's own server, as the pages write it -> the local test server, in this module's database.
PLACES = {
    "createdb -E UTF8 -T template0 handoff ": f"createdb -E UTF8 -T template0 {DB} ",
    "postgresql://me@dbhost:5432/handoff": LOCAL,
}
#: The README's second set-up line ends by running the whole suite, which is what CI does
#: itself (.ci/run ends with that line, in a fresh environment): here it only asks pytest its version.
INSTEAD = {"&& python -m pytest\n": "&& python -m pytest --version\n"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    sketch: str | None  # why it is not run as is
    example: str | None  # docs/examples/NAME.py it copies

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'bare fence'})"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1] if i else ""
        sketch, example = SKETCH.match(above), EXAMPLE.match(above)
        found.append(Block(page.name, i + 1, m.group("lang"), "\n".join(lines[i + 1:end]) + "\n",
                           sketch and sketch.group("why"), example and example.group("path")))
        i = end + 1
    return found


def runnable(b: Block) -> bool:
    return b.lang in (*SHELL, TRANSCRIPT, "python")


# -- a transcript ----------------------------------------------------------------------------

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
_TOKEN = re.compile(r"\b\d+\.[A-Za-z0-9_-]{43}\b")
_ANY_LINE = re.compile(r"^<[^<>]+>$")


def transcript(code: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each ``$ `` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and steps[-1][0].endswith("\\"):
            steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
        elif steps:
            steps[-1][1].append(line)
        else:
            raise AssertionError(f"a console block must start with a '$ ' line, not {line!r}")
    return steps


def masked(line: str) -> str:
    return _TOKEN.sub("<token>", _TIME.sub("<time>", line)).rstrip()


_MARK = "\x1e"


def transcript_script(steps: list[tuple[str, list[str]]]) -> str:
    out = ["exec 2>&1"]
    for n, (command, _) in enumerate(steps):
        out += [f"printf '{_MARK}step {n}{_MARK}\\n'", command, f"printf '{_MARK}exit %d{_MARK}\\n' $?"]
    return "\n".join(out) + "\n"


def compare_transcript(steps: list[tuple[str, list[str]]], printed: str) -> list[str]:
    """What differs between the transcript shown and the one printed (empty: none)."""
    parts = re.findall(rf"{_MARK}step (\d+){_MARK}\n(.*?){_MARK}exit (\d+){_MARK}\n", printed, re.S)
    problems = []
    if len(parts) != len(steps):
        return [f"only {len(parts)} of {len(steps)} commands ran; output:\n{printed[-3000:]}"]
    for (command, shown), (_, text, code) in zip(steps, parts):
        got = text.rstrip("\n").split("\n") if text.strip("\n") else []
        if code != "0":
            problems.append(f"$ {command}\n  exited {code}:\n" + "\n".join(got))
            continue
        same = len(got) == len(shown) and all(
            _ANY_LINE.match(s) or masked(s) == masked(g) for s, g in zip(shown, got))
        if not same:
            problems.append(f"$ {command}\n  shown:\n" + "\n".join(shown) + "\n  printed:\n" + "\n".join(got))
    return problems


# -- the user's checkout and Python ----------------------------------------------------------


@dataclass
class Place:
    checkout: Path
    venv: Path
    scratch: Path
    env: dict[str, str]
    setup: list[str] | None = None  # what the README's set-up block said went wrong, once run


def _copy_tracked(dest: Path) -> None:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        src, dst = ROOT / name, dest / name
        if not os.path.lexists(src):
            continue  # deleted in the working tree, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory):
    top = tmp_path_factory.mktemp("docs-run")
    checkout, venv = top / "handoff-ledger", top / "venv"
    _copy_tracked(checkout)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HANDOFF_", "PYTHON", "PG", "VIRTUAL_ENV", "PIP_REQUIRE"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PGHOST=_PG.hostname or "127.0.0.1", PGPORT=str(_PG.port or 5432),
               PGUSER=_PG.username or "postgres", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if _PG.password:
        env["PGPASSWORD"] = urllib.parse.unquote(_PG.password)
    yield Place(checkout, venv, top / "pages", env)
    subprocess.run(["dropdb", "--if-exists", "--force", DB], env=env, capture_output=True, timeout=60)


def _run(argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None,
         timeout: float = BLOCK_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run argv in a session of its own, so a block that starts a server is stopped whole."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n[still running after {timeout:.0f}s: stopped]"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _placed(code: str) -> str:
    for shown, here in {**PLACES, **INSTEAD}.items():
        code = code.replace(shown, here)
    return code


def run_block(b: Block, where: Path, place: Place) -> list[str]:
    """Run one block; what went wrong (empty: nothing)."""
    if b.sketch is not None:
        if b.lang == "python":
            try:
                compile(b.code, str(b), "exec")
            except SyntaxError as exc:
                return [f"{b}: a sketch that is not even Python: {exc}"]
            return []
        code = "\n".join(c for c, _ in transcript(b.code)) if b.lang == TRANSCRIPT else b.code
        done = _run(["bash", "-n"], where, place.env, code)
        return [f"{b}: a sketch that is not even shell:\n{done.stderr}"] if done.returncode else []
    code = _placed(b.code)
    if b.lang == "python":
        name = Path(b.example).name if b.example else f"block_{b.line}.py"
        (where / name).write_text(code, encoding="utf-8")
        argv = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", name] if name.startswith("test_") \
            else ["python", name]
        done = _run(argv, where, place.env)
        return [] if done.returncode == 0 else [f"{b} exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                                                f"{done.stderr[-3000:]}"]
    if b.lang == TRANSCRIPT:
        steps = transcript(code)
        done = _run(["bash"], where, place.env, transcript_script(steps))
        return [f"{b}: {p}" for p in compare_transcript(steps, done.stdout)]
    installs = re.search(r"^\s*pip install ", code, re.M) is not None
    done = _run(["bash", "-c", "set -euo pipefail\n" + code], place.checkout if installs else where, place.env,
                timeout=INSTALL_TIMEOUT_S if installs else BLOCK_TIMEOUT_S)
    return [] if done.returncode == 0 else [f"{b} exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                                            f"{done.stderr[-3000:]}"]


def _readme_setup(place: Place) -> list[str]:
    """What every page assumes: the README's set-up block has run (once per module)."""
    if place.setup is not None:
        return place.setup
    first = blocks(ROOT / "README.md")[0]
    assert "pip install ." in first.code, f"{first} is not the README's set-up block"
    took = time.monotonic()
    problems = run_block(first, place.checkout, place)
    print(f"{first}: {time.monotonic() - took:.1f}s")
    place.setup = problems
    return problems


RUN_PAGES = [p for p in PAGES if any(runnable(b) for b in blocks(p))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: p.name)
def test_the_page_runs_as_written(page: Path, place: Place) -> None:
    started = time.monotonic()
    if any(shown in b.code for b in blocks(page) if runnable(b) and b.sketch is None for shown in PLACES):
        pg.database_url()  # the server is there: else skip, or fail under CI=true (tests/pg.py)
    where = place.scratch / page.stem
    where.mkdir(parents=True)
    problems: list[str] = []
    setup = blocks(ROOT / "README.md")[0]
    for b in blocks(page):
        if not runnable(b):
            continue
        if b == setup:
            problems += _readme_setup(place)
            continue
        assert _readme_setup(place) == [], "the README's set-up fails: see test_the_page_runs_as_written[README.md]"
        took = time.monotonic()
        problems += run_block(b, where, place)
        print(f"{b}{' sketch' if b.sketch else ''}: {time.monotonic() - took:.1f}s")
    assert problems == [], f"{page.name} fails as written:\n\n" + "\n\n".join(problems)
    print(f"{page.name}: {time.monotonic() - started:.1f}s")


def misdeclared(page: Path) -> list[str]:
    """The blocks of a page whose fence does not say what they are."""
    found = []
    for b in blocks(page):
        if b.lang not in (*SHELL, TRANSCRIPT, "python", *NOT_RUN):
            found.append(f"{b}: say what the block is with its fence: ```sh, ```bash or ```shell for commands, "
                         f"```console for a transcript ('$ ' lines and their output), ```python, or ```text / "
                         f"```json / ```sql for output and data")
        elif b.sketch is not None and not runnable(b):
            found.append(f"{b}: only a block that would run can be a sketch")
        elif b.lang == TRANSCRIPT and not b.code.startswith("$ "):
            found.append(f"{b}: a console block starts with a '$ ' line")
        elif b.lang in SHELL and re.search(r"^\$ ", b.code, re.M):
            found.append(f"{b}: '$ ' lines and their output are a transcript: ```console")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_block_says_what_it_is(page: Path) -> None:
    assert misdeclared(page) == [], "\n".join(misdeclared(page))


def test_a_block_that_does_not_say_what_it_is_is_noticed(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```\nls\n```\n\n```sh\n$ ls\nx\n```\n\n*Sketch: data.*\n```json\n{}\n```\n\n"
                    "```console\nls\n```\n\n```text\nfine\n```\n")
    assert [p.split(":")[1] for p in misdeclared(page)] == ["1 (bare fence)", "5 (sh)", "11 (json)", "15 (console)"]
    generated = tmp_path / "cli.md"  # generated pages are held to the same rule
    generated.write_text("```\nUsage: handoff\n```\n")
    assert [p.split(":")[1] for p in misdeclared(generated)] == ["1 (bare fence)"]


def test_every_place_the_pages_name_is_replaced() -> None:
    text = "".join(b.code for p in PAGES for b in blocks(p) if runnable(b) and b.sketch is None)
    unused = [shown for shown in {**PLACES, **INSTEAD} if shown not in text]
    assert unused == [], f"these stand-ins match no block any more: {unused}"


def _said(page: str) -> str:
    return " ".join((ROOT / page).read_text(encoding="utf-8").split())


def test_the_demo_delivers_to_a_file_outbox_as_incident_report_md_says(place: Place) -> None:
    said = _said("docs/incident-report.md")
    assert "the demo's file outbox (`file://.../handoff-demo-files/outbox`) under key `inc-4711-report`" in said
    assert "the receipt is the outbox's: `file NAME sha256 DIGEST`" in said
    assert _readme_setup(place) == [], "the README's set-up block fails"  # its demo left handoff-demo.db
    done = _run(["handoff", "--db", "handoff-demo.db", "status", "demo-report", "--json"], place.checkout, place.env)
    assert done.returncode == 0, done.stderr
    delivery = json.loads(done.stdout)["delivery"]
    assert delivery["target"].startswith("file://") and delivery["target"].endswith("/handoff-demo-files/outbox")
    assert delivery["key"] == "inc-4711-report" and delivery["attempts"] == 1 and delivery["status"] == "confirmed"
    assert re.fullmatch(r"file \S+ sha256 [0-9a-f]{64}", delivery["receipt"]), delivery["receipt"]


def test_a_postgresql_address_opens_a_ledger_as_python_api_md_says() -> None:
    from handoff import Ledger

    assert "`postgresql://...` (or `postgres://...`) opens a ledger on a PostgreSQL server" in _said(
        "docs/python-api.md")
    url = pg.fresh_url()
    for address in (url, "postgres://" + url.split("://", 1)[1]):
        with Ledger(address) as lg:
            run = lg.open(goal="g", target="chat:#ops", owner="alice")
            assert lg.status(run)["state"] == "queued"


#: An install by the distribution's name asks an index, which has no handoff-ledger: it is
#: installed from its checkout (or a path, or a git URL). Once the checkout is installed, pip
#: would take the name as already there, so running such a line here proves nothing: read it.
BY_NAME = re.compile(r"pip install (?:-\S+ )*['\"]?handoff-ledger\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_installs_by_the_distributions_name(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = [f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in BY_NAME.finditer(text)]
    assert found == [], ("pip finds no handoff-ledger on an index; say pip install '.[EXTRA]' (in the checkout) "
                         "or pip install '/path/to/handoff-ledger[EXTRA]':\n" + "\n".join(found))


def test_an_install_by_name_is_noticed() -> None:
    assert BY_NAME.search("`pip install 'handoff-ledger[mcp]'`") and BY_NAME.search("pip install handoff-ledger[test]")
    assert BY_NAME.search("pip install -U \"handoff-ledger[otel]\"")
    assert not BY_NAME.search("pip install '.[mcp]'") and not BY_NAME.search("pip install '/src/handoff-ledger[mcp]'")


# -- the checks catch what they are for ---------------------------------------------------------


def test_a_transcript_that_differs_from_its_output_is_caught(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    place = Place(tmp_path, tmp_path, tmp_path, env)

    def check(code: str) -> list[str]:
        return run_block(Block("page.md", 1, TRANSCRIPT, code, None, None), tmp_path, place)

    assert check("$ X=2024-01-02T03:04:05.678Z; echo at $X\nat 2026-12-01T05:45:09.978Z\n$ echo one\n<any>\n") == []
    assert check("$ echo token 1.Dx3Nu_UNEbdyZJaWvYmsr1GRfawq049lAhGoBaCqZMw\n"
                 "token 2.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n") == []
    assert check("$ false; echo \"exit $?\"\nexit 1\n") == []
    [wrong] = check("$ echo healthy\nunavailable\n")
    assert "shown:\nunavailable" in wrong and "printed:\nhealthy" in wrong
    [failed] = check("$ false\n$ echo after\nafter\n")
    assert "$ false\n  exited 1" in failed
    assert check("$ echo a\n") and check("$ echo a; echo b\na\n")  # output not shown, a line missing


def test_a_failing_block_or_a_broken_sketch_is_caught(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDOFF_")}
    place = Place(tmp_path, tmp_path, tmp_path, env)
    page = tmp_path / "page.md"
    page.write_text("```sh\ntrue\nfalse\ntrue\n```\n\n```python\nraise SystemExit(3)\n```\n\n"
                    "*Sketch: needs a server.*\n```sh\nhandoff otel $RUN --endpoint http://collector:4318\n```\n\n"
                    "*Sketch: a broken one.*\n```python\ndef (:\n```\n")
    shell, python, sketch, broken = blocks(page)
    assert run_block(shell, tmp_path, place) and run_block(python, tmp_path, place)
    assert sketch.sketch == "needs a server." and run_block(sketch, tmp_path, place) == []
    [not_python] = run_block(broken, tmp_path, place)
    assert "not even Python" in not_python
