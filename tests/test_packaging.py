"""The distribution installs one top-level name, `handoff`, so it can sit beside a user's
own `ledger`, `reducers`, `projections` or `cli` (before, `pip install .` put all five
names into site-packages and a project with its own `ledger/` could not import handoff).

The checkout imports as the installed package does: handoff/ledger, handoff/reducers and
handoff/projections are links to the top-level folders (as handoff/cli.py is to cli.py),
so ``import handoff.ledger`` works from the repository root with nothing installed, and
the wheel holds the files the links lead to.

Builds the wheel from a copy of the tracked files (pip's isolated build fetches
setuptools, as any install does; a copy, so that no leftover of an earlier build in the
checkout's build/ reaches the wheel), installs it into a fresh virtual environment whose
dependencies come from this one's site-packages, and runs the demo from a directory whose
own `ledger` package and `cli` module must not be what handoff imports.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from handoff.demo import longest_s
from tests.test_docs_run import _copy_tracked

ROOT = Path(__file__).resolve().parent.parent


#: The demo stops itself within ``longest_s()``; twice that only catches a hang.
DEMO_HANG_GUARD_S = 2 * longest_s()
#: The layers kept at the top of the repository, each linked into handoff/ under its name.
LINKED = {"ledger": "ledger", "reducers": "reducers", "projections": "projections", "cli.py": "cli.py"}


def run(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def bare_env(env_dir: Path) -> tuple[Path, Path]:
    """A virtual environment without handoff: its python, which finds the dependencies
    (msgspec, click, pydantic, sqlite-utils) in this environment's site-packages, as a
    plain path entry: .pth files there (an editable install of handoff) are not run.
    Returns its python and its site-packages."""
    run(sys.executable, "-m", "venv", "--without-pip", str(env_dir))
    py = env_dir / "bin" / "python"
    site = run(str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, Path(site)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HANDOFF_DB")}


def library_files(top: Path) -> dict[str, bytes]:
    """handoff/... path -> content of every library module under ``top``'s handoff/,
    read through the links."""
    found = {}
    for folder, dirs, files in os.walk(top / "handoff", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder, name)
                found[path.relative_to(top).as_posix()] = path.read_bytes()
    return found


def test_the_layers_are_linked_into_handoff():
    """The one place the layout is mapped: no package-dir table, links instead."""
    for name, target in LINKED.items():
        link = ROOT / "handoff" / name
        assert link.is_symlink() and os.readlink(link) == f"../{target}", link
    assert "package-dir" not in (ROOT / "pyproject.toml").read_text()


def test_the_wheel_installs_one_name_and_runs_beside_a_package_named_ledger(tmp_path):
    dist, src = tmp_path / "dist", tmp_path / "src"
    _copy_tracked(src)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src))
    wheel = next(dist.glob("handoff_ledger-*.whl"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"handoff"}, tops
    # The wheel holds the files the links lead to, not links, and exactly the checkout's modules.
    infos = [i for i in zipfile.ZipFile(wheel).infolist() if not i.filename.split("/")[0].endswith(".dist-info")]
    assert [i.filename for i in infos if stat.S_ISLNK(i.external_attr >> 16)] == []
    packed = {i.filename: zipfile.ZipFile(wheel).read(i) for i in infos if i.filename.endswith(".py")}
    assert packed == library_files(src)

    env_dir = tmp_path / "env"
    py, site = bare_env(env_dir)
    run(sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)) \
        if _pip_knows_python() else _unzip(wheel, site)

    work = tmp_path / "project"
    (work / "ledger").mkdir(parents=True)
    (work / "ledger" / "__init__.py").write_text("WHO = 'the user project'\n")
    (work / "cli.py").write_text("raise SystemExit('the user project cli was imported')\n")
    env = clean_env()
    probe = run(str(py), "-c", "import ledger, handoff, handoff.ledger.errors, handoff.cli; "
                "print(ledger.WHO, handoff.ledger.errors.__file__)", cwd=work, env=env).stdout
    assert probe.startswith("the user project ") and str(env_dir) in probe, probe
    demo = run(str(env_dir / "bin" / "handoff"), "--db", str(work / "demo.db"), "demo", cwd=work, env=env,
               timeout=DEMO_HANG_GUARD_S)
    assert "delivered" in demo.stdout
    verify = run(str(env_dir / "bin" / "handoff"), "--db", str(work / "demo.db"), "verify", cwd=work, env=env)
    assert verify.returncode == 0
    # The README's first command runs the demo from the checkout itself: the installed
    # command runs the installed package there too.
    demo = run(str(env_dir / "bin" / "handoff"), "--db", str(tmp_path / "from-checkout.db"), "demo", cwd=ROOT, env=env,
               timeout=DEMO_HANG_GUARD_S)
    assert "delivered" in demo.stdout


#: Imports every module of the library by its one name, then prints what would show a
#: module loaded twice: a layer under its bare name (``ledger.events`` beside
#: ``handoff.ledger.events``, possible when the repository root is on sys.path), or two
#: module objects read from one file of the checkout.
IMPORT_ALL = """
import importlib, json, os, sys
root = os.path.realpath(os.getcwd()) + os.sep
# The project's own files only: a virtual environment may live inside the checkout (CI's
# .ci-venv), and a package there may alias its modules (requests.packages.urllib3).
own = tuple(root + d for d in ("handoff" + os.sep, "ledger" + os.sep, "reducers" + os.sep,
                               "projections" + os.sep, "benchmarks" + os.sep, "cli.py"))
