"""A scripted OpenAI Responses API on 127.0.0.1, for driving the real Codex CLI offline.

``codex exec`` with a model provider whose ``base_url`` is ``ScriptedResponses.url`` (and
``wire_api = "responses"``) posts each turn to ``/v1/responses`` and reads a stream of
server-sent events. Step N of the script is served when the request's input already holds N
tool outputs (``function_call_output``): a step is the commands the model runs, each one an
``exec_command`` call (Codex's shell tool), and the script's end is a text answer. The
events are the few Codex needs: ``response.created``, one ``response.output_item.done`` per
item, ``response.completed`` with the usage. ``before[N]`` is called once before step N.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any


class ScriptedResponses:
    def __init__(self, steps: list[list[str]], final: str = "Done.",
                 before: dict[int, Callable[[], object]] | None = None) -> None:
        self.steps = steps
        self.final = final
        self.before = dict(before or {})
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with model._lock:
                    model.requests.append(body)
                    n = len(model.requests)
                items = model.answer(body, n)
                rid = f"resp_{n:04d}"
                events = [("response.created", {"type": "response.created", "response": {"id": rid}})]
                events += [("response.output_item.done", {"type": "response.output_item.done", "item": item})
                           for item in items]
                events.append(("response.completed", {"type": "response.completed", "response": {
                    "id": rid, "usage": {"input_tokens": 5, "input_tokens_details": None, "output_tokens": 5,
                                         "output_tokens_details": None, "total_tokens": 10}}}))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()
                self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-responses", daemon=True)

    def answer(self, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        done = sum(1 for i in body.get("input", []) if isinstance(i, dict) and i.get("type") == "function_call_output")
        turn = sum(1 for i in body.get("input", []) if isinstance(i, dict) and i.get("type") == "function_call")
        step = turn if done == turn else None
        act = self.before.pop(turn, None) if step is not None else None
        if act is not None:
            act()
        if step is not None and step < len(self.steps):
            return [{"type": "function_call", "id": f"fc_{n}_{i}", "call_id": f"call_{step}_{i}",
                     "name": "exec_command", "arguments": json.dumps({"cmd": cmd})}
                    for i, cmd in enumerate(self.steps[step])]
        return [{"type": "message", "role": "assistant", "id": f"msg_{n}",
                 "content": [{"type": "output_text", "text": self.final}]}]

    def outputs(self) -> list[str]:
        """Every tool output Codex sent back, in order (what the model was told)."""
        last = self.requests[-1] if self.requests else {}
        return [str(i.get("output")) for i in last.get("input", [])
                if isinstance(i, dict) and i.get("type") == "function_call_output"]

    def __enter__(self) -> ScriptedResponses:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def codex_home(path: Any, url: str) -> None:
    """A CODEX_HOME whose model provider is the scripted server (no account, no network)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(
        'model = "gpt-5-codex"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\nname = "scripted"\n'
        f'base_url = "{url}"\nwire_api = "responses"\nenv_key = "SCRIPTED_API_KEY"\n')
