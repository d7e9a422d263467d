"""The dashboard: my live jobs, my teams' quota bars per GPU type, the cluster at a glance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.views.common import signed_in
from scheduling.models import Allocation, Gpu, Node, NodeState
from scheduling.selectors import jobs_visible, quota_usage
from scheduling.states import TERMINAL_STATES
from tenants.models import Role
from tenants.selectors import teams_visible, user_roles

MAX_TEAMS = 12
MAX_JOBS = 20


@dataclass(frozen=True)
class QuotaBar:
    """One team's use of one GPU type, scaled for a bar: within the guarantee, borrowed beyond it.

    Two numbers that must not be confused (a 192-GPU gang on borrowed quota once read as "192 borrowed,
    97 over guarantee"): ``borrowed`` is how many GPUs the team holds past its guarantee (what it borrows,
    ``scheduling.selectors.borrowed_beyond``), ``reclaimable`` how many GPUs its borrowing jobs hold (a
    gang is reclaimed whole, so it can be more). Both from ``scheduling.selectors.quota_usage``.
    """

    gpu_type: str
    guaranteed: int
    limit: int | None
    used: int
    borrowed: int
    reclaimable: int

    @property
    def scale(self) -> int:
        return max(self.guaranteed, self.used, self.limit or 0, 1)

    def pct(self, value: int) -> float:
        return round(100 * value / self.scale, 1)

    @property
    def within(self) -> int:
        return self.used - self.borrowed

    @property
    def within_pct(self) -> float:
        return self.pct(self.within)

    @property
    def borrowed_pct(self) -> float:
        return self.pct(self.borrowed)

    @property
    def guarantee_pct(self) -> float:
        return self.pct(self.guaranteed)

    @property
    def over_limit(self) -> bool:
        return self.limit is not None and self.used > self.limit


def _my_teams(user: Any) -> list[Any]:
    """Teams I belong to first (member or lead); else the teams I can see as an admin, a few."""
    own = [unit for unit, role in user_roles(user=user) if role in (Role.MEMBER, Role.TEAM_LEAD)]
    return own or list(teams_visible(user=user)[:MAX_TEAMS])


def _capacity() -> list[dict[str, Any]]:
    """Per GPU type: GPUs, GPUs on ready nodes, busy GPUs; and nodes not ready. Three queries."""
    gpus = Gpu.objects.values("gpu_type").annotate(
        total=Count("id"), ready=Count("id", filter=Q(node__state=NodeState.READY, healthy=True))
    )
    busy = dict(
        Allocation.objects.filter(released_at__isnull=True)
        .values("gpu__gpu_type")
        .annotate(n=Count("id"))
        .values_list("gpu__gpu_type", "n")
    )
    down = dict(
        Node.objects.exclude(state=NodeState.READY).values("gpu_type").annotate(n=Count("id")).values_list("gpu_type", "n")
    )
    return [
        {**row, "busy": busy.get(row["gpu_type"], 0), "free": max(row["ready"] - busy.get(row["gpu_type"], 0), 0),
         "nodes_out": down.get(row["gpu_type"], 0)}
        for row in gpus.order_by("gpu_type")
    ]  # fmt: skip


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    live = (
        jobs_visible(user=user)
        .filter(user_id=signed_in(request).pk)
        .exclude(state__in=TERMINAL_STATES)
        .select_related("team")
        .order_by("-submitted_at")[:MAX_JOBS]
    )
    if request.htmx:  # type: ignore[attr-defined]  # the poll refreshes the job list only
        return render(request, "portal/dashboard.html#live-jobs", {"live_jobs": live})
    mine = _my_teams(user)
    usage = quota_usage(team_ids=[team.pk for team in mine])
    teams = [(team, [QuotaBar(t, **line) for t, line in sorted(usage.get(team.pk, {}).items())]) for team in mine]
    return render(request, "portal/dashboard.html", {"live_jobs": live, "team_bars": teams, "capacity": _capacity()})
