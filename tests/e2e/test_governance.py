"""Governance live, with real agents (issue 13): what the scheduler takes back, from whom, and what it costs.

Every workload is a real process started by a real agent on simulated GPUs; a preempted one gets
SIGTERM from its agent, may checkpoint in its grace period, exits, and is requeued. The test plays the
beat: it runs a cycle, waits for what the agents do, and runs the next.

- borrowing and reclaim across teams: a job within its team's guarantee takes back what another team
  borrowed;
- a Tier 1 job takes back its own team's spot work, which had filled the team's guarantee and limit;
- topology-aware reclaim: a Tier 1 gang that must stay under one leaf preempts exactly the spot jobs
  of one leaf, and runs there;
- the minimum run time spares a younger job; victims go in order of least work lost since their last
  checkpoint;
- a checkpoint written in the grace period is recorded, and lost-to-preemption counts only the work
  since it; a job of known shape and run time is accounted to the second.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.governance.accounting import job_usage, month_of
from scheduling.models import Allocation, Job, Task
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState
from tenants.services import quota_set
from tests.e2e.conftest import Harness, script, wait_for
from tests.factories import make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Traps SIGTERM and exits cleanly; with CKPT_AT_START writes a checkpoint first, with CKPT_ON_TERM
# (seconds) writes another that long into its grace period.
SPOT = """
import os, pathlib, signal, sys, time
out, job, rank = pathlib.Path(os.environ["OUT_DIR"]), os.environ["YARD_JOB_ID"], os.environ.get("RANK", "0")
ckpt = pathlib.Path(os.environ["YARD_CHECKPOINT_DIR"])
def on_term(signum, frame):
    if os.environ.get("CKPT_ON_TERM"):
        time.sleep(float(os.environ["CKPT_ON_TERM"]))
        (ckpt / "step-2.pt").write_text("weights at step 2")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
if os.environ.get("CKPT_AT_START"):
    (ckpt / "step-1.pt").write_text("weights at step 1")
(out / ("ready-%s-%s-%s" % (job, os.environ["YARD_ATTEMPT"], rank))).write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""

SLEEPS_3_S = """
import time
time.sleep(3)
"""


def _submit(
    h: Harness, user: Any, team: Any, name: str, body: str = SPOT, *, env: dict[str, str] | None = None, **fields: Any
) -> Job:
    env = {"OUT_DIR": str(h.root), "PYTHONUNBUFFERED": "1", **(env or {})}
    return job_submit(user=user, spec=JobSpec(name=name, team=team, command=script(h.root, name, body), env=env, **fields))


def _running(h: Harness, *jobs: Job) -> list[Job]:
    """One cycle places them all; each rank's workload is up."""
    result = run_cycle_once()
    for job in jobs:
        assert job.pk in result.placed, Job.objects.get(pk=job.pk).pending_reason
    out = []
    for job in jobs:
        job = h.job_in(job, JobState.RUNNING)
        for rank in range(job.replicas):
            wait_for(f"job {job.pk} rank {rank} up", lambda j=job, r=rank: (h.root / f"ready-{j.pk}-1-{r}").exists())
        out.append(job)
    return out


def _ran_for(*jobs: Job, hours: float) -> None:
    """As if they had started ``hours`` ago (past the minimum run time, with that much work to lose)."""
    for job in jobs:
        Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=hours))


def _preempt(h: Harness, victims: set[int]) -> None:
    """One cycle preempts exactly ``victims``; their agents stop them and they are requeued."""
    result = run_cycle_once()
    assert set(result.preempted) == victims, {j.pk: j.pending_reason for j in Job.objects.filter(state=JobState.PENDING)}
    for pk in victims:
        job = h.job_in(Job.objects.get(pk=pk), JobState.PENDING)
        assert job.attempt == 2 and job.events.filter(to_state=JobState.PREEMPTED).count() == 1


def _nodes(job: Job, attempt: int = 1) -> set[str]:
    return set(Task.objects.filter(job=job, attempt=attempt).values_list("node__name", flat=True))


def _agents(h: Harness, *names: str, gpus: int = 2, leaf: str = "leaf-1") -> None:
    for name in names:
        h.start_agent(name, gpus=gpus, leaf=leaf)
    for name in names:
        h.node_ready(name)


