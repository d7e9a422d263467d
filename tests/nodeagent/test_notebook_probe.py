"""The agent's probe of a notebook's Jupyter server, against a real HTTP server on loopback.

The portal's proxy forwards only while the heartbeat says the server answers (kernel_busy not None). A
probe that misses once on a loaded node must not cut the browser off; a server that stays silent must.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nodeagent import notebook
from nodeagent.journal import NotebookInfo

BASE = "/notebooks/7/lab/"


class _Jupyter(BaseHTTPRequestHandler):
    answering = True

    def do_GET(self) -> None:
        if not type(self).answering:
            self.send_response(503)  # urllib raises for it, as for a timeout or a refused connection
            self.end_headers()
            return
        if self.path == BASE + "api/status":
            body = {"last_activity": "2026-12-05T01:00:00+00:00", "kernels": 1, "connections": 2}
        elif self.path == BASE + "api/kernels":
            body = [{"execution_state": "busy"}]
        else:
            self.send_response(404)
            self.end_headers()
            return
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def jupyter() -> Iterator[NotebookInfo]:
    _Jupyter.answering = True
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Jupyter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    yield NotebookInfo(url=f"http://127.0.0.1:{port}{BASE}?token=t", port=port, token="t", base_url=BASE)
    server.shutdown()
    server.server_close()


def test_a_server_that_misses_a_probe_or_two_is_reported_as_it_last_answered_and_then_as_silent(jupyter: NotebookInfo) -> None:
    memory = notebook.ProbeMemory()
    first = notebook.probe(jupyter, address="127.0.0.1", memory=memory)
    assert first["kernel_busy"] is True and first["connections"] == 2

    _Jupyter.answering = False
    tolerated = [notebook.probe(jupyter, address="127.0.0.1", memory=memory) for _ in range(notebook.MISSES_TOLERATED)]
    assert all(r == first for r in tolerated)
    silent = notebook.probe(jupyter, address="127.0.0.1", memory=memory)
    assert silent["kernel_busy"] is None and silent["url"] == jupyter.url

    _Jupyter.answering = True  # an answer starts the count again
    assert notebook.probe(jupyter, address="127.0.0.1", memory=memory)["kernel_busy"] is True
    _Jupyter.answering = False
    assert notebook.probe(jupyter, address="127.0.0.1", memory=memory)["kernel_busy"] is True


def test_a_server_that_never_answered_is_not_reported_as_answering(jupyter: NotebookInfo) -> None:
    _Jupyter.answering = False
    memory = notebook.ProbeMemory()
    assert notebook.probe(jupyter, address="127.0.0.1", memory=memory)["kernel_busy"] is None
    assert notebook.probe(jupyter, address="127.0.0.1")["kernel_busy"] is None  # without memory: as before
