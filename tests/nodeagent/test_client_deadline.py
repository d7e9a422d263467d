"""One timeout bounds a whole call to the portal, not each of its steps (nodeagent/client.py).

A loaded fill saw one heartbeat take 65 s at a 20 s timeout: the connect waited on a full listen
queue, then the answer got a whole timeout of its own. The steps here run on a clock the test steps,
so what each is left is exact, whatever the machine's load.
"""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from nodeagent.client import open_within


class _Answers(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:
        self.seen.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up before the answer: what the tests want


@pytest.fixture
def server() -> Iterator[str]:
    _Answers.seen = []
    httpd = _Server(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def stepping(step: float) -> Callable[[], float]:
    """A clock that moves ``step`` seconds at every reading: each step of a call costs that much."""
    now = [0.0]

    def clock() -> float:
        now[0] += step
        return now[0]

    return clock


def _request(url: str) -> urllib.request.Request:
    return urllib.request.Request(url + "/beat", data=b"{}", method="POST")


def test_a_call_within_its_timeout_is_answered(server: str) -> None:
    with open_within(_request(server), 5.0, clock=stepping(0.1)) as response:
        assert response.status == 200 and response.read() == b"{}"
    assert _Answers.seen == ["/beat"]


def test_the_wait_for_the_answer_gets_only_what_the_connect_left(server: str) -> None:
    # 0.6 s to start, 0.6 s more by the time it connected: of a 1 s timeout nothing is left to wait for
    # the answer, though the server answers at once. urllib's per-step timeout gave it a whole second.
    with pytest.raises(TimeoutError, match="whole timeout"):
        open_within(_request(server), 1.0, clock=stepping(0.6))


def test_a_call_whose_time_is_gone_before_it_connects_sends_nothing(server: str) -> None:
    with pytest.raises(urllib.error.URLError, match="whole timeout"):
        open_within(_request(server), 0.5, clock=stepping(0.6))
    assert _Answers.seen == []
