"""/metrics: authenticated, parses with Prometheus' own parser, carries the promised series."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from scheduling.governance.metrics import CYCLE_CACHE_KEY
from scheduling.models import Gpu, JobEvent, JobKind, Node, XidEvent
from scheduling.states import JobState
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import running_job

pytestmark = pytest.mark.django_db
TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture
def world(monkeypatch):
    monkeypatch.setenv("YARD_METRICS_TOKEN", TOKEN)
    org = make_org()
    node = make_cluster(nodes=1)[0]
    ada = make_user("ada", unit=org.team_a)
    now = timezone.now()
    job = running_job(team=org.team_a, user=ada, node=node, gpus=2, start=now - timedelta(minutes=10), tier=3)
    Gpu.objects.filter(node=node, index=0).update(utilization_pct=42.0, memory_used_mb=1024)
    JobEvent.objects.create(job=job, attempt=1, from_state=JobState.RUNNING, to_state=JobState.PREEMPTING)
    make_job(team=org.team_a, user=ada, kind=JobKind.NOTEBOOK, state=JobState.CANCELLED, stop_reason="IDLE_TIMEOUT")
    return org, ada


def _scrape(client) -> dict[str, list]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}


def _value(samples, name: str, **labels: str) -> float:
    return next(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_refuse_anonymous_callers(client, world):
    assert client.get("/metrics").status_code == 401


def test_metrics_refuse_a_wrong_token(client, world):
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401


def test_metrics_refuse_a_signed_in_non_staff_user(client, world):
    _, ada = world
    client.force_login(ada)
    assert client.get("/metrics").status_code == 401


def test_metrics_allow_a_staff_session(client, world):
    _, ada = world
    ada.is_staff = True
    ada.save()
    client.force_login(ada)
    assert client.get("/metrics").status_code == 200


def test_metrics_without_a_configured_token_refuse_bearer_callers(client, world, monkeypatch):
    monkeypatch.delenv("YARD_METRICS_TOKEN")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_metrics_parse_and_carry_the_promised_series(client, world):
    families = _scrape(client)
    for name in (
        "yard_gpu_utilization_ratio",
        "yard_gpu_memory_used_bytes",
        "yard_jobs",
        "yard_queue_wait_seconds",
        "yard_preemptions",
        "yard_notebooks_reaped",
        "yard_quota_used_gpus",
        "yard_quota_guaranteed_gpus",
        "yard_nodes",
        "yard_nodes_held",
        "yard_gpu_healthy",
        "yard_xid_errors",
    ):
        assert name in families, name


def test_xid_errors_and_gpu_health_are_exported_for_alerting(client, world):
    gpu = Gpu.objects.get(node__name="h100-01", index=3)
    XidEvent.objects.bulk_create([XidEvent(gpu=gpu, code=79), XidEvent(gpu=gpu, code=79), XidEvent(gpu=gpu, code=13)])
    Gpu.objects.filter(pk=gpu.pk).update(healthy=False)
    Node.objects.filter(name="h100-01").update(hold_reason="XID 79 on GPU 3")
    families = _scrape(client)
    assert _value(families["yard_xid_errors"], "yard_xid_errors_total", node="h100-01", code="79") == 2
    assert _value(families["yard_xid_errors"], "yard_xid_errors_total", node="h100-01", code="13") == 1
    assert _value(families["yard_gpu_healthy"], "yard_gpu_healthy", node="h100-01", gpu="3") == 0
    assert _value(families["yard_gpu_healthy"], "yard_gpu_healthy", node="h100-01", gpu="2") == 1
    assert _value(families["yard_nodes_held"], "yard_nodes_held") == 1


def test_gpu_utilisation_is_a_ratio_labelled_by_node_gpu_and_type(client, world):
    samples = _scrape(client)["yard_gpu_utilization_ratio"]
    assert _value(samples, "yard_gpu_utilization_ratio", node="h100-01", gpu="0", gpu_type="H100") == pytest.approx(0.42)


def test_jobs_are_counted_by_state_and_tier(client, world):
    samples = _scrape(client)["yard_jobs"]
    assert _value(samples, "yard_jobs", state="RUNNING", tier="3") == 1
    assert _value(samples, "yard_jobs", state="CANCELLED", tier="2") == 1


def test_preemptions_and_reaped_notebooks_are_counters(client, world):
    families = _scrape(client)
    assert _value(families["yard_preemptions"], "yard_preemptions_total", tier="3") == 1
    assert _value(families["yard_notebooks_reaped"], "yard_notebooks_reaped_total") == 1


def test_queue_wait_histogram_counts_recently_started_jobs(client, world):
    samples = _scrape(client)["yard_queue_wait_seconds"]
    assert _value(samples, "yard_queue_wait_seconds_count") == 1
    assert _value(samples, "yard_queue_wait_seconds_sum") == pytest.approx(300, abs=1)


def test_quota_use_per_team(client, world):
    samples = _scrape(client)["yard_quota_used_gpus"]
    assert _value(samples, "yard_quota_used_gpus", team="team-a", gpu_type="H100") == 2


def test_cycle_duration_comes_from_the_cycle_cache_key(client, world):
    cache.set(CYCLE_CACHE_KEY, 0.25, 60)
    try:
        samples = _scrape(client)["yard_scheduler_cycle_duration_seconds"]
    finally:
        cache.delete(CYCLE_CACHE_KEY)
    assert _value(samples, "yard_scheduler_cycle_duration_seconds") == 0.25


def test_grafana_dashboard_uses_only_series_that_metrics_exposes(client, world):
    import json
    import re
    from pathlib import Path

    cache.set(CYCLE_CACHE_KEY, 0.1, 60)
    try:
        exposed = set(_scrape(client))
    finally:
        cache.delete(CYCLE_CACHE_KEY)
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs/grafana/yardmaster-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|total|count|sum)$", "", m) for e in exprs for m in re.findall(r"yard_[a-z_]+", e)}
    assert used and used <= exposed, used - exposed
