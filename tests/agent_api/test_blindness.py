"""The portal never blames nodes for its own blindness: checker gaps are blind spells, and mass silence
holds the disruption guard (docs/agent-api.md, *What the portal counts as silence*)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from scheduling.agent.liveness import CLOCK, nodes_check, observed_silence
from scheduling.models import BlindSpell, Job, LivenessClock, Node, NodeState, Task
from scheduling.states import JobState
from tests.factories import make_cluster

Gang = Callable[..., list[Task]]


def _silent(nodes: list[Node], seconds: float, now: object = None) -> None:
    now = now or timezone.now()
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(last_heartbeat=now - timedelta(seconds=seconds))  # type: ignore[operator]


def test_observed_silence_subtracts_blind_spells_once_even_when_they_overlap() -> None:
    now = timezone.now()
    last = now - timedelta(seconds=100)
    spells = [
        (now - timedelta(seconds=80), now - timedelta(seconds=50)),
        (now - timedelta(seconds=60), now - timedelta(seconds=40)),
    ]
    assert observed_silence(last=last, now=now, spells=spells) == 60.0
    # A spell that began before the last heartbeat only counts from it.
    assert observed_silence(last=last, now=now, spells=[(now - timedelta(seconds=500), now - timedelta(seconds=90))]) == 90.0


def test_after_a_ten_minute_database_outage_no_node_is_lost(nodes: list[Node], gang: Gang) -> None:
    task = gang()[0]
    now = timezone.now()
    # The last check ran, then the database went away for ten minutes: no check, no heartbeat got through.
    LivenessClock.objects.create(name=CLOCK, last_tick=now - timedelta(seconds=600))
    _silent(nodes, 605, now)
    report = nodes_check(now=now)
    assert report.blind is not None and "not counted" in report.blind
    assert report.down == [] and report.not_ready == [] and report.requeued_jobs == []
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}
    job = Job.objects.get(pk=task.job_id)
    assert (job.state, job.attempt) == (JobState.STARTING, 1)
    (spell,) = BlindSpell.objects.all()
    assert spell.start == now - timedelta(seconds=600) and spell.end == now


def test_silence_after_the_outage_counts_again(nodes: list[Node]) -> None:
    now = timezone.now()
    LivenessClock.objects.create(name=CLOCK, last_tick=now - timedelta(seconds=600))
    _silent(nodes[:1], 605, now)
    nodes_check(now=now)
    # The node stays silent once the portal can see again: it goes NOT_READY, then DOWN, on observed time.
    later = now + timedelta(seconds=settings.YARD["NODE_NOT_READY_S"] + 10)
    for t in range(int((later - now).total_seconds()) // 10):
        nodes_check(now=now + timedelta(seconds=10 * (t + 1)))
    assert Node.objects.get(pk=nodes[0].pk).state == NodeState.NOT_READY
    end = now + timedelta(seconds=settings.YARD["NODE_DOWN_S"] + 20)
    tick = later
    while tick < end:
        tick += timedelta(seconds=10)
        nodes_check(now=tick)
    assert Node.objects.get(pk=nodes[0].pk).state == NodeState.DOWN


def test_one_silent_node_among_many_is_lost_as_before(nodes: list[Node]) -> None:
    _silent(nodes[:1], settings.YARD["NODE_DOWN_S"] + 5)
    report = nodes_check(now=timezone.now())
    assert report.down == [nodes[0].name] and report.guard is None


@override_settings(YARD={**settings.YARD, "DISRUPTION_MIN_NODES": 3, "DISRUPTION_SHARE": 0.5})
def test_many_silent_at_once_hold_the_guard_and_nobody_is_lost(db: None) -> None:
    cluster = make_cluster(nodes=8)
    now = timezone.now()
    Node.objects.update(last_heartbeat=now)
    _silent(cluster[:5], settings.YARD["NODE_DOWN_S"] + 5, now)  # 5 of 8: the portal, not the nodes
    nodes_check(now=now - timedelta(seconds=5))  # the previous check, so no gap is blind
    report = nodes_check(now=now)
    assert report.guard is not None and "5 of 8 nodes silent" in report.guard
    assert report.down == []
    clock = LivenessClock.objects.get(name=CLOCK)
    assert clock.guard_active and clock.guard_since is not None
    # Heartbeats return: the guard lifts and its time is a blind spell, so nobody is DOWN at once.
    Node.objects.update(last_heartbeat=now + timedelta(seconds=10))
    Node.objects.filter(pk=cluster[0].pk).update(last_heartbeat=now - timedelta(seconds=settings.YARD["NODE_DOWN_S"] + 5))
    report = nodes_check(now=now + timedelta(seconds=10))
    assert report.guard is None and report.down == []
    assert not LivenessClock.objects.get(name=CLOCK).guard_active
    assert BlindSpell.objects.filter(cause__startswith="disruption guard").count() == 1


@override_settings(YARD={**settings.YARD, "DISRUPTION_MIN_NODES": 3, "DISRUPTION_SHARE": 0.5})
def test_a_silent_leaf_is_guarded_while_the_rest_of_the_cluster_is_judged(db: None) -> None:
    cluster = make_cluster(nodes=16, leaves_per_spine=2)  # two leaves of 8
    now = timezone.now()
    Node.objects.update(last_heartbeat=now)
    by_leaf: dict[str, list[Node]] = {}
    for node in Node.objects.select_related("leaf").order_by("name"):
        by_leaf.setdefault(node.leaf.name, []).append(node)
    first, second = sorted(by_leaf)
    _silent(by_leaf[first][:6], settings.YARD["NODE_DOWN_S"] + 5, now)  # most of one leaf: its switch?
    _silent(by_leaf[second][:1], settings.YARD["NODE_DOWN_S"] + 5, now)  # one node of the other leaf
    nodes_check(now=now - timedelta(seconds=5))
    report = nodes_check(now=now)
    assert report.guarded_leaves == [first]
    assert report.down == [by_leaf[second][0].name]
    assert len(cluster) == 16


@override_settings(YARD={**settings.YARD, "DISRUPTION_MIN_NODES": 3, "DISRUPTION_SHARE": 0.5})
def test_the_guard_and_the_blind_time_show_in_metrics(db: None) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from scheduling.governance.metrics import render_metrics

    def series() -> dict[str, float]:
        text = render_metrics(now=timezone.now()).decode()
        return {
            f"{s.name}{'/' + s.labels['scope'] if 'scope' in s.labels else ''}": s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("yard_liveness")
        }

    make_cluster(nodes=6)
    now = timezone.now()
    Node.objects.update(last_heartbeat=now)
    nodes_check(now=now - timedelta(seconds=5))
    assert series()["yard_liveness_guard/cluster"] == 0.0
    _silent(list(Node.objects.all()[:4]), settings.YARD["NODE_DOWN_S"] + 5, now)
    nodes_check(now=now)
    assert series()["yard_liveness_guard/cluster"] == 1.0
    Node.objects.update(last_heartbeat=now + timedelta(seconds=30))
    nodes_check(now=now + timedelta(seconds=30))
    shown = series()
    assert shown["yard_liveness_guard/cluster"] == 0.0
    assert shown["yard_liveness_blind_seconds_total"] >= 30.0
