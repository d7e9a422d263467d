"""The cycle's lease: one cycle at a time cluster-wide, however many workers on however many hosts.

The ``SchedulerLease`` row "cycle" is claimed with a conditional UPDATE that bumps its epoch
(a fencing token), on PostgreSQL and SQLite alike. Every apply transaction first re-checks
the epoch with a conditional UPDATE of the lease row (``lease_fence``), which also locks that row until
the transaction commits; a claimer's UPDATE waits for that lock. So either a write of the old
holder commits before the new holder's claim, or it is refused: a paused holder that
resumes after another took over gets none of its writes accepted.

On PostgreSQL the holder also takes a session-level advisory lock: when a holder dies (SIGKILL, a
lost host), its database session ends and frees the lock at once, so another worker claims the cycle
at its next tick instead of waiting for the lease to expire. A holder that is only paused keeps its
session, and the lease (renewed at every write) and its epoch fence it as before.

Apart from ``cycle`` (what a cycle does under the lease) because the lease is a protocol of its own,
with its own failure cases, that every fenced write of the cycle relies on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from scheduling.models import SchedulerLease
from scheduling.selectors import yard_number

LEASE_NAME = "cycle"
# pg_advisory_lock key of the cycle: any constant the deployment does not use for something else.
ADVISORY_KEY = 0x59415244  # "YARD"


class LeaseLost(Exception):
    """Another holder claimed the cycle lease: this holder's writes are refused."""


@dataclass(frozen=True)
class Lease:
    holder: str
    epoch: int
    locked: bool = False  # holds the PostgreSQL session lock too


def _lease_s() -> float:
    return yard_number("CYCLE_LEASE_S")


def _session_lock() -> bool:
    """Take the cycle's session-level advisory lock (PostgreSQL); True where there is no such thing."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        # Held by this very session already (another lease of this process is running): the lock is
        # re-entrant, so taking it again would prove nothing about the other holder.
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
            "AND classid = 0 AND objid = %s AND granted",
            [ADVISORY_KEY],
        )
        if cursor.fetchone()[0]:
            return False
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY])
        return bool(cursor.fetchone()[0])


def _session_unlock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])


def lease_claim(*, holder: str | None = None, now: datetime | None = None) -> Lease | None:
    """Claim the cycle lease if it is free, expired, or its holder's database session is gone; the new
    epoch fences every earlier holder."""
    now = now or timezone.now()
    holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    SchedulerLease.objects.get_or_create(name=LEASE_NAME, defaults={"expires_at": now})
    # The session lock is free when no holder's session is alive: a holder that died (SIGKILL) lost it
    # with its connection, so its lease no longer needs to run out. Without it (a live holder, maybe
    # paused), only an expired lease may be taken over.
    sole = connection.vendor == "postgresql" and _session_lock()
    try:
        with transaction.atomic():
            free = Q(expires_at__lte=now) | Q(holder="")
            claimed = (
                SchedulerLease.objects.filter(name=LEASE_NAME)
                .filter(Q(pk=LEASE_NAME) if sole else free)
                .update(holder=holder, epoch=F("epoch") + 1, expires_at=now + timedelta(seconds=_lease_s()))
            )
            epoch = SchedulerLease.objects.values_list("epoch", flat=True).get(name=LEASE_NAME) if claimed else 0
    except BaseException:
        # The claim failed (a database error, an interrupt): a session lock kept by this live connection
        # would shut every other worker out of the cycle until this process exits.
        if sole:
            with contextlib.suppress(Exception):
                _session_unlock()
        raise
    if not claimed:
        if sole:
            _session_unlock()
        return None
    return Lease(holder=holder, epoch=epoch, locked=sole)


def lease_fence(lease: Lease) -> None:
    """Inside an apply transaction: refuse to write unless ``lease`` still holds the epoch; extend it.

    The conditional UPDATE locks the lease row until the caller's transaction ends, so no new
    holder can claim in between this check and the writes that follow it.
    """
    ok = SchedulerLease.objects.filter(name=LEASE_NAME, holder=lease.holder, epoch=lease.epoch).update(
        expires_at=timezone.now() + timedelta(seconds=_lease_s())
    )
    if not ok:
        raise LeaseLost(f"lease epoch {lease.epoch} of {lease.holder} was taken over")


def lease_release(lease: Lease) -> None:
    try:
        SchedulerLease.objects.filter(name=LEASE_NAME, holder=lease.holder, epoch=lease.epoch).update(
            holder="", expires_at=timezone.now()
        )
    finally:  # the lease runs out by itself; the session lock would not
        if lease.locked:
            with contextlib.suppress(Exception):
                _session_unlock()
