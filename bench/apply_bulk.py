"""How long one cycle takes to write a big plan: 4,000 one-GPU jobs placed at once on 500 nodes (PostgreSQL).

    python bench/apply_bulk.py [--jobs 4000 --nodes 500]

A throwaway PostgreSQL database, 500 READY 8-GPU nodes and 4,000 pending jobs; then one real cycle
(scheduling.cycle.run_cycle_once: lease, snapshot, plan, apply) in this process. It prints where the
time went; the apply phase is what the scale issue bounds (≤ 5 s for 4,000 placements, each gang
all or nothing, under the allocation and port constraints, fenced by the lease's epoch).

There is no "as before" run in here: the earlier code's figure is this same bench over that code
(`bench/compare.py --base <commit> apply_bulk`, which sets BENCH_CODE), in the same sitting.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import django_database, result, use_code

use_code()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--nodes", type=int, default=500)
    args = parser.parse_args()
    with django_database("yard_bench_apply"):
        run(args.jobs, args.nodes)


def run(jobs: int, nodes: int) -> None:
    from django.core.cache import cache
    from django.core.management import call_command

    from scheduling import cycle
    from scheduling.models import Job
    from scheduling.selectors import invariant_violations
    from tests.factories import make_shared_cluster

    call_command("migrate", verbosity=0)
    cache.clear()
    ((user, team),) = make_shared_cluster(nodes, teams=1)
    Job.objects.bulk_create(
        Job(name="one", team=team, user=user, gpu_type="H100", command="sleep 1", checkpoint_dir=f"/ckpt/{i}")
        for i in range(jobs)
    )
    done = cycle.run_cycle_once()
    print(f"{nodes} nodes x 8 GPUs, {jobs} pending one-GPU jobs; one cycle placed {len(done.placed)} "
          f"(conflicts {len(done.conflicts)}) in {done.seconds:.2f} s: snapshot {done.snapshot_seconds:.2f} s, "
          f"plan {done.plan_seconds:.2f} s, apply {done.apply_seconds:.2f} s "
          f"({len(done.placed) / done.apply_seconds:.0f} placements/s written)")  # fmt: skip
    assert invariant_violations() == [], invariant_violations()
    over = f"one run_cycle_once in-process on PostgreSQL, {jobs} one-GPU jobs onto {nodes} nodes"
    result("apply.placements_per_s", len(done.placed) / done.apply_seconds, "/s", better="higher", over=over)
    result("apply.apply_s", done.apply_seconds, "s", over=over)
    result("apply.cycle_s", done.seconds, "s", over=over + " (wall)")


if __name__ == "__main__":
    main()