def test_a_job_within_its_guarantee_takes_back_what_another_team_borrowed(harness: Harness) -> None:
    org = harness.org
    quota_set(actor=None, unit=org.team_c, gpu_type="H100", guaranteed=0, limit=4)  # all it runs is borrowed
    _agents(harness, "e2e-a", "e2e-b")
    cara = make_user("cara", unit=org.team_c)
    (borrower,) = _running(harness, _submit(harness, cara, org.team_c, "borrower", replicas=2, gpus_per_replica=2))
    assert borrower.borrowed is True
    _ran_for(borrower, hours=1)
    mine = _submit(harness, harness.user, org.team_a, "mine", tier=2, replicas=1, gpus_per_replica=2)

    _preempt(harness, {borrower.pk})
    stop = Job.objects.get(pk=borrower.pk).events.get(to_state=JobState.PREEMPTING).reason
    assert f"reclaimed for job mine (#{mine.pk}) (team {org.team_a.slug} within guarantee)" in stop
    harness.place(mine)

    mine = harness.job_in(mine, JobState.RUNNING)
    assert mine.borrowed is False and _nodes(mine) <= _nodes(borrower)


def test_a_tier_1_job_takes_back_its_own_teams_spot_work_that_filled_its_guarantee(harness: Harness) -> None:
    # The case: the team's own Tier 3 job held its whole guarantee (and limit), and its Tier 1
    # job was refused "Tier 1 runs only within guarantee: team holds 4/4".
    org = harness.org
    quota_set(actor=None, unit=org.team_a, gpu_type="H100", guaranteed=4, limit=4)
    _agents(harness, "e2e-a", gpus=4)
    (spot,) = _running(harness, _submit(harness, harness.user, org.team_a, "spot", tier=3, replicas=1, gpus_per_replica=4))
    assert spot.borrowed is False  # inside the team's guarantee: not borrowed, but Tier 3
    _ran_for(spot, hours=1)
    prod = _submit(harness, harness.user, org.team_a, "prod", tier=1, replicas=1, gpus_per_replica=2)

    _preempt(harness, {spot.pk})
    waiting = Job.objects.get(pk=prod.pk).pending_reason
    assert waiting.startswith(f"preempting 1 job(s) ({spot.pk}) to free e2e-a and bring team {org.team_a.slug} back")
    harness.place(prod)

    assert harness.job_in(prod, JobState.RUNNING).borrowed is False
    spot = Job.objects.get(pk=spot.pk)
    assert spot.state == JobState.PENDING and spot.pending_reason.startswith(f"over team {org.team_a.slug} quota for H100")


def test_a_tier_1_gang_preempts_exactly_the_spot_jobs_of_one_leaf_and_runs_there(harness: Harness) -> None:
    org = harness.org
    _agents(harness, "e2e-a1", "e2e-a2", leaf="leaf-a")
    _agents(harness, "e2e-b1", "e2e-b2", leaf="leaf-b")
    cara = make_user("cara", unit=org.team_c)
    spots = _running(harness, *(_submit(harness, cara, org.team_c, f"spot{i}", tier=3, gpus_per_replica=2) for i in range(4)))
    _ran_for(*spots, hours=1)
    leaf = {s.pk: Task.objects.get(job=s).node.leaf.name for s in spots}
    gang = _submit(harness, harness.user, org.team_a, "gang", tier=1, replicas=2, gpus_per_replica=2)

    result = run_cycle_once()
    victims = set(result.preempted)
    assert len(victims) == 2 and len({leaf[v] for v in victims}) == 1, (victims, leaf)
    for pk in victims:
        harness.job_in(Job.objects.get(pk=pk), JobState.PENDING)
    harness.place(gang)

    gang = harness.job_in(gang, JobState.RUNNING)
    assert _nodes(gang) == set().union(*(_nodes(Job.objects.get(pk=v)) for v in victims))
    spared = [s for s in spots if s.pk not in victims]
    assert all(Job.objects.get(pk=s.pk).state == JobState.RUNNING for s in spared)


def test_a_job_younger_than_the_minimum_run_time_is_spared(harness: Harness) -> None:
    org = harness.org
    _agents(harness, "e2e-a", gpus=4)
    cara = make_user("cara", unit=org.team_c)
    (old,) = _running(harness, _submit(harness, cara, org.team_c, "old", tier=3, gpus_per_replica=2))
    _ran_for(old, hours=1)
    # Just started: it has less work to lose, so by that order alone it would go first.
    (young,) = _running(harness, _submit(harness, cara, org.team_c, "young", tier=3, gpus_per_replica=2))
    prod = _submit(harness, harness.user, org.team_a, "prod", tier=1, gpus_per_replica=2)

    _preempt(harness, {old.pk})
    harness.place(prod)
    assert Job.objects.get(pk=young.pk).state == JobState.RUNNING


