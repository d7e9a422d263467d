"""A TCP proxy on 127.0.0.1 that a test can cut and restore, to take a server away without stopping it.

    with TcpProxy(target=("127.0.0.1", 5432)) as proxy:
        url = f"postgres://postgres@127.0.0.1:{proxy.port}/db"
        proxy.cut()       # every connection through it is reset, new ones are refused
        proxy.restore()   # connections are accepted and forwarded again
        proxy.hang()      # half-open: connections stay up and new ones are accepted, nothing is forwarded
        proxy.delay_s = 1 # every answer from the server arrives this much later (latency per round trip)

The shared PostgreSQL keeps running for everyone else: only what goes through the proxy loses it.
``refuse_with`` makes it answer every new connection with fixed bytes instead (an HTTP 503 page, say).

A hung proxy's kernel still acknowledges every packet, so to the client it is a server that takes
everything and never answers (a hung or stopped server): TCP keepalives and tcp_user_timeout do not
fire, only the client's own deadlines do. What was sent while hung is dropped; restore() resets those
connections, as their streams have a hole.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
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
        self.hung = False
        self.delay_s = 0.0
        self.dropped_bytes = 0
        self.held: list[socket.socket] = []  # accepted while hung, never connected upstream
        self.holed: set[socket.socket] = set()  # pairs (by their client socket) that lost bytes while hung
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
        """Forward again (after cut() or hang()); connections that lost bytes while hung are reset."""
        with self.lock:
            self.open = True
            self.hung = False
            held, self.held = self.held, []
            holed, self.holed = self.holed, set()
            broken = [pair for pair in self.pairs if pair[0] in holed]
            self.pairs = [pair for pair in self.pairs if pair[0] not in holed]
        for s in held + [s for pair in broken for s in pair]:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()

    def hang(self) -> None:
        """Half-open: keep every connection and accept new ones, forward nothing either way."""
        with self.lock:
            self.hung = True

    def _hold(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while client.recv(65536):
                pass

    def _serve(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                admit = self.open and not self.stopping
                if admit and self.hung:
                    self.held.append(client)
            if admit and self.hung:
                self.accepted += 1
                threading.Thread(target=self._hold, args=(client,), daemon=True).start()
                continue
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
            for a, b, delayed in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(a, b, client, delayed), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, client: socket.socket, delayed: bool) -> None:
        # The reader takes bytes as they come; a writer sends each chunk when it is due, so a delay adds
        # latency to every answer without serialising the chunks of one answer behind each other.
        due: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        writer = threading.Thread(target=self._write, args=(due, sink), daemon=True)
        writer.start()
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if self.hung:
                    with self.lock:
                        self.dropped_bytes += len(data)
                        self.holed.add(client)
                    continue
                due.put((time.monotonic() + (self.delay_s if delayed else 0.0), data))
        except OSError:
            pass
        finally:
            due.put(None)
            writer.join(timeout=self.delay_s + 5)
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self.lock:
                self.pairs = [p for p in self.pairs if source not in p]

    @staticmethod
    def _write(due: queue.Queue[tuple[float, bytes] | None], sink: socket.socket) -> None:
        try:
            while (item := due.get()) is not None:
                at, data = item
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # the latency being simulated
                sink.sendall(data)
        except OSError:
            pass