for name in sys.argv[1:]:
    importlib.import_module(name)
files = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path and os.path.realpath(path).startswith(own):
        files.setdefault(os.path.realpath(path), []).append(name)
print(json.dumps({
    "ledger": importlib.import_module("handoff.ledger").__file__,
    "bare": sorted(n for n in sys.modules if n.split(".")[0] in ("ledger", "reducers", "projections", "cli")),
    "twice": sorted(names for names in files.values() if len(names) > 1),
}))
"""


def test_the_checkout_imports_with_nothing_installed(tmp_path):
    """From the repository root, in an environment holding only the dependencies (no
    handoff, no PYTHONPATH), every module imports by its ``handoff.`` name, each once, and
    the benchmarks' runner starts."""
    import json

    from tests.test_import_direction import library_modules, module_name

    py, _ = bare_env(tmp_path / "bare")
    assert subprocess.run([str(py), "-c", "import handoff"], cwd=tmp_path, capture_output=True).returncode != 0
    names = [module_name(p) for p in library_modules()]
    got = json.loads(run(str(py), "-c", IMPORT_ALL, *names, cwd=ROOT, env=clean_env()).stdout)
    assert got["ledger"] == str(ROOT / "handoff" / "ledger" / "__init__.py")
    assert got["bare"] == [] and got["twice"] == [], got
    listing = run(str(py), "-m", "benchmarks", "--list", cwd=ROOT, env=clean_env()).stdout
    assert "append" in listing, listing


def test_an_editable_install_imports_the_checkout_beside_a_package_named_ledger(tmp_path):
    src, work = tmp_path / "src", tmp_path / "project"
    _copy_tracked(src)
    py, _ = bare_env(tmp_path / "env")
    run(sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", "-e", str(src), env=clean_env())
    (work / "ledger").mkdir(parents=True)
    (work / "ledger" / "__init__.py").write_text("WHO = 'the user project'\n")
    probe = run(str(py), "-c", "import ledger, handoff.ledger.store, handoff.reducers.decide, handoff.cli; "
                "print(ledger.WHO); print(handoff.ledger.store.__file__); print(handoff.cli.__file__)",
                cwd=work, env=clean_env()).stdout.splitlines()
    assert probe == ["the user project", str(src / "handoff" / "ledger" / "store.py"), str(src / "handoff" / "cli.py")]


def _pip_knows_python() -> bool:
    out = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout
    major, minor = (int(x) for x in out.split()[1].split(".")[:2])
    return (major, minor) >= (22, 3)


def _unzip(wheel: Path, site: Path) -> None:  # pragma: no cover - an old pip
    zipfile.ZipFile(wheel).extractall(site)
