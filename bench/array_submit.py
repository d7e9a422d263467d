"""A job array through the whole stack: one REST request that makes 4,000 tasks, with a long queue beside it.

    python bench/array_submit.py            # 32 agents, 5,000 jobs queued first, 3 arrays of 4,000 tasks (0-3999%50)
    python bench/array_submit.py --quick    # 8 agents, 5,000 queued, 2 arrays of 4,000

The parts are bench/stack.py's: gunicorn as the README runs it (2 workers x 4 threads), a Celery worker
and beat running the cycle, PostgreSQL (a throwaway database) and Redis, and a few agents as
`nodeagent.fleet` processes heartbeating over HTTP (the cluster the admission check reads). Before the
request, the queue is filled with `--queued` PENDING jobs written straight into the database, for a team
whose limit lets it hold 8 GPUs, so nothing of the arrays starts and what is measured is the submission.

Each array is one POST /api/v1/jobs with {"array": "0-3999%50", ...} (a CI token, an Idempotency-Key of
its own), timed at the client from the request to the whole answer, and in gunicorn's access log; then
the tasks in the database are counted. After the arrays, the next cycles' seconds (the worker's own
lines) show what the queue of 5,000 + N x 4,000 costs the cycle with the array limit's filter in it.
A checkout without job arrays (the base) answers with one job: its figures are reported as None.
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_submit import QUEUE_TEAM, server_times
from bench.benchlib import result
from bench.stack import Stack, pct


def post_array(stack: Stack, *, tasks: int, limit: int, key: str) -> tuple[float, int, dict]:
    """One POST of an array of ``tasks`` (0..tasks-1 %limit): (client seconds, status, answer)."""
    url = urlparse(stack.url)
    body = json.dumps(
        {
            "name": f"sweep-{key}",
            "team": "queue",
            "gpus_per_replica": 1,
            "gpu_type": "H100",
            "command": 'exec python eval.py --seed "$YARD_ARRAY_TASK_ID"',
            "time_limit_s": 3600,
            "array": f"0-{tasks - 1}%{limit}",
        }
    )
    headers = {"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json", "Idempotency-Key": key}
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    try:
        started = time.perf_counter()
        conn.request("POST", "/api/v1/jobs", body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    return seconds, response.status, json.loads(data or b"{}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=32, help="agents, each a node of 8 GPUs")
    parser.add_argument("--queued", type=int, default=5000, help="PENDING jobs written before the arrays")
    parser.add_argument("--tasks", type=int, default=4000, help="tasks per array")
    parser.add_argument("--limit", type=int, default=50, help="the arrays' %%N")
    parser.add_argument("--arrays", type=int, default=3, help="arrays posted, one after another")
    parser.add_argument("--quick", action="store_true", help="8 agents, 2 arrays")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.arrays = 8, 2
    with Stack(nodes=args.agents, fleets=1) as stack:
        stack.wait_ready()
        stack.token = stack.django(QUEUE_TEAM.format(queued=args.queued)).strip().splitlines()[-1]
        print(f"state: {args.agents} nodes (agents heartbeating over HTTP), {args.queued} jobs PENDING; "
              f"{args.arrays} arrays of {args.tasks} one-GPU tasks (%{args.limit}) posted one at a time "
              f"to a team that may hold 8 GPUs")  # fmt: skip
        time.sleep(6)  # the first cycles over the new queue
        cycles_before = len(stack.cycles())
        log_at = (stack.tmp / "web.log").stat().st_size
        seconds: list[float] = []
        supported = True
        for n in range(args.arrays):
            took, status, answer = post_array(stack, tasks=args.tasks, limit=args.limit, key=f"bench-array-{n}")
            if status != 201 or answer.get("task_count") is None:
                # The base code has no arrays: it takes the body as one job (unknown fields are ignored).
                supported = False
                print(f"array {n}: {status}, no array in the answer (this code has no job arrays): "
                      f"{str(answer)[:200]}")  # fmt: skip
                break
            (made,) = stack.sql("SELECT count(*) FROM scheduling_job WHERE array_id = %s", (answer["id"],))[0]
            seconds.append(took)
            print(f"array {answer['id']}: {status}, {answer['task_count']} tasks in the answer, {made} in the database, "
                  f"{took:.3f} s at the client")  # fmt: skip
        taken, shed = server_times(stack, log_at)
        time.sleep(8)  # cycles over the queue with the arrays in it
        after = stack.cycles()[cycles_before:]
        (pending,) = stack.sql("SELECT count(*) FROM scheduling_job WHERE state = 'PENDING'")[0]
        if supported:
            print(f"submit: {len(seconds)} arrays of {args.tasks} tasks: client p50 {pct(seconds, 50):.3f} s, "
                  f"max {max(seconds):.3f} s; server (gunicorn's log) {', '.join(f'{t:.0f} ms' for t in taken)}; "
                  f"{shed} shed; {args.tasks / pct(seconds, 50):.0f} tasks/s")  # fmt: skip
        if after:
            print(f"cycles after: {len(after)}, snapshot p50 {pct([c['snapshot'] for c in after], 50):.3f} s, "
                  f"total p50 {pct([c['total'] for c in after], 50):.3f} s over {pending} PENDING")  # fmt: skip
        over = (f"one REST request over real gunicorn (2x4) and PostgreSQL, {args.queued} jobs queued, "
                f"{args.agents} agents heartbeating; client wall time, median of {args.arrays}")  # fmt: skip
        result(f"array_submit.seconds_{args.tasks}_tasks", pct(seconds, 50) if supported else None, "s", over=over)
        result(
            "array_submit.tasks_per_s",
            args.tasks / pct(seconds, 50) if supported else None,
            "tasks/s",
            better="higher",
            over=over,
        )
        result(
            "array_submit.cycle_s_after",
            pct([c["total"] for c in after], 50) if supported and after else None,
            "s",
            over="the worker's cycles (median) just after the arrays, with them queued: the %N filter's share included",
        )


if __name__ == "__main__":
    main()
