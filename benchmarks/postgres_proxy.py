"""A counting TCP proxy between a PostgreSQL client and the server: how many round trips
a command costs, seen on the wire.

Why a proxy and not psycopg's hooks: psycopg has no public hook that fires once per
exchange with the server (its notice and notify handlers see only what the server volunteers),
and counting calls to its internal wait functions would tie the figure to one
driver's internals and miss any round trip made outside them. The proxy sees every byte
both ways, whatever code (ours, raw psycopg, eventsourcing) sits on the client side and
whatever the integrator does to the write path (pipeline mode, a server-side function).

What it counts, per connection, summed over all connections through it:

- **round trips** (``turns``): the number of times the client sends after the server
  has sent something since the client last sent (a client burst that follows a server
  reply). A client that waits for each answer before it sends again makes one turn per
  request; a pipelined batch sent in one go, answered once, is one turn. The server
  sends nothing until it gets a Sync, a Flush or a simple Query (it holds its replies
  unless its output buffer fills), so a client that pipelines does not turn the
  direction mid-batch. The count
  is an upper bound only for a client that sends the next batch while an earlier one's
  answer is already on its way (asynchronous pipelining, which nothing here does).
- **ReadyForQuery** messages (``ready``, type ``Z``): one per Sync or simple Query the
  server answered, a protocol-level cross-check of the turn count.

The proxy reads the server's messages, so they must not be encrypted: it answers a
client's SSLRequest or GSSENCRequest itself with "N" (not supported), and the client
goes on in plain text, as libpq's default ``sslmode=prefer`` allows (a client that
requires encryption cannot use it). It runs in a thread of the benchmark process, which slows the proxied side:
the scenario that uses it reports counts, not speed.
"""

from __future__ import annotations

import selectors
import socket
import threading
import urllib.parse
from typing import Any


class _Parser:
    """Splits the server's byte stream into messages (type byte + int32 length) and
    counts ReadyForQuery, across chunk boundaries."""

    __slots__ = ("header", "skip", "ready")

    def __init__(self) -> None:
        self.header = b""
        self.skip = 0
        self.ready = 0

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                k = min(self.skip, n - i)
                self.skip -= k
                i += k
                continue
            take = data[i : i + 5 - len(self.header)]
            self.header += take
            i += len(take)
            if len(self.header) == 5:
                if self.header[0] == ord("Z"):
                    self.ready += 1
                self.skip = int.from_bytes(self.header[1:5], "big") - 4
                self.header = b""


#: The startup-phase requests for encryption (length 8, then this code), which the
#: proxy refuses itself.
_ENCRYPTION_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest


class _Pair:
    __slots__ = ("client", "server", "last", "turns", "parser", "startup")

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.startup: bytes | None = b""  # the client's first bytes, until its startup message is seen
        self.last = "server"  # the startup message counts as the first turn
        self.turns = 0
        self.parser = _Parser()

    def from_client(self, data: bytes) -> bytes:
        """What of the client's bytes goes to the server: an encryption request is
        answered here with "N" and dropped, until the startup message passes."""
        if self.startup is None:
            return data
        buf = self.startup + data
        while len(buf) >= 8 and int.from_bytes(buf[4:8], "big") in _ENCRYPTION_REQUESTS \
                and int.from_bytes(buf[0:4], "big") == 8:
            self.client.sendall(b"N")
            buf = buf[8:]
        if len(buf) < 8:
            self.startup = buf
            return b""
        self.startup = None
        return buf


class CountingProxy:
    """Listens on 127.0.0.1 (a free port) and forwards each connection to the server."""

    def __init__(self, target_url: str) -> None:
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(target_url)
        self.target_host = str(info.get("host") or "127.0.0.1")
        self.target_port = int(info.get("port") or 5432)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._by_fd: dict[int, tuple[_Pair, str]] = {}
        self._base = (0, 0)
        self._stop = False
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._loop, name="pg-counting-proxy", daemon=True)
        self._thread.start()

    def url(self, url: str) -> str:
        """``url`` pointed at the proxy."""
        parts = urllib.parse.urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = (user + "@" if user else "") + f"127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    def _connect_upstream(self) -> socket.socket:
        if self.target_host.startswith("/"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(f"{self.target_host}/.s.PGSQL.{self.target_port}")
        else:
            s = socket.create_connection((self.target_host, self.target_port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def _loop(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(timeout=0.1):
                sock: Any = key.fileobj
                if sock is self.listener:
                    try:
                        client, _addr = self.listener.accept()
                    except BlockingIOError:
                        continue
                    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    server = self._connect_upstream()
                    pair = _Pair(client, server)
                    with self._lock:
                        self._pairs.append(pair)
                    self._by_fd[client.fileno()] = (pair, "client")
                    self._by_fd[server.fileno()] = (pair, "server")
                    self._sel.register(client, selectors.EVENT_READ)
                    self._sel.register(server, selectors.EVENT_READ)
                    continue
                entry = self._by_fd.get(sock.fileno())
                if entry is None:  # closed with its partner earlier in this round
                    continue
                pair, side = entry
                try:
                    data = sock.recv(262144)
                except OSError:
                    data = b""
                if not data:
                    self._close(pair)
                    continue
                if side == "client":
                    data = pair.from_client(data)
                    if not data:
                        continue
                    with self._lock:
                        if pair.last == "server":
                            pair.turns += 1
                        pair.last = "client"
                    pair.server.sendall(data)
                else:
                    with self._lock:
                        pair.last = "server"
                        pair.parser.feed(data)
                    pair.client.sendall(data)

    def _close(self, pair: _Pair) -> None:
        for s in (pair.client, pair.server):
            try:
                self._by_fd.pop(s.fileno(), None)
                self._sel.unregister(s)
            except (KeyError, ValueError, OSError):
                pass
            s.close()

    def totals(self) -> tuple[int, int]:
        """(round trips, ReadyForQuery messages) over every connection so far."""
        with self._lock:
            return (sum(p.turns for p in self._pairs), sum(p.parser.ready for p in self._pairs))

    def mark(self) -> None:
        """Start counting from here (what :meth:`since_mark` reports)."""
        self._base = self.totals()

    def since_mark(self) -> tuple[int, int]:
        turns, ready = self.totals()
        return turns - self._base[0], ready - self._base[1]

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        with self._lock:
            pairs = list(self._pairs)
        for p in pairs:
            for s in (p.client, p.server):
                try:
                    s.close()
                except OSError:
                    pass
        self._sel.close()
        self.listener.close()
