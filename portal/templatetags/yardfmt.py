"""Numbers and words the portal's pages write the same way everywhere."""

from __future__ import annotations

import re

from django import template

from scheduling.core.reasons import memory_words
from tenants.models import OrgUnit

register = template.Library()

STOP_REASONS = {
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "IDLE_TIMEOUT": "idle: stopped by the idle reaper",
    "TIME_LIMIT": "time limit reached",
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
