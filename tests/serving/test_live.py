"""A service under load through the real portal, with everything real: gunicorn (REST and agent API),
uvicorn (the service proxy), a Celery worker and beat (the scheduling cycle and the service controller),
and a `nodeagent.fleet` whose agents run a small real HTTP model server as each replica.

50 requests a second go through the proxy the whole time, while (a) one replica's server is killed
with SIGKILL, (b) a new version rolls out, (c) the service scales 2 → 3 → 1. Asserted (issue 27):
only requests in flight at the kill may fail, none that started after it; no request fails during the
rollout or the scaling; the new version's answers appear, and after the rollout only they do. The
counts are printed (`pytest -rP`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.stack import Stack
from tests.livestack import free_port_block, wait_for

pytestmark = [pytest.mark.slow]

RATE = 50.0  # requests per second through the proxy
ENV = {
    "YARD_HEARTBEAT_INTERVAL_S": "1",
    "YARD_CYCLE_INTERVAL_S": "1",
    "YARD_SERVICE_TICK_S": "1",
    "YARD_SERVICE_DRAIN_S": "2",
    "YARD_SERVICE_WINDOW_S": "2",
}
# A model server in a few lines: y = the sum of squares below x, from the version in its environment.
MODEL = """
import json, os, sys, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit, parse_qs

