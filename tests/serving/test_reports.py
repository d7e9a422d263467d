"""A service in the numbers people read: /metrics and the monthly report, under its own kind."""

from __future__ import annotations

import pytest

from scheduling.governance.accounting import month_of
from scheduling.governance.metrics import render_metrics
from scheduling.governance.reports import build_report
from scheduling.models import ServiceWindow
from scheduling.serving.selectors import SERVICE_LATENCY_EDGES_MS
from tests.serving.conftest import later, live, start, tick

pytestmark = pytest.mark.django_db


def test_metrics_show_a_services_replicas_and_what_the_proxy_measured(world):
    service = world.create(replicas=2)
    tick(service)
    first, _ = live(service)
    start(first)
    counts = [0] * (len(SERVICE_LATENCY_EDGES_MS) + 1)
    counts[40] = 100  # 100 requests of about 22 ms
    start_at = later(-20).replace(microsecond=0)
    ServiceWindow.objects.create(service=service, start=start_at, source="p:1", requests=100, busy_s=2.0, latency_counts=counts)
    text = render_metrics(now=later(0)).decode()
    assert 'yard_service_replicas_wanted{service="chat",team="team-a"} 2.0' in text
    assert 'yard_service_replicas_ready{service="chat",team="team-a"} 1.0' in text
    rps = next(line for line in text.splitlines() if line.startswith("yard_service_requests_per_second{"))
    assert float(rps.split()[-1]) > 0
    p50 = next(line for line in text.splitlines() if line.startswith("yard_service_latency_seconds{") and '"0.5"' in line)
    assert abs(float(p50.split()[-1]) - SERVICE_LATENCY_EDGES_MS[40] / 1000) < 1e-6


def test_the_monthly_report_counts_a_services_gpu_hours_under_its_own_kind(world):
    service = world.create(replicas=1, gpus_per_node=2)
    tick(service)
    (job,) = live(service)
    start(job)
    now = later(1800)
    report = build_report(month=month_of(now), tops=[world.org.root], now=now)
    kinds = dict(report.by_kind)
    assert "Service replica" in kinds
    assert kinds["Service replica"].used_gpu_hours == pytest.approx(1.0, abs=0.01)  # 2 GPUs for half an hour
    assert [row.kind for row in report.jobs] == ["service"]
