"""What the whole-stack tests (tests/serving/test_live.py, tests/devsessions/test_live.py) share: a block
of ports nothing listens on for the cycle to hand out, and waiting for a condition with a deadline."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any


def free_port_block(size: int, *, first: int) -> str:
    """YARD_RENDEZVOUS_PORTS for a stack: ``size`` ports from ``first`` on (shifted by this process, so two
    test workers look in different places) that nothing listens on now."""
    for low in range(first + os.getpid() % 100 * size, 60000, size):
        probes = [socket.socket() for _ in range(size)]
        try:
            for probe, port in zip(probes, range(low, low + size), strict=True):
                probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        return f"{low}-{low + size - 1}"
    raise AssertionError("no free block of ports")


def wait_for(what: str, check: Callable[[], Any], *, timeout: float, interval: float = 0.25) -> Any:
    """``check()``'s first true value within ``timeout`` seconds; an AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
