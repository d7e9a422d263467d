"""Node liveness: a node that stops heartbeating goes NOT_READY, then DOWN (its gangs requeued) — but
only for silence the portal could observe.

Run by the Celery beat task scheduling.agent.tasks.check_nodes. Three rules keep an overloaded or
blind control plane from costing running work (docs/agent-api.md, *What the portal counts as silence*):

1. **Blind spells are not silence.** The checker records when it last ran (LivenessClock). A gap longer
   than YARD["LIVENESS_BLIND_GAP_S"] between two of its runs means the database, the broker or the
   workers were unavailable: the portal could neither receive heartbeats nor judge them, so the gap
   becomes a BlindSpell and a node's silence inside it does not count. After a ten-minute database
   outage no node has been observed silent for more than a heartbeat or two.
2. **Disruption guard** (Kubernetes' node lifecycle controller, ``--unhealthy-zone-threshold``): when at
   least YARD["DISRUPTION_SHARE"] of a leaf's nodes, or of the cluster's, and at least
   YARD["DISRUPTION_MIN_NODES"] of them, are silent at once, the cause is the portal or the network, not
   the nodes: no node under it is marked DOWN, the guard shows on the cluster page and in /metrics, and
   its duration is a blind spell too, so that nodes returning late are not marked DOWN the moment it lifts.
3. **Conditional claims.** Every state change is a conditional UPDATE on the node row (including its
   last heartbeat), so any number of concurrent checkers agree: exactly one of them moves a node to
   DOWN, only that one requeues its jobs, and a heartbeat that lands meanwhile wins.

Observed silence never exceeds wall-clock silence, so blind spells only ever make the portal wait
longer: the at-most-one-attempt arithmetic, which an agent keeps in wall-clock time, still holds.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction

from scheduling import services as scheduling_services
from scheduling.models import BlindSpell, Job, LivenessClock, Node, NodeState
from tenants.services import audit

log = logging.getLogger(__name__)

# States from which a silent node may be declared DOWN (DOWN itself is excluded: once is enough).
LOSABLE_STATES = (NodeState.READY, NodeState.NOT_READY, NodeState.DRAINING)
CLOCK = "nodes"


@dataclass
class LivenessReport:
    not_ready: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    requeued_jobs: list[int] = field(default_factory=list)
    blind: str | None = None  # the blind spell this check recorded, if any
    guard: str | None = None  # why the disruption guard holds, if it does
    guarded_leaves: list[str] = field(default_factory=list)
    # node name -> seconds of observed silence, for nodes silent past NOT_READY (the cluster page shows it)
    silent: dict[str, float] = field(default_factory=dict)


def _seconds(key: str) -> float:
    value = settings.YARD[key]
    assert isinstance(value, int | float), f"YARD[{key!r}] must be a number of seconds"
    return float(value)


def observed_silence(*, last: datetime, now: datetime, spells: list[tuple[datetime, datetime]]) -> float:
    """Seconds in (last, now] outside every blind spell (spells may overlap)."""
    total = (now - last).total_seconds()
    covered = 0.0
    edge = last
    for start, end in sorted(spells):
        start, end = max(start, edge), min(end, now)
        if end > start:
            covered += (end - start).total_seconds()
            edge = end
    return max(0.0, total - covered)


def _tick(*, now: datetime) -> tuple[LivenessClock, str | None]:
    """Record this run; a long gap since the last one becomes a blind spell. Under the clock's row lock,
    so two checkers record one spell."""
    clock, _ = LivenessClock.objects.select_for_update().get_or_create(name=CLOCK)
    blind = None
    web = _web_blind(now=now, last_tick=clock.last_tick)
    if web is not None and web[1] > web[0]:
        blind = "the web tier could not reach the database: node silence in that time is not counted"
        BlindSpell.objects.update_or_create(start=web[0], cause=blind, defaults={"end": web[1], "leaves": []})
    if clock.last_tick is not None and now > clock.last_tick:
        gap = (now - clock.last_tick).total_seconds()
        if gap > _seconds("LIVENESS_BLIND_GAP_S"):
            blind = (
                f"no liveness check for {gap:.0f} s (database, broker or workers unavailable): "
                "node silence in that time is not counted"
            )
            BlindSpell.objects.create(start=clock.last_tick, end=now, cause=blind[:255], leaves=[])
    if clock.last_tick is None or now > clock.last_tick:
        clock.last_tick = now
    return clock, blind


def _web_blind(*, now: datetime, last_tick: datetime | None) -> tuple[datetime, datetime] | None:
    """The span in which the web tier answered agents "unavailable" (portal/middleware.py), if any since
    the last check; a streak that has ended is cleared so the next one starts afresh."""
    from django.core.cache import cache

    from portal.middleware import BLIND_LATEST_KEY, BLIND_SINCE_KEY

    try:
        since, latest = cache.get(BLIND_SINCE_KEY), cache.get(BLIND_LATEST_KEY)
    except Exception:
        log.warning("cannot read the web tier's blindness from the cache", exc_info=True)
        return None
    if since is None or latest is None:
        return None
    start, end = datetime.fromtimestamp(float(since), tz=UTC), datetime.fromtimestamp(float(latest), tz=UTC)
    if (now - end).total_seconds() > 2 * _seconds("HEARTBEAT_INTERVAL_S") + _seconds("LIVENESS_TICK_S"):
        cache.delete_many([BLIND_SINCE_KEY, BLIND_LATEST_KEY])  # the streak is over
    if last_tick is not None and end < last_tick - timedelta(seconds=_seconds("LIVENESS_TICK_S")):
        return None  # already recorded by an earlier check
    # An agent pauses between two "unavailable" answers; its next attempt may come a backoff later.
    return start, min(now, end + timedelta(seconds=_seconds("HEARTBEAT_INTERVAL_S")))


def _guard(
    *, nodes: list[tuple[int, str, str, str, datetime | None]], silent: set[int]
) -> tuple[str | None, set[str], list[str]]:
    """(cluster-wide reason or None, leaves under guard, their reasons) for this set of silent nodes."""
    share = _seconds("DISRUPTION_SHARE")
    least = int(_seconds("DISRUPTION_MIN_NODES"))
    by_leaf: dict[str, list[int]] = defaultdict(list)
    for pk, _name, leaf, state, last in nodes:
        if last is not None and state != NodeState.DOWN:  # nodes never heard from, and lost ones, do not vote
            by_leaf[leaf].append(pk)
    watched = [pk for pks in by_leaf.values() for pk in pks]
    quiet = [pk for pk in watched if pk in silent]
    cluster = None
    if watched and len(quiet) >= least and len(quiet) >= share * len(watched):
        cluster = f"{len(quiet)} of {len(watched)} nodes silent at once: the portal or the network is at fault, not the nodes"
    leaves: set[str] = set()
    reasons: list[str] = []
    for leaf, pks in sorted(by_leaf.items()):
        n = sum(1 for pk in pks if pk in silent)
        if n >= least and n >= share * len(pks):
            leaves.add(leaf)
            reasons.append(f"{leaf}: {n} of {len(pks)} nodes silent")
    return cluster, leaves, reasons


def _set_guard(clock: LivenessClock, *, reason: str | None, leaves: list[str], now: datetime) -> None:
    """Start, keep or lift the guard; a lifted guard's duration becomes a blind spell (over the leaves it
    held, or the whole cluster). A guard whose scope changes is closed and reopened, so each spell
    covers exactly what was guarded."""
    if reason is not None and clock.guard_active and clock.guarded_leaves != leaves:
        _set_guard(clock, reason=None, leaves=[], now=now)
    if reason is not None:
        if not clock.guard_active:
            clock.guard_since = now
            log.warning("disruption guard on: %s", reason)
            audit(actor=None, actor_label="liveness", action="cluster.guard", obj=clock, message=f"guard on: {reason}")
        clock.guard_active, clock.guard_reason, clock.guarded_leaves = True, reason[:255], leaves
        return
    if clock.guard_active:
        since = clock.guard_since or now
        BlindSpell.objects.create(
            start=since, end=now, cause=f"disruption guard: {clock.guard_reason}"[:255], leaves=list(clock.guarded_leaves)
        )
        log.warning("disruption guard off after %.0f s", (now - since).total_seconds())
        audit(actor=None, actor_label="liveness", action="cluster.guard", obj=clock, message="guard off: heartbeats returned")
    clock.guard_active, clock.guard_reason, clock.guarded_leaves, clock.guard_since = False, "", [], None


def _mark_down(*, node_id: int, last: datetime, now: datetime, silent_s: float) -> tuple[Node, list[Job]] | None:
    """Claim the node for DOWN and lose its tasks, in one transaction; None if another checker or a heartbeat won."""
    reason = f"no heartbeat for {silent_s:.0f} s (observed): its tasks were lost and their jobs requeued"
    with transaction.atomic():
        claimed = Node.objects.filter(pk=node_id, state__in=LOSABLE_STATES, last_heartbeat=last).update(
            state=NodeState.DOWN, state_reason=reason, state_changed_at=now
        )
        if claimed != 1:
            return None
        node = Node.objects.get(pk=node_id)
        audit(actor=None, actor_label="liveness", action="node.down", obj=node, message=reason)
        jobs = scheduling_services.node_mark_lost(node=node, reason=f"node {node.name} is down (no heartbeat)")
    return node, jobs


def nodes_check(*, now: datetime) -> LivenessReport:
    """Apply the NOT_READY and DOWN timeouts (YARD["NODE_NOT_READY_S"], YARD["NODE_DOWN_S"]) to observed silence.

    Nodes never heard from (no last_heartbeat: seeded, waiting for their agent) are left alone.
    """
    report = LivenessReport()
    not_ready_s, down_s = _seconds("NODE_NOT_READY_S"), _seconds("NODE_DOWN_S")
    with transaction.atomic():
        clock, report.blind = _tick(now=now)
        horizon = now - timedelta(seconds=down_s * 4 + _seconds("LIVENESS_BLIND_GAP_S"))
        spells = list(BlindSpell.objects.filter(end__gt=horizon).values_list("start", "end", "leaves"))
        if clock.guard_active and clock.guard_since is not None:
            # the guard's time so far is not silence either, where it holds
            spells.append((clock.guard_since, now, list(clock.guarded_leaves)))
        nodes = list(Node.objects.values_list("pk", "name", "leaf__name", "state", "last_heartbeat"))

        def spells_over(leaf: str) -> list[tuple[datetime, datetime]]:
            return [(start, end) for start, end, scope in spells if not scope or leaf in scope]

        silence = {
            pk: observed_silence(last=last, now=now, spells=spells_over(leaf))
            for pk, _n, leaf, _s, last in nodes
            if last is not None
        }
        silent = {pk for pk, s in silence.items() if s > not_ready_s}
        cluster, leaves, leaf_reasons = _guard(nodes=nodes, silent=silent)
        reason = cluster or ("; ".join(leaf_reasons) if leaf_reasons else None)
        # A cluster-wide guard covers every leaf (an empty scope); otherwise only the leaves it holds.
        _set_guard(clock, reason=reason, leaves=[] if cluster else sorted(leaves), now=now)
        clock.save()
    report.guard, report.guarded_leaves = reason, sorted(leaves)
    report.silent = {name: round(silence[pk]) for pk, name, _l, _s, _last in nodes if pk in silent}

    # DRAINING nodes keep their state (an admin's decision) until they are DOWN.
    for pk, name, _leaf, state, last in nodes:
        if pk in silent and state == NodeState.READY:
            moved = Node.objects.filter(pk=pk, state=NodeState.READY, last_heartbeat=last).update(
                state=NodeState.NOT_READY, state_reason=f"no heartbeat for {silence[pk]:.0f} s (observed)", state_changed_at=now
            )
            if moved:
                report.not_ready.append(name)
    for pk, _name, leaf, state, last in nodes:
        if pk not in silent or silence[pk] <= down_s or state not in LOSABLE_STATES or last is None:
            continue
        if cluster is not None or leaf in leaves:
            continue  # the disruption guard holds: silence of many at once is not the nodes' fault
        result = _mark_down(node_id=pk, last=last, now=now, silent_s=silence[pk])
        if result is None:
            continue
        node, jobs = result
        report.down.append(node.name)
        report.requeued_jobs += [job.pk for job in jobs]
        log.warning("node %s is DOWN; jobs requeued: %s", node.name, [job.pk for job in jobs])
    return report


def liveness_status() -> LivenessClock | None:
    """The checker's record (last run, disruption guard) for the cluster page and /metrics."""
    return LivenessClock.objects.filter(name=CLOCK).first()
