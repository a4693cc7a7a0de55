"""A TCP proxy that reads the PostgreSQL wire protocol from the client and counts the
messages that end a request (Sync of the extended protocol, or a simple Query): the
client waits for the server's answer after each, so their count is the number of round
trips a command costs. (psycopg's pipeline sends a Flush with its Sync, in the same
burst: not a round trip of its own, so Flush is not counted.)"""

from __future__ import annotations

import socket
import struct
import threading
import urllib.parse


class CountingProxy:
    def __init__(self, host: str = "127.0.0.1", port: int = 5432) -> None:
        self.target = (host, port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.requests = 0  # Sync + Query messages, over every connection
        self.kinds: dict[str, int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """The same address, through this proxy."""
        parts = urllib.parse.urlsplit(url)
        user = parts.username or "postgres"
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{self.port}"))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._from_client, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _from_client(self, client: socket.socket, server: socket.socket) -> None:
        buf = b""
        started = False
        try:
            while data := client.recv(65536):
                server.sendall(data)
                buf += data
                while True:
                    if not started:  # untyped: SSLRequest / GSSENCRequest / StartupMessage
                        if len(buf) < 8:
                            break
                        n, code = struct.unpack("!ii", buf[:8])
                        if len(buf) < n:
                            break
                        buf = buf[n:]
                        if code not in (80877103, 80877104):  # not an SSL/GSS request: the startup
                            started = True
                        continue
                    if len(buf) < 5:
                        break
                    kind = buf[:1].decode("latin-1")
                    n = struct.unpack("!i", buf[1:5])[0]
                    if len(buf) < 1 + n:
                        break
                    buf = buf[1 + n:]
                    with self._lock:
                        self.kinds[kind] = self.kinds.get(kind, 0) + 1
                        if kind in "SQ":
                            self.requests += 1
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
