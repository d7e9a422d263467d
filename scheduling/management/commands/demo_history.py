"""A month of plausible history for the demo (seed_demo): what the report, fair share and the charts read.

Jobs of every demo team over the last 30 days, placed by a small first-fit packer on the demo's real
nodes and GPUs (so no GPU is ever in two allocations at once), with what the live system would have
written: Task and Allocation rows per attempt (``borrowed`` where the team held more than its guarantee),
JobEvents, preemptions requeued from a checkpoint, one notebook the idle reaper stopped, and GpuWindow
telemetry as the agents write it (one row per GPU per minute: samples, utilization_sum, utilization_max),
sampled a few minutes per allocation so that start-up stays within a second or two (bulk inserts; the
report's efficiency is the mean over the minutes that have telemetry, so a sample is what it needs).

Deterministic (a fixed seed) relative to ``now``; every job has ended before ``now``, so the live demo's
own jobs start on an idle cluster.

Who runs what and when is decided here; the rows each job writes, the packer and the bulk write are in
``_history_rows``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model

from scheduling.management.commands._history_rows import _job, _minute, _Packer, _Rows, _telemetry, _write
from scheduling.models import Gpu, JobEvent, JobKind, Node
from scheduling.states import JobState
from tenants.models import Membership, OrgUnit, Quota, Role

DAYS = 30
SEED = 18

# team: [(gpu type, replicas, gpus per replica, hours (low, high), jobs a day, mean utilisation %, names)]
PROFILES: dict[str, list[tuple[str, int, int, tuple[float, float], float, float, tuple[str, ...]]]] = {
    "pretraining": [
        ("H100", 8, 8, (10, 30), 0.9, 91, ("llm-7b-pretrain", "llm-13b-pretrain", "tokenizer-sweep")),
        ("H100", 16, 8, (20, 40), 0.15, 93, ("llm-70b-pretrain",)),
        ("H100", 2, 8, (2, 8), 1.0, 78, ("ablation", "data-mix-eval")),
    ],
    "alignment": [
        ("H100", 1, 8, (2, 10), 1.6, 74, ("dpo", "rlhf-reward-model", "sft")),
        ("A100", 1, 4, (1, 5), 1.0, 58, ("eval-harness",)),
    ],
    "perception": [
        ("H100", 2, 8, (4, 12), 1.0, 82, ("detector-train", "segmentation")),
        ("A100", 1, 8, (2, 8), 1.2, 66, ("vit-finetune", "augment-sweep")),
    ],
    "generative-video": [("H100", 4, 8, (8, 20), 0.6, 89, ("video-diffusion", "vae-train"))],
    "ranking": [
        ("H100", 2, 8, (2, 8), 1.4, 70, ("ranker-train", "two-tower")),
        ("A100", 1, 4, (1, 4), 1.5, 52, ("feature-backfill", "ranker-eval")),
    ],
    "retrieval": [
        ("A100", 1, 8, (2, 8), 1.2, 61, ("embedder-train", "index-build")),
        ("H100", 1, 4, (1, 3), 1.0, 48, ("retrieval-eval",)),
    ],
    "speech": [("H100", 1, 8, (3, 10), 1.4, 80, ("asr-train", "tts-finetune"))],
    "agents": [
        ("H100", 1, 8, (2, 6), 1.2, 68, ("tool-use-sft", "planner-rl")),
        ("H100", 1, 2, (1, 4), 1.5, 35, ("agent-eval",)),
    ],
}
NOTEBOOK_USERS = ("alice", "bob", "carol")


@dataclass
class _Held:
    team_id: int
    gpu_type: str
    start: datetime
    end: datetime
    gpus: int


def seed_history(*, now: datetime) -> dict[str, int]:
    """Write the month; returns how many rows of each kind (for the command's message)."""
    rng = random.Random(SEED)
    start = _minute(now) - timedelta(days=DAYS)
    teams = {u.name: u for u in OrgUnit.objects.filter(name__in=PROFILES)}
    guaranteed = {(q.unit_id, q.gpu_type): q.guaranteed for q in Quota.objects.filter(unit__in=teams.values())}
    users = _team_users(teams)
    gpus: dict[int, list[int]] = defaultdict(list)
    for gpu_id, node_id in Gpu.objects.order_by("node_id", "index").values_list("id", "node_id"):
        gpus[node_id].append(gpu_id)
    packers = {t: _Packer(list(Node.objects.filter(gpu_type=t).order_by("name")), gpus, start) for t in ("H100", "A100")}
    arrivals: list[tuple[datetime, str, tuple[Any, ...]]] = []
    for team_name, profiles in PROFILES.items():
        for profile in profiles:
            per_day = profile[4]
            at = start + timedelta(hours=rng.uniform(0, 12))
            while at < now:
                arrivals.append((at, team_name, profile))
                # Busier on weekdays, quieter at weekends: the daily chart's shape.
                gap = rng.expovariate(per_day / 24) * (1.8 if at.weekday() >= 5 else 1.0)
                at += timedelta(hours=max(gap, 0.2))
    arrivals.sort(key=lambda a: (a[0], a[1]))
    rows = _Rows()
    held: list[_Held] = []
    for arrival, team_name, (gpu_type, replicas, per, (lo, hi), _, util, names) in arrivals:
        team = teams.get(team_name)
        if team is None:
            continue
        hours = rng.uniform(lo, hi)
        found = packers[gpu_type].place(replicas, per, arrival, hours)
        if found is None:
            continue
        began, chosen = found
        end = began + timedelta(hours=hours)
        if end > now - timedelta(minutes=10) or began - arrival > timedelta(days=2):
            for slot, positions in chosen:  # give the GPUs back: this job is not part of the history
                for p in positions:
                    slot.free_at[p] = min(slot.free_at[p], began)
            continue
        n = replicas * per
        held_then = sum(h.gpus for h in held if h.team_id == team.pk and h.gpu_type == gpu_type and h.start <= began < h.end)
        borrowed = held_then + n > guaranteed.get((team.pk, gpu_type), 0)
        held.append(_Held(team.pk, gpu_type, began, end, n))
        outcome = rng.random()
        state = JobState.COMPLETED if outcome < 0.86 else JobState.FAILED if outcome < 0.94 else JobState.CANCELLED
        preempted = borrowed and rng.random() < 0.15  # borrowed work, gangs too, is what reclaim takes
        _job(
            rows,
            rng,
            team=team,
            user=rng.choice(users[team.pk]),
            name=rng.choice(names),
            gpu_type=gpu_type,
            replicas=replicas,
            per=per,
            arrival=arrival,
            began=began,
            end=end,
            chosen=chosen,
            state=state,
            borrowed=borrowed,
            util=util,
            preempted=preempted,
            time_limit_s=int(hi * 3600 * 1.2),
        )
    _notebooks(rows, rng, packers["H100"], teams=teams, users=users, start=start, now=now)
    return _write(rows)


def _team_users(teams: dict[str, OrgUnit]) -> dict[int, list[Any]]:
    """Each team's people: its demo users, else its CI service account (as an API token would make it)."""
    user_model = get_user_model()
    out: dict[int, list[Any]] = defaultdict(list)
    for m in Membership.objects.filter(unit__in=teams.values()).select_related("user"):
        out[m.unit_id].append(m.user)
    for team in teams.values():
        if not out[team.pk]:
            user, created = user_model.objects.get_or_create(username=f"svc-{team.slug}")
            if created:
                user.set_unusable_password()
                user.save()
                Membership.objects.get_or_create(user=user, unit=team, defaults={"role": Role.MEMBER})
            out[team.pk].append(user)
    return out


def _notebooks(
    rows: _Rows,
    rng: random.Random,
    packer: _Packer,
    *,
    teams: dict[str, OrgUnit],
    users: dict[int, list[Any]],
    start: datetime,
    now: datetime,
) -> None:
    """A notebook most days for each demo user, and one the idle reaper stopped (45 idle minutes)."""
    people = {
        m.user.get_username(): (m.user, m.unit)
        for m in Membership.objects.filter(user__username__in=NOTEBOOK_USERS).select_related("user", "unit")
    }
    day = start + timedelta(days=1, hours=9)
    while day < now - timedelta(days=1):
        for username in NOTEBOOK_USERS:
            if username not in people or rng.random() < 0.3 or day.weekday() >= 5:
                continue
            _notebook(
                rows,
                rng,
                packer,
                people[username],
                arrival=day + timedelta(minutes=rng.uniform(0, 180)),
                hours=rng.uniform(1.5, 5),
                now=now,
                reaped=False,
            )
        day += timedelta(days=1)
    if "alice" in people:  # the one the idle reaper stopped, three days ago: always there, whatever the dice said
        arrival = (now - timedelta(days=3)).replace(hour=10, minute=0, second=0, microsecond=0)
        _notebook(rows, rng, packer, people["alice"], arrival=arrival, hours=2.5, now=now, reaped=True)


def _notebook(
    rows: _Rows,
    rng: random.Random,
    packer: _Packer,
    who: tuple[Any, OrgUnit],
    *,
    arrival: datetime,
    hours: float,
    now: datetime,
    reaped: bool,
) -> None:
    user, team = who
    found = packer.place(1, 1, arrival, hours)
    if found is None:
        return
    began, chosen = found
    end = began + timedelta(hours=hours)
    if end > now - timedelta(minutes=10):
        return
    name = user.get_username()
    _job(
        rows,
        rng,
        team=team,
        user=user,
        name=f"notebook-{name}",
        gpu_type="H100",
        replicas=1,
        per=1,
        arrival=began - timedelta(seconds=30),
        began=began,
        end=end,
        chosen=chosen,
        state=JobState.CANCELLED,
        borrowed=False,
        util=30,
        preempted=False,
        time_limit_s=24 * 3600,
        kind=JobKind.NOTEBOOK,
        stop_reason="IDLE_TIMEOUT" if reaped else "CANCELLED",
    )
    if not reaped:
        return
    index = len(rows.jobs) - 1
    gpu_id = chosen[0][0].gpu_ids[chosen[0][1][0]]
    rows.windows[:] = [w for w in rows.windows if not (w.gpu_id == gpu_id and began <= w.start < end)]
    _telemetry(rows, rng, gpu_id, began, end, 40, idle_tail=46)
    warning = "idle warning: its GPUs are unused; it will be stopped in about 10 min unless they are used"
    rows.events.append((index, JobEvent(time=end - timedelta(minutes=10), attempt=1, reason=warning, actor_label="idle-reaper")))
    stopping = "idle for 45 min (GPU telemetry): stopping the notebook"
    rows.events.append((index, JobEvent(time=end - timedelta(seconds=40), attempt=1, reason=stopping, actor_label="idle-reaper")))
