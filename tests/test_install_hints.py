"""What a missing extra's hint tells a user to run is a command that works.

handoff-ledger is installed from its checkout, not from a package index: a hint naming
``handoff-ledger[mcp]`` sends the user to a package that does not exist there. Every hint
is ``ledger.extras.install_hint``: the extra's own requirements, read from the installed
metadata, and the checkout's path with the extra. Here the requirements are held to
pyproject.toml (parsed on its own), pip is asked whether it takes them as written, and each
place that prints a hint (handoff mcp, handoff otel, a PostgreSQL address without the driver)
is run in a process where the extra's package cannot be imported.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from handoff.ledger import extras
from handoff.ledger.errors import BackendUnavailable

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DECLARED: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
#: The extras whose absence a command reports with a hint.
HINTED = ("mcp", "otel", "postgres")


def _norm(req: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """A requirement as (name, extras, version clauses), spelling and order aside
    (metadata writes ``mcp<3,>=2.3`` for pyproject's ``mcp>=2.3,<3``)."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*?)\s*", req)
    assert m, req
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    extra = tuple(sorted(e.strip() for e in (m.group(2) or "").split(",") if e.strip()))
    clauses = tuple(sorted(c.replace(" ", "") for c in m.group(3).split(",") if c.strip()))
    return name, extra, clauses


def _own_expanded(extra: str) -> list[str]:
    """pyproject's requirements of ``extra``, handoff-ledger's own extras expanded."""
    out: list[str] = []
    for req in DECLARED[extra]:
        name, inner, _ = _norm(req)
        if name == "handoff-ledger":
            for e in inner:
                out += [r for r in _own_expanded(e) if r not in out]
        elif req not in out:
            out.append(req)
    return out


@pytest.mark.parametrize("extra", sorted(DECLARED))
def test_the_requirements_named_are_pyprojects_own(extra):
    assert sorted(map(_norm, extras.requirements(extra))) == sorted(map(_norm, _own_expanded(extra)))


def test_the_hint_names_the_requirements_and_the_checkout_never_the_index_name():
    assert extras.checkout() == ROOT  # the tests run from the checkout
    for extra in HINTED:
        hint = extras.install_hint(extra)
        assert "handoff-ledger[" not in hint, hint
        assert "pip install " + " ".join(shlex.quote(r) for r in extras.requirements(extra)) in hint
        assert "pip install " + shlex.quote(f"{ROOT}[{extra}]") in hint


def _pip_commands(hint: str) -> list[list[str]]:
    """The argument lists of the hint's ``pip install`` commands (the second in parentheses)."""
    return [shlex.split(part.split(" (or, ")[0].removesuffix(")")) for part in hint.split("pip install ")[1:]]


@pytest.mark.parametrize("extra", HINTED)
def test_pip_takes_the_hints_requirements_as_written(extra):
    """pip parses and resolves the hint's requirements exactly as printed (here, where the
    extra is installed, offline: each is found already satisfied)."""
    reqs, from_checkout = _pip_commands(extras.install_hint(extra))
    assert reqs == extras.requirements(extra) and from_checkout == [f"{ROOT}[{extra}]"]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
                           "--disable-pip-version-check", *reqs], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Would install" not in proc.stdout, proc.stdout


def _without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that cannot import ``module`` (as without its extra)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", f"import sys\nsys.modules[{module!r}] = None\n{code}"], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _cli(db: Path, *args: str) -> str:
    return f"sys.argv = ['handoff', '--db', {str(db)!r}, *{list(args)!r}]\nfrom handoff.cli import main\nmain()\n"


@pytest.mark.parametrize(("module", "args", "extra"), [
    ("mcp", ["mcp", "--as", "owner"], "mcp"),
    ("opentelemetry", ["otel", "r1", "-o", "trace.json"], "otel"),
], ids=["mcp", "otel"])
def test_the_cli_prints_the_hint_when_its_extra_is_missing(tmp_path, module, args, extra):
    proc = _without(module, _cli(tmp_path / "l.db", *args))
    assert proc.returncode == 2, proc.stderr
    assert extras.install_hint(extra) in " ".join(proc.stderr.split()), proc.stderr
    assert "handoff-ledger[" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_postgresql_address_without_the_driver_prints_the_hint():
    code = ("from handoff import Ledger\nfrom handoff.ledger.errors import BackendUnavailable\n"
            "try:\n    Ledger('postgresql://127.0.0.1:1/nowhere')\nexcept BackendUnavailable as exc:\n"
            "    print(exc)\n")
    proc = _without("psycopg", code)
    assert proc.returncode == 0, proc.stderr
    assert extras.install_hint("postgres") in proc.stdout and "handoff-ledger[" not in proc.stdout
    # The store itself, reached without open_store, says the same.
    code = ("from handoff.ledger.postgres.postgres_store import PostgresStore\n"
            "from handoff.ledger.errors import BackendUnavailable\n"
            "try:\n    PostgresStore('postgresql://127.0.0.1:1/nowhere')\nexcept BackendUnavailable as exc:\n"
            "    print(exc)\n")
    proc = _without("psycopg", code)
    assert proc.returncode == 0, proc.stderr
    assert extras.install_hint("postgres") in proc.stdout and "handoff-ledger[" not in proc.stdout
    assert issubclass(BackendUnavailable, Exception)
