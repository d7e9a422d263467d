"""The heartbeat path under a full fleet: 1,000 nodes (8 GPUs, 8 running tasks each) at the default interval.

    python bench/heartbeat.py                  # 1,000 agents, 90 s
    python bench/heartbeat.py --agents 2000    # twice the supported fleet
    python bench/heartbeat.py --quick          # 200 agents, 30 s

The server side is the real thing (bench/stack.py): gunicorn 2 workers x 4 threads, PostgreSQL, Redis,
a Celery worker and beat running scheduling cycles and liveness checks throughout. The cluster is made
in the database: N nodes with their tokens, 8 one-GPU jobs RUNNING on each, and a queue of pending jobs
so every cycle has real work. The agents are light clients (the agent's own heartbeat builder,
nodeagent.heartbeat, over simulated GPUs, so the bodies are exactly what agents send, with telemetry
folded into minute windows), each on its own schedule at the default 10 s interval, a connection per
heartbeat as the agent's urllib client makes.

Every agent sends its first heartbeat before the measurement (a first one carries the latest readings
and the node's health facts). Then, over a fixed window of --seconds (each agent's first due time falls
in its first interval), it measures: which beats carried readings or windows (the mix moves with the
clients' timing, so two runs compare where it is alike); the rate, as heartbeats answered 200 *within* the window divided by the window (not by the
time the clients took, which runs over when they fall behind); the latency of each heartbeat from the
moment it was *due* on its agent's schedule to its answer, so time a beat spent waiting for its client
(queueing on a loaded machine) counts, as it would for an agent whose silence clock runs; beside it,
how late the clients sent (send - due) and the latency from the send alone, to tell the client's
delay from the server's. Beats due in the window but not sent by its end are counted, not timed. Also
the server's own time (gunicorn's access log), the web tier's CPU per heartbeat (utime + stime of the
gunicorn processes over the run, divided by all heartbeats it answered then), PostgreSQL's CPU beside
it (all backends of the bench's database: the worker's cycles included), SQL statements per heartbeat
(counted by the server: YARD_QUERY_COUNT_HEADER), and what the liveness checks did meanwhile (nodes
NOT_READY or DOWN, jobs requeued).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result, use_code
from bench.stack import PG, Stack, cpu_seconds, pct

use_code()

from nodeagent.heartbeat import Telemetry  # noqa: E402 - the measured checkout's agent
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec  # noqa: E402

INTERVAL_S = 10.0


class SimAgent:
    def __init__(self, name: str, token: str, tasks: list[tuple[int, int]], started_at: float) -> None:
        self.name, self.token = name, token
        self.telemetry = Telemetry(SimulatedGpus(gpus_from_spec("8xH100", node=name)), where=name)
        self.tasks = [
            {"task_id": t, "attempt": 1, "state": "running", "pid": 10_000 + t, "started_at": started_at,
             "checkpoint_time": None, "notebook": None}
            for t, _ in tasks
        ]  # fmt: skip

    def body(self, now: float) -> tuple[dict[str, object], tuple[dict[int, int], int, bool]]:
        self.telemetry.sample(now, {})
        gpus, windows, xids, nwindows = self.telemetry.outgoing()
        return {"gpus": gpus, "windows": windows, "tasks": self.tasks, "draining_reason": None}, (xids, nwindows, bool(gpus))


def send(port: int, agent: SimAgent) -> tuple[int, int, str, str]:
    """One heartbeat of ``agent``, a connection of its own (as the agent's urllib makes: the server spreads them
    over its workers as they come, which keep-alive connections pinned to one worker would not).
    Returns (HTTP status or 0, SQL statements, what it carried, the error if any)."""
    body, ack = agent.body(time.time())
    carried = ("r" if ack[2] else "") + ("w" if ack[1] else "")
    headers = {"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json", "Connection": "close"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/api/agent/v1/heartbeat", body=json.dumps(body, separators=(",", ":")), headers=headers)
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as exc:
        return 0, 0, carried, type(exc).__name__
    finally:
        conn.close()
    if response.status != 200:
        return response.status, 0, carried, str(response.status)
    agent.telemetry.acknowledged(sent_xids=ack[0], windows=ack[1], latest=ack[2])
    return 200, int(response.getheader("X-Yard-Queries") or 0), carried, ""


class Driver(threading.Thread):
    """Sends the heartbeats of its agents at their times, a connection each (as the agent does).

    Each beat is recorded as (due, sent, answered, status, carried): due on the agent's schedule, from ``start``
    (its first within the first interval) every INTERVAL_S until ``until``; a beat still unsent at
    ``until`` is recorded unsent, and the driver stops.
    """

    def __init__(self, port: int, agents: list[SimAgent], *, start: float, until: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.port, self.agents, self.until = port, agents, until
        self.due = {a.name: start + rng.uniform(0, INTERVAL_S) for a in agents}
        # due, sent, answered, HTTP status (0: no answer), what it carried ("" nothing, "r" readings, "w" windows)
        self.beats: list[tuple[float, float, float, int, str]] = []
        self.unsent = 0  # due within the window, not sent by its end
        self.queries: list[int] = []
        self.errors: dict[str, int] = {}

    def run(self) -> None:
        by_name = {a.name: a for a in self.agents}
        while self.due:
            name, due = min(self.due.items(), key=lambda kv: kv[1])
            if due >= self.until:
                break
            now = time.monotonic()
            if now >= self.until:
                self.unsent += sum(math.ceil((self.until - d) / INTERVAL_S) for d in self.due.values() if d < self.until)
                break
            if due > now:
                time.sleep(due - now)
            sent = time.monotonic()
            status, queries, carried, error = send(self.port, by_name[name])
            answered = time.monotonic()
            self.beats.append((due, sent, answered, status, carried))
            self.due[name] = due + INTERVAL_S
            if error:
                self.errors[error] = self.errors.get(error, 0) + 1
            if status == 200:
                self.queries.append(queries)


SETUP = """
import json, secrets
from datetime import timedelta
from django.utils import timezone
from scheduling.models import Allocation, Gpu, Job, JobEvent, Node, NodeState, Task
from scheduling.states import JobState, TaskState
from tenants.models import OrgUnit, hash_token
from tests.factories import build_cluster
from django.contrib.auth.models import User
N = {nodes}
nodes = build_cluster(spines=max(1, N // 128), leaves_per_spine=4, layout=(("H100", N),), state=NodeState.READY)
team = OrgUnit.objects.get(slug="bench"); user = User.objects.get(username="bencher")
now = timezone.now(); started = now - timedelta(minutes=30)
tokens = {{}}
for node in nodes:
    raw = "ynd_" + secrets.token_urlsafe(30)
    tokens[node.name] = raw
    Node.objects.filter(pk=node.pk).update(token_hash=hash_token(raw), last_heartbeat=now)
jobs = Job.objects.bulk_create(
    Job(name="steady", team=team, user=user, gpu_type="H100", command="sleep 1d", state=JobState.RUNNING,
        started_at=started, state_changed_at=started, time_limit_s=86400 * 3, locality="nvlink")
    for _ in range(N * 8)
)
gpus = list(Gpu.objects.order_by("node_id", "index").values_list("id", "node_id", "index"))
tasks = Task.objects.bulk_create(
    Task(job=job, attempt=1, rank=0, node_id=node_id, state=TaskState.RUNNING,
         master_addr=f"10.{{node_id // 256}}.{{node_id % 256}}.1", master_port=29500 + index, gpu_indices=[index], started_at=started, pid=10000 + i)
    for i, (job, (gpu_id, node_id, index)) in enumerate(zip(jobs, gpus))
)
Allocation.objects.bulk_create(
    Allocation(gpu_id=gpu_id, task=task, job=task.job, attempt=1, allocated_at=started)
    for task, (gpu_id, node_id, index) in zip(tasks, gpus)
)
Job.objects.bulk_create(
    Job(name="queued", team=team, user=user, gpu_type="H100", replicas=r, gpus_per_replica=g, command="true")
    for r, g in [(1, 1), (1, 8), (2, 8), (4, 8)] * {pending}
)
by_node = {{}}
for task_id, node_name, job_id in Task.objects.values_list("id", "node__name", "job_id"):
    by_node.setdefault(node_name, []).append((task_id, job_id))
print(json.dumps({{"tokens": tokens, "tasks": by_node}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--drivers", type=int, default=100, help="client threads")
    parser.add_argument("--processes", type=int, default=4, help="client processes the drivers are spread over")
    parser.add_argument(
        "--node-down", type=float, default=90.0,
        help="the portal's node-down timeout for the run (short, so that a run of a few minutes would see a node "
        "wrongly declared lost; NOT_READY is a third of it)",
    )  # fmt: skip
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--web-threads", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.seconds, args.drivers, args.processes = 200, 30, 8, 2
    stack = Stack(
        nodes=args.agents,
        agents=False,
        web_workers=args.web_workers,
        web_threads=args.web_threads,
        extra_env={
            "YARD_QUERY_COUNT_HEADER": "1",
            "YARD_ACCESS_LOG_SLOW_S": "0",
            "YARD_NODE_DOWN_S": str(args.node_down),
            "YARD_NODE_NOT_READY_S": str(args.node_down / 3),
            "YARD_AGENT_STOP_AFTER_S": str(args.node_down / 3),
            "YARD_AGENT_FENCE_AFTER_S": str(args.node_down / 4),
            "YARD_AGENT_MAX_GRACE_S": "5",
        },
    )
    with stack:
        began = time.monotonic()
        made = json.loads(stack.django(SETUP.format(nodes=args.agents, pending=125)).strip().splitlines()[-1])
        print(f"setup: {args.agents} nodes, {args.agents * 8} running one-GPU tasks, 500 queued jobs in "
              f"{time.monotonic() - began:.0f} s")  # fmt: skip
        started_at = time.time() - 1800
        agents = [
            SimAgent(name, token, made["tasks"].get(name, []), started_at) for name, token in sorted(made["tokens"].items())
        ]
        # Every agent's first heartbeat before the window, not measured: it carries what a first one does
        # (the latest readings, the node's health facts) and would otherwise be most of a short run's beats.
        began = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            first = list(pool.map(lambda a: send(stack.port, a)[0], agents))
        print(f"warm-up: every agent's first heartbeat, before the window: {first.count(200)} answered 200 in "
              f"{time.monotonic() - began:.0f} s")  # fmt: skip
        web = stack.web_pids()
        pg_cpu = PgCpu(stack)
        cpu_before = cpu_seconds(web)
        log_before = (stack.tmp / "web.log").stat().st_size
        # The window, on the monotonic clock every client process shares (Linux: one for the machine);
        # its start leaves the client processes time to fork.
        start = time.monotonic() + 2.0
        until = start + args.seconds
        # The clients in several processes (threads of one would starve on its own interpreter lock).
        slices = [agents[i :: args.processes] for i in range(args.processes)]
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.processes) as pool:
            pg_cpu.start()  # after the fork: the clients get no copy of a thread
            results = pool.starmap(
                _drive,
                [(stack.port, part, start, until, args.drivers // args.processes, seed) for seed, part in enumerate(slices)],
            )
        ran = time.monotonic() - start
        cpu = cpu_seconds(web) - cpu_before
        pg = pg_cpu.finish()
        beats = [b for r in results for b in r["beats"]]
        unsent = sum(r["unsent"] for r in results)
        queries = [q for r in results for q in r["queries"]]
        errors: dict[str, int] = {}
        for r in results:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        ok = [b for b in beats if b[3] == 200]
        in_window = [b for b in ok if b[2] <= until]
        rate = len(in_window) / args.seconds
        from_due = [b[2] - b[0] for b in ok]
        from_send = [b[2] - b[1] for b in ok]
        late = [b[1] - b[0] for b in beats]
        readings, windows = sum("r" in b[4] for b in ok), sum("w" in b[4] for b in ok)
        server = _server_times(stack.tmp / "web.log", log_before)
        offered = args.agents / INTERVAL_S
        due_in_window = len(beats) + unsent
        where = f"real gunicorn {args.web_workers}x{args.web_threads}, PostgreSQL, worker and beat; {args.agents} agents at {INTERVAL_S:.0f} s"
        print(f"web tier: gunicorn {args.web_workers} workers x {args.web_threads} threads; clients: {args.processes} processes, "
              f"{args.drivers} threads, a connection per heartbeat")  # fmt: skip
        print(f"window: {args.seconds:.0f} s; the clients finished {max(ran - args.seconds, 0):.1f} s after its end (a beat "
              f"answered after it is not in the rate)")  # fmt: skip
        print(f"heartbeats due in the window: {due_in_window} ({offered:.1f}/s offered); sent {len(beats)}, not sent by its end "
              f"{unsent}; answered 200: {len(ok)}, of which {len(in_window)} within the window; errors {errors or 'none'}")  # fmt: skip
        print(f"rate: {rate:.1f}/s answered within the window (of {offered:.1f}/s offered)")
        # The agent's builder sends readings when a GPU's use moved or a minute closed: how many did depends on
        # the clients' timing, so two runs compare only where this mix is alike.
        print(f"what the answered beats carried: {100 * readings / max(len(ok), 1):.0f} % the latest readings, "
              f"{100 * windows / max(len(ok), 1):.0f} % minute windows, the rest neither")  # fmt: skip
        result(
            "heartbeat.with_readings_pct",
            100 * readings / max(len(ok), 1),
            "%",
            better="lower",
            over="the beat mix (not a result)",
        )
        print(f"latency from the beat's due time to its answer (the agent's view, client queueing included): "
              f"p50 {1000 * pct(from_due, 50):.1f} ms, p99 {1000 * pct(from_due, 99):.1f} ms, max {1000 * max(from_due or [0]):.0f} ms")  # fmt: skip
        print(f"  of which the clients sent late (send - due): p50 {1000 * pct(late, 50):.1f} ms, p99 {1000 * pct(late, 99):.0f} ms, "
              f"max {1000 * max(late or [0]):.0f} ms (client load on this machine)")  # fmt: skip
        print(f"  latency from the send alone: p50 {1000 * pct(from_send, 50):.1f} ms, p99 {1000 * pct(from_send, 99):.1f} ms")
        print(f"time in the server (gunicorn's request time): p50 {pct(server, 50):.1f} ms, p99 {pct(server, 99):.1f} ms")
        served = len(ok)
        print(f"web tier CPU: {1000 * cpu / max(served, 1):.2f} ms per heartbeat ({cpu:.1f} s over {ran:.0f} s for {served} answered, "
              f"{100 * cpu / ran:.0f} % of one core); PostgreSQL backends (worker's included) {1000 * pg / max(served, 1):.2f} ms per heartbeat")  # fmt: skip
        result("heartbeat.rate_per_s", rate, "/s", better="higher", over=f"answered 200 within the window / window; {where}")
        result("heartbeat.offered_per_s", offered, "/s", better="higher", over="agents / interval (the load, not a result)")
        result(
            "heartbeat.latency_from_due_p50_ms",
            1000 * pct(from_due, 50),
            "ms",
            better="lower",
            over=f"due time to answer; {where}",
        )
        result(
            "heartbeat.latency_from_due_p99_ms",
            1000 * pct(from_due, 99),
            "ms",
            better="lower",
            over=f"due time to answer; {where}",
        )
        result(
            "heartbeat.client_late_p99_ms",
            1000 * pct(late, 99),
            "ms",
            better="lower",
            over="send - due: the bench's clients, not the server",
        )
        result(
            "heartbeat.unsent", unsent, "beats", better="lower", over="due in the window, not sent by its end (clients behind)"
        )
        result(
            "heartbeat.latency_from_send_p99_ms", 1000 * pct(from_send, 99), "ms", better="lower", over=f"send to answer; {where}"
        )
        result("heartbeat.server_p50_ms", pct(server, 50), "ms", better="lower", over="gunicorn's request time (access log)")
        result("heartbeat.server_p99_ms", pct(server, 99), "ms", better="lower", over="gunicorn's request time (access log)")
        result(
            "heartbeat.web_cpu_ms",
            1000 * cpu / max(served, 1),
            "ms",
            better="lower",
            over=f"gunicorn utime+stime / heartbeats answered; {where}",
        )
        result(
            "heartbeat.pg_cpu_ms",
            1000 * pg / max(served, 1),
            "ms",
            better="lower",
            over="PostgreSQL backends of the bench's db (the worker's too) / heartbeats answered",
        )
        if queries:
            print(f"SQL statements per heartbeat: median {sorted(queries)[len(queries) // 2]}, max {max(queries)} "
                  f"(telemetry once a minute per node)")  # fmt: skip
            result(
                "heartbeat.statements_median", sorted(queries)[len(queries) // 2], "stmts", better="lower", over="X-Yard-Queries"
            )
            result("heartbeat.statements_max", max(queries), "stmts", better="lower", over="X-Yard-Queries")
        cycles = stack.cycles()
        if cycles:
            print(f"cycles meanwhile: {len(cycles)}, each p50 {pct([c['total'] for c in cycles], 50):.2f} s, "
                  f"max {max(c['total'] for c in cycles):.2f} s")  # fmt: skip
        states = dict(stack.sql("SELECT state, count(*) FROM scheduling_node GROUP BY 1"))
        lost = stack.lost()
        print(
            f"liveness meanwhile (node-down {args.node_down:.0f} s): nodes {states}; {lost['lost']} jobs lost, "
            f"{lost['requeued']} requeued; {stack.sql('SELECT count(*) FROM scheduling_blindspell')[0][0]} blind spells"
        )
        result("heartbeat.jobs_requeued", lost["requeued"], "jobs", better="lower", over="liveness checks during the run")


def _drive(port: int, agents: list[SimAgent], start: float, until: float, threads: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    per = math.ceil(len(agents) / max(threads, 1))
    drivers = [Driver(port, agents[i : i + per], start=start, until=until, rng=rng) for i in range(0, len(agents), per)]
    for d in drivers:
        d.start()
    for d in drivers:
        d.join()
    errors: dict[str, int] = {}
    for d in drivers:
        for k, v in d.errors.items():
            errors[k] = errors.get(k, 0) + v
    return {
        "beats": [b for d in drivers for b in d.beats],
        "unsent": sum(d.unsent for d in drivers),
        "queries": [q for d in drivers for q in d.queries],
        "errors": errors,
    }


def _server_times(log: Path, since: int) -> list[float]:
    """Milliseconds gunicorn spent on each heartbeat (its access log, every agent request logged for the bench)."""
    with open(log, "rb") as handle:
        handle.seek(since)
        text = handle.read().decode(errors="replace")
    return [float(m) for m in re.findall(r'"POST /api/agent/v1/heartbeat HTTP/1.1" 200 \d+ (\d+)ms', text)]


class PgCpu(threading.Thread):
    """The CPU of the bench database's PostgreSQL backends over the run, polled every half second: a web
    thread's connection ends after CONN_MAX_AGE and a new backend takes its place, so two readings of the
    backends alive at the start and the end (what this bench did before) lost the CPU of every backend
    that came and went between them, and could come out negative. One that ends loses at most its last
    half second here."""

    def __init__(self, stack: Stack) -> None:
        import psycopg

        super().__init__(daemon=True)
        self.db = stack.db
        self.conn = psycopg.connect(f"{PG.rstrip('/')}/{stack.db}", autocommit=True)  # one, its own backend not counted
        self.first: dict[int, float] = {}  # a backend's CPU when first seen (0 for one born during the run)
        self.last: dict[int, float] = {}
        self.done = threading.Event()
        self.poll(initial=True)

    def poll(self, *, initial: bool = False) -> None:
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        pids = {int(p) for (p,) in self.conn.execute(query, (self.db,)).fetchall()}
        for pid in pids:
            self.last[pid] = cpu_seconds({pid})
            self.first.setdefault(pid, self.last[pid] if initial else 0.0)

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.poll()

    def finish(self) -> float:
        self.done.set()
        self.join()
        self.poll()
        self.conn.close()
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


if __name__ == "__main__":
    main()
