"""Each harness's hook payload, read into one shape (``Hook``). Standard library only.

The harnesses name the same moments differently: Claude Code and OpenHands (whose hooks
file is Claude Code's) and Codex put the event in ``hook_event_name``, Goose in ``event``;
Goose calls the tool call's id ``tool_call_id`` and the prompt ``message``. What a hook
keeps of a tool's input is bounded here, before anything is written anywhere: a file
tool's content is dropped (the file itself is measured as an artifact), other inputs are
kept up to ``MAX_INPUT`` characters for the replay to scrub and cut (``lease.bounded_text``).
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # not typing's: a hook does not pay for importing typing
if TYPE_CHECKING:
    from typing import Any

#: The harnesses ``handoff hook`` reads, and the prefix of the run ids their sessions get.
HARNESSES = ("claude-code", "codex", "openhands", "goose")

#: The events a hook records, by the name each harness gives them.
EVENTS = {
    "SessionStart": "session_start",
    "UserPromptSubmit": "prompt",
    "PreToolUse": "pre_tool",
    "PostToolUse": "post_tool",
    "PostToolUseFailure": "tool_failed",
    "PermissionRequest": "permission_request",
    "Notification": "notification",
    "Stop": "stop",
    "SessionEnd": "session_end",
}

#: Tools whose call changes the world outside the repository (a command, a request): each
#: call is a side effect, started before and confirmed after, so a session killed in the
#: middle shows ``unknown``. MCP tools (``mcp__...``) count too: what they do is unknown.
SIDE_EFFECT_TOOLS = frozenset({
    "Bash", "BashOutput", "KillShell", "WebFetch", "WebSearch",  # Claude Code, OpenHands
    "shell", "exec_command", "local_shell", "unified_exec", "NetworkAccess",  # Codex
    "execute_bash", "terminal", "browser", "fetch",  # OpenHands
    "developer__shell",  # Goose
})
#: Tools that write a file, and the input field naming it: the file is recorded as an artifact.
FILE_TOOLS = {
    "Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path",
    "str_replace_editor": "path", "file_editor": "path",  # OpenHands
    "developer__write": "path", "developer__edit": "path", "developer__text_editor": "path",  # Goose
}
#: Codex's patch tool names its files inside the patch text.
PATCH_TOOLS = frozenset({"apply_patch"})
_PATCH_MARKS = ("*** Add File: ", "*** Update File: ")
#: Input fields that hold a file's content: never kept (the artifact measures the file).
CONTENT_FIELDS = frozenset({"content", "old_string", "new_string", "new_source", "edits", "before", "after",
                            "file_text", "old_str", "new_str"})
#: How much of a tool's input (as JSON) and of free text a hook keeps before the replay
#: scrubs and bounds it. Longer text is cut here, raw: generous enough that the replay's cut
#: (200 characters for an input, 500 for a message) is the one a reader sees.
MAX_INPUT = 4000
MAX_TEXT = 8000


#: A ``Hook``'s fields and their empty values.
FIELDS = {"harness": "", "event": "", "session": "", "cwd": "", "source": "", "prompt": "", "tool": "",
          "call_id": "", "input": "", "files": None, "error": "", "message": "", "kind": "", "reason": "",
          "model": ""}


class Hook:
    """One payload, read. ``event`` is one of ``EVENTS``' values; the rest as the event has
    them: ``source`` (session_start: startup, resume, clear, compact), ``prompt``, ``tool``,
    ``call_id``, ``input`` (the tool's input as JSON, content fields dropped, bounded),
    ``files`` (what a file tool writes, absolute), ``error``, ``message`` (a notification's,
    or the last assistant message at stop), ``kind`` (a notification's type), ``reason``
    (session_end's), ``model``. A plain class: dataclasses would cost a hook ~10 ms."""

    __slots__ = tuple(FIELDS)
    harness: str
    event: str
    session: str
    cwd: str
    source: str
    prompt: str
    tool: str
    call_id: str
    input: str
    files: list[str]
    error: str
    message: str
    kind: str
    reason: str
    model: str

    def __init__(self, **values: Any) -> None:
        for name, empty in FIELDS.items():
            value = values.get(name, empty)
            setattr(self, name, [] if value is None else value)

    def doc(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in FIELDS if getattr(self, k) not in ("", [])}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Hook:
        return cls(**{k: v for k, v in doc.items() if k in FIELDS})


class NotAHook(ValueError):
    """The input is not a payload this harness sends (or an event it has no record for)."""


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:limit]


def _abs(cwd: str, path: str) -> str:
    import os.path

    return os.path.normpath(path if os.path.isabs(path) or not cwd else os.path.join(cwd, path))


def _patch_files(patch: str, cwd: str) -> list[str]:
    return [_abs(cwd, line[len(mark):].strip()) for line in patch.splitlines() for mark in _PATCH_MARKS
            if line.startswith(mark)]


def _tool_input(tool: str, raw: Any, cwd: str) -> tuple[str, list[str]]:
    """The input kept (JSON, content dropped, bounded) and the files a file tool writes."""
    files: list[str] = []
    if isinstance(raw, dict):
        field = FILE_TOOLS.get(tool)
        if field and isinstance(raw.get(field), str):
            files.append(_abs(cwd, raw[field]))
        if tool in PATCH_TOOLS:
            patch = raw.get("input") or raw.get("patch") or raw.get("command") or ""
            if isinstance(patch, list):
                patch = "\n".join(str(p) for p in patch)
            files += _patch_files(str(patch), cwd)
            raw = {"files": files}
        else:
            raw = {k: v for k, v in raw.items() if k not in CONTENT_FIELDS}
    elif tool in PATCH_TOOLS and isinstance(raw, str):
        files += _patch_files(raw, cwd)
        raw = {"files": files}
    return _text(raw, MAX_INPUT), files


def read(harness: str, doc: Any) -> Hook:
    """The payload ``doc`` (parsed JSON) of ``harness`` as a ``Hook``; ``NotAHook`` when it
    is not one (the hook then records nothing)."""
    if harness not in HARNESSES:
        raise NotAHook(f"unknown harness {harness!r}; one of {', '.join(HARNESSES)}")
    if not isinstance(doc, dict):
        raise NotAHook("the payload is not a JSON object")
    name = doc.get("event") if harness == "goose" else doc.get("hook_event_name")
    if not isinstance(name, str) or name not in EVENTS:
        raise NotAHook(f"event {name!r} is not one a hook records")
    session = doc.get("session_id")
    if not isinstance(session, str) or not session:
        raise NotAHook("the payload has no session_id")
    cwd = doc.get("cwd") or doc.get("working_dir") or ""
    cwd = cwd if isinstance(cwd, str) else ""
    hook = Hook(harness=harness, event=EVENTS[name], session=session, cwd=cwd,
                model=_text(doc.get("model"), 200))
    if hook.event == "session_start":
        hook.source = _text(doc.get("source"), 40)
    elif hook.event == "prompt":
        hook.prompt = _text(doc.get("message") if harness == "goose" else doc.get("prompt"))
    elif hook.event in ("pre_tool", "post_tool", "tool_failed", "permission_request"):
        hook.tool = _text(doc.get("tool_name"), 200)
        call = doc.get("tool_call_id") if harness == "goose" else doc.get("tool_use_id")
        hook.call_id = _text(call, 200)
        hook.input, hook.files = _tool_input(hook.tool, doc.get("tool_input"), cwd)
        if hook.event == "tool_failed":
            hook.error = _text(doc.get("error") or doc.get("tool_response"))
    elif hook.event == "notification":
        hook.message = _text(doc.get("message"))
        hook.kind = _text(doc.get("notification_type"), 80)
    elif hook.event == "stop":
        hook.message = _text(doc.get("last_assistant_message"))
    elif hook.event == "session_end":
        hook.reason = _text(doc.get("reason"), 200)
    return hook


def deny(harness: str, reason: str) -> str:
    """What a PreToolUse hook prints to refuse the tool call, in the harness's words."""
    if harness == "goose":
        return json.dumps({"decision": "block", "reason": reason})
    return json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                              "permissionDecisionReason": reason}})
