"""A scripted Anthropic Messages API on 127.0.0.1, for driving the real Claude Code CLI offline.

Claude Code (``claude -p``) sends its conversation to ``$ANTHROPIC_BASE_URL/v1/messages``.
This server answers each request carrying tools with the next step of a script: step N is
served when the conversation already holds N assistant turns, so a step is a list of tool
calls (``Call``) the model makes at once, and the script's end is a plain text answer.
Requests without tools (Claude Code's own side requests: titles, summaries) get a short
text answer. ``before[N]`` is called once, before step N is served (a test revoking a lease
between two tool calls, say). Answers are streamed as the API streams them (``message_start``,
``content_block_*`` with ``input_json_delta`` for a tool's input, ``message_delta``,
``message_stop``) when the request asks for a stream, else sent whole.

Every request is kept (``requests``) so a test can see what the CLI sent, tool results
included.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class Call:
    """One tool call the model makes: the tool's name and its input."""

    name: str
    input: dict[str, Any]


class ScriptedModel:
    """``with ScriptedModel([[Call("Bash", {...})], ...], final="Done.") as model:`` serves on
    ``model.url`` until the block ends."""

    def __init__(self, steps: list[list[Call]], final: str = "Done.",
                 before: dict[int, Callable[[], object]] | None = None) -> None:
        self.steps = steps
        self.final = final
        self.before = dict(before or {})
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = 0
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with model._lock:
                    model.requests.append({"path": self.path, "body": body})
                    model._ids += 1
                    msg_id = f"msg_{model._ids:04d}"
                if "count_tokens" in self.path:
                    self._json({"input_tokens": 10})
                    return
                content = model.answer(body, msg_id)
                stop = "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn"
                if body.get("stream"):
                    self._stream(body, msg_id, content, stop)
                else:
                    self._json({"id": msg_id, "type": "message", "role": "assistant", "model": body.get("model"),
                                "content": content, "stop_reason": stop, "stop_sequence": None,
                                "usage": {"input_tokens": 5, "output_tokens": 5}})

            def do_GET(self) -> None:  # noqa: N802
                self._json({}, status=404)

            def _json(self, doc: dict[str, Any], status: int = 200) -> None:
                out = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _stream(self, body: dict[str, Any], msg_id: str, content: list[dict[str, Any]], stop: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                events: list[tuple[str, dict[str, Any]]] = [("message_start", {
                    "type": "message_start",
                    "message": {"id": msg_id, "type": "message", "role": "assistant", "model": body.get("model"),
                                "content": [], "stop_reason": None, "stop_sequence": None,
                                "usage": {"input_tokens": 5, "output_tokens": 1}}})]
                for i, block in enumerate(content):
                    if block["type"] == "text":
                        events += [("content_block_start", {"type": "content_block_start", "index": i,
                                                            "content_block": {"type": "text", "text": ""}}),
                                   ("content_block_delta", {"type": "content_block_delta", "index": i,
                                                            "delta": {"type": "text_delta", "text": block["text"]}})]
                    else:
                        events += [("content_block_start", {"type": "content_block_start", "index": i,
                                                            "content_block": {**block, "input": {}}}),
                                   ("content_block_delta", {"type": "content_block_delta", "index": i,
                                                            "delta": {"type": "input_json_delta",
                                                                      "partial_json": json.dumps(block["input"])}})]
                    events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
                events += [("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": stop, "stop_sequence": None},
                                              "usage": {"output_tokens": 5}}),
                           ("message_stop", {"type": "message_stop"})]
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)

    def answer(self, body: dict[str, Any], msg_id: str) -> list[dict[str, Any]]:
        """The content of the next answer: the script's step for this point of the
        conversation, or the final text."""
        if not body.get("tools"):
            return [{"type": "text", "text": "ok"}]
        turns = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        act = self.before.pop(turns, None)
        if act is not None:
            act()  # what the test does at this point of the session, before the model answers
        if turns < len(self.steps):
            return [{"type": "tool_use", "id": f"toolu_{turns:02d}_{i}_{msg_id}", "name": c.name, "input": c.input}
                    for i, c in enumerate(self.steps[turns])]
        return [{"type": "text", "text": self.final}]

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
