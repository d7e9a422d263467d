"""Reads about services: who may see, manage and call one; its replicas; where the proxy sends requests;
what the proxy measured (requests/s, p50/p99 latency, in-flight requests per replica)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from scheduling.models import Job, RolloutState, Service, ServiceState, ServiceWindow, Task
from scheduling.states import ACTIVE_STATES, TERMINAL_STATES, JobState, TaskState
from tenants.selectors import AnyUser, is_cluster_admin, teams_led, teams_visible

# Latency histogram bucket edges in milliseconds (the last bucket is everything above the last edge):
# roughly 10 % apart, so a percentile read from them is within about 5 % of the true one.
SERVICE_LATENCY_EDGES_MS: tuple[float, ...] = tuple(round(0.5 * 1.1**i, 3) for i in range(130))


def window_s() -> float:
    return float(cast(float, settings.YARD["SERVICE_WINDOW_S"]))


# --------------------------------------------------------------------------- access


def services_visible(*, user: AnyUser) -> QuerySet[Service]:
    """Live services of the teams the user can see (as jobs: members see their team's)."""
    return Service.objects.exclude(state=ServiceState.DELETED).filter(team__in=teams_visible(user=user))


def access_service(*, user: AnyUser, pk: int | str) -> Service:
    """The service with ``pk`` if the user may read it; the same 404 as a missing one otherwise."""
    try:
        return services_visible(user=user).select_related("team", "user").get(pk=int(pk))
    except (Service.DoesNotExist, ValueError, TypeError, OverflowError):
        raise Http404("No such service") from None


def access_service_by_name(*, user: AnyUser, team: str, name: str) -> Service:
    try:
        return services_visible(user=user).select_related("team", "user").get(team__slug=team, name=name)
    except Service.DoesNotExist:
        raise Http404("No such service") from None


def can_manage_service(*, user: AnyUser, service: Service) -> bool:
    """Its owner, a member of its team (a squad shares its services), the team's lead, an admin above it."""
    if not user.is_authenticated:
        return False
    if service.user_id == user.pk or is_cluster_admin(user):
        return True
    from tenants.selectors import may_submit_to

    return may_submit_to(user=user, team=service.team) or teams_led(user=user).filter(pk=service.team_id).exists()


def can_call_service(*, user: AnyUser, service: Service) -> bool:
    """Who may call its endpoint with their portal session: anyone who may see it."""
    return user.is_authenticated and services_visible(user=user).filter(pk=service.pk).exists()


# --------------------------------------------------------------------------- replicas


def live_replicas(*, service: Service) -> QuerySet[Job]:
    """Its replica jobs that are not over (pending, starting, running, being stopped)."""
    return Job.objects.filter(service=service).exclude(state__in=TERMINAL_STATES)


@dataclass(frozen=True)
class Replica:
    """A replica job as the controller and the pages see it: its rank-0 task's report."""

    job: Job
    task: Task | None  # rank 0 of its current attempt (None while pending)

    @property
    def revision(self) -> int:
        return self.job.service_revision or 0

    @property
    def stopping(self) -> bool:
        return self.job.stop_requested_at is not None or self.job.state not in (*ACTIVE_STATES, JobState.PENDING)

    @property
    def draining(self) -> bool:
        return self.job.drain_started_at is not None

    @property
    def ready(self) -> bool:
        """In the proxy's rotation: running, its probe passing, not draining or being stopped."""
        return (
            self.job.state == JobState.RUNNING
            and not self.stopping
            and not self.draining
            and self.task is not None
            and self.task.state == TaskState.RUNNING
            and bool(self.task.service_ready)
            and bool(self.task.service_url)
        )

    @property
    def restarts(self) -> int:
        return self.task.service_restarts if self.task is not None else 0

    @property
    def crash_looping(self) -> bool:
        return bool(self.task and self.task.service_crash_looping)


def replicas_of(*, service: Service, include_ended: bool = False) -> list[Replica]:
    """The service's replicas (live ones; with ``include_ended``, the last 20 ended too), oldest first."""
    jobs = list(live_replicas(service=service).order_by("submitted_at", "id"))
    if include_ended:
        ended = Job.objects.filter(service=service, state__in=TERMINAL_STATES).order_by("-ended_at", "-id")[:20]
        jobs += list(ended)
    # Rank 0 of each job's current attempt (a requeued replica's earlier attempts are history).
    tasks: dict[tuple[int, int], Task] = {}
    for task in Task.objects.filter(job__in=jobs, rank=0).select_related("node"):
        tasks[(task.job_id, task.attempt)] = task
    return [Replica(job=j, task=tasks.get((j.pk, j.attempt))) for j in jobs]


# --------------------------------------------------------------------------- the proxy's view


@dataclass(frozen=True)
class Route:
    """A ready replica the proxy may send requests to."""

    job_id: int
    url: str  # http://address:port of its rank 0


@dataclass(frozen=True)
class ServiceRoutes:
    service_id: int
    team: str
    name: str
    routes: tuple[Route, ...]
    replicas: int  # live replica jobs (ready or not): for the "none ready" answer
    token_hashes: frozenset[str] = frozenset()  # its live tokens' SHA-256


def service_routes(*, team: str, name: str) -> ServiceRoutes | None:
    """Where the proxy sends ``/services/<team>/<name>/…`` now: its ready replicas; None for no such service."""
    service = Service.objects.filter(team__slug=team, name=name, state=ServiceState.ACTIVE).only("id", "team_id", "name").first()
    if service is None:
        return None
    ready = (
        Task.objects.filter(
            job__service=service,
            job__state=JobState.RUNNING,
            job__stop_requested_at__isnull=True,
            job__drain_started_at__isnull=True,
            rank=0,
            state=TaskState.RUNNING,
            service_ready=True,
        )
        .exclude(service_url="")
        .order_by("job_id")
        .values_list("job_id", "service_url", "attempt", "job__attempt")
    )
    routes = tuple(Route(job_id=job_id, url=url) for job_id, url, attempt, current in ready if attempt == current)
    hashes = frozenset(service.tokens.filter(revoked_at__isnull=True).values_list("token_hash", flat=True))
    return ServiceRoutes(
        service_id=service.pk,
        team=team,
        name=name,
        routes=routes,
        replicas=live_replicas(service=service).count(),
        token_hashes=hashes,
    )


# --------------------------------------------------------------------------- what the proxy measured


@dataclass
class ServiceStats:
    """Over the last ``seconds``: requests/s, errors/s, p50/p99 latency (ms; None without requests), mean
    in-flight requests in all, and per replica job (Little's law: time spent in requests / time)."""

    seconds: float
    requests: int = 0
    errors: int = 0
    rps: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    inflight: float = 0.0
    per_replica: dict[int, dict[str, float]] = field(default_factory=dict)


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The q-th quantile (0..1) of a histogram over SERVICE_LATENCY_EDGES_MS: the upper edge of its bucket."""
    total = sum(counts)
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for i, count in enumerate(counts):
        seen += count
        if seen >= rank:
            edges = SERVICE_LATENCY_EDGES_MS
            return edges[i] if i < len(edges) else edges[-1] * 1.1
    return None


def service_stats(*, service: Service, seconds: float = 60.0, now: datetime | None = None) -> ServiceStats:
    """What the proxies measured of ``service`` over the last ``seconds``: the windows that have ended and
    began within them. A proxy writes no row for a window without requests, so the rates are over the
    whole ``seconds`` (a quiet window counts as zero, as it was)."""
    now = now or timezone.now()
    size = window_s()
    windows = ServiceWindow.objects.filter(
        service=service, start__gte=now - timedelta(seconds=seconds + size), start__lt=now - timedelta(seconds=size)
    )
    stats = ServiceStats(seconds=seconds)
    counts = [0] * (len(SERVICE_LATENCY_EDGES_MS) + 1)
    busy = 0.0
    per: dict[int, list[float]] = {}
    for w in windows:
        stats.requests += w.requests
        stats.errors += w.errors
        busy += w.busy_s
        for i, c in enumerate(w.latency_counts[: len(counts)]):
            counts[i] += int(c)
        for job_id, (n, spent) in _per_replica(w.per_replica).items():
            acc = per.setdefault(job_id, [0.0, 0.0])
            acc[0] += n
            acc[1] += spent
    span = seconds
    stats.rps = stats.requests / span
    stats.inflight = busy / span
    stats.p50_ms, stats.p99_ms = percentile(counts, 0.50), percentile(counts, 0.99)
    stats.per_replica = {j: {"requests": n, "rps": n / span, "inflight": spent / span} for j, (n, spent) in per.items()}
    return stats


def _per_replica(data: Any) -> dict[int, tuple[float, float]]:
    out: dict[int, tuple[float, float]] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            try:
                out[int(key)] = (float(value[0]), float(value[1]))
            except (TypeError, ValueError, IndexError):
                continue
    return out


def rollout_progress(*, service: Service, replicas: Sequence[Replica]) -> dict[str, Any]:
    """The rollout as people read it: towards which revision, how many replicas run it and are ready."""
    new = [r for r in replicas if r.revision == service.revision and not r.stopping and not r.draining]
    old = [r for r in replicas if r.revision != service.revision and not r.stopping]
    return {
        "state": service.rollout_state or RolloutState.COMPLETE,
        "revision": service.revision,
        "from_revision": service.rollout_from,
        "updated": len(new),
        "updated_ready": sum(1 for r in new if r.ready),
        "old": len(old),
        "wanted": service.replicas,
        "started_at": service.rollout_started_at,
        "message": service.rollout_message,
    }


def active_services() -> QuerySet[Service]:
    return Service.objects.filter(Q(state=ServiceState.ACTIVE) | Q(state=ServiceState.DELETING))