def test_the_victim_is_the_job_with_least_work_lost_since_its_last_checkpoint(harness: Harness) -> None:
    org = harness.org
    _agents(harness, "e2e-a", gpus=4)
    cara = make_user("cara", unit=org.team_c)
    saved, unsaved = _running(
        harness,
        _submit(harness, cara, org.team_c, "saved", tier=3, gpus_per_replica=2, env={"CKPT_AT_START": "1"}),
        _submit(harness, cara, org.team_c, "unsaved", tier=3, gpus_per_replica=2),
    )
    # The older job, which "newest first" alone would spare, checkpointed just now (its agent says so).
    _ran_for(saved, hours=2)
    _ran_for(unsaved, hours=1)
    wait_for("the checkpoint reported", lambda: Job.objects.get(pk=saved.pk).last_checkpoint_at is not None)
    prod = _submit(harness, harness.user, org.team_a, "prod", tier=1, gpus_per_replica=2)

    _preempt(harness, {saved.pk})
    harness.place(prod)
    assert Job.objects.get(pk=unsaved.pk).state == JobState.RUNNING


def test_a_checkpoint_written_in_the_grace_period_is_recorded_and_only_work_since_it_is_lost(harness: Harness, settings) -> None:
    settings.YARD = {**settings.YARD, "MIN_RUNTIME_S": 0.0}
    org = harness.org
    _agents(harness, "e2e-a")
    cara = make_user("cara", unit=org.team_c)
    env = {"CKPT_AT_START": "1", "CKPT_ON_TERM": "1.0"}
    (victim,) = _running(harness, _submit(harness, cara, org.team_c, "victim", tier=3, gpus_per_replica=2, env=env))
    wait_for("the first checkpoint reported", lambda: Job.objects.get(pk=victim.pk).last_checkpoint_at is not None)
    _submit(harness, harness.user, org.team_a, "prod", tier=1, gpus_per_replica=2)

    _preempt(harness, {victim.pk})

    victim = Job.objects.get(pk=victim.pk)
    written = Path(victim.checkpoint_dir, "step-2.pt").stat().st_mtime  # written 1 s into the grace period
    assert victim.last_checkpoint_at is not None and abs(victim.last_checkpoint_at.timestamp() - written) < 1e-3
    (task,) = Task.objects.filter(job=victim, attempt=1)
    assert task.checkpoint_at == victim.last_checkpoint_at
    allocations = list(Allocation.objects.filter(job=victim, attempt=1))
    assert len(allocations) == 2 and all(a.released_at is not None for a in allocations)
    now = timezone.now()
    (usage,) = [u.usage for u in job_usage(month=month_of(now), now=now) if u.job_id == victim.pk]
    lost = sum((a.released_at - victim.last_checkpoint_at).total_seconds() for a in allocations)
    used = sum((a.released_at - a.allocated_at).total_seconds() for a in allocations)
    assert usage.lost_s == pytest.approx(lost, abs=1e-6) and 0 < lost < used
    assert usage.used_s == pytest.approx(used, abs=1e-6)


def test_a_job_of_known_shape_and_run_time_is_accounted_to_the_second(harness: Harness) -> None:
    org = harness.org
    _agents(harness, "e2e-a", "e2e-b")
    job = _submit(harness, harness.user, org.team_a, "known", SLEEPS_3_S, replicas=2, gpus_per_replica=2)
    harness.place(job)
    job = harness.job_in(job, JobState.COMPLETED, timeout=60)

    allocations = list(Allocation.objects.filter(job=job))
    tasks = {t.pk: t for t in Task.objects.filter(job=job)}
    assert len(allocations) == 4
    for a in allocations:
        task = tasks[a.task_id]
        assert task.started_at is not None and task.ended_at is not None and a.released_at is not None
        # Held from placement to the exit report: the workload's 3 s inside it.
        assert a.allocated_at <= task.started_at and task.ended_at <= a.released_at
        assert (task.ended_at - task.started_at).total_seconds() >= 3.0
    now = timezone.now()
    (row,) = [u for u in job_usage(month=month_of(now), now=now) if u.job_id == job.pk]
    expected = sum((a.released_at - a.allocated_at).total_seconds() for a in allocations)
    assert row.usage.used_s == pytest.approx(expected, abs=1e-6)
    assert row.usage.used_s >= 4 * 3.0
    assert (row.usage.borrowed_s, row.usage.lost_s, row.usage.reaped_s) == (0.0, 0.0, 0.0)