VERSION = os.environ["MODEL_VERSION"]
PORT = int(os.environ["PORT"])

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/health":
            body = b"ok"
        elif url.path == "/predict":
            query = parse_qs(url.query)
            x = int(query.get("x", ["10"])[0])
            time.sleep(float(query.get("sleep", ["0"])[0]))  # a model that takes its time
            body = json.dumps({"y": sum(i * i for i in range(x)), "version": VERSION, "pid": os.getpid()}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
Path(os.environ["PID_DIR"], f"{PORT}.pid").write_text(str(os.getpid()))
print(f"model v{VERSION} serving on {PORT}", flush=True)
server.serve_forever()
"""


@dataclass
class Load:
    """RATE requests a second to ``url`` from a pool of threads; every outcome kept with its times."""

    url: str
    token: str
    rate: float = RATE
    query: str = ""
    results: list[tuple[float, float, int, str]] = field(default_factory=list)  # start, end, status, version or error
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def one(self, x: int) -> None:
        began = time.monotonic()
        request = urllib.request.Request(f"{self.url}?x={x}{self.query}", headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                status, what = response.status, str(json.loads(response.read())["version"])
        except urllib.error.HTTPError as exc:
            status, what = exc.code, exc.read()[:200].decode(errors="replace")
        except Exception as exc:  # a connection error is a failed request too
            status, what = 0, repr(exc)[:200]
        with self.lock:
            self.results.append((began, time.monotonic(), status, what))

    def run(self) -> None:
        with ThreadPoolExecutor(max_workers=48) as pool:
            n, began = 0, time.monotonic()
            while not self.stop.is_set():
                pool.submit(self.one, 200 + n % 50)
                n += 1
                time.sleep(max(0.0, began + n / self.rate - time.monotonic()))

    def between(self, start: float, end: float) -> list[tuple[float, float, int, str]]:
        with self.lock:
            return [r for r in self.results if start <= r[0] < end]


def failed(rows: list[tuple[float, float, int, str]]) -> list[tuple[float, float, int, str]]:
    return [r for r in rows if r[2] != 200]


def api(stack: Stack, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        stack.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_service_stays_up_through_a_crash_a_rollout_and_scaling_at_50_requests_a_second(tmp_path: Path) -> None:
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**ENV, "YARD_RENDEZVOUS_PORTS": free_port_block(40, first=41000)}
    with Stack(nodes=3, fleets=1, nodes_file="2xH100", extra_env=env, asgi=True) as stack:
        stack.wait_ready(timeout=120)
        service = api(
            stack,
            "POST",
            "/api/v1/services",
            {
                "name": "squares",
                "team": "bench",
                "gpu_type": "H100",
                "replicas": 2,
                "command": f"exec {sys.executable} {script}",
                "env": {"MODEL_VERSION": "1", "PID_DIR": str(pids), "PYTHONUNBUFFERED": "1"},
                "readiness_path": "/health",
                "liveness_path": "/health",
                "probe_period_s": 0.5,
                "failure_threshold": 2,
            },
        )
        sid = service["id"]
        token = api(stack, "POST", f"/api/v1/services/{sid}/tokens", {"name": "load"})["token"]

        def status() -> dict[str, Any]:
            return dict(api(stack, "GET", f"/api/v1/services/{sid}"))

        wait_for("2 ready replicas", lambda: status()["ready_replicas"] == 2, timeout=120)
        load = Load(url=f"{stack.asgi_url}/services/bench/squares/predict", token=token)
        runner = threading.Thread(target=load.run, daemon=True)
        runner.start()
        try:
            time.sleep(3)
            # (a) one replica's server killed outright.
            replica = status()["replica_list"][0]
            (url,) = stack.sql("SELECT service_url FROM scheduling_task WHERE job_id = %s AND rank = 0", (replica["job"],))[0]
            victim = int((pids / f"{url.rsplit(':', 1)[1]}.pid").read_text())
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            in_flight_at_kill = len([r for r in load.between(0, killed_at) if r[1] > killed_at])

            def restarted() -> bool:
                rows = [r for r in status()["replica_list"] if r["job"] == replica["job"]]
                return bool(rows and rows[0]["restarts"] >= 1 and rows[0]["ready"])

            wait_for("the killed replica restarted in place and ready", restarted, timeout=120)
            time.sleep(2)
            crash_end = time.monotonic()
            # (b) a new version, rolled out replica by replica.
            api(stack, "POST", f"/api/v1/services/{sid}/rollout", {"env": {"MODEL_VERSION": "2", "PID_DIR": str(pids)}})
            # Generous: a quiet machine takes about 15 s, one running the whole suite has taken 144 s.
            wait_for("the rollout complete", lambda: status()["rollout"]["state"] == "complete", timeout=360)
            time.sleep(3)  # drained replicas are stopped after their drain
            rollout_end = time.monotonic()
            # (c) 2 -> 3 -> 1.
            api(stack, "POST", f"/api/v1/services/{sid}/scale", {"replicas": 3})
            wait_for("3 ready replicas", lambda: status()["ready_replicas"] == 3, timeout=240)
            time.sleep(2)
            api(stack, "POST", f"/api/v1/services/{sid}/scale", {"replicas": 1})
            wait_for("1 replica left", lambda: len(status()["replica_list"]) == 1, timeout=240)
            time.sleep(2)
            end = time.monotonic()
        finally:
            load.stop.set()
            runner.join(timeout=30)
        final = status()

    crash = load.between(killed_at, crash_end)
    before_kill = load.between(0, killed_at)
    rollout = load.between(crash_end, rollout_end)
    scaling = load.between(rollout_end, end)
    after_kill_failures = [r for r in failed(crash) if r[0] >= killed_at]
    kill_failures = [r for r in failed(before_kill) if r[1] >= killed_at]
    print(
        f"\nservice under {RATE:.0f} requests/s through the proxy: {len(load.results)} requests in "
        f"{end - load.results[0][0]:.0f} s\n"
        f"  crash:   {len(crash)} requests after the SIGKILL, {len(after_kill_failures)} failed; "
        f"{len(kill_failures)} in-flight requests failed at the kill ({in_flight_at_kill} were in flight)\n"
        f"  rollout: {len(rollout)} requests, {len(failed(rollout))} failed; versions answered "
        f"{sorted({r[3] for r in rollout if r[2] == 200})}\n"
        f"  scaling 2 -> 3 -> 1: {len(scaling)} requests, {len(failed(scaling))} failed\n"
        f"  failures: {[r[2:] for r in failed(load.results)][:10]}"
    )
    assert len(failed(before_kill)) == len(kill_failures), "nothing failed before the kill"
    assert len(kill_failures) <= in_flight_at_kill
    assert after_kill_failures == [], "a request that started after the kill failed"
    assert failed(rollout) == [], "a request failed during the rollout"
    assert failed(scaling) == [], "a request failed while scaling"
    versions = [r[3] for r in rollout if r[2] == 200]
    assert "2" in versions, "the new version answers during the rollout"
    assert {r[3] for r in scaling if r[2] == 200} == {"2"}, "after the rollout only the new version answers"
    assert final["revision"] == 2 and final["ready_replicas"] == 1
    assert len(load.results) >= RATE * 20


def test_the_autoscaler_follows_in_flight_requests_measured_at_the_proxy(tmp_path: Path) -> None:
    """30 requests/s of 0.1 s each keep about 3 in flight: with a target of 1 per replica the service grows
    from 1 to 3 replicas, and once the load stops it shrinks back to 1 after its cool-down, failing nothing."""
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    (tmp_path / "pids").mkdir()
    env = {**ENV, "YARD_RENDEZVOUS_PORTS": free_port_block(40, first=41000)}
    with Stack(nodes=2, fleets=1, nodes_file="2xH100", extra_env=env, asgi=True) as stack:
        stack.wait_ready(timeout=120)
        body = {
            "name": "slow", "team": "bench", "gpu_type": "H100", "replicas": 1, "min_replicas": 1, "max_replicas": 3,
            "target_inflight": 1.0, "scale_cooldown_s": 10, "command": f"exec {sys.executable} {script}",
            "env": {"MODEL_VERSION": "1", "PID_DIR": str(tmp_path / "pids")}, "readiness_path": "/health",
            "probe_period_s": 0.5,
        }  # fmt: skip
        sid = api(stack, "POST", "/api/v1/services", body)["id"]
        token = api(stack, "POST", f"/api/v1/services/{sid}/tokens", {"name": "load"})["token"]

        def status() -> dict[str, Any]:
            return dict(api(stack, "GET", f"/api/v1/services/{sid}"))

        wait_for("1 ready replica", lambda: status()["ready_replicas"] == 1, timeout=120)
        load = Load(url=f"{stack.asgi_url}/services/bench/slow/predict", token=token, rate=30.0, query="&sleep=0.1")
        runner = threading.Thread(target=load.run, daemon=True)
        runner.start()
        try:
            grown = wait_for("3 ready replicas", lambda: (s := status())["ready_replicas"] == 3 and s, timeout=180)
            grew_at = time.monotonic()
        finally:
            load.stop.set()
            runner.join(timeout=30)
        shrunk = wait_for("back to 1 replica", lambda: len(status()["replica_list"]) == 1, timeout=150)
        shrank_after = time.monotonic() - grew_at
        scaled = stack.sql(
            "SELECT message FROM tenants_auditentry WHERE action = 'service.autoscale' AND object_id = %s ORDER BY id",
            (str(sid),),
        )
    print(
        f"\nautoscaling at 30 requests/s x 0.1 s: grew to {grown['replicas']} replicas "
        f"({grown['stats']['inflight']:.1f} in flight, {grown['stats']['requests_per_s']:.1f} requests/s measured at the proxy); "
        f"back to 1 {shrank_after:.0f} s after the load stopped; "
        f"{len(load.results)} requests, {len(failed(load.results))} failed\n" + "\n".join(f"  {m}" for (m,) in scaled)
    )
    assert failed(load.results) == []
    assert grown["stats"]["requests"] >= 100, "the proxy measured the requests it carried"
    assert next(m for (m,) in scaled).split(": ")[1].startswith("1 → ")
    assert shrunk is not None
