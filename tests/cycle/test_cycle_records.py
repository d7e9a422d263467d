"""A cycle leaves its duration where /metrics reads it."""

import pytest
from django.core.cache import cache
from django.utils import timezone

from scheduling.cycle import CYCLE_SECONDS_CACHE_KEY, run_cycle_once
from scheduling.governance.metrics import render_metrics
from tests.factories import make_cluster, make_org

pytestmark = pytest.mark.django_db


def test_a_cycle_records_its_duration_for_the_metrics_endpoint():
    make_org()
    make_cluster(nodes=2)
    cache.delete(CYCLE_SECONDS_CACHE_KEY)
    result = run_cycle_once()
    assert result.ran
    assert cache.get(CYCLE_SECONDS_CACHE_KEY) == pytest.approx(result.seconds)
    text = render_metrics(now=timezone.now()).decode()
    line = next(x for x in text.splitlines() if x.startswith("yard_scheduler_cycle_duration_seconds "))
    assert float(line.split()[1]) == pytest.approx(result.seconds)


@pytest.mark.django_db
def test_the_deployments_span_slowdown_reaches_the_plan(settings):
    from scheduling.selectors import snapshot_build

    settings.YARD = {**settings.YARD, "SPAN_SLOWDOWN": 0.4}
    assert snapshot_build(now=timezone.now()).config.span_slowdown == 0.4
