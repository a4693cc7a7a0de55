"""A real webhook receiver on 127.0.0.1 for the delivery tests.

It records every request, and each test chooses how it answers: succeed, answer 5xx,
hang past the client's timeout, act and then close the connection without answering
(the "did it arrive?" case), or never read the request at all. It keeps Idempotency-Key
like a careful receiver: a repeat of a key it acted on is answered again and never acted
on twice, so ``effects`` counts what really happened at the target.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
from typing import Any


class Receiver:
    def __init__(self, *, dedupe: bool = True) -> None:
        self.requests: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self.mode = "ok"  # ok, 5xx, 400, hang, close_after_act, act_then_hang, act_then_wait
        self.dedupe = dedupe
        self.done: dict[str, bytes] = {}
        self.acted = threading.Event()
        self.received = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        rx = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                key = self.headers.get("Idempotency-Key", "")
                with rx.lock:
                    rx.requests.append({"key": key, "headers": dict(self.headers), "body": body})
                    mode = rx.mode
                if mode == "hang":  # read it, never act on it
                    rx.received.set()
                    rx.release.wait(30)
                    return self._close()
                if mode == "5xx":
                    return self._answer(503, b'{"error": "busy"}')
                if mode == "400":
                    return self._answer(400, b'{"error": "bad"}')
                answer = rx.act(key, body)
                if mode == "close_after_act":
                    return self._close()
                if mode == "act_then_hang":
                    rx.acted.set()
                    rx.release.wait(30)
                    return self._close()
                if mode == "act_then_wait":  # acted; answers 200 once released
                    rx.acted.set()
                    rx.release.wait(30)
                self._answer(200, answer)
                rx.acted.set()

            def _answer(self, code: int, data: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _close(self) -> None:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def act(self, key: str, body: bytes) -> bytes:
        with self.lock:
            if self.dedupe and key in self.done:
                return self.done[key]
            self.effects.append({"key": key, "body": body})
            answer = json.dumps({"id": f"msg-{len(self.effects)}",
                                 "sha256": hashlib.sha256(body).hexdigest()}).encode()
            self.done[key] = answer
            return answer

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class Deaf:
    """A listening socket nobody accepts on: a connection completes in the kernel's
    backlog and the request sits unread, so nothing ever acts on it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def close(self) -> None:
        self.sock.close()
