"""What the service proxy adds to a request: the same requests to a replica directly and through the
portal's proxy (portal/service_proxy.py), in the same run, latency p50/p99 of each and the difference.

    python bench/service_proxy.py               # 2,000 sequential requests each way, then 2,000 more each way at 16 in flight
    python bench/service_proxy.py --quick       # 300 and 300
    python bench/service_proxy.py --requests 5000 --concurrency 32

The parts are real and in processes of their own: the replica is a tiny ASGI app (an 89-byte JSON
answer) under uvicorn; the proxy is the portal's ASGI application (portal.asgi: service proxy, notebook
proxy, Django) under uvicorn as `make run` serves it, reading the service's routes from PostgreSQL (a
throwaway database) with a service token. The clients are httpx (one keep-alive client each way, the
direct and the proxied runs interleaved in blocks of 100 so that the machine's load moves both alike).
"Added" is the proxied figure less the direct one; the proxy's CPU per request (its process's utime +
stime over the sequential phase) moves less with the machine's load than wall time does. Nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result
from bench.stack import MARK, PG, REDIS, ROOT, cpu_seconds, free_port, marked_pids, pct

PY = sys.executable
BLOCK = 100

SEED = """
import hashlib
from scheduling.models import JobKind, Node, Service, ServiceToken, Task
from scheduling.states import JobState
from tenants.models import UnitKind
from tenants.services import quota_set, unit_create
from tests.factories import make_cluster, make_job, make_user
make_cluster(nodes=1)
root = unit_create(actor=None, name="Cluster", kind=UnitKind.ROOT, parent=None)
quota_set(actor=None, unit=root, gpu_type="H100", guaranteed=8)
team = unit_create(actor=None, name="bench", kind=UnitKind.TEAM, parent=root)
quota_set(actor=None, unit=team, gpu_type="H100", guaranteed=8)
user = make_user("bencher", unit=team)
service = Service.objects.create(name="echo", team=team, user=user, gpu_type="H100")
ServiceToken.objects.create(service=service, name="bench", prefix="{token}"[:12], token_hash=hashlib.sha256(b"{token}").hexdigest())
job = make_job(team=team, user=user, kind=JobKind.SERVICE, state=JobState.RUNNING, service=service, service_revision=1, time_limit_s=0)
Task.objects.create(job=job, attempt=1, rank=0, node=Node.objects.first(), state="RUNNING", service_ready=True,
                    service_url="http://127.0.0.1:{replica_port}")
print(team.slug)
"""

REPLICA_BODY = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "hello", "index": 0}]}).encode()


async def replica_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The stand-in replica: answers a small JSON body at once (the bench sends GETs: no body to read)."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": REPLICA_BODY})


def serve_replica(port: int) -> None:
    import uvicorn

    uvicorn.run(replica_app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


class Setup:
    """A throwaway database with one service, its token and one ready replica; the replica and the proxy running."""

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.db = f"yard_bench_{self.mark[:8]}"
        self.tmp = Path(tempfile.mkdtemp(prefix="yard-bench-proxy-"))
        self.token = "ysv_" + secrets.token_urlsafe(24)
        self.replica_port, self.proxy_port = free_port(), free_port()
        self.env = {
            **os.environ,
            MARK: self.mark,
            "DATABASE_URL": f"{PG.rstrip('/')}/{self.db}",
            "REDIS_URL": REDIS,
            "SECRET_KEY": "bench-" + secrets.token_urlsafe(40),
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "YARD_VAR_DIR": str(self.tmp / "var"),
            "LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "PYTHONPATH": str(ROOT),
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Setup:
        import psycopg

        with psycopg.connect(f"{PG.rstrip('/')}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db}"')
        self.run([PY, "manage.py", "migrate", "--noinput", "-v0"])
        code = "import django; django.setup()\n" + SEED.format(token=self.token, replica_port=self.replica_port)
        self.team = self.run([PY, "-c", code]).strip().splitlines()[-1]
        self.start("replica", [PY, __file__, "--serve-replica", str(self.replica_port)])
        self.start(
            "proxy",
            [PY, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(self.proxy_port),
             "--log-level", "warning", "--no-access-log", "--lifespan", "on"],
        )  # fmt: skip
        self.wait(self.direct_url("/"), {})
        self.wait(self.proxy_url("/"), self.headers())
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        for pid in marked_pids(self.mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        import psycopg

        with psycopg.connect(f"{PG.rstrip('/')}/postgres", autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [self.db]
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}"')
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run(self, argv: list[str]) -> str:
        done = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {done.stderr[-3000:]}")
        return done.stdout

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
        self.procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def wait(self, url: str, headers: dict[str, str], timeout: float = 60) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, headers=headers, timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{url} did not answer 200; see {self.tmp}")

    def proxy_cpu(self) -> float:
        return cpu_seconds({self.procs[1].pid})

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def direct_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.replica_port}{path}"

    def proxy_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.proxy_port}/services/{self.team}/echo{path}"


def sequential(setup: Setup, n: int) -> tuple[list[float], list[float]]:
    """n requests each way, one at a time, in interleaved blocks; each request's time in ms."""
    import httpx

    direct: list[float] = []
    proxied: list[float] = []
    with httpx.Client(timeout=30) as d, httpx.Client(timeout=30, headers=setup.headers()) as p:
        for client, url in ((d, setup.direct_url("/v1/completions")), (p, setup.proxy_url("/v1/completions"))):
            for _ in range(100):  # warm: connections, caches, the proxy's route cache
                client.get(url).raise_for_status()
        done = 0
        while done < n:
            block = min(BLOCK, n - done)
            for client, url, out in (
                (d, setup.direct_url("/v1/completions"), direct),
                (p, setup.proxy_url("/v1/completions"), proxied),
            ):
                for _ in range(block):
                    began = time.perf_counter()
                    answer = client.get(url)
                    out.append((time.perf_counter() - began) * 1000)
                    if answer.status_code != 200:
                        raise RuntimeError(f"{url}: {answer.status_code} {answer.text[:200]}")
            done += block
    return direct, proxied


