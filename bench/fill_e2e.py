"""Fill a cluster end to end: REST submission, Celery cycles, node agents over HTTP, real workloads.

    python bench/fill_e2e.py            # 4,000 one-GPU jobs onto 500 simulated 8-GPU nodes
    python bench/fill_e2e.py --quick    # 1,000 jobs onto 125 nodes (CI size)
    python bench/fill_e2e.py --nodes 1000 --jobs 8000    # twice the supported fleet

The parts (bench/stack.py): gunicorn as the README runs it (2 workers x 4 threads), a Celery worker
(2 processes) and beat, PostgreSQL (a throwaway database) and Redis, and `nodeagent.fleet` processes
(each node a full agent: registration, heartbeats, real `sleep` workloads under the launcher's
wrapper, log shipping, exit reports). The bench's own part is four HTTP clients posting to
/api/v1/jobs with a CI token, and reading the database for the timings.

Phases:
1. fill: N one-GPU jobs, 4 concurrent clients: submission throughput (jobs/s, p50/p99 per request)
   while cycles place what arrives; then the time from the last submission (a full queue) to the
   last job RUNNING, the placements per second the cycles wrote, and the heartbeat latency the
   agents saw.
2. backlog: with the cluster full, 5,000 more jobs queued by the same clients: is submission still
   as fast with thousands of jobs waiting?
3. lost: jobs lost or requeued, nodes DOWN, agents that stopped work for want of the portal.

Nothing here asserts a time; it prints what it measured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result
from bench.stack import Stack, pct

COMMAND = "exec sleep 3600"


class Client(threading.Thread):
    """One CI pipeline: POSTs jobs over one keep-alive connection, as fast as answers come."""

    def __init__(self, url: str, token: str, count: int, *, label: str, team: str = "bench") -> None:
        super().__init__(daemon=True)
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token, self.count, self.label, self.team = token, count, label, team
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.shed = 0  # answers 503/429 "overloaded": retried after Retry-After
        self.broken = 0  # connections that broke or timed out: retried with the same key

    def run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        body = json.dumps({"name": "fill", "team": self.team, "replicas": 1, "gpus_per_replica": 1, "gpu_type": "H100",
                           "tier": 2, "command": COMMAND, "time_limit_s": 7200})  # fmt: skip
        for _ in range(self.count):
            self.post(conn, body)
        conn.close()

    def post(self, conn: http.client.HTTPConnection, body: str) -> None:
        """One submission as the CLI makes it: one Idempotency-Key for all its tries, a 503/429 retried
        after its Retry-After (the portal shed it: nothing was created), a broken connection retried."""
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                   "Idempotency-Key": f"{self.label}-{uuid.uuid4().hex}"}  # fmt: skip
        for _ in range(20):
            began = time.perf_counter()
            try:
                conn.request("POST", "/api/v1/jobs", body=body, headers=headers)
                response = conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.broken += 1
                conn.close()
                time.sleep(0.5)
                if self.broken > 1000:
                    self.errors.append(repr(exc))
                    return
                continue
            self.latencies.append(time.perf_counter() - began)
            if response.status in (429, 503):
                self.shed += 1
                try:
                    wait = float(response.getheader("Retry-After") or 1)
                except ValueError:
                    wait = 1.0
                time.sleep(min(max(wait, 0.1), 5.0))
                continue
            if response.status not in (200, 201):  # 200: a retry the portal had already taken
                self.errors.append(f"{response.status} {payload[:200]!r}")
            return
        self.errors.append("gave up after 20 tries")


SHED = {"submissions": 0, "broken": 0}


def submit(stack: Stack, jobs: int, *, clients: int = 4, label: str, team: str = "bench") -> tuple[float, list[float], list[str]]:
    """(seconds, per-request latencies, errors) for `jobs` submissions over `clients` connections;
    the sheds and broken connections they met add to SHED."""
    share = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    threads = [Client(stack.url, stack.token, n, label=f"{label}{i}", team=team) for i, n in enumerate(share)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    SHED["submissions"] += sum(t.shed for t in threads)
    SHED["broken"] += sum(t.broken for t in threads)
    return time.perf_counter() - began, [x for t in threads for x in t.latencies], [e for t in threads for e in t.errors]


def _agent_calls(stack: Stack) -> int:
    """Every call the agents made so far that the portal answered (accepted or shed)."""
    return sum(c.get("ok", 0) + c.get("blind", 0) + c.get("refused", 0) for c in stack.fleet_stats()["calls"].values())


def since(before: list[float], after: list[float]) -> list[float]:
    """The latencies added between two readings of the fleets' stats. Each reading is every agent's own
    list one after the other, each list only ever growing, so the new ones are the multiset difference
    (a slice at the earlier length would cut whole agents' lists, not the earlier beats)."""
    return list((Counter(after) - Counter(before)).elements())


def count(stack: Stack, state: str) -> int:
    return int(stack.sql("SELECT count(*) FROM scheduling_job WHERE state = %s", (state,))[0][0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--backlog", type=int, default=5000, help="jobs queued behind a full cluster in phase 2")
    parser.add_argument("--fleets", type=int, default=4, help="fleet processes the agents run in")
    parser.add_argument("--quick", action="store_true", help="1,000 jobs onto 125 nodes, backlog 1,000")
    parser.add_argument("--hog", type=int, default=0, help="this many CPU-burning processes beside the stack all along")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.jobs, args.backlog, args.fleets = 125, 1000, 1000, 2
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    try:
        run(args)
    finally:
        for hog in hogs:
            hog.kill()


def run(args: argparse.Namespace) -> None:
    if args.hog:
        print(f"load: {args.hog} CPU hog process(es) beside the stack, the clients and the fleets")
    with Stack(nodes=args.nodes, fleets=args.fleets) as stack:
        ready_s = stack.wait_ready()
        print(f"stack: gunicorn 2x4, Celery worker (2) + beat, PostgreSQL, Redis; {args.nodes} agents in {args.fleets} "
              f"fleet processes, all {args.nodes} nodes READY {ready_s:.0f} s after start")  # fmt: skip
        hb_before = stack.fleet_stats()["calls"].get("heartbeat", {}).get("latencies_s", [])
        calls_before = _agent_calls(stack)

        # -- phase 1: fill
        cpu_before = stack.component_cpu()
        bench_before = time.process_time()
        seconds, latencies, errors = submit(stack, args.jobs, label="fill")
        cpu_fill = {k: v - cpu_before.get(k, 0.0) for k, v in stack.component_cpu().items()}
        cpu_fill["clients"] = time.process_time() - bench_before
        full_at = time.monotonic()
        print(f"fill: {args.jobs} one-GPU jobs over 4 clients in {seconds:.1f} s: {args.jobs / seconds:.1f} jobs/s; "
              f"per request p50 {1000 * pct(latencies, 50):.0f} ms, p99 {1000 * pct(latencies, 99):.0f} ms; "
              f"{len(errors)} errors{': ' + errors[0] if errors else ''}")  # fmt: skip
        print(
            "CPU during the submissions: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(cpu_fill.items()))
            + f" (of {2 * seconds:.0f} core-seconds on 2 cores); web {1000 * cpu_fill.get('web', 0) / args.jobs:.1f} ms per job"
        )
        over = f"REST (gunicorn 2x4) + Celery + PostgreSQL + {args.nodes} agents over HTTP, 4 clients"
        result("fill.submit_jobs_per_s", args.jobs / seconds, "jobs/s", better="higher", over=over)
        result("fill.submit_p99_ms", 1000 * pct(latencies, 99), "ms", over=over)
        result(
            "fill.web_cpu_ms_per_job", 1000 * cpu_fill.get("web", 0) / args.jobs, "ms", over=over + " (agents' calls included)"
        )
        # The web tier's CPU is not all the submissions': the agents' calls meanwhile are served by it too.
        calls = _agent_calls(stack) - calls_before
        print(f"web requests during the submissions: {args.jobs} jobs (+{SHED['submissions']} shed) and {calls} agent calls "
              f"(heartbeats, status, logs); web CPU {1000 * cpu_fill.get('web', 0) / (args.jobs + calls):.1f} ms per request of both")  # fmt: skip
        placed_at = running_at = None
        deadline = full_at + 600
        while time.monotonic() < deadline:
            running = count(stack, "RUNNING")
            if placed_at is None and running + count(stack, "STARTING") >= args.jobs:
                placed_at = time.monotonic()
            if running >= args.jobs:
                running_at = time.monotonic()
                break
            time.sleep(0.5)
        result(
            "fill.last_running_s",
            None if running_at is None else running_at - full_at,
            "s",
            over=over + ", from the last submission",
        )
        if running_at is None:
            print(f"fill: only {count(stack, 'RUNNING')} of {args.jobs} RUNNING after 600 s")
        else:
            print(f"fill: last job placed {(placed_at or running_at) - full_at:.1f} s and the last RUNNING "
                  f"{running_at - full_at:.1f} s after the queue was full (submission ended)")  # fmt: skip
        cycles = [c for c in stack.cycles() if c["placed"]]
        placed = sum(c["placed"] for c in cycles)
        apply_s = sum(c["apply"] for c in cycles)
        if cycles:
            biggest = max(cycles, key=lambda c: c["placed"])
            print(f"cycles: {len(cycles)} placed {placed} jobs; writes {placed / apply_s:.0f} placements/s "
                  f"(largest: {biggest['placed']} in {biggest['apply']:.2f} s apply, {biggest['total']:.2f} s whole cycle: "
                  f"snapshot {biggest['snapshot']:.2f} s, plan {biggest['plan']:.2f} s)")  # fmt: skip
        beats = stack.fleet_stats()["calls"].get("heartbeat", {})
        lat = since(hb_before, beats.get("latencies_s", []))
        print(f"heartbeats during the fill: {len(lat)} timed, p50 {1000 * pct(lat, 50):.0f} ms, p99 {1000 * pct(lat, 99):.0f} ms, "
              f"max {1000 * max(lat or [0]):.0f} ms; {beats.get('unreachable', 0)} failed, {beats.get('blind', 0)} blind")  # fmt: skip

        result(
            "fill.heartbeat_p99_ms",
            1000 * pct(lat, 99) if lat else None,
            "ms",
            over=over + ", agents' own timing during the fill",
        )
        # -- phase 2: a backlog behind a full cluster
        seconds, latencies, errors = submit(stack, args.backlog, label="backlog")
        queued = count(stack, "PENDING")
        print(f"backlog: {args.backlog} more jobs behind the full cluster in {seconds:.1f} s: {args.backlog / seconds:.1f} jobs/s "
              f"(p50 {1000 * pct(latencies, 50):.0f} ms, p99 {1000 * pct(latencies, 99):.0f} ms); {queued} queued at the end; "
              f"{len(errors)} errors")  # fmt: skip
        result("backlog.submit_jobs_per_s", args.backlog / seconds, "jobs/s", better="higher", over=over + ", cluster full")
        tail, tail_lat, _ = submit(stack, 400, label="tail")
        print(f"with {count(stack, 'PENDING') - 400} queued: 400 more at {400 / tail:.1f} jobs/s "
              f"(p50 {1000 * pct(tail_lat, 50):.0f} ms, p99 {1000 * pct(tail_lat, 99):.0f} ms)")  # fmt: skip
        time.sleep(15)  # a few heartbeat intervals and liveness checks with the full queue

        # -- phase 3: what was lost
        lost = stack.lost()
        stats = stack.fleet_stats()
        print(f"lost: {lost['lost']} jobs lost, {lost['requeued']} requeued, {lost['preempted']} preempted, "
              f"{lost['nodes_down']} nodes DOWN; {stats['tasks_stopped_for_portal_loss']} tasks stopped by agents "
              f"that lost the portal; still RUNNING {count(stack, 'RUNNING')} of {args.jobs}")  # fmt: skip
        beats = stats["calls"].get("heartbeat", {})
        all_lat = beats.get("latencies_s", [])
        if all_lat:
            print(f"heartbeats over the whole run: {beats['ok']} ok, p50 {1000 * statistics.median(all_lat):.0f} ms, "
                  f"p99 {1000 * pct(all_lat, 99):.0f} ms")  # fmt: skip
        calls = stats["calls"]
        blind = sum(c.get("blind", 0) for c in calls.values())
        unreachable = sum(c.get("unreachable", 0) for c in calls.values())
        print(f"shed: {SHED['submissions']} submissions answered 503/429 and retried after Retry-After, "
              f"{SHED['broken']} broken connections retried with the same Idempotency-Key; agents: {blind} calls answered "
              f"overloaded/unavailable (counted blind), {unreachable} timed out or refused")  # fmt: skip
        print(f"longest agent silence: {stats['longest_silence_s']:.1f} s as the agents count it (shed time paused), "
              f"{stats['longest_gap_s']:.1f} s between two accepted heartbeats of one agent; agents stop their work at 120 s "
              f"(stop_after_s), the portal marks a node DOWN at 300 s")  # fmt: skip
        result("lost.requeued_or_lost", lost["requeued"] + lost["lost"], "jobs", over=over)
        verdict = lost["requeued"] == 0 and lost["lost"] == 0 and stats["tasks_stopped_for_portal_loss"] == 0
        print(f"verdict: {'held' if verdict else 'NOT held'}: 0 jobs requeued or lost and 0 tasks stopped by agents "
              f"is the target; every one of the {args.jobs} fill jobs RUNNING: {count(stack, 'RUNNING') >= args.jobs}")  # fmt: skip


if __name__ == "__main__":
    main()
