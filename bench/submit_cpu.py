"""What one REST submission costs the web process: its SQL statements and its CPU time, in one process.

    python bench/submit_cpu.py                # 500 nodes, 500 jobs running, 6,500 queued; 300 posts x 2 rounds
    python bench/submit_cpu.py --profile      # and cProfile's top functions
    BENCH_CODE=/path/to/other/checkout python bench/submit_cpu.py --keep-db NAME
                                              # the same against another checkout's code (before/after in one sitting)

Django's test client through the whole middleware stack and DRF (token, throttle, Idempotency-Key,
admission, the writes), on PostgreSQL (a throwaway database, or --keep-db NAME kept and reused, so two
checkouts are measured on the same rows); no web server, no clients, no fleet: the figure is the
request's own CPU (`time.process_time`), which the machine's load moves far less than wall time.
bench/api_submit.py measures the same path through gunicorn with clients and a fleet. Nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result, use_code

CODE = use_code()
PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--posts", type=int, default=300, help="submissions per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="and cProfile's top functions, by cumulative and own time")
    parser.add_argument("--profile-out", help="with --profile: also write the raw cProfile stats here (pstats, snakeviz)")
    parser.add_argument("--keep-db", help="use (and keep) this database; built the first time")
    args = parser.parse_args()
    import psycopg

    name = args.keep_db or f"yard_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        fresh = not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if fresh:
            conn.execute(f'CREATE DATABASE "{name}"')
    var = Path("/tmp") / f"{name}-var"
    os.environ.update(
        DATABASE_URL=f"{PG}/{name}",
        REDIS_URL=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/11"),
        YARD_VAR_DIR=str(var),
        SECRET_KEY="bench-only-secret-key-0123456789abcdef0123456789abcdef",
        ALLOWED_HOSTS="testserver",
        YARD_TOKEN_THROTTLE="1000000/minute",
        LOG_LEVEL="WARNING",
        DEBUG="0",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    import django

    django.setup()
    try:
        run(args, fresh=fresh, var=var)
    finally:
        if not args.keep_db:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def run(args: argparse.Namespace, *, fresh: bool, var: Path) -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    if fresh:
        call_command("migrate", verbosity=0)
        from scheduling.cycle import run_cycle_once
        from scheduling.models import Job
        from tenants.services import token_create_service
        from tests.factories import make_shared_cluster

        pairs = make_shared_cluster(500, teams=4)
        user, team = pairs[0]
        token = token_create_service(actor=user, team=team, name="ci", expires_at=None).raw
        (var / "bench-token").parent.mkdir(parents=True, exist_ok=True)
        (var / "bench-token").write_text(f"{token} {team.slug}")

        def jobs(n: int) -> list[Job]:
            return [Job(team=t, user=u, name="fill", gpu_type="H100", replicas=1, gpus_per_replica=1, command="sleep 1",
                        time_limit_s=7200, cpus_per_replica=1, memory_mb_per_replica=1024)
                    for i in range(n) for (u, t) in [pairs[i % 4]]]  # fmt: skip

        Job.objects.bulk_create(jobs(4000), batch_size=1000)
        run_cycle_once()  # some run (with their tasks and allocations), the rest wait
        Job.objects.bulk_create(jobs(3000), batch_size=1000)
    token, slug = (var / "bench-token").read_text().split()
    from scheduling.models import Job

    running, queued = (
        Job.objects.filter(state="RUNNING").count() + Job.objects.filter(state="STARTING").count(),
        Job.objects.filter(state="PENDING").count(),
    )
    client = Client()
    body = json.dumps({"name": "fill", "team": slug, "replicas": 1, "gpus_per_replica": 1, "gpu_type": "H100", "tier": 2,
                       "command": "exec sleep 3600", "time_limit_s": 7200})  # fmt: skip

    def post() -> None:
        response = client.post("/api/v1/jobs", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}",
                               HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)  # fmt: skip
        assert response.status_code == 201, response.content

    for _ in range(20):  # warm: imports, the topology cache, the token's last-used stamp
        post()
    with CaptureQueriesContext(connection) as ctx:
        post()
    statements = [q["sql"] for q in ctx.captured_queries]  # Django forgets them at the next request
    print(f"code: {CODE}; state: 500 nodes, {running} jobs placed, {queued} queued")
    print(f"statements per submission: {len(statements)}")
    for sql in statements:
        print(f"  {sql[:110]}")
    cpus, walls = [], []
    for r in range(args.rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.posts):
            post()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        cpus.append(1000 * cpu / args.posts)
        walls.append(1000 * wall / args.posts)
        print(f"round {r + 1}: {args.posts} submissions, CPU {cpus[-1]:.2f} ms each, wall {walls[-1]:.1f} ms")
    over = "in-process (Django test client, every middleware, DRF), PostgreSQL, 500 nodes, thousands queued"
    result("submit_cpu.statements", len(statements), "statements", over=over)
    result("submit_cpu.cpu_ms", min(cpus), "ms", over=over + "; the best round's CPU per submission")
    result("submit_cpu.wall_ms", min(walls), "ms", over=over + "; the best round's wall time per submission")
    if args.profile:
        profile = cProfile.Profile(
            time.process_time
        )  # CPU, as the rounds count it: waits on the database are not this process's cost
        profile.enable()
        for _ in range(args.posts):
            post()
        profile.disable()
        if args.profile_out:
            profile.dump_stats(args.profile_out)
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(60)
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(40)
        print(out.getvalue())


if __name__ == "__main__":
    main()
