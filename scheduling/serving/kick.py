"""Ask for the service controller soon (debounced cluster-wide), as ``cycle_request`` asks for a cycle."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.core.cache import cache
from django.db import transaction

from tenants.dispatch import send_task

log = logging.getLogger(__name__)

_KICK_KEY = "yard:serving-kick"
_DEBOUNCE_S = 0.5


def serving_request(*, service_ids: Iterable[int] = ()) -> None:
    """Run the controller once the current transaction commits (a replica became ready, a service
    changed): within about half a second instead of at its next beat (YARD_SERVICE_TICK_S)."""
    del service_ids  # the controller looks at every active service: there are few, and it is cheap
    transaction.on_commit(_kick)


def _kick() -> None:
    try:
        if cache.add(_KICK_KEY, 1, timeout=_DEBOUNCE_S):
            send_task("scheduling.serving.tasks.reconcile_services", countdown=_DEBOUNCE_S)
    except Exception:  # the broker or cache being down must not fail a heartbeat; beat runs it anyway
        log.warning("could not request the service controller", exc_info=True)
