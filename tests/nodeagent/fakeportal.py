"""A small portal that speaks docs/agent-api.md, on the standard library's threaded HTTP server.

For agent tests without Django: tests set each node's `desired` list and read back what the agents
sent. It can go down and come back on the same port, to test an agent losing its portal.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENROLMENT_TOKEN = "yen_fake-enrolment"
PREFIX = "/api/agent/v1/"


@dataclass
class NodeRecord:
    name: str
    token: str
    registration: dict[str, Any]
    desired: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: list[dict[str, Any]] = field(default_factory=list)
    drains: list[str] = field(default_factory=list)


class FakePortal:
    def __init__(self, *, heartbeat_interval_s: float = 0.3, stop_after_s: float = 120.0) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stop_after_s = stop_after_s
        self.lock = threading.Lock()
        self.nodes: dict[str, NodeRecord] = {}
        self.statuses: list[tuple[int, dict[str, Any]]] = []
        self.logs: dict[tuple[int, int], bytes] = {}
        self.stale: set[tuple[int, int]] = set()
        # task id -> the node it was ever assigned to: another node's token gets a 404
        self.assigned: dict[int, str] = {}
        # Tasks whose start a heartbeat reported, as the portal records them (docs/agent-api.md): each
        # start is also kept in `statuses` as a "running" status, the shape tests read.
        self.started: set[int] = set()
        # Extra limits every heartbeat answer carries (stop_after_s, fence_after_s, max_grace_s).
        self.limits: dict[str, float] = {}
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        # While set (shed()), every node call is answered with this status, body and Retry-After.
        self.shedding: tuple[int, dict[str, Any], str] | None = None
        self.shed_count = 0
        self.shed_first: float | None = None
        # While hanging (hang()), node calls are accepted and never answered, until released.
        self.hanging = False
        self.release = threading.Event()

    # -- server lifecycle ------------------------------------------------------------------------
    def start(self) -> FakePortal:
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._answer(400, {"code": "invalid", "errors": {"body": ["not JSON"]}})
                    return
                auth = self.headers.get("Authorization", "")
                token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else ""
                shed = portal.shed_answer(self.path)
                if shed is not None:
                    self._answer(shed[0], shed[1], {"Retry-After": shed[2]})
                    return
                status, answer = portal.handle(self.path, token, body)
                self._answer(status, answer)

            def _answer(self, status: int, answer: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                payload = json.dumps(answer).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """Go down: connections are refused until `start()` again (same port, same state)."""
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- what tests use --------------------------------------------------------------------------
    def shed(self, status: int | None, body: dict[str, Any] | None = None, retry_after: str = "1") -> None:
        """Answer every node call with `status` and `body` (the portal shedding, or a load balancer's 503)
        until shed(None)."""
        with self.lock:
            self.shedding = None if status is None else (status, body or {}, retry_after)
            self.shed_count, self.shed_first = 0, None

    def hang(self, on: bool = True) -> None:
        """Take every node call and never answer it (a portal stuck on its database) until hang(False)."""
        with self.lock:
            self.hanging = on
            if on:
                self.release.clear()
            else:
                self.release.set()

    def shed_answer(self, path: str) -> tuple[int, dict[str, Any], str] | None:
        if self.hanging and not path.endswith("/register"):
            self.release.wait(60)
        with self.lock:
            if self.shedding is None or path.endswith("/register"):
                return None
            self.shed_count += 1
            if self.shed_first is None:
                self.shed_first = time.monotonic()
            return self.shedding

    def shedding_for(self) -> float:
        """Seconds since the first call shed in this spell (0 before it)."""
        with self.lock:
            return 0.0 if self.shed_first is None else time.monotonic() - self.shed_first

    def add_node(self, name: str) -> str:
        """Register a node up front; returns its node token."""
        token = "ynd_" + secrets.token_hex(8)
        with self.lock:
            self.nodes[name] = NodeRecord(name=name, token=token, registration={"name": name})
        return token

    def set_desired(self, name: str, specs: list[dict[str, Any]]) -> None:
        with self.lock:
            self.nodes[name].desired = [dict(spec) for spec in specs]
            self.assigned.update({int(spec["task_id"]): name for spec in specs})

    def heartbeats(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.nodes[name].heartbeats) if name in self.nodes else []

    def statuses_of(self, task_id: int, state: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [b for t, b in self.statuses if t == task_id and (state is None or b["state"] == state)]

    def log_text(self, task_id: int, attempt: int = 1) -> str:
        with self.lock:
            return self.logs.get((task_id, attempt), b"").decode()

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    # -- the API ---------------------------------------------------------------------------------
    def handle(self, path: str, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not path.startswith(PREFIX):
            return 404, {"code": "not_found"}
        route = path.removeprefix(PREFIX).strip("/")
        with self.lock:
            if route == "register":
                return self._register(token, body)
            node = next((n for n in self.nodes.values() if n.token == token), None)
            if node is None:
                return 401, {"code": "unauthorized"}
            if route == "heartbeat":
                node.heartbeats.append(body)
                self._record_starts(node, body)
                return 200, {
                    # A stale attempt is not the node's any more: the portal leaves it out, the agent fences it.
                    "desired": [
                        {**s, "started": int(s["task_id"]) in self.started}
                        for s in node.desired
                        if (int(s["task_id"]), int(s["attempt"])) not in self.stale
                    ],
                    "heartbeat_interval_s": self.heartbeat_interval_s,
                    "node_state": "READY",
                    **self.limits,
                }
            if route == "drain":
                node.drains.append(str(body.get("reason")))
                return 200, {"node_state": "DRAINING"}
            parts = route.split("/")
            if len(parts) == 3 and parts[0] == "tasks":
                return self._task_call(node, int(parts[1]), parts[2], body)
        return 404, {"code": "not_found"}

    def _record_starts(self, node: NodeRecord, body: dict[str, Any]) -> None:
        for report in body.get("tasks", []):
            task_id = int(report["task_id"])
            if task_id in self.started or report.get("started_at") is None or self.assigned.get(task_id) != node.name:
                continue
            if (task_id, int(report["attempt"])) in self.stale:
                continue
            self.started.add(task_id)
            notebook = report.get("notebook") or {}
            self.statuses.append(
                (
                    task_id,
                    {
                        "attempt": report["attempt"],
                        "state": "running",
                        "pid": report.get("pid"),
                        "started_at": report.get("started_at"),
                        "notebook_url": notebook.get("url"),
                    },
                )
            )

    def _register(self, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if token != ENROLMENT_TOKEN:
            return 401, {"code": "unauthorized"}
        name = str(body["name"])
        if name in self.nodes:
            return 409, {"code": "node_exists"}
        node_token = "ynd_" + secrets.token_hex(8)
        self.nodes[name] = NodeRecord(name=name, token=node_token, registration=body)
        return 201, {
            "node": {"id": len(self.nodes), "name": name},
            "token": node_token,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "stop_after_s": self.stop_after_s,
        }

    def _task_call(self, node: NodeRecord, task_id: int, what: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.assigned.get(task_id) != node.name:
            return 404, {"code": "not_found"}
        key = (task_id, int(body["attempt"]))
        if key in self.stale:
            return 409, {"code": "stale_attempt"}
        if what == "status":
            self.statuses.append((task_id, body))
            return 200, {}
        if what == "logs":
            stored = self.logs.get(key, b"")
            data = str(body["data"]).encode()
            offset = int(body["offset"])
            # At-least-once from the agent: keep only what goes beyond the stored length.
            if offset + len(data) > len(stored):
                stored += data[max(0, len(stored) - offset) :]
            self.logs[key] = stored
            return 200, {"next_offset": len(stored)}
        return 404, {"code": "not_found"}