async def _concurrent_run(url: str, headers: dict[str, str], n: int, concurrency: int) -> tuple[list[float], float]:
    import httpx

    times: list[float] = []
    left = n
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=30, headers=headers, limits=limits) as client:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                began = time.perf_counter()
                answer = await client.get(url)
                times.append((time.perf_counter() - began) * 1000)
                if answer.status_code != 200:
                    raise RuntimeError(f"{url}: {answer.status_code} {answer.text[:200]}")

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return times, time.perf_counter() - began


def concurrent(setup: Setup, n: int, concurrency: int) -> tuple[list[float], float, list[float], float]:
    """n requests each way with ``concurrency`` in flight, alternating direct and proxied runs of n/4."""
    direct: list[float] = []
    proxied: list[float] = []
    d_s = p_s = 0.0
    part = max(1, n // 4)
    url_d, url_p = setup.direct_url("/v1/completions"), setup.proxy_url("/v1/completions")
    asyncio.run(_concurrent_run(url_p, setup.headers(), concurrency * 4, concurrency))  # warm
    for _ in range(4):
        t, s = asyncio.run(_concurrent_run(url_d, {}, part, concurrency))
        direct += t
        d_s += s
        t, s = asyncio.run(_concurrent_run(url_p, setup.headers(), part, concurrency))
        proxied += t
        p_s += s
    return direct, d_s, proxied, p_s


def line(label: str, direct: list[float], proxied: list[float]) -> str:
    out = []
    for q in (50, 99):
        a, b = pct(direct, q), pct(proxied, q)
        out.append(f"p{q} direct {a:.2f} ms, proxied {b:.2f} ms, added {b - a:+.2f} ms (x{b / a:.2f})")
    return f"{label}: " + "; ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000, help="requests each way, sequential and again concurrent")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="300 requests each way")
    parser.add_argument("--serve-replica", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_replica:
        serve_replica(args.serve_replica)
        return
    n = 300 if args.quick else args.requests
    with Setup() as setup:
        print(
            f"replica: uvicorn, {len(REPLICA_BODY)}-byte JSON; proxy: portal.asgi under uvicorn (1 process); PostgreSQL; httpx clients"
        )
        cpu = setup.proxy_cpu()
        direct, proxied = sequential(setup, n)
        # The proxy is idle while the direct blocks run: its CPU over the phase is the proxied requests'.
        per_request = (setup.proxy_cpu() - cpu) / (n + 100) * 1000
        print(line(f"sequential, {n} each way", direct, proxied))
        print(f"  proxy CPU: {per_request:.2f} ms per request (its process's utime + stime)")
        d, d_s, p, p_s = concurrent(setup, n, args.concurrency)
        print(line(f"{args.concurrency} in flight, {len(d)} each way", d, p))
        print(f"  throughput: direct {len(d) / d_s:.0f} req/s, proxied {len(p) / p_s:.0f} req/s")
        over = "portal.asgi under uvicorn over PostgreSQL, uvicorn replica, httpx"
        result("proxy.added_p50_ms", pct(proxied, 50) - pct(direct, 50), "ms", over=over + ", sequential")
        result("proxy.cpu_ms_per_request", per_request, "ms", over=over)
        result("proxy.req_per_s", len(p) / p_s, "/s", better="higher", over=over + f", {args.concurrency} in flight")


if __name__ == "__main__":
    main()
