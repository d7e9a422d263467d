"""REST submission through the whole stack: jobs/s, per-request latency and web CPU per job, with a long
queue and a heartbeating fleet beside it.

    python bench/api_submit.py                  # 500 agents, 5,000 jobs queued first, 8 clients post 2,000 more
    python bench/api_submit.py --quick          # 125 agents, 5,000 queued, 800 posted
    python bench/compare.py --base b9ece15 api_submit      # the same over another commit's code, in one sitting

The parts are bench/stack.py's, running the measured code (BENCH_CODE, bench/benchlib.py): gunicorn as the
README runs it (`portal/gunicorn.conf.py`, its defaults: 2 workers x 8 threads), a Celery worker and beat running
cycles, PostgreSQL (a throwaway database) and Redis, and the agents as `nodeagent.fleet` processes
heartbeating over HTTP. The bench's own part is N HTTP clients: threads of this process, each with one
keep-alive connection, posting one job at a time as fast as the answers come, each job with its own
Idempotency-Key; a 503/429 (the portal shed it: nothing was made) is sent again after its Retry-After
with the same key, a broken connection is reopened and the job sent again with the same key.

The jobs go to a team whose limit lets it hold 8 GPUs, so the queue grows as they arrive (8 run, the
rest wait; the cycles walk them all) and no workloads start: what is measured is the submission path,
with the heartbeats and the cycles beside it. Before the clients start, the queue is filled with
`--queued` PENDING jobs written straight into the database, and the database is ANALYZEd, as a
deployment's autovacuum would have done after such writes (bench/stack.py `Stack.analyze`).

Figures:
- jobs/s: jobs accepted (201, or 200 for a job a broken connection's retry found made) over the wall
  time of the posting window (all clients start together; the window ends when the last one is done);
- per request p50/p99: each HTTP exchange that got an answer, as the client timed it (a shed answer is
  one request, its retry another); per job p99: from a job's first send to its accepted answer, waits
  after Retry-After included; server p50/p99: gunicorn's own time of each accepted request (access log);
- web CPU per job: the web tier's CPU (gunicorn's processes) while the clients post, less what it spends
  on the fleet alone (measured for `--idle` seconds just before, at the same state), over the jobs.
- the clients' CPU per job: this process's CPU while they post (its main thread only waits), over the jobs.

Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result, use_code
from bench.stack import PY, ROOT, Stack, cpu_seconds, pct

use_code()  # nothing of the measured code is imported here; the stack runs it (bench/stack.py)

QUEUE_TEAM = """
from tenants.models import OrgUnit, UnitKind
from tenants.services import unit_create, quota_set, token_create_service
from tests.factories import make_user
from scheduling.models import Job
bu = OrgUnit.objects.get(slug="research")
team = unit_create(actor=None, name="queue", kind=UnitKind.TEAM, parent=bu)
quota_set(actor=None, unit=team, gpu_type="H100", guaranteed=0, limit=8)
user = make_user("queuer", unit=team)
Job.objects.bulk_create([Job(team=team, user=user, name="queued", gpu_type="H100", replicas=1, gpus_per_replica=1,
                             command="exec sleep 3600", time_limit_s=7200, cpus_per_replica=14, memory_mb_per_replica=262144)
                         for _ in range({queued})], batch_size=1000)
