"""Node agents whose clocks are 5 minutes ahead and behind the portal's (libfaketime, DONT_FAKE_MONOTONIC=1).

What must hold: the portal measures each node's skew (the agent's NTP-style estimate from heartbeat
round trips) and shows it on the cluster page; the times the agent reports (task start and end, GPU
telemetry windows) are stored in the portal's clock; and no workload is killed for it (the agents'
liveness runs on the monotonic clock and on the portal's answers). Prints the measured skews.
"""

from __future__ import annotations

import glob
import html
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import GpuWindow, Node, Task
from scheduling.states import JobState
from tests.e2e.conftest import Harness, script, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)

WORK = """
import os, pathlib, threading, time
out = pathlib.Path(os.environ["OUT_DIR"])
(out / ("ran-%s" % os.environ["YARD_JOB_ID"])).write_text(str(time.time()))
util = os.environ.get("YARD_SIM_UTIL_FILE")
deadline = time.monotonic() + float(os.environ["RUN_S"])
while time.monotonic() < deadline:
    if util:
        pathlib.Path(util).write_text("80")
    threading.Event().wait(0.1)
"""


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime is not installed (apt-get install faketime)")
def test_agents_five_minutes_off_are_measured_corrected_and_kill_nothing(harness: Harness, settings: Any, client: Client) -> None:
    settings.YARD = {**settings.YARD, "HEARTBEAT_INTERVAL_S": 0.5, "TELEMETRY_WINDOW_S": 2.0}
    # Agent, watchdog and workloads all run on the wrong clock, as on a real node (libfaketime makes
    # Python's time.sleep fail with EINVAL, so the workload waits on an Event).
    for name, shift in (("ahead", "+300"), ("behind", "-300")):
        env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": shift, "DONT_FAKE_MONOTONIC": "1"}
        harness.start_agent(name, gpus=1, env=env)
    for name in ("ahead", "behind"):
        harness.node_ready(name)
    work = script(harness.root, "work", WORK)
    jobs = [harness.submit(f"job-{i}", work, replicas=1, gpus_per_replica=1, env={"RUN_S": "5"}) for i in range(2)]
    submitted = timezone.now()
    run_cycle_once()
    for job in jobs:
        harness.job_in(job, JobState.COMPLETED, timeout=60)  # not killed: each ran its 5 s and exited 0
    finished = timezone.now()

    skews = {}
    for name, expected in (("ahead", 300.0), ("behind", -300.0)):
        node = wait_for(
            f"{name}'s skew measured",
            lambda name=name, expected=expected: (
                n if (n := Node.objects.get(name=name)).clock_skew_s is not None and abs(n.clock_skew_s - expected) < 3 else None
            ),
        )
        skews[name] = node.clock_skew_s
    slack = timedelta(seconds=3)
    for job in jobs:
        task = Task.objects.get(job=job)
        assert task.started_at is not None and task.ended_at is not None
        # In the portal's clock: within the test's own span, not five minutes off it.
        assert submitted - slack <= task.started_at <= task.ended_at <= finished + slack, (
            task.node.name,
            task.started_at,
            task.ended_at,
        )
        assert task.ended_at - task.started_at >= timedelta(seconds=4)
    # GPU telemetry windows: in the portal's clock too (the reaper and the reports read them).
    windows = list(GpuWindow.objects.filter(gpu__node__name__in=("ahead", "behind")).values_list("start", flat=True))
    assert windows, "no telemetry window stored"
    now = timezone.now()
    assert all(submitted - timedelta(seconds=30) <= w <= now for w in windows), (submitted, now, sorted(windows))

    harness.user.is_staff = True
    client.force_login(harness.user)
    page = " ".join(html.unescape(client.get("/cluster/").content.decode()).split())
    assert "its clock is 5 min ahead of the portal's" in page
    assert "its clock is 5 min behind the portal's" in page
    print(f"\nclock skew: measured ahead {skews['ahead']:+.3f} s, behind {skews['behind']:+.3f} s; 2 jobs completed, 0 killed")
