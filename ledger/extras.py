"""How to install an optional extra, said in a form that works.

handoff-ledger is installed from its checkout, not from a package index, so
``pip install 'handoff-ledger[mcp]'`` fails. What works is the extra's own
requirements (read from the installed distribution's metadata, the one record of
them) and, when the package runs from a checkout, ``pip install '<checkout>[mcp]'``.
Every hint a missing extra prints comes from ``install_hint``. It lives in ledger/
because the lowest layer prints one (the PostgreSQL driver) and every layer may
import from here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

DISTRIBUTION = "handoff-ledger"

_EXTRA_MARKER = re.compile(r"""^extra\s*==\s*["']([^"']+)["']$""")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> list[str]:
    """The distribution's requirement lines (``Requires-Dist``), or, without installed
    metadata, the checkout's pyproject.toml turned into the same form."""
    from importlib import metadata

    try:
        return list(metadata.requires(DISTRIBUTION) or [])
    except metadata.PackageNotFoundError:
        project = _pyproject()
        if project is None:
            return []
        extras = project.get("project", {}).get("optional-dependencies", {})
        return [f'{req}; extra == "{extra}"' for extra, reqs in extras.items() for req in reqs]


def requirements(extra: str) -> list[str]:
    """The requirements ``extra`` adds, as pip takes them: an extra that names
    handoff-ledger's own extras (``test``) is expanded into theirs."""
    lines = _declared()
    out: list[str] = []

    def add(name: str, seen: frozenset[str]) -> None:
        for line in lines:
            req, _, marker = line.partition(";")
            m = _EXTRA_MARKER.match(marker.strip())
            if m is None or _canonical(m.group(1)) != _canonical(name):
                continue
            head = _NAME.match(req)
            if head and _canonical(head.group(1)) == DISTRIBUTION:
                for inner in (head.group(2) or "").split(","):
                    if inner.strip() and inner.strip() not in seen:
                        add(inner.strip(), seen | {inner.strip()})
            elif req.strip() not in out:
                out.append(req.strip())

    add(extra, frozenset({extra}))
    return out


def checkout() -> Path | None:
    """The source tree this package runs from (pyproject.toml naming handoff-ledger beside
    the package's directory), or None for an installed copy."""
    root = Path(__file__).resolve().parent.parent
    project = _pyproject(root)
    return root if project is not None and project.get("project", {}).get("name") == DISTRIBUTION else None


def _pyproject(root: Path | None = None) -> dict | None:
    import tomllib

    root = Path(__file__).resolve().parent.parent if root is None else root
    try:
        with open(root / "pyproject.toml", "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return None


def install_hint(extra: str) -> str:
    """The command(s) that install ``extra``, e.g. ``pip install 'mcp<3,>=2.3'`` (or, from
    the checkout: ``pip install '/src/handoff-ledger[mcp]'``)."""
    reqs = requirements(extra)
    where = checkout()
    ways = []
    if reqs:
        ways.append("pip install " + " ".join(shlex.quote(r) for r in reqs))
    if where is not None:
        ways.append("pip install " + shlex.quote(f"{where}[{extra}]"))
    if not ways:
        return f"install the {extra} extra of handoff-ledger from its source tree: pip install '.[{extra}]'"
    if len(ways) == 1:
        return ways[0]
    return f"{ways[0]} (or, from the checkout it runs from: {ways[1]})"
