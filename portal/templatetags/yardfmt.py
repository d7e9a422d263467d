"""Numbers and words the portal's pages write the same way everywhere."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from django import template
from django.utils import timezone

from scheduling.core.reasons import memory_words
from tenants.models import OrgUnit

register = template.Library()

STOP_REASONS = {
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "IDLE_TIMEOUT": "idle: stopped by the idle reaper",
    "TIME_LIMIT": "time limit reached",
    "IMAGE_PULL": "its image could not be pulled",
}


@register.filter
def duration(seconds: float | int | str | None) -> str:
    """3600 -> '1 h', 5400 -> '1 h 30 min', 2700 -> '45 min', 90 -> '1 min 30 s', 200000 -> '2 d 7 h'."""
    if seconds is None or seconds == "":
        return "—"
    total = round(float(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h" if hours else f"{days} d"
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def when_words(moment: datetime | None, now: datetime | None = None) -> str:
    """A moment as people read it, with its day unless it is today: '05:57', 'tomorrow 05:57',
    'Thu 3 Dec 05:57' (in the portal's time zone)."""
    if moment is None:
        return "—"
    here, today = timezone.localtime(moment), timezone.localtime(now or timezone.now()).date()
    clock = f"{here:%H:%M}"
    if here.date() == today:
        return clock
    if here.date() == today + timedelta(days=1):
        return f"tomorrow {clock}"
    if here.date() == today - timedelta(days=1):
        return f"yesterday {clock}"
    year = f" {here.year}" if here.year != today.year else ""
    return f"{here:%a} {here.day} {here:%b}{year} {clock}"


@register.filter
def when(moment: datetime | None) -> str:
    return when_words(moment)


@register.filter
def capacity(amount: int | float | None, kind: str) -> str:
    """How much of one resource the cluster has, with its unit: '64 H100', '5,040 CPU cores',
    '79.7 TiB memory' (fair share counts cores and MiB of memory beside the GPU types)."""
    if amount is None:
        return "—"
    if kind == "cpu":
        return f"{int(amount):,} CPU cores"
    if kind == "memory":
        return f"{memory_words(int(amount))} memory"
    return f"{int(amount):,} {kind}"


@register.filter
def resource_name(kind: str) -> str:
    """A fair-share resource as people say it: 'CPU cores', 'memory', or the GPU type."""
    return {"cpu": "CPU cores", "memory": "memory"}.get(kind, kind)


@register.filter
def mib(value: int | None) -> str:
    """MiB as people read it: '512 MiB', '64 GiB', '2 TiB'."""
    return "—" if value is None else memory_words(int(value))


@register.filter
def stop_reason(code: str) -> str:
    return STOP_REASONS.get(code, (code or "").lower().replace("_", " "))


@register.filter
def gpuh(value: float | None, decimals: int = 1) -> str:
    """GPU-hours with thousands separators and a fixed number of decimals: '142,848.0'."""
    if value is None:
        return "—"
    return f"{float(value):,.{int(decimals)}f}"


@register.filter
def pct(ratio: float | None) -> str:
    """0.873 -> '87.3 %'; None -> '—'."""
    if ratio is None:
        return "—"
    return f"{100 * float(ratio):.1f} %"


_UNIT_REF = re.compile(r"\b(team|unit|parent unit) (\d+)\b")


@register.filter
def unit_names(text: str) -> str:
    """Org units named by name in a scheduler's reason ("over team 4 quota" -> "over team pretraining
    quota"). The scheduler core names units by its own key; rows written while that key was the id
    still read right (one query per text that has any)."""
    text = str(text or "")
    ids = {int(m.group(2)) for m in _UNIT_REF.finditer(text)}
    if not ids:
        return text
    names = dict(OrgUnit.objects.filter(pk__in=ids).values_list("pk", "name"))
    return _UNIT_REF.sub(lambda m: f"{m.group(1)} {names.get(int(m.group(2)), m.group(2))}", text)
