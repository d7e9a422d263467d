"""How long one cycle takes to write a big plan: 4,000 one-GPU jobs placed at once on 500 nodes (PostgreSQL).

    python bench/apply_bulk.py [--jobs 4000 --nodes 500]

A throwaway PostgreSQL database, 500 READY 8-GPU nodes and 4,000 pending jobs; then one real cycle
(scheduling.cycle.run_cycle_once: lease, snapshot, plan, apply) in this process. It prints where the
time went; the apply phase is what the scale issue bounds (≤ 5 s for 4,000 placements, each gang
all or nothing, under the allocation and port constraints, fenced by the lease's epoch). For the
baseline, the same plan is written again gang by gang, as the cycle wrote it before (one fenced
transaction of ~8 statements per gang), on a fresh copy of the state.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    import psycopg

    name = f"yard_bench_apply_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(
        DATABASE_URL=f"{PG}/{name}",
        REDIS_URL=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/11"),
        SECRET_KEY="bench-" + "k" * 60,
        DJANGO_SETTINGS_MODULE="portal.settings",
        LOG_LEVEL="WARNING",
        YARD_VAR_DIR=f"/tmp/{name}",
    )
    import django

    django.setup()
    try:
        run(args.jobs, args.nodes)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def run(jobs: int, nodes: int) -> None:
    from django.core.cache import cache
    from django.core.management import call_command
    from django.utils import timezone

    from scheduling import cycle, cycle_lease
    from scheduling.core.plan import plan
    from scheduling.models import Job
    from scheduling.selectors import invariant_violations, snapshot_build
    from tests.factories import make_shared_cluster

    call_command("migrate", verbosity=0)
    cache.clear()
    ((user, team),) = make_shared_cluster(nodes, teams=1)
    Job.objects.bulk_create(
        Job(name="one", team=team, user=user, gpu_type="H100", command="sleep 1", checkpoint_dir=f"/ckpt/{i}")
        for i in range(jobs)
    )
    result = cycle.run_cycle_once()
    print(f"{nodes} nodes x 8 GPUs, {jobs} pending one-GPU jobs; one cycle placed {len(result.placed)} "
          f"(conflicts {len(result.conflicts)}) in {result.seconds:.2f} s: snapshot {result.snapshot_seconds:.2f} s, "
          f"plan {result.plan_seconds:.2f} s, apply {result.apply_seconds:.2f} s "
          f"({len(result.placed) / result.apply_seconds:.0f} placements/s written)")  # fmt: skip
    assert invariant_violations() == [], invariant_violations()

    # Baseline: the same kind of plan written gang by gang (as before: one transaction per gang).
    Job.objects.all().delete()
    from scheduling.models import Allocation, Task

    Allocation.objects.all().delete()
    Task.objects.all().delete()
    Job.objects.bulk_create(
        Job(name="one", team=team, user=user, gpu_type="H100", command="sleep 1", checkpoint_dir=f"/ckpt/{i}")
        for i in range(jobs)
    )
    now = timezone.now()
    snapshot = snapshot_build(now=now)
    plan_ = plan(snapshot, now=now.timestamp())
    lease = cycle_lease.lease_claim()
    assert lease is not None
    os.environ[cycle.APPLY_PAUSE_ENV] = "0.000001"  # the test hook writes one gang per transaction
    began = time.monotonic()
    one_by_one = cycle.apply_plan(lease=lease, snapshot=snapshot, plan_=plan_, now=now)
    seconds = time.monotonic() - began
    del os.environ[cycle.APPLY_PAUSE_ENV]
    cycle_lease.lease_release(lease)
    print(f"baseline, one transaction per gang: {len(one_by_one.placed)} placed in {seconds:.2f} s "
          f"({len(one_by_one.placed) / seconds:.0f} placements/s); bulk is {seconds / result.apply_seconds:.1f}x faster")  # fmt: skip


if __name__ == "__main__":
    main()
