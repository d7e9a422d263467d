"""A database outage longer than the node-down timeout costs no running work.

The portal's processes (gunicorn, a Celery worker and beat) reach PostgreSQL through a TCP proxy the
test cuts; the agents are `nodeagent.fleet` processes with real workloads. Timings are shortened
(node-down 20 s) and the outage lasts 45 s: before, this marked every node DOWN and requeued every job.
Now the agents hear "unavailable" (503 JSON) and keep their work, the checker counts the outage as a
blind spell, and when the database is back nothing was lost.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from bench.stack import PG, Stack
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.slow]

SHORT = {
    "YARD_HEARTBEAT_INTERVAL_S": "0.5",
    "YARD_NODE_NOT_READY_S": "3",
    "YARD_NODE_DOWN_S": "20",
    "YARD_AGENT_STOP_AFTER_S": "6",
    "YARD_AGENT_FENCE_AFTER_S": "4",
    "YARD_AGENT_MAX_GRACE_S": "1",
    "YARD_LIVENESS_TICK_S": "1",
    "YARD_LIVENESS_BLIND_GAP_S": "3",
    "YARD_CYCLE_INTERVAL_S": "1",
}
OUTAGE_S = 45.0
# A slow or half-open database answers each heartbeat only after its budget (about two seconds here),
# and a query in flight when the budget ends still takes its round trip: a heartbeat may outlast the
# agent's 2.8 s timeout, and on two loaded cores (CI: four test workers) a few did in a row. So there
# stop-after is 16 s (as production's 120 s, over five HTTP timeouts; node-down 32 s, still past the
# late-loss bound) and the outage 60 s (1.9 x node-down, 3.75 x stop-after).
SLOW = {**SHORT, "YARD_AGENT_STOP_AFTER_S": "16", "YARD_NODE_DOWN_S": "32"}
SLOW_OUTAGE_S = 60.0


def _get(url: str, token: str | None = None) -> tuple[int, dict[str, str], dict[str, object]]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {"not_json": body[:200].decode(errors="replace")}
        return exc.code, dict(exc.headers), parsed


def _post_job(stack: Stack, name: str) -> int:
    body = json.dumps({"name": name, "team": "bench", "replicas": 1, "gpus_per_replica": 2, "gpu_type": "H100",
                       "command": "exec sleep 600", "time_limit_s": 3600}).encode()  # fmt: skip
    request = urllib.request.Request(
        stack.url + "/api/v1/jobs",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.loads(response.read())["id"])


def _workload_pids(stack: Stack) -> dict[int, int]:
    """task id -> pid of its running workload, from the agents' journals (what they supervise)."""
    found: dict[int, int] = {}
    for journal in stack.tmp.glob("fleet-*/*/journal.json"):
        for task in json.loads(journal.read_text())["tasks"]:
            if task["state"] == "running" and task["pid"]:
                found[task["task_id"]] = task["pid"]
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


FAULTS = {
    "cut": "cut (connections refused)",
    "slow": "slow (1 s added to every round trip)",
    "half_open": "half-open (connections accepted, nothing forwarded)",
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_database_outage_twice_the_node_down_timeout_loses_no_node_and_no_job(fault: str) -> None:
    """Cut for 45 s (2.25 x node-down, 7.5 x the agents' stop-after), slow or half-open for 60 s (1.9 x
    and 3.75 x): the agents hear "unavailable" in time (a heartbeat waits on the
    database within its budget, portal/middleware.py) and keep their work."""
    host, port = "127.0.0.1", int(PG.rsplit(":", 1)[1].split("/")[0])
    with TcpProxy(target=(host, port)) as proxy:
        portal_pg = f"postgres://postgres@127.0.0.1:{proxy.port}"
        timings, outage_s = (SHORT, OUTAGE_S) if fault == "cut" else (SLOW, SLOW_OUTAGE_S)
        with Stack(nodes=4, fleets=1, nodes_per_leaf=4, extra_env=timings, portal_pg=portal_pg) as stack:
            stack.wait_ready(timeout=120)
            jobs = [_post_job(stack, f"steady-{i}") for i in range(4)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                running = stack.sql("SELECT count(*) FROM scheduling_job WHERE state = 'RUNNING'")[0][0]
                if running == len(jobs):
                    break
                time.sleep(0.5)
            assert running == len(jobs), stack.sql("SELECT id, state, pending_reason FROM scheduling_job")
            pids = _workload_pids(stack)
            assert len(pids) == len(jobs)

            if fault == "cut":
                proxy.cut()
            elif fault == "slow":
                proxy.delay_s = 1.0
            else:
                proxy.hang()
            cut_at = time.monotonic()
            time.sleep(5)
            if fault == "cut":
                status, headers, body = _get(stack.url + "/healthz")
                assert (status, body.get("code")) == (503, "unavailable"), (status, body)
                assert headers.get("Retry-After")
                status, headers, body = _get(stack.url + "/api/v1/jobs", stack.token)
                assert status == 503 and body.get("code") == "unavailable" and headers.get("Retry-After"), (status, body)
            time.sleep(max(0.0, outage_s - (time.monotonic() - cut_at)))
            proxy.delay_s = 0.0
            proxy.restore()
            outage = time.monotonic() - cut_at

            # A few heartbeat intervals and liveness checks with the database back: at least 12 s, and
            # until the checker has run since (it records the outage as a blind spell); a loaded
            # machine's worker and beat may take longer to find the database again.
            back_at = time.monotonic()
            while time.monotonic() - back_at < 12 or (
                not stack.sql("SELECT 1 FROM scheduling_blindspell LIMIT 1") and time.monotonic() - back_at < 90
            ):
                time.sleep(0.5)
            states = dict(stack.sql("SELECT state, count(*) FROM scheduling_node GROUP BY 1"))
            lost = stack.lost()
            kept = sum(1 for pid in pids.values() if _alive(pid))
            stopped = stack.fleet_stats()["tasks_stopped_for_portal_loss"]
            beats = stack.fleet_stats()["calls"].get("heartbeat", {})
            blind, timed_out = beats.get("blind", 0), beats.get("unreachable", 0)
            spells = stack.sql("SELECT cause FROM scheduling_blindspell")
            down_s = float(timings["YARD_NODE_DOWN_S"])
            print(
                f"database {FAULTS[fault]} {outage:.0f} s ({outage / down_s:.1f} x node-down): nodes {states}; "
                f"{lost['lost']} jobs lost, {lost['requeued']} requeued; {kept}/{len(pids)} workloads kept their pids; "
                f"{blind} heartbeats answered 'unavailable', {timed_out} timed out; {stopped} tasks stopped by agents; "
                f"blind spells {spells}"
            )
            assert states == {"READY": 4}
            assert (lost["lost"], lost["requeued"], lost["nodes_down"]) == (0, 0, 0)
            assert kept == len(pids) and stopped == 0
            assert blind > 0 and spells
            attempts = {a for (a,) in stack.sql("SELECT attempt FROM scheduling_job")}
            assert attempts == {1}
