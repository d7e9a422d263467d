"""The portal's own singleton duties' records: the cycle's lease (with its fencing epoch), the liveness
checker's clock and disruption guard, and the blind spells in which it could not observe heartbeats.

Apart from the cluster's and the jobs' models because they describe the portal, not the cluster or
its work: no row here points at a node or a job.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class SchedulerLease(models.Model):
    """One row per singleton duty ("cycle"): who holds it, until when, under which epoch.

    Claimed with a conditional UPDATE; every write of a cycle re-checks the epoch so a paused
    old holder's late writes are refused (fencing token).
    """

    name = models.CharField(max_length=32, primary_key=True)
    holder = models.CharField(max_length=128, blank=True)
    epoch = models.PositiveBigIntegerField(default=0)
    expires_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or '—'} (epoch {self.epoch})"


class LivenessClock(models.Model):
    """The liveness checker's own record (one row, "nodes"): when it last ran, and the disruption guard.

    The checker's own gaps are time the portal could not observe: they become BlindSpells, which node
    silence does not count (docs/agent-api.md, *What the portal counts as silence*).
    """

    name = models.CharField(max_length=32, primary_key=True)
    last_tick = models.DateTimeField(null=True, blank=True)
    # Disruption guard: while a large share of nodes is silent at once, no node is marked lost.
    guard_active = models.BooleanField(default=False)
    guard_reason = models.CharField(max_length=255, blank=True)
    guard_since = models.DateTimeField(null=True, blank=True)
    guarded_leaves = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"{self.name}: last tick {self.last_tick}"


class BlindSpell(models.Model):
    """An interval in which the portal could not observe heartbeats (its database, workers or web tier
    were unavailable, or a disruption guard held): node silence inside it is not counted."""

    start = models.DateTimeField()
    end = models.DateTimeField(db_index=True)
    cause = models.CharField(max_length=255)
    # The leaves it covers (a disruption guard held on some leaves); empty: the whole cluster.
    leaves = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-end"]
        constraints = [models.CheckConstraint(condition=Q(end__gte=F("start")), name="blindspell_end_after_start")]

    def __str__(self) -> str:
        return f"{self.start:%H:%M:%S}–{self.end:%H:%M:%S}: {self.cause}"
