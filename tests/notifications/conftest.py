"""Real servers on 127.0.0.1 for the notification channels: an SMTP server (aiosmtpd) and an HTTP
server that records webhook calls and answers with the status a test chooses."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.core.cache import cache

from tests.portal.conftest import _fast_password_hashing, _yard_context_processor, cast  # noqa: F401 - the portal's cast
from tests.sso.conftest import free_port


@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd's handler hook
        with self.lock:
            self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"

    def subjects(self) -> list[str]:
        with self.lock:
            return [str(m["Subject"]) for m in self.messages]


@pytest.fixture
def smtp(settings: Any) -> Iterator[Mailbox]:
    box = Mailbox(host="127.0.0.1", port=free_port())
    controller = Controller(box, hostname=box.host, port=box.port)
    controller.start()
    # pytest-django swaps in the in-memory backend for every test; these tests talk SMTP for real.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = box.host, box.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    try:
        yield box
    finally:
        controller.stop()


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class HookServer:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.status = 200
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with owner.lock:
                    owner.calls.append(Call(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    status = owner.status
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self) -> int:
        with self.lock:
            return len(self.calls)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[HookServer]:
    server = HookServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _notify_settings(settings: Any) -> None:
    # Loopback receivers are the point of these tests; production keeps 127.0.0.0/8 denied.
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "WEBHOOK_DENY_NETWORKS": [], "RETRY_BASE_S": 0.2, "WEBHOOK_DISABLE_AFTER": 3}
    cache.clear()
