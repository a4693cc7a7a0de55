"""The distribution installs one top-level name, `handoff`, so it can sit beside a user's
own `ledger`, `reducers`, `projections` or `cli` (before, `pip install .` put all five
names into site-packages and a project with its own `ledger/` could not import handoff).

Builds the wheel (pip's isolated build fetches setuptools, as any install does), installs
it into a fresh virtual environment whose dependencies come from this one's
site-packages, and runs the demo from a directory whose own `ledger` package and `cli`
module must not be what handoff imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from handoff.demo import longest_s

ROOT = Path(__file__).resolve().parent.parent


#: The demo stops itself within ``longest_s()``; twice that only catches a hang.
DEMO_HANG_GUARD_S = 2 * longest_s()


def run(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_wheel_installs_one_name_and_runs_beside_a_package_named_ledger(tmp_path):
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT))
    wheel = next(dist.glob("handoff_ledger-*.whl"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"handoff"}, tops

    env_dir = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", str(env_dir))
    py = env_dir / "bin" / "python"
    site = run(str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    # The dependencies (msgspec, click, pydantic, sqlite-utils) from this environment, as a
    # plain path entry: .pth files there (an editable install of handoff) are not run.
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)) \
        if _pip_knows_python() else _unzip(wheel, Path(site))

    work = tmp_path / "project"
    (work / "ledger").mkdir(parents=True)
    (work / "ledger" / "__init__.py").write_text("WHO = 'the user project'\n")
    (work / "cli.py").write_text("raise SystemExit('the user project cli was imported')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HANDOFF_DB")}
    probe = run(str(py), "-c", "import ledger, handoff, handoff.ledger.errors, handoff.cli; "
                "print(ledger.WHO, handoff.ledger.errors.__file__)", cwd=work, env=env).stdout
    assert probe.startswith("the user project ") and str(env_dir) in probe, probe
    demo = run(str(env_dir / "bin" / "handoff"), "--db", str(work / "demo.db"), "demo", cwd=work, env=env,
               timeout=DEMO_HANG_GUARD_S)
    assert "delivered" in demo.stdout
    verify = run(str(env_dir / "bin" / "handoff"), "--db", str(work / "demo.db"), "verify", cwd=work, env=env)
    assert verify.returncode == 0
    # The README's first command runs the demo from the checkout itself, whose handoff/
    # folder (without the layers mapped into it) must not shadow the installed package.
    demo = run(str(env_dir / "bin" / "handoff"), "--db", str(tmp_path / "from-checkout.db"), "demo", cwd=ROOT, env=env,
               timeout=DEMO_HANG_GUARD_S)
    assert "delivered" in demo.stdout


def _pip_knows_python() -> bool:
    out = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout
    major, minor = (int(x) for x in out.split()[1].split(".")[:2])
    return (major, minor) >= (22, 3)


def _unzip(wheel: Path, site: Path) -> None:  # pragma: no cover - an old pip
    zipfile.ZipFile(wheel).extractall(site)
