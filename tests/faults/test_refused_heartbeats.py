"""An agent that is alive but whose heartbeats are refused (a proxy in front of the portal answers every
call with a 503 page that is not the portal's): the agent stops its own work within stop_after_s plus
the grace, the portal declares the node lost after node-down, and the next attempt starts elsewhere
only after the first is gone. When the path is back, the agent is fenced clean and the node READY.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from scheduling.agent.tasks import check_nodes
from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Node, NodeState, Task
from scheduling.states import JobState
from tests.e2e.conftest import Harness, script, wait_for
from tests.faults.proxy import TcpProxy
from tests.faults.test_dead_agent import TIMINGS, WORKLOAD

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LB_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\nContent-Length: 19\r\n"
    b"Connection: close\r\n\r\n<h1>no backend</h1>"
)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_an_agent_whose_heartbeats_are_refused_stops_its_work_before_the_portal_moves_it(harness: Harness, settings: Any) -> None:
    settings.YARD = {**settings.YARD, **TIMINGS}
    live = urlsplit(harness.url)
    with TcpProxy(target=(live.hostname or "127.0.0.1", live.port or 80)) as proxy:
        direct = harness.url
        harness.url = f"http://localhost:{proxy.port}"
        harness.start_agent("ref-a", gpus=2)  # the one behind the proxy
        harness.url = direct
        harness.node_ready("ref-a")
        job = harness.submit("refused", script(harness.root, "loop", WORKLOAD), replicas=1, gpus_per_replica=2)
        harness.place(job)
        harness.job_in(job, JobState.RUNNING)
        harness.start_agent("ref-b", gpus=2)  # where the next attempt can go
        harness.node_ready("ref-b")
        pid1 = int(
            wait_for(
                "attempt 1", lambda: (harness.root / "attempt-1").exists() and (harness.root / "attempt-1").read_text()
            ).split()[0]
        )

        proxy.refuse_with = LB_503
        proxy.cut()
        proxy.restore()  # accept again, but answer every call with the load balancer's page
        refused_at = time.time()
        gone_at = started2 = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and started2 is None:
            if gone_at is None and not _alive(pid1):
                gone_at = time.time()
            check_nodes()
            run_cycle_once()
            marker = harness.root / "attempt-2"
            if marker.exists() and marker.read_text():
                started2 = float(marker.read_text().split()[1])
            time.sleep(0.05)
        assert started2 is not None, Job.objects.get(pk=job.pk).pending_reason
        assert gone_at is not None, "attempt 1 still runs while attempt 2 started"
        print(
            f"heartbeats refused; attempt 1 stopped by its own agent {gone_at - refused_at:.1f} s later, node DOWN and "
            f"attempt 2 started {started2 - refused_at:.1f} s later: overlap {max(0.0, gone_at - started2):.1f} s"
        )
        assert gone_at < started2
        assert Task.objects.get(job=job, attempt=2).node.name == "ref-b"

        proxy.refuse_with = None  # the path is back
        wait_for("ref-a READY again", lambda: Node.objects.get(name="ref-a").state == NodeState.READY, timeout=20)
        assert "portal has not accepted a heartbeat" in harness.agent_log("ref-a")
