"""Installing the hooks into a harness's settings, and taking them out again.

Each harness keeps its hooks in a JSON file of the same shape, ``{"hooks": {EVENT:
[{"matcher": ..., "hooks": [{"type": "command", "command": ...}]}]}}``: Claude Code's
``.claude/settings.json``, OpenHands' ``.openhands/hooks.json``, Codex's
``.codex/hooks.json``, and for Goose a plugin's ``hooks/hooks.json`` (a directory
``.agents/plugins/handoff-ledger/`` that is wholly ours). ``install`` adds one group per
event whose command is this package's hook, next to whatever the user has there, and
replaces only an earlier group of ours (idempotent); ``uninstall`` removes the groups whose
command runs ``-m handoff.hooks`` and nothing else, and drops the lists and the ``hooks``
table it leaves empty. The file is rewritten whole through a private temporary file, with
the mode it had (0600 for a new one).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from typing import Any

from handoff.ledger.errors import InvalidInput

#: The marker of our commands: what ``uninstall`` removes.
MARK = "-m handoff.hooks "

#: The events each harness is given a hook for (those it has and the mapping uses).
EVENTS = {
    "claude-code": ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure",
                    "PermissionRequest", "Notification", "Stop", "SessionEnd"),
    "openhands": ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SessionEnd"),
    "codex": ("SessionStart", "UserPromptSubmit", "PreToolUse", "PermissionRequest", "PostToolUse", "Stop"),
    "goose": ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "Stop",
              "SessionEnd"),
}
#: Events whose groups take a matcher (a tool name pattern): ours matches every tool.
TOOL_EVENTS = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest"})
GOOSE_PLUGIN = "handoff-ledger"
#: Seconds a harness gives our hook before it stops waiting (a journal append takes
#: milliseconds; a PreToolUse with the deny switch waits up to ~7 s for the ledger).
TIMEOUT_S = 30


def settings_path(harness: str, scope: str, project: str | None = None) -> str:
    """Where ``harness`` reads hooks for ``scope`` (``project``: the directory ``project``,
    default the working directory; ``user``: the home directory)."""
    root = os.path.abspath(project or os.getcwd()) if scope == "project" else os.path.expanduser("~")
    if harness == "claude-code":
        return os.path.join(root, ".claude", "settings.json")
    if harness == "openhands":
        return os.path.join(root, ".openhands", "hooks.json")
    if harness == "codex":
        base = os.environ.get("CODEX_HOME") if scope == "user" and os.environ.get("CODEX_HOME") else os.path.join(root, ".codex")
        return os.path.join(base, "hooks.json")
    if harness == "goose":
        return os.path.join(root, ".agents", "plugins", GOOSE_PLUGIN, "hooks", "hooks.json")
    raise InvalidInput(f"unknown harness {harness!r}; one of {', '.join(EVENTS)}", field="harness")


def command(harness: str, db: str, *, deny_revoked: bool = False, owner: str | None = None,
            target: str | None = None, heartbeat_timeout: float | None = None,
            progress_timeout: float | None = None, python: str | None = None) -> str:
    """The hook's command line: this interpreter running the lean entry point."""
    # -P: the harness runs hooks in the project's directory, which must not shadow the
    # package (a repository holding handoff/hooks/__main__.py would run its own code).
    parts = [python or sys.executable, "-P", "-m", "handoff.hooks", harness, "--db", db if "://" in db else os.path.abspath(db)]
    if deny_revoked:
        parts.append("--deny-revoked")
    for flag, value in (("--owner", owner), ("--target", target), ("--heartbeat-timeout", heartbeat_timeout),
                        ("--progress-timeout", progress_timeout)):
        if value is not None:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def _ours(handler: Any) -> bool:
    """A handler this module wrote: its command runs ``python [-P] -m handoff.hooks``, not
    merely mentions it."""
    if not isinstance(handler, dict) or MARK not in str(handler.get("command", "")):
        return False
    try:
        words = shlex.split(str(handler["command"]))
    except ValueError:
        return False
    if not words or not os.path.basename(words[0]).startswith("python"):
        return False
    return words[1:4] == ["-P", "-m", "handoff.hooks"] or words[1:3] == ["-m", "handoff.hooks"]


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise InvalidInput(f"{path} is not JSON ({exc}); fix it by hand, then install again: it is left as it is",
                           field="settings") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("hooks", {}), dict):
        raise InvalidInput(f"{path} is not a settings file with a 'hooks' table; it is left as it is", field="settings")
    for event, groups in doc.get("hooks", {}).items():
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise InvalidInput(f"{path}: hooks.{event} is not a list of hook groups; fix it by hand, then install "
                               "again: it is left as it is", field="settings")
    return doc


