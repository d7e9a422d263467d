"""A TCP proxy on 127.0.0.1 that a test can cut and restore, to take a server away without stopping it.

    with TcpProxy(target=("127.0.0.1", 5432)) as proxy:
        url = f"postgres://postgres@127.0.0.1:{proxy.port}/db"
        proxy.cut()       # every connection through it is reset, new ones are refused
        proxy.restore()   # connections are accepted and forwarded again

The shared PostgreSQL keeps running for everyone else: only what goes through the proxy loses it.
``refuse_with`` makes it answer every new connection with fixed bytes instead (an HTTP 503 page, say).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


class TcpProxy:
    def __init__(self, *, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(256)
        self.port: int = self.listener.getsockname()[1]
        self.open = True
        self.refuse_with: bytes | None = None
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        self.refused = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> TcpProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopping = True
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.close()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until restore()."""
        with self.lock:
            self.open = False
            pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    # RST, not FIN: what a pulled cable or a crashed server looks like to the client.
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.close()

    def restore(self) -> None:
        with self.lock:
            self.open = True

    def _serve(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                admit = self.open and not self.stopping
            if not admit:
                self.refused += 1
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    client.close()
                continue
            if self.refuse_with is not None:
                self.refused += 1
                with contextlib.suppress(OSError):
                    client.recv(65536)
                    client.sendall(self.refuse_with)
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.accepted += 1
            with self.lock:
                self.pairs.append((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self.lock:
                self.pairs = [p for p in self.pairs if source not in p]
