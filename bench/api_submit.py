"""REST submission through the whole stack: jobs/s, per-request latency and web CPU per job, with a long
queue and a heartbeating fleet beside it.

    python bench/api_submit.py                  # 500 agents, 5,000 jobs queued first, 4 clients post 2,000 more
    python bench/api_submit.py --quick          # 125 agents, 1,000 queued, 600 posted

The parts are bench/stack.py's: gunicorn as the README runs it (2 workers x 4 threads), a Celery worker
and beat, PostgreSQL (a throwaway database) and Redis, and the agents as `nodeagent.fleet` processes
heartbeating over HTTP. The bench's own part is N HTTP clients (threads, one keep-alive connection
each, an Idempotency-Key per job, a shed request retried after its Retry-After: bench/fill_e2e.py's).

The jobs go to a team whose limit lets it hold 8 GPUs, so the queue grows as they arrive (8 run, the
rest wait; the cycles walk them all) and no workloads start: what is measured is the submission path
and the heartbeats beside it. Before the clients start, the queue is filled with `--queued` PENDING
jobs written straight into the database.

Web CPU per job: the web tier's CPU while the clients post, less what it spends on the fleet alone
(measured for `--idle` seconds just before, at the same state), over the jobs. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fill_e2e import SHED, submit
from bench.stack import Stack, cpu_seconds, pct

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


def server_times(stack: Stack, start: int) -> tuple[list[float], int]:
    """gunicorn's own time (ms) of each submission it took (2xx) from byte `start` of its access log, and its 503s."""
    text = (stack.tmp / "web.log").read_bytes()[start:].decode(errors="replace")
    taken, shed = [], 0
    for status, ms in ACCESS.findall(text):
        if status.startswith("2"):
            taken.append(float(ms))
        elif status in ("503", "429"):
            shed += 1
    return taken, shed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=500, help="agents, each a node of 8 GPUs")
    parser.add_argument("--queued", type=int, default=5000, help="PENDING jobs written before the clients start")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs the clients post")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the fleet alone, for its share of the web CPU")
    parser.add_argument("--quick", action="store_true", help="125 agents, 1,000 queued, 600 posted, 15 s idle")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.queued, args.jobs, args.idle = 125, 1000, 600, 15.0
    nodes = args.agents
    with Stack(nodes=nodes, fleets=max(1, min(4, nodes // 100))) as stack:
        stack.wait_ready()
        token = stack.django(QUEUE_TEAM.format(queued=args.queued)).strip().splitlines()[-1]
        stack.token = token
        print(f"state: {nodes} nodes (agents heartbeating over HTTP in {max(1, min(4, nodes // 100))} fleet processes), "
              f"{args.queued} jobs PENDING; {args.clients} clients post {args.jobs} one-GPU jobs to a team that may hold 8 GPUs")  # fmt: skip
        time.sleep(5)  # the first cycle over the new queue
        web = stack.web_pids()

        before = cpu_seconds(web)
        beats_before = len(stack.fleet_stats()["calls"].get("heartbeat", {}).get("latencies_s", []))
        time.sleep(args.idle)
        idle_rate = (cpu_seconds(web) - before) / args.idle
        idle_beats = stack.fleet_stats()["calls"].get("heartbeat", {}).get("latencies_s", [])[beats_before:]

        log_at = (stack.tmp / "web.log").stat().st_size
        cpu_before = stack.component_cpu()
        beats_before = len(stack.fleet_stats()["calls"].get("heartbeat", {}).get("latencies_s", []))
        seconds, latencies, errors = submit(stack, args.jobs, clients=args.clients, label="api", team="queue")
        cpu = {k: v - cpu_before.get(k, 0.0) for k, v in stack.component_cpu().items()}
        beats = stack.fleet_stats()["calls"].get("heartbeat", {}).get("latencies_s", [])[beats_before:]
        taken, shed_503 = server_times(stack, log_at)
        queued = int(stack.sql("SELECT count(*) FROM scheduling_job WHERE state = 'PENDING'")[0][0])

        print(f"submit: {args.jobs} jobs over {args.clients} clients in {seconds:.1f} s: {args.jobs / seconds:.1f} jobs/s; "
              f"per request p50 {1000 * pct(latencies, 50):.0f} ms, p99 {1000 * pct(latencies, 99):.0f} ms (client); "
              f"server p50 {pct(taken, 50):.0f} ms, p99 {pct(taken, 99):.0f} ms; {len(errors)} errors{': ' + errors[0] if errors else ''}")  # fmt: skip
        print(f"shed: {SHED['submissions']} submissions answered 503/429 and retried ({shed_503} in the access log), "
              f"{SHED['broken']} broken connections retried; {queued} PENDING at the end")  # fmt: skip
        web_job = (cpu.get("web", 0.0) - idle_rate * seconds) / args.jobs
        print("CPU while posting: " + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(cpu.items()))
              + f" (of {2 * seconds:.0f} core-seconds); the fleet alone kept the web tier at {idle_rate:.2f} cores; "
              f"web CPU per job {1000 * web_job:.1f} ms (that subtracted; postgres counts only its backends alive at both ends)")  # fmt: skip
        print(f"heartbeats: fleet alone {len(idle_beats)}, p50 {1000 * pct(idle_beats, 50):.0f} ms, p99 {1000 * pct(idle_beats, 99):.0f} ms; "
              f"while posting {len(beats)}, p50 {1000 * pct(beats, 50):.0f} ms, p99 {1000 * pct(beats, 99):.0f} ms, "
              f"max {1000 * max(beats or [0]):.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