def _target(path: str) -> str:
    """The file a settings path stands for: a link (to a dotfiles repository, say) is
    followed, so the file it names is updated and the link stays a link."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _write(path: str, doc: dict[str, Any]) -> None:
    path = _target(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o600
    tmp = f"{path}.handoff-{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)  # a crashed earlier install of this pid's; never written through a link
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _strip(doc: dict[str, Any]) -> int:
    """Remove our handlers from ``doc``; returns how many."""
    removed = 0
    table = doc.get("hooks") or {}
    for event in list(table):
        groups = table[event]
        if not isinstance(groups, list):
            continue
        kept_groups = []
        for group in groups:
            handlers = group.get("hooks") if isinstance(group, dict) else None
            if isinstance(handlers, list):
                kept = [h for h in handlers if not _ours(h)]
                removed += len(handlers) - len(kept)
                if not kept and len(handlers):
                    continue
                group = {**group, "hooks": kept}
            kept_groups.append(group)
        if kept_groups:
            table[event] = kept_groups
        else:
            del table[event]
    if "hooks" in doc and not doc["hooks"]:
        del doc["hooks"]
    return removed


def install(harness: str, cmd: str, *, scope: str = "project", project: str | None = None) -> dict[str, Any]:
    """Add our hook to every event of ``harness``; an earlier install of ours is replaced."""
    path = settings_path(harness, scope, project)
    doc = _load(path)
    replaced = _strip(doc)
    table = doc.setdefault("hooks", {})
    for event in EVENTS[harness]:
        group: dict[str, Any] = {"hooks": [{"type": "command", "command": cmd, "timeout": TIMEOUT_S}]}
        if event in TOOL_EVENTS and harness != "goose":
            group = {"matcher": "*" if harness == "openhands" else "", **group}
        table.setdefault(event, []).append(group)
    if harness == "goose":
        manifest = os.path.join(os.path.dirname(os.path.dirname(path)), "plugin.json")
        if not os.path.exists(manifest):
            _write(manifest, {"name": GOOSE_PLUGIN, "version": "1",
                              "description": "Records each goose session as a run of handoff-ledger"})
    _write(path, doc)
    return {"harness": harness, "path": path, "events": list(EVENTS[harness]), "replaced": replaced, "command": cmd}


def uninstall(harness: str, *, scope: str = "project", project: str | None = None) -> dict[str, Any]:
    """Remove exactly what ``install`` added (every handler whose command is ours)."""
    path = settings_path(harness, scope, project)
    if not os.path.exists(path):
        return {"harness": harness, "path": path, "removed": 0}
    doc = _load(path)
    removed = _strip(doc)
    if harness == "goose" and not doc:
        plugin = os.path.dirname(os.path.dirname(path))
        if set(os.listdir(plugin)) <= {"plugin.json", "hooks"} and os.listdir(os.path.dirname(path)) == ["hooks.json"]:
            shutil.rmtree(plugin)
            return {"harness": harness, "path": path, "removed": removed}
    if removed:
        _write(path, doc)
    return {"harness": harness, "path": path, "removed": removed}
