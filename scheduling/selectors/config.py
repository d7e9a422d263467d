"""Numbers from settings.YARD and the core's ``Config``: what every other read here is tuned by.

Apart so that the modules of this package that read a setting (usage, the topology, the snapshot)
and the services that read one (``yard_number``) import it from one place below them all.
"""

from __future__ import annotations

from typing import cast

from django.conf import settings

from scheduling.core.types import Config


def yard_number(name: str) -> float:
    """A number from settings.YARD (typed there as a plain dict)."""
    return float(cast(float, settings.YARD[name]))


def scheduler_config() -> Config:
    return Config(
        half_life_s=yard_number("HALF_LIFE_S"),
        grace_period_s=yard_number("GRACE_PERIOD_S"),
        min_runtime_s=yard_number("MIN_RUNTIME_S"),
        span_slowdown=yard_number("SPAN_SLOWDOWN"),
    )
