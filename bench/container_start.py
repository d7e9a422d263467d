"""Placement to first rank running: a host process, a container with a cold image cache, a warm one.

    python bench/container_start.py            # 7 host and 7 warm starts, 3 cold ones per image size
    python bench/container_start.py --runs 15

The parts: the bench stack (bench/stack.py: gunicorn, a Celery worker and beat, PostgreSQL, Redis), one
real node agent (`python -m nodeagent`, 8 simulated GPUs, runc containers) and Debian's
docker-registry on loopback with busybox-static images built by umoci and pushed by skopeo
(bench/oci.py). Each job is submitted through the REST API with the bench's CI token; the cycle places
it (Task.created_at) and the agent reports its rank started (Task.started_at, when its process ran):
the figure is the difference. Both runs of a pair wait for the same heartbeat (0.5 s interval here),
so a container's cost is its median less the host's. Cold: an image the node has never pulled (each
run pushes a new one: busybox alone, ~1 MB, and with a 200 MB layer); warm: one it has (the agent still
asks the registry for the manifest, as every launch does).

Needs root, runc, skopeo, umoci, docker-registry and busybox-static; without them it says which and
measures nothing. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result
from bench.oci import build_image, missing, start_registry
from bench.stack import ENROLMENT, PY, ROOT, Stack

HEARTBEAT_S = 0.5


def _call(stack: Stack, method: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
    request = urllib.request.Request(
        stack.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")  # type: ignore[no-any-return]


def start_latency(stack: Stack, image: str = "") -> float:
    """Seconds from the placement of a one-GPU job (its task row) to its rank running; then cancel it."""
    body: dict[str, object] = {"name": "start", "team": "bench", "replicas": 1, "gpus_per_replica": 1, "gpu_type": "H100",
                               "command": "sleep 600", "time_limit_s": 3600}  # fmt: skip
    if image:
        body["image"] = image
    job = int(_call(stack, "POST", "/api/v1/jobs", body)["id"])
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            rows = stack.sql(
                "SELECT extract(epoch FROM t.started_at - t.created_at), j.state, j.stop_message FROM scheduling_task t "
                "JOIN scheduling_job j ON j.id = t.job_id WHERE t.job_id = %s",
                (job,),
            )
            if rows and rows[0][0] is not None:
                return float(rows[0][0])
            if rows and rows[0][1] in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"job {job} {rows[0][1]}: {rows[0][2]}")
            time.sleep(0.05)
        raise RuntimeError(f"job {job} did not start in 300 s")
    finally:
        _call(stack, "POST", f"/api/v1/jobs/{job}/cancel", {})
        _wait_idle(stack)


def _wait_idle(stack: Stack) -> None:
    """Until no task holds a GPU (the cancelled rank is gone), so each start finds the node as the last."""
    deadline = time.monotonic() + 60
    while stack.sql("SELECT count(*) FROM scheduling_task WHERE state IN ('ASSIGNED', 'RUNNING', 'STOPPING')")[0][0]:
        if time.monotonic() > deadline:
            raise RuntimeError("a cancelled task did not end in 60 s")
        time.sleep(0.1)


def _line(label: str, values: list[float], base: float | None = None) -> str:
    med = statistics.median(values)
    extra = f"; {med - base:+.2f} s over the host's median" if base is not None else ""
    return f"{label:<34} n={len(values):<3} median {med:.2f} s, min {min(values):.2f}, max {max(values):.2f}{extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="host and warm starts (alternating)")
    parser.add_argument("--cold", type=int, default=3, help="cold starts per image size")
    args = parser.parse_args()
    reason = missing()
    if reason:
        print(f"container_start: not measured: {reason}")
        return

    work = Path(tempfile.mkdtemp(prefix="yard-ctbench-"))
    registry = start_registry(work / "registry")
    env = {"YARD_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S), "YARD_CYCLE_INTERVAL_S": "1"}
    try:
        with Stack(nodes=1, agents=False, extra_env=env) as stack:
            agent = stack.start(
                "agent",
                [PY, "-m", "nodeagent", "--portal", stack.url, "--token", ENROLMENT, "--simulate", "8xH100",
                 "--name", "ct-bench", "--address", "127.0.0.1", "--state-dir", str(stack.tmp / "agent")],
            )  # fmt: skip
            stack.wait_ready(timeout=120)
            warm_ref = registry.ref("busybox", "warm")
            build_image(work / "img-warm", warm_ref, env={}, cmd=["/bin/sh"])
            first = start_latency(stack, warm_ref)  # the pull that warms the cache (a cold start too)
            host, warm = [], []
            for _ in range(args.runs):
                host.append(start_latency(stack))
                warm.append(start_latency(stack, warm_ref))
            cold: dict[int, list[float]] = {0: [first], 200: []}
            for pad in cold:
                while len(cold[pad]) < args.cold:
                    ref = registry.ref(f"cold-{pad}", str(len(cold[pad])))
                    build_image(work / f"img-{pad}-{len(cold[pad])}", ref, env={"RUN": ref}, cmd=["/bin/sh"], pad_mb=pad)
                    cold[pad].append(start_latency(stack, ref))
            pulls = [line for line in (stack.tmp / "agent.log").read_text().splitlines() if "pulled in" in line]
            agent.terminate()
            base = statistics.median(host)
            print(f"stack: gunicorn 2x4, Celery worker + beat, PostgreSQL, Redis; one agent (8 simulated GPUs, runc "
                  f"{subprocess.run(['runc', '--version'], capture_output=True, text=True).stdout.split()[2]}); "
                  f"heartbeat {HEARTBEAT_S} s; placement -> first rank running (Task.started_at - created_at)")  # fmt: skip
            print(_line("host process", host))
            print(_line("container, warm cache", warm, base))
            print(_line("container, cold cache (~1 MB)", cold[0], base))
            print(_line("container, cold cache (+200 MB)", cold[200], base))
            print(f"agent's pull lines: {len(pulls)}; last: {pulls[-1].split(': ', 1)[-1] if pulls else '-'}")
            over = "REST + Celery + one agent over HTTP, runc, local registry: placement to first rank running"
            result("container.host_start_s", base, "s", over=over)
            result("container.warm_extra_s", statistics.median(warm) - base, "s", over=over + ", over a host process")
            result("container.cold_extra_s", statistics.median(cold[0]) - base, "s", over=over + ", ~1 MB image")
            target = statistics.median(warm) - base < 1.0
            print(f"verdict: a warm start adds {statistics.median(warm) - base:.2f} s over a host process: "
                  f"{'under' if target else 'NOT under'} the 1 s target")  # fmt: skip
    finally:
        registry.process.terminate()
        registry.process.wait(timeout=10)
        subprocess.run(["rm", "-rf", str(work)], check=False, cwd=ROOT)


if __name__ == "__main__":
    main()
