"""Reads of the what-if: drafts and runs a user may see, and the replay's input from the database (the
window's jobs as submitted with their real run times, the fleet, the live tree and a draft's)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Q, QuerySet
from django.http import Http404

from scheduling.core.fairshare import accrue, decay
from scheduling.core.types import Gpu as CoreGpu
from scheduling.core.types import Node as CoreNode
from scheduling.core.types import QuotaUnit, Topology
from scheduling.models import Allocation, Gpu, Job, Node, Task
from scheduling.selectors.config import yard_number
from scheduling.whatif.models import DraftQuota, QuotaDraft, WhatIfRun
from scheduling.whatif.replay import ReplayJob
from tenants.models import OrgUnit, Quota
from tenants.selectors import admin_roots

Cell = tuple[int, str]  # (unit id, GPU type)
Values = tuple[int, int | None, float]  # guaranteed, limit, weight


def cell_key(unit_id: int, gpu_type: str) -> str:
    return f"{unit_id}/{gpu_type}"


# --------------------------------------------------------------------------- access


def drafts_visible(*, user: Any) -> QuerySet[QuotaDraft]:
    """Drafts of the subtrees the user administers (an org admin: drafts of their unit's subtree; a
    cluster admin: all); none for anyone else."""
    roots = admin_roots(user=user)
    if not roots:
        return QuotaDraft.objects.none()
    return QuotaDraft.objects.filter(reduce(or_, [Q(root__path__startswith=r.path) for r in roots])).select_related("root")


def access_draft(*, user: Any, pk: int | str) -> QuotaDraft:
    try:
        return drafts_visible(user=user).get(pk=pk)
    except (QuotaDraft.DoesNotExist, ValueError):
        raise Http404("No such draft") from None


def access_run(*, user: Any, pk: int | str) -> WhatIfRun:
    try:
        return WhatIfRun.objects.select_related("draft", "draft__root").get(pk=pk, draft__in=drafts_visible(user=user))
    except (WhatIfRun.DoesNotExist, ValueError):
        raise Http404("No such what-if run") from None


# --------------------------------------------------------------------------- trees


def subtree_units(*, root: OrgUnit) -> list[OrgUnit]:
    return list(OrgUnit.objects.filter(path__startswith=root.path).order_by("path"))


def live_cells(*, root: OrgUnit) -> dict[Cell, Values]:
    rows = Quota.objects.filter(unit__path__startswith=root.path).values_list(
        "unit_id", "gpu_type", "guaranteed", "limit", "weight"
    )
    return {(u, t): (g, lim, w) for u, t, g, lim, w in rows}


def draft_cells(*, draft: QuotaDraft) -> dict[Cell, Values]:
    rows = DraftQuota.objects.filter(draft=draft).values_list("unit_id", "gpu_type", "guaranteed", "limit", "weight")
    return {(u, t): (g, lim, w) for u, t, g, lim, w in rows}


def base_cells(*, draft: QuotaDraft) -> dict[Cell, Values]:
    out: dict[Cell, Values] = {}
    for key, (g, lim, w) in draft.base.items():
        unit_id, gpu_type = key.split("/", 1)
        out[(int(unit_id), gpu_type)] = (int(g), None if lim is None else int(lim), float(w))
    return out


def quota_units(*, draft: QuotaDraft | None = None) -> tuple[QuotaUnit, ...]:
    """The whole tree as the core sees it (slugs as names, as the cycle's snapshot), no usage; with
    ``draft``, the quotas of the units it copied (or has cells for) replaced by the draft's cells. A unit
    added to the live tree since the copy keeps its live quotas: the draft says nothing about it."""
    cells: dict[int, dict[str, Values]] = defaultdict(dict)
    for q in Quota.objects.all():
        cells[q.unit_id][q.gpu_type] = (q.guaranteed, q.limit, q.weight)
    units = list(OrgUnit.objects.order_by("path").values_list("id", "parent_id", "slug", "path"))
    if draft is not None:
        replaced = draft_cells(draft=draft)
        owned = {u for u, _ in replaced} | {u for u, _ in base_cells(draft=draft)}
        for pk in owned:
            cells[pk] = {}
        for (unit_id, gpu_type), values in replaced.items():
            cells[unit_id][gpu_type] = values
    slugs = {pk: slug for pk, _, slug, _ in units}
    out = []
    for pk, parent_id, slug, _ in units:
        own = cells.get(pk, {})
        types = sorted(own)
        out.append(
            QuotaUnit(
                name=slug,
                parent=slugs[parent_id] if parent_id else None,
                guaranteed={t: own[t][0] for t in types},
                limit={t: lim for t in types if (lim := own[t][1]) is not None},
                # The core keeps one weight per unit: the first quota's, as the cycle's snapshot does.
                weight=own[types[0]][2] if types else 1.0,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- the replay's input


def fleet() -> Topology:
    """Every node and its whole GPUs, whatever their state now: the fleet the month ran on, as far as the
    portal knows it today (a node retired during the month is not in it). GPUs are named "node/index",
    not by row id, so that the same fleet replays the same way in any database."""
    nodes = list(
        Node.objects.order_by("name").values_list(
            "id", "name", "leaf__name", "leaf__spine__name", "gpu_type", "cpus", "memory_mb"
        )
    )
    types = {pk: t for pk, _, _, _, t, _, _ in nodes}
    names = {pk: name for pk, name, _, _, _, _, _ in nodes}
    # What jobs may be given of a node's cores and memory, as the cycle's topology counts it: less the
    # system reserve; 0 ("not known") stays 0 and holds no job to it.
    reserve_cpus, reserve_mb = int(yard_number("SYSTEM_RESERVE_CPUS")), int(yard_number("SYSTEM_RESERVE_MEMORY_MB"))
    gpus: dict[int, list[CoreGpu]] = defaultdict(list)
    rows = Gpu.objects.order_by("node_id", "index").values_list(
        "node_id", "index", "nvlink_domain", "pcie_switch", "numa_node", "gpu_type"
    )
    for node_id, index, nvlink, pcie, numa, gpu_type in rows:
        if gpu_type in ("", types.get(node_id)):
            gpus[node_id].append(CoreGpu(id=f"{names[node_id]}/{index}", index=index, nvlink=nvlink, pcie=pcie, numa=numa))
    return Topology(
        nodes=tuple(
            CoreNode(
                name=name,
                leaf=leaf,
                spine=spine,
                gpu_type=gpu_type,
                gpus=tuple(gpus[pk]),
                cpus=max(cpus - reserve_cpus, 1) if cpus else 0,
                memory_mb=max(memory_mb - reserve_mb, 1) if memory_mb else 0,
            )
            for pk, name, leaf, spine, gpu_type, cpus, memory_mb in nodes
            if gpus[pk]
        )
    )


def usage_before(*, start: datetime, half_life_s: float) -> dict[str, dict[str, float]]:
    """Team key -> GPU type -> decayed GPU-seconds at ``start`` from what teams held before it (as the
    portal's accounting decays it; allocations older than ten half-lives weigh < 0.1 % and are skipped):
    fair share's memory of the time before a window, the same for both trees."""
    horizon = start - timedelta(seconds=10 * half_life_s)
    rows = Allocation.objects.filter(allocated_at__lt=start).filter(Q(released_at__isnull=True) | Q(released_at__gt=horizon))
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for slug, gpu_type, began, ended in rows.values_list(
        "job__team__slug", "job__gpu_type", "allocated_at", "released_at"
    ).iterator(chunk_size=5000):
        stop = min(ended or start, start)
        held = accrue(0.0, 1, max((stop - began).total_seconds(), 0.0), half_life_s)
        out[slug][gpu_type] += decay(held, (start - stop).total_seconds(), half_life_s)
    return {team: dict(types) for team, types in out.items()}


def window_jobs_count(*, start: datetime, end: datetime) -> int:
    return _window(start, end).count()


def _window(start: datetime, end: datetime) -> QuerySet[Job]:
    """The jobs submitted in the window that ran: a job cancelled before it started asked nothing of the fleet."""
    return Job.objects.filter(submitted_at__gte=start, submitted_at__lt=end, started_at__isnull=False)


@dataclass
class WindowJobs:
    jobs: list[ReplayJob]
    team_of: dict[str, int]  # job id -> team unit id
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many jobs of the window are not replayed


def window_jobs(*, start: datetime, end: datetime, fleet: Topology) -> WindowJobs:
    """The window's jobs as submitted (arrival, gang, GPU type, tier, team, time limit, priority, leaf
    locality), each with the work it really ran: the rank-0 task's time over its attempts, an earlier
    attempt counted up to its last checkpoint (what the next attempt did not redo), none if it had none.
    Two queries; a job still running counts up to now."""
    from django.utils import timezone

    now = timezone.now()
    rows = list(
        _window(start, end)
        .order_by("submitted_at", "id")
        .values_list(
            "id", "team_id", "team__slug", "tier", "gpu_type", "replicas", "gpus_per_replica", "submitted_at",
            "time_limit_s", "priority", "leaf_locality", "attempt", "cpus_per_replica", "memory_mb_per_replica",
        )
    )  # fmt: skip
    ids = [r[0] for r in rows]
    work: dict[int, float] = defaultdict(float)
    last_attempt = {r[0]: r[11] for r in rows}
    tasks = Task.objects.filter(job_id__in=ids, rank=0, started_at__isnull=False).values_list(
        "job_id", "attempt", "started_at", "ended_at", "checkpoint_at"
    )
    for job_id, attempt, began, ended, checkpoint in tasks.iterator(chunk_size=5000):
        if began is None:
            continue
        stop: datetime = began
        if attempt >= last_attempt[job_id]:
            stop = ended or now
        elif checkpoint is not None and checkpoint > began:
            stop = checkpoint
        work[job_id] += max((stop - began).total_seconds(), 0.0)
    capacity: dict[str, int] = defaultdict(int)
    for node in fleet.nodes:
        capacity[node.gpu_type] += len(node.gpus)
    out = WindowJobs([], {})
    for pk, team_id, slug, tier, gpu_type, replicas, per, submitted, limit_s, priority, locality, _, cpus, memory_mb in rows:
        ran = work.get(pk, 0.0)
        why = ""
        if capacity.get(gpu_type, 0) == 0:
            why = f"no {gpu_type} GPUs in the fleet now"
        elif replicas * per > capacity[gpu_type]:
            why = "larger than the fleet's GPUs of its type"
        elif ran <= 0:
            why = "no task of it ever ran"
        if why:
            out.skipped[why] = out.skipped.get(why, 0) + 1
            continue
        out.team_of[str(pk)] = team_id
        out.jobs.append(
            ReplayJob(
                job_id=str(pk),
                team=slug,
                tier=tier,
                gpu_type=gpu_type,
                replicas=replicas,
                gpus_per_replica=per,
                submit_s=(submitted - start).total_seconds(),
                run_s=ran,
                limit_s=float(limit_s) if limit_s else ran,
                locality=locality or "auto",
                priority=priority,
                cpus_per_replica=cpus,
                memory_mb_per_replica=memory_mb,
            )
        )
    return out


def runs_of(*, draft: QuotaDraft) -> QuerySet[WhatIfRun]:
    return WhatIfRun.objects.filter(draft=draft).defer("result")
