"""A fault-injecting TCP proxy between worker processes and PostgreSQL, steered by the test.

Each worker gets a proxy of its own (``FaultProxy(upstream_port)``; its ``url(base)`` is
the worker's address), so a fault hits one worker and not the others. The test changes
the mode at any moment, from its own process, while the workers run as real processes:

- ``pass_()``: forward both ways (the default);
- ``delay(seconds)``: forward, but hold every chunk that long first (a slow link);
- ``blackhole()``: accept connections and never answer: bytes in both directions are
  held, not delivered, exactly as a partition looks from both ends while TCP stays up;
- ``heal()``: back to ``pass``, delivering what was held (TCP retransmits after a
  partition heals), so a write sent into the partition arrives late;
- ``cut()``: close every connection now and refuse new ones until ``pass_()`` (a
  firewall reset, a dead NAT entry);
- ``blackhole_after(pattern, deliver=True)``: forward until a client chunk contains
  ``pattern`` (``b"COMMIT"``), then blackhole: with ``deliver`` the chunk reaches the
  server (the commit lands, its answer is lost), without it the chunk is held too.

Written for the tests because none of the registries' proxies (toxiproxy is a Go
server, not a Python package) gives a held-then-delivered blackhole and a trigger on
the bytes of one statement, and threads are all it takes.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.parse
from typing import Any


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.held: list[tuple[socket.socket, bytes]] = []  # (destination, bytes) while blackholed
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for s in (self.client, self.upstream):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


class FaultProxy:
    """A TCP proxy on 127.0.0.1 (a free port) to ``upstream_host:upstream_port``."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode = "pass"
        self._delay = 0.0
        self._trigger: tuple[bytes, bool] | None = None
        self._links: list[_Link] = []
        self._stopped = False
        #: What happened, for the test's evidence: connections, cuts, triggers fired.
        self.counts = {"connections": 0, "refused": 0, "cut": 0, "triggered": 0, "held_chunks": 0}
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    # --- the test's controls ------------------------------------------------------------

    def url(self, base: str) -> str:
        """``base`` (a postgresql:// URL) with host and port replaced by this proxy's."""
        parts = urllib.parse.urlsplit(base)
        user = parts.netloc.rpartition("@")[0]
        netloc = (user + "@" if user else "") + f"127.0.0.1:{self.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))

    @property
    def mode(self) -> str:
        return self._mode

    def pass_(self) -> None:
        with self._lock:
            self._mode, self._delay, self._trigger = "pass", 0.0, None

    def delay(self, seconds: float) -> None:
        with self._lock:
            self._mode, self._delay = "delay", seconds

    def blackhole(self) -> None:
        with self._lock:
            self._mode = "blackhole"

    def blackhole_after(self, pattern: bytes, *, deliver: bool = True) -> None:
        with self._lock:
            self._mode, self._trigger = "pass", (pattern, deliver)

    def heal(self) -> None:
        """Forward again, delivering in order whatever was held during the blackhole."""
        with self._lock:
            self._mode, self._delay, self._trigger = "pass", 0.0, None
            for link in self._links:
                held, link.held = link.held, []
                for dest, data in held:
                    self._send(link, dest, data)

    def cut(self) -> None:
        with self._lock:
            self._mode = "cut"
            for link in self._links:
                link.close()
                self.counts["cut"] += 1
            self._links = [lnk for lnk in self._links if not lnk.closed]

    def close(self) -> None:
        self._stopped = True
        with self._lock:
            for link in self._links:
                link.close()
            self._links = []
        try:
            self._listener.close()
        except OSError:
            pass

    # --- the machinery -------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                mode = self._mode
            if mode == "cut":
                self.counts["refused"] += 1
                _Link(client, socket.socket()).close()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
                self.counts["connections"] += 1
            threading.Thread(target=self._pump, args=(link,), daemon=True).start()

    def _send(self, link: _Link, dest: socket.socket, data: bytes) -> None:
        try:
            dest.sendall(data)
        except OSError:
            link.close()

    def _pump(self, link: _Link) -> None:
        peer = {link.client: link.upstream, link.upstream: link.client}
        while not link.closed and not self._stopped:
            try:
                ready, _, _ = select.select([link.client, link.upstream], [], [], 0.2)
            except (OSError, ValueError):
                break
            for src in ready:
                try:
                    data = src.recv(65536)
                except OSError:
                    data = b""
                if not data:  # one side closed: close the other (what was held is lost)
                    link.close()
                    break
                self._forward(link, peer[src], data, from_client=src is link.client)
        link.close()
        with self._lock:
            if link in self._links:
                self._links.remove(link)

    def _forward(self, link: _Link, dest: socket.socket, data: bytes, *, from_client: bool) -> None:
        with self._lock:
            mode, delay, trigger = self._mode, self._delay, self._trigger
            if mode == "pass" and trigger is not None and from_client and trigger[0] in data:
                self._mode, self._trigger = "blackhole", None
                self.counts["triggered"] += 1
                if trigger[1]:
                    self._send(link, dest, data)
                    return
                mode = "blackhole"
            if mode == "blackhole" or link.held:
                link.held.append((dest, data))
                self.counts["held_chunks"] += 1
                return
            if mode == "cut":
                link.close()
                return
        if delay > 0:
            time.sleep(delay)
        self._send(link, dest, data)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
