"""Prometheus metrics, computed from the database on every scrape.

A custom collector on a private CollectorRegistry, not process-global counters: with many web
processes each would count only its own events, while the database holds the truth for all of
them. Counters ("_total") are counts of durable rows (JobEvents, reaped jobs), so they only grow
and survive restarts. Names and labels follow Prometheus conventions (base units: seconds,
bytes, ratios 0..1).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db.models import Count, Sum
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from scheduling.agent.liveness import CLOCK as LIVENESS_CLOCK
from scheduling.cycle import CYCLE_SECONDS_CACHE_KEY
from scheduling.models import (
    Allocation,
    BlindSpell,
    Gpu,
    Job,
    JobEvent,
    JobKind,
    LivenessClock,
    Node,
    SchedulerLease,
    Service,
    ServiceState,
    XidEvent,
)
from scheduling.selectors import quota_usage
from scheduling.states import JobState
from tenants.models import OrgUnit, UnitKind

CYCLE_CACHE_KEY = CYCLE_SECONDS_CACHE_KEY  # written by every cycle
QUEUE_WAIT_WINDOW = timedelta(hours=1)  # the histogram covers jobs that started in the last hour
QUEUE_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
MIB = 1024 * 1024


def _gpu_metrics() -> Iterator[Metric]:
    util = GaugeMetricFamily(
        "yard_gpu_utilization_ratio", "GPU utilisation reported by the node agent (0..1)", labels=["node", "gpu", "gpu_type"]
    )
    used = GaugeMetricFamily("yard_gpu_memory_used_bytes", "GPU memory in use", labels=["node", "gpu", "gpu_type"])
    total = GaugeMetricFamily("yard_gpu_memory_total_bytes", "GPU memory size", labels=["node", "gpu", "gpu_type"])
    allocated = GaugeMetricFamily(
        "yard_gpu_allocated", "1 if a live allocation holds the GPU", labels=["node", "gpu", "gpu_type"]
    )
    healthy = GaugeMetricFamily(
        "yard_gpu_healthy", "0 once a critical XID took the GPU out of placement (until its node is resumed)",
        labels=["node", "gpu", "gpu_type"],
    )  # fmt: skip
    live = set(Allocation.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
    for gpu in Gpu.objects.select_related("node").order_by("node__name", "index"):
        labels = [gpu.node.name, str(gpu.index), gpu.gpu_type]
        if gpu.utilization_pct is not None:
            util.add_metric(labels, gpu.utilization_pct / 100)
        if gpu.memory_used_mb is not None:
            used.add_metric(labels, gpu.memory_used_mb * MIB)
        total.add_metric(labels, gpu.memory_mb * MIB)
        allocated.add_metric(labels, 1.0 if gpu.pk in live else 0.0)
        healthy.add_metric(labels, 1.0 if gpu.healthy else 0.0)
    yield from (util, used, total, allocated, healthy)
    xids = CounterMetricFamily("yard_xid_errors", "XID errors reported by the node agents", labels=["node", "code"])
    for node, code, n in (
        XidEvent.objects.values_list("gpu__node__name", "code").annotate(n=Sum("count")).order_by("gpu__node__name", "code")
    ):
        xids.add_metric([node, str(code)], n)
    yield xids


def _node_metrics() -> Iterator[Metric]:
    nodes = GaugeMetricFamily("yard_nodes", "Nodes by state", labels=["state"])
    counts = dict(Node.objects.values_list("state").annotate(n=Count("id")))
    for state in ("READY", "NOT_READY", "DRAINING", "DOWN"):
        nodes.add_metric([state], counts.get(state, 0))
    yield nodes
    held = GaugeMetricFamily("yard_nodes_held", "Nodes held out of placement until an admin resumes them")
    held.add_metric([], Node.objects.exclude(hold_reason="").count())
    yield held
    # The liveness check's own state (scheduling/agent/liveness.py): while the guard holds, no node
    # under it is marked lost; blind seconds are time the portal could not observe.
    clock = LivenessClock.objects.filter(name=LIVENESS_CLOCK).first()
    guard = GaugeMetricFamily(
        "yard_liveness_guard", "1 while the disruption guard holds (many nodes silent at once: none is marked lost)",
        labels=["scope"],
    )  # fmt: skip
    guard.add_metric(["cluster"], 1.0 if clock and clock.guard_active and not clock.guarded_leaves else 0.0)
    guard.add_metric(["leaves"], float(len(clock.guarded_leaves)) if clock and clock.guard_active else 0.0)
    yield guard
    blind = CounterMetricFamily(
        "yard_liveness_blind_seconds", "Time the portal could not observe heartbeats (not counted as silence)"
    )
    blind.add_metric([], sum((b.end - b.start).total_seconds() for b in BlindSpell.objects.only("start", "end")))
    yield blind
    if clock is not None and clock.last_tick is not None:
        last = GaugeMetricFamily("yard_liveness_last_check_timestamp_seconds", "When the liveness check last ran")
        last.add_metric([], clock.last_tick.timestamp())
        yield last


def _job_metrics(now: datetime) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("yard_jobs", "Jobs by state and tier", labels=["state", "tier"])
    counts = {(s, t): n for s, t, n in Job.objects.values_list("state", "tier").annotate(n=Count("id"))}
    for state in JobState.values:
        for tier in (1, 2, 3):
            jobs.add_metric([state, str(tier)], counts.get((state, tier), 0))
    yield jobs

    # Queue wait of the jobs that started within the window: PENDING time of their newest attempt,
    # from the event that made them PENDING (submission or requeue) to the start of the attempt.
    waits: list[float] = []
    recent = Job.objects.filter(started_at__gte=now - QUEUE_WAIT_WINDOW).values_list(
        "pk", "attempt", "submitted_at", "started_at"
    )
    recent_list = list(recent)
    queued_at = {
        (job_id, attempt): time
        for job_id, attempt, time in JobEvent.objects.filter(
            job_id__in=[r[0] for r in recent_list], to_state=JobState.PENDING
        ).values_list("job_id", "attempt", "time")
    }
    for job_id, attempt, submitted_at, started_at in recent_list:
        if started_at is None:  # filtered out above; says so to the type checker
            continue
        since = queued_at.get((job_id, attempt), submitted_at)
        waits.append(max((started_at - since).total_seconds(), 0.0))
    buckets = [(str(float(b)), sum(1 for w in waits if w <= b)) for b in QUEUE_WAIT_BUCKETS]
    buckets.append(("+Inf", len(waits)))
    yield HistogramMetricFamily(
        "yard_queue_wait_seconds",
        f"PENDING time of jobs that started in the last {int(QUEUE_WAIT_WINDOW.total_seconds())} s",
        buckets=buckets,
        sum_value=sum(waits),
    )

    preemptions = CounterMetricFamily("yard_preemptions", "Preemption orders (jobs sent to PREEMPTING)", labels=["tier"])
    by_tier = dict(JobEvent.objects.filter(to_state=JobState.PREEMPTING).values_list("job__tier").annotate(n=Count("id")))
    for tier in (1, 2, 3):
        preemptions.add_metric([str(tier)], by_tier.get(tier, 0))
    yield preemptions

    reaped = CounterMetricFamily("yard_notebooks_reaped", "Notebooks stopped by the idle reaper")
    reaped.add_metric([], Job.objects.filter(kind=JobKind.NOTEBOOK, stop_reason="IDLE_TIMEOUT").count())
    yield reaped
    reaped_dev = CounterMetricFamily("yard_dev_sessions_reaped", "Dev sessions stopped by the idle reaper")
    reaped_dev.add_metric([], Job.objects.filter(kind=JobKind.DEV, stop_reason="IDLE_TIMEOUT").count())
    yield reaped_dev


def _cycle_metrics() -> Iterator[Metric]:
    seconds = cache.get(CYCLE_CACHE_KEY)
    if seconds is not None:
        gauge = GaugeMetricFamily("yard_scheduler_cycle_duration_seconds", "Duration of the newest scheduling cycle")
        gauge.add_metric([], float(seconds))
        yield gauge
    epoch = SchedulerLease.objects.filter(name="cycle").values_list("epoch", flat=True).first()
    cycles = CounterMetricFamily("yard_scheduler_cycles", "Scheduling cycles run (the cycle lease's epoch)")
    cycles.add_metric([], epoch or 0)
    yield cycles


def _quota_metrics() -> Iterator[Metric]:
    labels = ["team", "gpu_type"]
    guaranteed = GaugeMetricFamily("yard_quota_guaranteed_gpus", "Guaranteed GPUs of each team", labels=labels)
    limit = GaugeMetricFamily("yard_quota_limit_gpus", "Most GPUs a team may hold, borrowing included", labels=labels)
    used = GaugeMetricFamily("yard_quota_used_gpus", "GPUs a team holds now (live allocations)", labels=labels)
    borrowed = GaugeMetricFamily("yard_quota_borrowed_gpus", "GPUs a team holds beyond its guarantee", labels=labels)
    teams = {u.pk: u.slug for u in OrgUnit.objects.filter(kind=UnitKind.TEAM)}
    # The API's and the portal's figures (borrowed: beyond the guarantee, not the GPUs of borrowing jobs).
    for team_id, types in sorted(quota_usage().items()):
        if team_id not in teams:
            continue
        for gpu_type, line in sorted(types.items()):
            row = [teams[team_id], gpu_type]
            guaranteed.add_metric(row, line["guaranteed"])
            if line["limit"] is not None:
                limit.add_metric(row, line["limit"])
            used.add_metric(row, line["used"])
            borrowed.add_metric(row, line["borrowed"])
    yield from (guaranteed, limit, used, borrowed)


def _service_metrics(now: datetime) -> Iterator[Metric]:
    """Per service: replicas wanted, live and ready, restarts in place, and what the proxy measured over
    the last minute (requests/s, errors/s, p50/p99 latency, requests in flight)."""
    from scheduling.serving.selectors import replicas_of, service_stats

    labels = ["team", "service"]
    wanted = GaugeMetricFamily("yard_service_replicas_wanted", "Replicas a service should have now", labels=labels)
    live = GaugeMetricFamily("yard_service_replicas", "Replica jobs of a service that are not over", labels=labels)
    ready = GaugeMetricFamily("yard_service_replicas_ready", "Replicas in the proxy's rotation", labels=labels)
    restarts = GaugeMetricFamily(
        "yard_service_replica_restarts", "In-place restarts of the live replicas' current attempts", labels=labels
    )
    crash = GaugeMetricFamily("yard_service_replicas_crash_looping", "Replicas the agent says are crash-looping", labels=labels)
    rps = GaugeMetricFamily("yard_service_requests_per_second", "Requests through the proxy, last minute", labels=labels)
    errors = GaugeMetricFamily("yard_service_errors_per_second", "5xx answers through the proxy, last minute", labels=labels)
    inflight = GaugeMetricFamily(
        "yard_service_inflight_requests", "Mean requests in flight at the proxy, last minute", labels=labels
    )
    latency = GaugeMetricFamily(
        "yard_service_latency_seconds", "Latency at the proxy over the last minute", labels=[*labels, "quantile"]
    )
    for service in Service.objects.filter(state=ServiceState.ACTIVE).select_related("team").order_by("team__slug", "name"):
        row = [service.team.slug, service.name]
        replicas = replicas_of(service=service)
        stats = service_stats(service=service, seconds=60, now=now)
        wanted.add_metric(row, service.replicas)
        live.add_metric(row, len(replicas))
        ready.add_metric(row, sum(1 for r in replicas if r.ready))
        restarts.add_metric(row, sum(r.restarts for r in replicas))
        crash.add_metric(row, sum(1 for r in replicas if r.crash_looping))
        rps.add_metric(row, stats.rps)
        errors.add_metric(row, stats.errors / stats.seconds)
        inflight.add_metric(row, stats.inflight)
        for q, value in (("0.5", stats.p50_ms), ("0.99", stats.p99_ms)):
            if value is not None:
                latency.add_metric([*row, q], value / 1000)
    yield from (wanted, live, ready, restarts, crash, rps, errors, inflight, latency)


class YardCollector(Collector):
    def __init__(self, now: datetime) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        yield from _gpu_metrics()
        yield from _node_metrics()
        yield from _job_metrics(self.now)
        yield from _cycle_metrics()
        yield from _quota_metrics()
        yield from _service_metrics(self.now)


def render_metrics(*, now: datetime) -> bytes:
    """The Prometheus text exposition of the cluster at ``now``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(YardCollector(now))
    return generate_latest(registry)
