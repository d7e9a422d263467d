"""The fault suite reuses the end-to-end harness: the portal as pytest-django's live server, agents as
`python -m nodeagent` processes (tests/e2e/conftest.py)."""

import os
import socket
from typing import Any

import pytest

from tests.e2e.conftest import harness  # noqa: F401  (the fixture)


@pytest.fixture
def free_rendezvous_ports(settings: Any) -> tuple[int, int]:
    """YARD_RENDEZVOUS_PORTS set to a block of ports nothing listens on now, away from 29500, where other
    tests (and workloads) on this host may meet at the same time, and below Linux's ephemeral range
    (32768-60999): there, any outgoing connection on the machine (the suite's own, to PostgreSQL and
    Redis) may take a port of the block as its local port between this probe and the rank's bind."""
    size = 10
    low_end, high_end = 20000, 29400
    for low in range(low_end + os.getpid() % 900 * 10, high_end, size):
        probes = [socket.socket() for _ in range(size)]
        try:
            for probe, port in zip(probes, range(low, low + size), strict=True):
                probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        settings.YARD = {**settings.YARD, "RENDEZVOUS_PORTS": (low, low + size - 1)}
        return low, low + size - 1
    raise AssertionError("no free block of ports")
