"""A draft of the quota tree (a copy of one subtree an admin edits without touching the live tree) and a
what-if run: the window's real jobs replayed under the live tree and under the draft."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from tenants.models import OrgUnit


class QuotaDraft(models.Model):
    """A copy of the live quotas of ``root``'s subtree, as they were when copied (``base``)."""

    root = models.ForeignKey(OrgUnit, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    # "unit_id/gpu_type" -> [guaranteed, limit, weight] of the live tree at the copy: what apply compares
    # the live tree against, to refuse a draft that would undo someone's later edit.
    base = models.JSONField(default=dict)
    applied_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.root})"


class DraftQuota(models.Model):
    """One cell of a draft: the same fields and rules as ``tenants.Quota``."""

    draft = models.ForeignKey(QuotaDraft, on_delete=models.CASCADE, related_name="quotas")
    unit = models.ForeignKey(OrgUnit, on_delete=models.CASCADE, related_name="+")
    gpu_type = models.CharField(max_length=32)
    guaranteed = models.PositiveIntegerField(default=0)
    limit = models.PositiveIntegerField(null=True, blank=True)
    weight = models.FloatField(default=1.0)

    class Meta:
        ordering = ["unit__path", "gpu_type"]
        constraints = [
            models.UniqueConstraint(fields=["draft", "unit", "gpu_type"], name="draftquota_unique_cell"),
            models.CheckConstraint(
                condition=Q(limit__isnull=True) | Q(limit__gte=F("guaranteed")), name="draftquota_limit_gte_guaranteed"
            ),
            models.CheckConstraint(condition=Q(weight__gt=0), name="draftquota_weight_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.draft}: {self.unit} {self.gpu_type} {self.guaranteed}"


class RunState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    CANCELLING = "cancelling", "Cancelling"
    DONE = "done", "Done"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


FINISHED = (RunState.DONE, RunState.CANCELLED, RunState.FAILED)


class WhatIfRun(models.Model):
    """The window's jobs replayed twice: under the live tree and under the draft. ``result`` holds the
    side-by-side figures (scheduling/whatif/results.py) once done."""

    draft = models.ForeignKey(QuotaDraft, on_delete=models.CASCADE, related_name="runs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    jobs = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=12, choices=RunState.choices, default=RunState.QUEUED)
    progress = models.FloatField(default=0.0)  # 0..1 over both replays
    message = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(window_end__gt=F("window_start")), name="whatifrun_window_not_empty")]

    def __str__(self) -> str:
        return f"what-if {self.pk} of {self.draft} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def percent(self) -> int:
        return round(self.progress * 100)