print(token_create_service(actor=user, team=team, name="ci", expires_at=None).raw)
"""

ACCESS = re.compile(r'"POST /api/v1/jobs HTTP/[\d.]+" (\d{3}) \S+ (\d+)ms')
BODY = json.dumps({"name": "sub", "team": "queue", "replicas": 1, "gpus_per_replica": 1, "gpu_type": "H100", "tier": 2,
                   "command": "exec sleep 3600", "time_limit_s": 7200})  # fmt: skip


class Client(threading.Thread):
    """One CI pipeline: one keep-alive connection, one job at a time, each with its own Idempotency-Key."""

    def __init__(self, url: str, token: str, count: int, *, label: str, start: threading.Barrier) -> None:
        super().__init__(daemon=True)
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token, self.count, self.label, self.start_together = token, count, label, start
        self.requests: list[float] = []  # each exchange that got an answer, seconds
        self.jobs: list[float] = []  # each accepted job, first send to its answer, seconds
        self.accepted = 0
        self.shed = 0  # answers 503/429: sent again after Retry-After
        self.broken = 0  # connections that broke: reopened, the job sent again with its key
        self.errors: list[str] = []
        self.ended = 0.0

    def run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        self.start_together.wait()
        for _ in range(self.count):
            self.post(conn)
        self.ended = time.perf_counter()
        conn.close()

    def post(self, conn: http.client.HTTPConnection) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                   "Idempotency-Key": f"{self.label}-{uuid.uuid4().hex}"}  # fmt: skip
        first = time.perf_counter()
        for _ in range(50):
            began = time.perf_counter()
            try:
                conn.request("POST", "/api/v1/jobs", body=BODY, headers=headers)
                response = conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException):
                self.broken += 1
                conn.close()
                time.sleep(0.2)
                continue
            self.requests.append(time.perf_counter() - began)
            if response.status in (429, 503):
                self.shed += 1
                try:
                    wait = float(response.getheader("Retry-After") or 1)
                except ValueError:
                    wait = 1.0
                time.sleep(min(max(wait, 0.1), 5.0))
                continue
            if response.status in (200, 201):
                self.accepted += 1
                self.jobs.append(time.perf_counter() - first)
            else:
                self.errors.append(f"{response.status} {payload[:200]!r}")
            return
        self.errors.append("gave up after 50 tries")


def post_all(stack: Stack, jobs: int, clients: int) -> tuple[float, float, list[Client]]:
    """(the posting window's wall seconds, the clients' CPU seconds, the clients) for `jobs` submissions over
    `clients` connections. The clients' CPU is this process's while they post: its main thread only waits."""
    share = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    barrier = threading.Barrier(clients + 1)
    threads = [Client(stack.url, stack.token, n, label=f"api{i}", start=barrier) for i, n in enumerate(share)]
    for t in threads:
        t.start()
    barrier.wait()  # every client has its connection object; they send their first jobs now
    began, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    return max(t.ended for t in threads) - began, time.process_time() - cpu, threads


def server_times(stack: Stack, start: int) -> tuple[list[float], int]:
    """gunicorn's own time (ms) of each submission it took (2xx) from byte `start` of its access log, and its 503/429s."""
    text = (stack.tmp / "web.log").read_bytes()[start:].decode(errors="replace")
    taken, shed = [], 0
    for status, ms in ACCESS.findall(text):
        if status.startswith("2"):
            taken.append(float(ms))
        elif status in ("503", "429"):
            shed += 1
    return taken, shed


