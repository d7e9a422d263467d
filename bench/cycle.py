"""What one whole scheduling cycle costs at 1,000 nodes, 8,000 running jobs and 500 pending (PostgreSQL).

    python bench/cycle.py [--quick] [--cycles 15]

A throwaway PostgreSQL database (as bench/apply_bulk.py makes one) holds 1,000 READY 8-GPU nodes, each
at its own address, under 8 spines x 4 leaves, twelve teams under two business units with guarantees and limits, 8,000 one-GPU
jobs RUNNING on every GPU (each with its task and live allocation; starts spread over the last 20 h,
each ending within its time limit 30 min to 48 h from now; Tier 1 and 2, every team at its guarantee),
and 500 pending jobs of 1-64 GPUs (1 to 8 replicas) of Tier 2 and 3 from every team. So the queue waits
for free GPUs and over quota, and no cycle orders a stop: with no agents in the bench a job told to stop
would stay stopping for ever, and each cycle would preempt more. ``--quick``: 250 nodes, 2,000 running,
125 pending. Then real cycles in this process (``scheduling.cycle.run_cycle_once``: the lease, the
snapshot from PostgreSQL, plan(), the estimated starts, the writes, the time limits), over the code that
BENCH_CODE names (bench/compare.py):

- **quiet**: nothing changes between cycles (the cluster is full, the queue waits): what every beat
  costs on a steady cluster. One cycle first, unmeasured, writes the 500 reasons and warms the caches.
- **churn**: before each cycle 16 running jobs end (their allocations released, as the agents' reports
  do) and 16 jobs are submitted, so every cycle places work, changes the free GPUs, the releases and
  the quotas, and writes reasons and estimates anew.

Per cycle it prints CPU time of this process (``time.process_time``: the cycle's Python, the database
driver included; PostgreSQL's own work is apart, read from /proc for the database's backends) and wall
time, median and p90, and the phases: snapshot (``snapshot_build``), plan (``plan``), estimates (the
estimated starts: ``with_estimates``), apply (``apply_plan``) and time limits (``enforce_time_limits``),
each timed by wrapping the function the cycle module calls, so the same breakdown reads old code and new.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import django_database, result, use_code

SEED = 29
TEAMS = 12
CHURN = 16  # jobs that end, and jobs submitted, before each churn cycle
# The phases by the name the cycle module calls each by (the estimates had other names in other code).
PHASES: dict[str, tuple[str, ...]] = {
    "snapshot": ("snapshot_build",),
    "plan": ("plan",),
    "estimates": ("with_estimates", "estimates_refresh"),
    "apply": ("apply_plan",),
    "time limits": ("enforce_time_limits",),
}
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8))
SHAPE_WEIGHTS = (40, 12, 12, 18, 9, 6, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="250 nodes, 2,000 running, 125 pending, 5 cycles of each kind")
    parser.add_argument("--cycles", type=int, default=0, help="measured cycles of each kind (default 15; --quick 5)")
    parser.add_argument("--profile", default="", help="write a cProfile of the quiet cycles to this file")
    parser.add_argument("--profile-churn", default="", help="write a cProfile of the cycles after churn to this file")
    args = parser.parse_args()
    nodes = 250 if args.quick else 1000
    cycles = args.cycles or (5 if args.quick else 15)
    use_code()
    with django_database("yard_bench_cycle") as (name, _):
        run(
            nodes=nodes,
            running=nodes * 8,
            pending=nodes // 2,
            cycles=cycles,
            db=name,
            profile=args.profile,
            profile_churn=args.profile_churn,
        )


def build(*, nodes: int, running: int, pending: int) -> dict[str, Any]:
    """The state in the database; returns the users and teams for the churn's submissions."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.models import Allocation, Gpu, Job, Node, NodeState, Task
    from scheduling.states import JobState, TaskState
    from tenants.models import UnitKind
    from tenants.services import quota_set, unit_create
    from tests.factories import build_cluster, make_user

    rng = random.Random(SEED)
    build_cluster(spines=max(1, nodes // 128), leaves_per_spine=4, layout=(("H100", nodes),), state=NodeState.READY)
    # Each node at its own address, as in a real cluster (the demo's simulated nodes share 127.0.0.1, one
    # host, so every gang would meet at one address and each placing cycle would read all 8,000 gangs'
    # rendezvous ports to choose one).
    addresses = {pk: f"10.{pk // 65536 % 256}.{pk // 256 % 256}.{pk % 256}" for pk in Node.objects.values_list("pk", flat=True)}
    Node.objects.bulk_update([Node(pk=pk, address=a) for pk, a in addresses.items()], ["address"], batch_size=1000)
    total = nodes * 8
    root = unit_create(actor=None, name="Cluster", kind=UnitKind.ROOT, parent=None)
    quota_set(actor=None, unit=root, gpu_type="H100", guaranteed=total)
    teams = []
    for b in range(2):
        bu = unit_create(actor=None, name=f"bu-{b}", kind=UnitKind.BUSINESS_UNIT, parent=root)
        quota_set(actor=None, unit=bu, gpu_type="H100", guaranteed=total // 2, limit=total * 3 // 4)
        for t in range(TEAMS // 2):
            team = unit_create(actor=None, name=f"team-{b}-{t}", kind=UnitKind.TEAM, parent=bu)
            quota_set(actor=None, unit=team, gpu_type="H100", guaranteed=total // TEAMS, limit=total // 4)
            teams.append((make_user(f"user-{b}-{t}", unit=team), team))
    now = timezone.now()
    jobs = []
    for i in range(running):
        user, team = teams[i % len(teams)]
        elapsed = rng.uniform(0, 20 * 3600)
        started = now - timedelta(seconds=elapsed)
        jobs.append(
            Job(
                name=f"run-{i}",
                team=team,
                user=user,
                gpu_type="H100",
                command="sleep 1d",
                state=JobState.RUNNING,
                tier=rng.choices((1, 2), (10, 90))[0],
                submitted_at=started - timedelta(seconds=rng.uniform(0, 600)),
                started_at=started,
                state_changed_at=started,
                time_limit_s=int(elapsed + rng.uniform(0.5, 48) * 3600),
                checkpoint_dir=f"/ckpt/run-{i}",
            )
        )
    jobs = Job.objects.bulk_create(jobs, batch_size=2000)
    gpus = list(Gpu.objects.order_by("node_id", "index").values_list("id", "node_id", "index"))
    tasks = Task.objects.bulk_create(
        (
            Task(job=job, attempt=1, rank=0, node_id=node_id, state=TaskState.RUNNING, master_addr=addresses[node_id],
                 master_port=20000 + i, gpu_indices=[index], started_at=job.started_at, pid=10000 + i)
            for i, (job, (_, node_id, index)) in enumerate(zip(jobs, gpus, strict=False))
        ),
        batch_size=2000,
    )  # fmt: skip
    Allocation.objects.bulk_create(
        (
            Allocation(gpu_id=gpu_id, task=task, job=task.job, attempt=1, allocated_at=task.started_at)
            for task, (gpu_id, _, _) in zip(tasks, gpus, strict=False)
        ),
        batch_size=2000,
    )
    submit(rng, teams, pending, now)
    return {"teams": teams, "rng": rng}


def submit(rng: random.Random, teams: list[tuple[Any, Any]], count: int, now: Any) -> None:
    from datetime import timedelta

    from scheduling.models import Job

    out = []
    for i in range(count):
        user, team = rng.choice(teams)
        replicas, per = rng.choices(SHAPES, SHAPE_WEIGHTS)[0]
        out.append(
            Job(
                name=f"queued-{i}",
                team=team,
                user=user,
                gpu_type="H100",
                command="true",
                replicas=replicas,
                gpus_per_replica=per,
                tier=rng.choices((2, 3), (80, 20))[0],
                priority=rng.choice((0, 0, 0, 1)),
                submitted_at=now - timedelta(seconds=rng.uniform(0, 6 * 3600)),
                time_limit_s=int(rng.uniform(1, 24) * 3600),
                checkpoint_dir="/ckpt/q",
            )
        )
    Job.objects.bulk_create(out)


def churn(rng: random.Random, teams: list[tuple[Any, Any]]) -> None:
    """``CHURN`` running jobs end (as an agent's report ends them: job, task and allocation) and as many
    are submitted."""
    from django.utils import timezone

    from scheduling.models import Allocation, Job, Task
    from scheduling.states import JobState, TaskState

    now = timezone.now()
    ids = list(Job.objects.filter(state=JobState.RUNNING).values_list("pk", flat=True))
    ended = rng.sample(ids, min(CHURN, len(ids)))
    Job.objects.filter(pk__in=ended).update(state=JobState.COMPLETED, ended_at=now, state_changed_at=now, exit_code=0)
    Task.objects.filter(job_id__in=ended).update(state=TaskState.EXITED, ended_at=now, exit_code=0)
    Allocation.objects.filter(job_id__in=ended, released_at__isnull=True).update(released_at=now)
    submit(rng, teams, CHURN, now)


class Phases:
    """CPU and wall time of each phase, by wrapping the functions ``scheduling.cycle`` calls."""

    def __init__(self) -> None:
        from scheduling import cycle

        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.found: list[str] = []
        for phase, names in PHASES.items():
            for fn_name in names:
                fn = getattr(cycle, fn_name, None)
                if callable(fn):
                    setattr(cycle, fn_name, self._wrap(phase, fn))
                    self.found.append(phase)
                    break

    def _wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[phase] = self.cpu.get(phase, 0.0) + time.process_time() - c0
                self.wall[phase] = self.wall.get(phase, 0.0) + time.perf_counter() - w0

        return timed

    def reset(self) -> None:
        self.cpu.clear()
        self.wall.clear()


class GcTime:
    """CPU time in Python's garbage collector (``gc.callbacks``), whichever phase it interrupts."""

    def __init__(self) -> None:
        import gc

        self.total = 0.0
        self.collections = 0
        self._began = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.total += time.process_time() - self._began
            self.collections += 1


def pg_cpu(db: str) -> float:
    """CPU seconds of the bench database's PostgreSQL backends so far (from /proc; 0 where unreadable)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [db])
        pids = [row[0] for row in cur.fetchall()]
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered)) - 1))]


def run(*, nodes: int, running: int, pending: int, cycles: int, db: str, profile: str, profile_churn: str = "") -> None:
    from django.core.cache import cache
    from django.core.management import call_command

    from scheduling import cycle
    from scheduling.models import Job
    from scheduling.selectors import invariant_violations
    from scheduling.states import ACTIVE_STATES, JobState

    call_command("migrate", verbosity=0)
    cache.clear()

    def builds() -> float:
        """Models of the estimated starts built so far (code that keeps none between cycles: nan)."""
        kept = getattr(cycle, "_ESTIMATES", None)
        return float(kept.builds) if kept is not None else math.nan

    began = time.monotonic()
    made = build(nodes=nodes, running=running, pending=pending)
    print(f"state: {nodes} nodes x 8 H100 ({nodes // 128 or 1} spines x 4 leaves), {TEAMS} teams, {running} running "
          f"one-GPU jobs, {pending} pending (1-64 GPUs), built in {time.monotonic() - began:.0f} s")  # fmt: skip
    phases = Phases()
    gc_time = GcTime()
    first = cycle.run_cycle_once()
    assert first.ran, "the lease was not free"
    print(f"first cycle (unmeasured): placed {len(first.placed)}, {first.reasons_updated} reasons written, "
          f"{first.seconds * 1e3:.0f} ms wall")  # fmt: skip
    rows: dict[str, dict[str, list[float]]] = {}
    for kind in ("quiet", "churn"):
        rec: dict[str, list[float]] = {"cpu": [], "wall": [], "pg": [], "placed": [], "written": [], "builds": [], "gc": []}
        rec.update({f"cpu:{p}": [] for p in PHASES})
        prof = None
        prof_to = profile if kind == "quiet" else profile_churn
        if prof_to:
            import cProfile

            prof = cProfile.Profile(time.process_time)
        for _ in range(cycles):
            if kind == "churn":
                churn(made["rng"], made["teams"])
            phases.reset()
            built = builds()
            pg0 = pg_cpu(db)
            gc0 = gc_time.total
            c0, w0 = time.process_time(), time.perf_counter()
            if prof is not None:
                prof.enable()
            res = cycle.run_cycle_once()
            if prof is not None:
                prof.disable()
            rec["cpu"].append(time.process_time() - c0)
            rec["wall"].append(time.perf_counter() - w0)
            rec["gc"].append(gc_time.total - gc0)
            rec["pg"].append(pg_cpu(db) - pg0)
            assert res.ran, "the lease was not free"
            rec["placed"].append(len(res.placed))
            rec["builds"].append(builds() - built)
            rec["written"].append(res.reasons_updated)
            for p in PHASES:
                rec[f"cpu:{p}"].append(phases.cpu.get(p, 0.0))
        if prof is not None:
            prof.dump_stats(prof_to)
        rows[kind] = rec
    assert invariant_violations() == [], invariant_violations()
    active = Job.objects.filter(state__in=ACTIVE_STATES).count()
    waiting = Job.objects.filter(state=JobState.PENDING).count()
    over = "in-process cycle (run_cycle_once) on PostgreSQL, " + (
        f"{nodes} nodes / {running} running / {pending} pending; CPU of this process"
    )
    print(f"\n{cycles} cycles of each kind; at the end {active} active jobs, {waiting} pending")
    print(f"phases timed: {', '.join(phases.found)} (CPU ms, median)")
    head = (
        f"{'cycle':>6} {'CPU med':>8} {'CPU p90':>8} {'wall med':>8} {'wall p90':>8} {'PG CPU':>7} {'placed':>6} "
        f"{'written':>7} {'rebuilt':>7} {'GC':>5}"
    )
    head += "".join(f" {p:>11}" for p in PHASES)
    print(head)
    for kind, rec in rows.items():
        line = (
            f"{kind:>6} {statistics.median(rec['cpu']) * 1e3:>8.1f} {p90(rec['cpu']) * 1e3:>8.1f} "
            f"{statistics.median(rec['wall']) * 1e3:>8.1f} {p90(rec['wall']) * 1e3:>8.1f} "
            f"{statistics.median(rec['pg']) * 1e3:>7.0f} {statistics.median(rec['placed']):>6.0f} "
            f"{statistics.median(rec['written']):>7.0f} {sum(rec['builds']):>7.0f} "
            f"{statistics.median(rec['gc']) * 1e3:>5.1f}"
        )
        line += "".join(f" {statistics.median(rec[f'cpu:{p}']) * 1e3:>11.1f}" for p in PHASES)
        print(line)
    print(
        "\nCPU: time.process_time of this process over run_cycle_once (one core); PG CPU: utime + stime of the\n"
        "database's PostgreSQL backends over the cycle (/proc); placed: gangs placed by the cycle; written: rows\n"
        "whose reason, estimate or borrowed flag changed; rebuilt: cycles that built the estimates' model anew (nan:\n"
        "the code keeps none between cycles); GC: CPU ms in Python's garbage collector during the cycle, median,\n"
        "whichever phase it interrupted. Phases are CPU ms of the functions the cycle calls."
    )
    for kind, rec in rows.items():
        result(f"cycle.{kind}.cpu_ms_median", statistics.median(rec["cpu"]) * 1e3, "ms", over=over)
        result(f"cycle.{kind}.cpu_ms_p90", p90(rec["cpu"]) * 1e3, "ms", over=over)
        result(
            f"cycle.{kind}.wall_ms_median",
            statistics.median(rec["wall"]) * 1e3,
            "ms",
            over=over.replace("CPU of this process", "wall"),
        )
        result(f"cycle.{kind}.wall_ms_p90", p90(rec["wall"]) * 1e3, "ms", over=over.replace("CPU of this process", "wall"))
        result(
            f"cycle.{kind}.pg_cpu_ms_median",
            statistics.median(rec["pg"]) * 1e3,
            "ms",
            over=over.replace("this process", "PostgreSQL backends"),
        )
        for p in PHASES:
            value = statistics.median(rec[f"cpu:{p}"]) * 1e3 if p in phases.found else None
            result(f"cycle.{kind}.{p.replace(' ', '_')}_cpu_ms", value, "ms", over=over)
        result(f"cycle.{kind}.gc_cpu_ms", statistics.median(rec["gc"]) * 1e3, "ms", over=over)


if __name__ == "__main__":
    main()
