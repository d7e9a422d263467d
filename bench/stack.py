"""The real parts, started for a benchmark: PostgreSQL (a throwaway database), Redis (a db of its own),
gunicorn as the README runs it, a Celery worker and beat, and node agents as `nodeagent.fleet` processes
speaking HTTP. Nothing is faked and nothing is in-process but the bench's own clients.

    with Stack(nodes=500, fleets=4) as stack:
        stack.wait_ready()
        ...

Every process carries the marker variable YARD_BENCH_RUN, and on exit everything carrying it is
stopped, workloads included.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.benchlib import CODE

# Where the portal, the worker and the agents run from: the measured checkout (bench/benchlib.py).
ROOT = CODE
PY = sys.executable
MARK = "YARD_BENCH_RUN"
PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/11")
ENROLMENT = "yen_bench-" + secrets.token_hex(8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def marked_pids(mark: str) -> set[int]:
    needle = f"{MARK}={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def cpu_seconds(pids: set[int]) -> float:
    """utime + stime of these processes (their own, not their children's), in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            if int(raw[raw.rfind(")") + 2 :].split()[1]) == pid:
                found.add(int(entry.name))
    return found


class Stack:
    def __init__(
        self,
        *,
        nodes: int,
        fleets: int = 4,
        nodes_per_leaf: int = 32,
        leaves_per_spine: int = 4,
        web_workers: int | None = None,
        web_threads: int | None = None,
        worker_concurrency: int = 2,
        agents: bool = True,
        extra_env: dict[str, str] | None = None,
        portal_pg: str | None = None,
        nodes_file: str = "8xH100",
        database: str = "postgresql",
        asgi: bool = False,
    ) -> None:
        self.nodes, self.fleets, self.agents_on, self.simulate = nodes, fleets, agents, nodes_file
        # "sqlite": the zero-setup demo's way (`make run`): a SQLite file, kombu's embedded broker, the file cache.
        self.database = database
        self.nodes_per_leaf, self.leaves_per_spine = nodes_per_leaf, leaves_per_spine
        self.mark = uuid.uuid4().hex
        self.tmp = Path(tempfile.mkdtemp(prefix="yard-bench-"))
        self.db = f"yard_bench_{self.mark[:8]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The ASGI server (uvicorn: the notebook and service proxies), as `make run` starts it beside gunicorn.
        self.asgi = asgi
        self.asgi_port = free_port() if asgi else 0
        self.asgi_url = f"http://127.0.0.1:{self.asgi_port}" if asgi else ""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            MARK: self.mark,
            # The portal's processes may reach PostgreSQL through something else (a fault test's proxy).
            "DATABASE_URL": f"{(portal_pg or PG).rstrip('/')}/{self.db}",
            "REDIS_URL": REDIS,
            "SECRET_KEY": "bench-" + secrets.token_urlsafe(40),
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "YARD_VAR_DIR": str(self.tmp / "var"),
            "YARD_AGENT_ENROLMENT_TOKEN": ENROLMENT,
            "YARD_AGENT_ENROLMENT_MAX_USES": str(max(1, nodes)),
            "YARD_TOKEN_THROTTLE": "1000000/minute",
            "LOG_LEVEL": "WARNING",
            "YARD_BIND": f"127.0.0.1:{self.port}",
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "PYTHONPATH": str(ROOT),
            # Every simulated node here has the address 127.0.0.1, and rendezvous ports are unique per
            # address (one host: a job's torch store binds there): room for a one-GPU job on every GPU.
            "YARD_RENDEZVOUS_PORTS": f"20000-{min(20000 + 16 * max(nodes, 1), 60999)}",
            **(extra_env or {}),
        }
        # gunicorn's workers and threads: the measured code's own defaults (portal/gunicorn.conf.py, as the
        # README runs it) unless a bench asks for others, as arguments or in extra_env (a fault test's shape).
        for name, value in (("YARD_WEB_WORKERS", web_workers), ("YARD_WEB_THREADS", web_threads)):
            if value is not None:
                self.env[name] = str(value)
            elif name not in (extra_env or {}):
                self.env.pop(name, None)
        if asgi:  # where the portal tells callers the ASGI server is (service and SSH tunnel URLs)
            self.env.setdefault("YARD_NOTEBOOK_URL", self.asgi_url)
        if database == "sqlite":
            self.env.update(DATABASE_URL=f"sqlite:///{self.tmp / 'yard.sqlite3'}", REDIS_URL="")
        self.worker_concurrency = worker_concurrency

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Stack:
        import psycopg
        import redis

        if self.database == "postgresql":
            with psycopg.connect(f"{PG.rstrip('/')}/postgres", autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.db}"')
            redis.Redis.from_url(REDIS).flushdb()
        self.run_manage("migrate", "--noinput", "-v0")
        self.setup_org()
        self.start("web", [PY, "-m", "gunicorn", "-c", "portal/gunicorn.conf.py", "portal.wsgi"])
        # INFO for the worker: its cycle lines (placed, snapshot/plan/apply seconds) are what the bench reads.
        self.start("worker", [PY, "-m", "celery", "-A", "portal", "worker", "-l", "INFO", "-c", str(self.worker_concurrency),
                              "--without-gossip", "--without-mingle", "-n", f"bench-{self.mark[:6]}@%h"],
                   env={**self.env, "LOG_LEVEL": "INFO"})  # fmt: skip
        self.start("beat", [PY, "-m", "celery", "-A", "portal", "beat", "-l", "WARNING", "-s", str(self.tmp / "beat-schedule")])
        if self.asgi:
            self.start(
                "asgi",
                [PY, "-m", "uvicorn", "portal.asgi:application", "--host", "127.0.0.1", "--port", str(self.asgi_port),
                 "--lifespan", "on", "--no-server-header", "--timeout-graceful-shutdown", "3", "--no-access-log"],
            )  # fmt: skip
        self.wait_http()
        if self.asgi:
            self.wait_http(url=self.asgi_url + "/healthz")
        if self.agents_on:
            self.start_fleets()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.stop(keep=exc_type is not None or bool(os.environ.get("BENCH_KEEP")))

    def run_manage(self, *args: str) -> str:
        done = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout

    def django(self, code: str) -> str:
        """Run Python with Django set up against the bench's database (a separate process)."""
        prelude = "import django; django.setup()\n"
        done = subprocess.run([PY, "-c", prelude + code], cwd=ROOT, env=self.env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"bench setup failed: {done.stderr[-3000:]}")
        return done.stdout

    def setup_org(self) -> None:
        """One team guaranteed the whole cluster, a member, and a CI token for the clients."""
        gpus = self.nodes * 8
        out = self.django(
            f"""
from tenants.models import UnitKind
from tenants.services import unit_create, quota_set, token_create_service
from tests.factories import make_user
root = unit_create(actor=None, name="Cluster", kind=UnitKind.ROOT, parent=None)
quota_set(actor=None, unit=root, gpu_type="H100", guaranteed={gpus})
bu = unit_create(actor=None, name="Research", kind=UnitKind.BUSINESS_UNIT, parent=root)
quota_set(actor=None, unit=bu, gpu_type="H100", guaranteed={gpus})
team = unit_create(actor=None, name="bench", kind=UnitKind.TEAM, parent=bu)
quota_set(actor=None, unit=team, gpu_type="H100", guaranteed={gpus}, limit={gpus * 4})
user = make_user("bencher", unit=team)
print(token_create_service(actor=user, team=team, name="bench", expires_at=None).raw)
"""
        )
        self.token = out.strip().splitlines()[-1]

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_http(self, timeout: float = 60, *, url: str = "") -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(url or self.url + "/healthz", timeout=2).read()
                return
            time.sleep(0.3)
        raise RuntimeError(f"{url or 'gunicorn'} did not answer; see the logs in {self.tmp}")

    def start_fleets(self) -> None:
        per = -(-self.nodes // self.fleets)
        for f in range(self.fleets):
            lines = []
            for i in range(f * per, min(self.nodes, (f + 1) * per)):
                leaf = i // self.nodes_per_leaf
                spine = leaf // self.leaves_per_spine
                lines.append(
                    f'[[nodes]]\nname = "n{i:05d}"\nleaf = "leaf-{leaf:03d}"\nspine = "spine-{spine:02d}"\nsimulate = "{self.simulate}"\n'
                )
            if not lines:
                continue
            spec = self.tmp / f"fleet-{f}.toml"
            spec.write_text("\n".join(lines))
            self.start(
                f"fleet-{f}",
                [PY, "-m", "nodeagent.fleet", "--portal", self.url, "--token", ENROLMENT, "--simulate-nodes", str(spec),
                 "--state-dir", str(self.tmp / f"fleet-{f}"), "--stop-workloads-on-exit", "--workload-grace", "2",
                 "--stats-file", str(self.tmp / f"fleet-{f}.stats.json")],
            )  # fmt: skip

    def stop(self, *, keep: bool = False) -> None:
        for name, proc in self.procs.items():
            if name.startswith("fleet"):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            if name.startswith("fleet"):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _ in range(3):
            pids = marked_pids(self.mark)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        self._drop()
        if keep:
            print(f"bench: logs kept in {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _drop(self) -> None:
        import psycopg

        if self.database != "postgresql":
            return
        with psycopg.connect(f"{PG.rstrip('/')}/postgres", autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [self.db]
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{self.db}"')

    # -- reading the state -----------------------------------------------------------------------
    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        if self.database == "sqlite":
            import sqlite3

            with contextlib.closing(sqlite3.connect(self.tmp / "yard.sqlite3", timeout=20)) as conn:
                return list(conn.execute(query.replace("%s", "?"), params).fetchall())
        with psycopg.connect(f"{PG.rstrip('/')}/{self.db}", autocommit=True) as conn:
            return list(conn.execute(query, params).fetchall())

    def analyze(self) -> None:
        """ANALYZE the bench's database: what autovacuum does in a deployment after bulk writes (thousands of
        queued jobs, hundreds of nodes registered). PostgreSQL servers run for CI often have autovacuum off
        (this machine's does: conf.d/90-ci.conf), and without statistics the planner guesses row counts, so a
        bench would measure plans no deployment runs (a sequential scan of every GPU for the admission
        check's count of the unhealthy ones, where the partial index gpu_unhealthy answers from an empty index)."""
        if self.database != "postgresql":
            return
        import psycopg

        with psycopg.connect(f"{PG.rstrip('/')}/{self.db}", autocommit=True) as conn:
            conn.execute("ANALYZE")

    def wait_ready(self, *, timeout: float = 300) -> float:
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            (ready,) = self.sql("SELECT count(*) FROM scheduling_node WHERE state = 'READY'")[0]
            if ready >= self.nodes:
                return time.monotonic() - began
            time.sleep(1)
        raise RuntimeError(f"only {ready} of {self.nodes} nodes READY after {timeout} s; see {self.tmp}")

    def component_cpu(self) -> dict[str, float]:
        """CPU seconds so far of each part: the web tier, the worker, beat, the fleets, PostgreSQL's backends."""
        out: dict[str, float] = {}
        for name, proc in self.procs.items():
            key = "fleet" if name.startswith("fleet") else name
            out[key] = out.get(key, 0.0) + cpu_seconds({proc.pid, *children_of(proc.pid)})
        if self.database == "postgresql":
            pids = {int(p) for (p,) in self.sql("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.db,))}
            out["postgres"] = cpu_seconds(pids)
        return out

    def web_pids(self) -> set[int]:
        master = self.procs["web"].pid
        return {master, *children_of(master)}

    def fleet_stats(self) -> dict[str, Any]:
        pooled: dict[str, Any] = {
            "calls": {}, "agents_lost_portal": 0, "tasks_stopped_for_portal_loss": 0, "longest_silence_s": 0.0, "longest_gap_s": 0.0
        }  # fmt: skip
        for path in self.tmp.glob("fleet-*.stats.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                pooled["agents_lost_portal"] += data["agents_lost_portal"]
                pooled["tasks_stopped_for_portal_loss"] += data["tasks_stopped_for_portal_loss"]
                for key in ("longest_silence_s", "longest_gap_s"):
                    pooled[key] = max(pooled[key], float(data.get(key, 0.0)))
                for kind, entry in data["calls"].items():
                    into = pooled["calls"].setdefault(
                        kind, {"ok": 0, "blind": 0, "unreachable": 0, "refused": 0, "latencies_s": []}
                    )
                    for key in ("ok", "blind", "unreachable", "refused"):
                        into[key] += entry[key]
                    into["latencies_s"] += entry["latencies_s"]
        return pooled

    def cycles(self) -> list[dict[str, float]]:
        """The worker's cycle lines: placed, apply seconds, total seconds."""
        # "estimates" since the cycle logs them apart (issue 29); without it, no line matched and benches counted 0 cycles
        pattern = re.compile(
            r"placed (\d+), .* in ([\d.]+) s \(snapshot ([\d.]+) s, plan ([\d.]+) s, (?:estimates [\d.]+ s, )?apply ([\d.]+) s\)"
        )
        out = []
        for line in (self.tmp / "worker.log").read_text(errors="replace").splitlines():
            m = pattern.search(line)
            if m:
                placed, total, snap, planned, apply = m.groups()
                out.append(
                    {
                        "placed": int(placed),
                        "total": float(total),
                        "snapshot": float(snap),
                        "plan": float(planned),
                        "apply": float(apply),
                    }
                )
        return out

    def lost(self) -> dict[str, int]:
        rows = dict(
            self.sql("SELECT to_state, count(*) FROM scheduling_jobevent WHERE to_state IN ('LOST', 'PREEMPTED') GROUP BY 1")
        )
        (requeued,) = self.sql("SELECT count(*) FROM scheduling_job WHERE attempt > 1")[0]
        (down,) = self.sql("SELECT count(*) FROM scheduling_node WHERE state = 'DOWN'")[0]
        return {
            "lost": int(rows.get("LOST", 0)),
            "preempted": int(rows.get("PREEMPTED", 0)),
            "requeued": int(requeued),
            "nodes_down": int(down),
        }