def web_shape(stack: Stack) -> str:
    """gunicorn's workers x threads as the measured code's config sets them (its defaults, unless the stack's env says)."""
    code = "ns = {}; exec(open('portal/gunicorn.conf.py').read(), ns); print(f\"{ns['workers']}x{ns['threads']}\")"
    done = subprocess.run([PY, "-c", code], cwd=ROOT, env=stack.env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def heartbeat_latencies(stack: Stack) -> list[float]:
    return list(stack.fleet_stats()["calls"].get("heartbeat", {}).get("latencies_s", []))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=500, help="agents, each a node of 8 GPUs")
    parser.add_argument("--queued", type=int, default=5000, help="PENDING jobs written before the clients start")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs the clients post")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the fleet alone, for its share of the web CPU")
    parser.add_argument("--quick", action="store_true", help="125 agents, 5,000 queued, 800 posted, 15 s idle")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.jobs, args.idle = 125, 800, 15.0
    nodes, fleets = args.agents, max(1, min(4, args.agents // 100))
    with Stack(nodes=nodes, fleets=fleets) as stack:
        web = web_shape(stack)
        over = (f"gunicorn {web} + Celery worker/beat + PostgreSQL + Redis + {nodes} agents over HTTP, "
                f"{args.clients} keep-alive HTTP clients, {args.queued} queued")  # fmt: skip
        stack.wait_ready()
        stack.token = stack.django(QUEUE_TEAM.format(queued=args.queued)).strip().splitlines()[-1]
        stack.analyze()  # as autovacuum would have, after the registrations and the queue (bench/stack.py)
        print(f"code: {stack.env['PYTHONPATH']}; gunicorn {web} (its config's defaults); {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"state: {nodes} nodes (agents heartbeating over HTTP in {fleets} fleet processes), {args.queued} jobs "
              f"PENDING; {args.clients} clients post {args.jobs} one-GPU jobs to a team that may hold 8 GPUs")  # fmt: skip
        time.sleep(5)  # the first cycle over the new queue
        web = stack.web_pids()

        before = cpu_seconds(web)
        beats_at = len(heartbeat_latencies(stack))
        time.sleep(args.idle)
        idle_rate = (cpu_seconds(web) - before) / args.idle
        idle_beats = heartbeat_latencies(stack)[beats_at:]

        log_at = (stack.tmp / "web.log").stat().st_size
        cycles_at = len(stack.cycles())
        cpu_before = stack.component_cpu()
        beats_at = len(heartbeat_latencies(stack))
        seconds, client_cpu, clients = post_all(stack, args.jobs, args.clients)
        cpu = {k: v - cpu_before.get(k, 0.0) for k, v in stack.component_cpu().items()}
        cycles = stack.cycles()[cycles_at:]
        time.sleep(1)  # the fleets write their stats files every second
        beats = heartbeat_latencies(stack)[beats_at:]
        taken, shed_logged = server_times(stack, log_at)
        queued = int(stack.sql("SELECT count(*) FROM scheduling_job WHERE state = 'PENDING'")[0][0])
        made = int(stack.sql("SELECT count(*) FROM scheduling_job WHERE name = 'sub'")[0][0])

    accepted = sum(c.accepted for c in clients)
    requests = [x for c in clients for x in c.requests]
    jobs = [x for c in clients for x in c.jobs]
    errors = [e for c in clients for e in c.errors]
    shed, broken = sum(c.shed for c in clients), sum(c.broken for c in clients)
    rate = accepted / seconds
    web_job = (cpu.get("web", 0.0) - idle_rate * seconds) / max(accepted, 1)
    print(f"submit: {accepted} of {args.jobs} jobs accepted over {args.clients} clients in {seconds:.1f} s: {rate:.1f} jobs/s; "
          f"{made} jobs in the database; {len(errors)} errors{': ' + errors[0] if errors else ''}")  # fmt: skip
    print(f"per request ({len(requests)}): p50 {1000 * pct(requests, 50):.0f} ms, p99 {1000 * pct(requests, 99):.0f} ms; "
          f"per job, retries included: p50 {1000 * pct(jobs, 50):.0f} ms, p99 {1000 * pct(jobs, 99):.0f} ms; "
          f"server (gunicorn's time): p50 {pct(taken, 50):.0f} ms, p99 {pct(taken, 99):.0f} ms")  # fmt: skip
    print(f"shed: {shed} answers 503/429, sent again after Retry-After ({shed_logged} in the access log); "
          f"{broken} broken connections; {queued} PENDING at the end")  # fmt: skip
    print("CPU while posting: " + ", ".join(f"{k} {v:.1f} s" for k, v in sorted({**cpu, "clients": client_cpu}.items()))
          + f" (of {(os.cpu_count() or 1) * seconds:.0f} core-seconds); the fleet alone kept the web tier at {idle_rate:.2f} cores; "
          f"web CPU per job {1000 * web_job:.1f} ms (that subtracted; postgres counts only its backends alive at both ends)")  # fmt: skip
    print(f"cycles while posting: {len(cycles)}, {sum(c['total'] for c in cycles):.1f} s in all "
          f"(the longest {max((c['total'] for c in cycles), default=0):.2f} s)")  # fmt: skip
    print(f"heartbeats: fleet alone {len(idle_beats)}, p50 {1000 * pct(idle_beats, 50):.0f} ms, p99 {1000 * pct(idle_beats, 99):.0f} ms; "
          f"while posting {len(beats)}, p50 {1000 * pct(beats, 50):.0f} ms, p99 {1000 * pct(beats, 99):.0f} ms, "
          f"max {1000 * max(beats or [0]):.0f} ms; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    result("api_submit.jobs_per_s", rate, "jobs/s", better="higher", over=over)
    result("api_submit.request_p50_ms", 1000 * pct(requests, 50), "ms", over="per HTTP request, client-timed")
    result("api_submit.request_p99_ms", 1000 * pct(requests, 99), "ms", over="per HTTP request, client-timed")
    result("api_submit.job_p99_ms", 1000 * pct(jobs, 99), "ms", over="per job, first send to accepted, retries included")
    result("api_submit.server_p99_ms", pct(taken, 99), "ms", over="gunicorn's request time, accepted submissions")
    result("api_submit.shed", shed, "answers", over="503/429 answers to submissions, retried after Retry-After")
    result(
        "api_submit.web_cpu_ms_per_job", 1000 * web_job, "ms", over="gunicorn's CPU while posting, the fleet's share taken out"
    )
    result("api_submit.heartbeat_p99_ms", 1000 * pct(beats, 99), "ms", over="agents' heartbeats while the clients post")
    # What the submissions cost the worker: each asks for a cycle (scheduling/services/common.py cycle_window)
    # and, behind a long queue, each cycle walks all of it.
    result("api_submit.cycles", len(cycles), "cycles", over="cycles the worker ran while the clients posted")
    result(
        "api_submit.cycle_share",
        sum(c["total"] for c in cycles) / seconds,
        "of the window",
        over="cycles' wall time over the posting window",
    )
    result(
        "api_submit.client_cpu_ms_per_job",
        1000 * client_cpu / max(accepted, 1),
        "ms",
        over="the bench's HTTP clients' CPU while posting, over the jobs",
    )
    result("api_submit.worker_cpu_s", cpu.get("worker", 0.0), "s", over="the Celery worker's CPU while the clients posted")
    result(
        "api_submit.postgres_cpu_ms_per_job",
        1000 * cpu.get("postgres", 0.0) / max(accepted, 1),
        "ms",
        over="PostgreSQL backends' CPU while posting, over the jobs",
    )
    if errors:
        raise SystemExit(f"{len(errors)} submissions failed")


if __name__ == "__main__":
    main()
