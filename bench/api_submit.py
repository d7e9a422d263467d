"""Jobs submitted through the REST API per second, and submit-to-placed latency, on 200 simulated nodes.

    python bench/api_submit.py                      # throwaway SQLite database in a temp dir
    BENCH_POSTGRES=postgres://postgres@127.0.0.1:5432 python bench/api_submit.py
                                                    # a throwaway PostgreSQL database on that server (dropped after)

What it does: builds a 200-node H100 cluster (8 GPUs each, 2 spines x 5 leaves, DB rows only) and
4 teams, then submits jobs through POST /api/v1/jobs with a CI token (the real WSGI stack:
authentication, throttle, serializer, admission check, insert). Scheduling cycles run in-process
(no worker): one cycle after every batch of submissions, as a beat tick or a debounced kick
would, and the simulated agents report ranks running and finish ~1/3 of the running gangs after
each cycle, so the cluster keeps churning. Latency is from the submit response to the cycle that
placed the job committing. Nothing here asserts a time.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODES = 200
JOBS = int(os.environ.get("BENCH_JOBS", "400"))
BATCH = int(os.environ.get("BENCH_BATCH", "10"))
SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]


def _database() -> tuple[str, str | None]:
    """(DATABASE_URL, throwaway postgres db name to drop or None)."""
    server = os.environ.get("BENCH_POSTGRES")
    if not server:
        return f"sqlite:///{tempfile.mkdtemp(prefix='yard-bench-')}/bench.sqlite3", None
    import psycopg

    name = f"yard_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server.rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server.rstrip('/')}/{name}", name


def _drop(name: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(f"{os.environ['BENCH_POSTGRES'].rstrip('/')}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    url, throwaway = _database()
    var = tempfile.mkdtemp(prefix="yard-bench-var-")
    os.environ.update(
        DATABASE_URL=url,
        REDIS_URL="",  # file cache and broker under the temp dir: no shared state with anything else
        YARD_VAR_DIR=var,
        SECRET_KEY="bench-only-secret-key-0123456789abcdef0123456789abcdef",
        ALLOWED_HOSTS="testserver",
        YARD_TOKEN_THROTTLE="1000000/minute",
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    for sub in ("broker/out", "broker/processed", "cache"):  # the zero-setup broker's folders (debounced cycle kicks land there)
        Path(var, sub).mkdir(parents=True, exist_ok=True)
    import django

    django.setup()
    try:
        run()
    finally:
        if throwaway:
            _drop(throwaway)


def run() -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone
    from rest_framework.test import APIClient

    from scheduling.cycle import run_cycle_once
    from scheduling.models import Job, Task
    from scheduling.services import task_mark_exited, task_mark_running
    from scheduling.states import JobState, TaskState
    from tenants.services import token_create_service
    from tests.factories import make_shared_cluster

    call_command("migrate", verbosity=0)
    clients = []
    for team_user, team in make_shared_cluster(NODES):
        client = APIClient()
        token = token_create_service(actor=team_user, team=team, name="ci", expires_at=None).raw
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        clients.append((client, team.slug))

    rng = random.Random(1)
    submit_s: list[float] = []
    cycle_s: list[float] = []
    submitted_at: dict[int, float] = {}
    latency: list[float] = []
    started = time.perf_counter()
    for batch_start in range(0, JOBS, BATCH):
        for _ in range(min(BATCH, JOBS - batch_start)):
            client, team = rng.choice(clients)
            replicas, gpus = rng.choice(SHAPES)
            body = {"name": "bench", "team": team, "replicas": replicas, "gpus_per_replica": gpus, "tier": 2}
            t0 = time.perf_counter()
            response = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
            t1 = time.perf_counter()
            assert response.status_code == 201, response.content
            submit_s.append(t1 - t0)
            submitted_at[response.json()["id"]] = t1
        t0 = time.perf_counter()
        result = run_cycle_once()
        t1 = time.perf_counter()
        cycle_s.append(t1 - t0)
        latency.extend(t1 - submitted_at[j] for j in result.placed)
        # simulated agents: ranks start; a third of the running gangs finish
        now = timezone.now()
        for task in Task.objects.filter(state=TaskState.ASSIGNED):
            task_mark_running(task=task, pid=1, started_at=now)
        for job in Job.objects.filter(state=JobState.RUNNING):
            if rng.random() < 1 / 3:
                for task in Task.objects.filter(job=job, attempt=job.attempt, state=TaskState.RUNNING):
                    task_mark_exited(task=task, exit_code=0, signal=None, stopped_by="", ended_at=now)
    elapsed = time.perf_counter() - started
    pending = Job.objects.filter(state=JobState.PENDING).count()

    print(f"database: {connection.vendor}; {NODES} nodes x 8 H100 = {NODES * 8} GPUs; {JOBS} jobs in batches of {BATCH}")
    print("cycles: in-process, one after every batch (no Celery worker)")
    print(f"API submit: {len(submit_s) / sum(submit_s):.1f} jobs/s (serial, one client), "
          f"p50 {1000 * _pct(submit_s, 50):.1f} ms, p99 {1000 * _pct(submit_s, 99):.1f} ms per request")  # fmt: skip
    print(
        f"cycle: p50 {1000 * _pct(cycle_s, 50):.0f} ms, p99 {1000 * _pct(cycle_s, 99):.0f} ms, max {1000 * max(cycle_s):.0f} ms"
    )
    if latency:
        print(f"submit-to-placed: {len(latency)} jobs placed, p50 {_pct(latency, 50):.2f} s, p99 {_pct(latency, 99):.2f} s "
              f"(mean {statistics.mean(latency):.2f} s); {pending} still pending at the end")  # fmt: skip
    print(f"total {elapsed:.1f} s")


if __name__ == "__main__":
    main()
