"""What one heartbeat costs the web process: its CPU time and its SQL statements, in one process.

    python bench/heartbeat_cpu.py                 # 1,000 nodes (8 GPUs, 8 running tasks each), 300 beats of each kind
    python bench/heartbeat_cpu.py --beats 100     # fewer beats (the state is the same)
    python bench/heartbeat_cpu.py --profile       # and cProfile's top functions for the beats with samples

The whole request path as gunicorn runs it, minus the socket: Django's WSGI application called with a
WSGI environ as gunicorn's worker calls it (the request signals, the connection's reuse and its health
check, every middleware; Django's test client would add its own per-request signal wiring and leave the
health check out), the agent API's view (body parsing and validation, the token's lookup, the liveness update),
the heartbeat service and its writes, the JSON answer; on PostgreSQL (a throwaway database) at the state
of a full fleet: 1,000 READY nodes of 8 H100s, 8 one-GPU tasks RUNNING on each. The figure is the
beat's own CPU (`time.process_time` around each request), which the machine's load moves far less than
wall time; PostgreSQL's backend CPU is shown beside it (its /proc counters over all the beats of a kind,
so only as an average). Three kinds of beat, interleaved and each on a node of its own:

    steady   the 8 tasks' reports, no telemetry (what an agent sends most of the time)
    samples  and the latest readings of its 8 GPUs (a GPU went busy or idle)
    minute   and the 8 GPUs' windows of the minute that just closed (what an agent sends once a minute)

Statements per beat are counted on a beat of each kind outside the timed ones. bench/heartbeat.py
measures the same path through gunicorn under a fleet's load. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result, use_code

CODE = use_code()
PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")
KINDS = ("steady", "samples", "minute")
OVER = "in-process: Django's WSGI application as gunicorn calls it, whole request path, PostgreSQL, 1,000 nodes x 8 GPUs x 8 running tasks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--beats", type=int, default=300, help="timed beats of each kind")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--keep-db", help="use (and keep) this database; built the first time (one checkout's code only)")
    args = parser.parse_args()
    import psycopg

    name = args.keep_db or f"yard_bench_hb_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        args.fresh = not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if args.fresh:
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(
        DATABASE_URL=f"{PG}/{name}",
        REDIS_URL=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/11"),
        YARD_VAR_DIR=str(Path("/tmp") / f"{name}-var"),
        SECRET_KEY="bench-only-secret-key-0123456789abcdef0123456789abcdef",
        ALLOWED_HOSTS="testserver",
        LOG_LEVEL="WARNING",
        DEBUG="0",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    import django

    django.setup()
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def wsgi_environ(data: bytes, token: str) -> dict[str, object]:
    """A heartbeat's WSGI environ, as gunicorn's worker builds it from the agent's request."""
    import io

    return {
        "REQUEST_METHOD": "POST", "SCRIPT_NAME": "", "PATH_INFO": "/api/agent/v1/heartbeat", "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(data)), "HTTP_HOST": "testserver",
        "HTTP_AUTHORIZATION": f"Bearer {token}", "HTTP_USER_AGENT": "yard-agent", "REMOTE_ADDR": "127.0.0.1",
        "SERVER_NAME": "testserver", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(data), "wsgi.errors": sys.stderr,
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }  # fmt: skip


def build(nodes: int) -> dict[str, tuple[str, list[int]]]:
    """The fleet's state: READY nodes with tokens, a one-GPU job RUNNING on each GPU. {node: (token, task ids)}."""
    import secrets
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.models import Allocation, Gpu, Job, Node, NodeState, Task
    from scheduling.states import JobState, TaskState
    from tenants.models import OrgUnit, UnitKind, hash_token
    from tenants.services import unit_create
    from tests.factories import build_cluster, make_user

    built = build_cluster(spines=max(1, nodes // 128), leaves_per_spine=4, layout=(("H100", nodes),), state=NodeState.READY)
    root = unit_create(actor=None, name="Cluster", kind=UnitKind.ROOT, parent=None)
    bu = unit_create(actor=None, name="Research", kind=UnitKind.BUSINESS_UNIT, parent=root)
    team: OrgUnit = unit_create(actor=None, name="bench", kind=UnitKind.TEAM, parent=bu)
    user = make_user("bencher", unit=team)
    now = timezone.now()
    started = now - timedelta(minutes=30)
    tokens: dict[str, str] = {}
    for node in built:
        tokens[node.name] = "ynd_" + secrets.token_urlsafe(30)
        Node.objects.filter(pk=node.pk).update(token_hash=hash_token(tokens[node.name]), last_heartbeat=now)
    jobs = Job.objects.bulk_create(
        Job(name="steady", team=team, user=user, gpu_type="H100", command="sleep 1d", state=JobState.RUNNING,
            started_at=started, state_changed_at=started, time_limit_s=86400 * 3)
        for _ in range(nodes * 8)
    )  # fmt: skip
    gpus = list(Gpu.objects.order_by("node_id", "index").values_list("id", "node_id", "index"))
    tasks = Task.objects.bulk_create(
        Task(job=job, attempt=1, rank=0, node_id=node_id, state=TaskState.RUNNING, master_addr=f"10.{node_id // 256}.{node_id % 256}.1",
             master_port=29500 + index, gpu_indices=[index], started_at=started, pid=10000 + i)
        for i, (job, (gpu_id, node_id, index)) in enumerate(zip(jobs, gpus, strict=True))
    )  # fmt: skip
    Allocation.objects.bulk_create(
        Allocation(gpu_id=gpu_id, task=task, job=task.job, attempt=1, allocated_at=started)
        for task, (gpu_id, _, _) in zip(tasks, gpus, strict=True)
    )
    by_node: dict[str, list[int]] = {}
    for task_id, node_name in Task.objects.values_list("id", "node__name"):
        by_node.setdefault(node_name, []).append(task_id)
    return {name: (token, sorted(by_node.get(name, []))) for name, token in tokens.items()}


def body(kind: str, tasks: list[int], *, beat: int, started_at: float) -> str:
    """What the agent sends (nodeagent/heartbeat.py): its tasks' reports, and for a telemetry beat its GPUs' latest
    readings and closed minutes (one GPU of the eight with a failed reading: nulls)."""
    reports = [
        {"task_id": t, "attempt": 1, "state": "running", "pid": 10_000 + t, "started_at": started_at,
         "checkpoint_time": None, "notebook": None}
        for t in tasks
    ]  # fmt: skip
    data: dict[str, object] = {"tasks": reports, "draining_reason": None, "gpus": [], "windows": []}
    if kind in ("samples", "minute"):
        data["gpus"] = [
            {"index": i, "utilization_pct": None if i == 7 else float((beat * 7 + i * 13) % 100),
             "memory_used_mb": 1000.0 + beat % 50 + i, "temperature_c": 40.0 + i, "power_w": 300.5 + i, "xid_errors": []}
            for i in range(8)
        ]  # fmt: skip
    if kind == "minute":
        minute = 60.0 * (int(started_at) // 60 + 1 + beat)
        data["windows"] = [
            {"index": i, "start": minute, "samples": 6, "utilization_sum": 6.0 * (beat % 100), "utilization_max": float(beat % 100),
             "memory_used_max_mb": 2000.0 + i}
            for i in range(8)
        ]  # fmt: skip
    return json.dumps(data, separators=(",", ":"))


def backend_cpu(pid: int) -> float:
    """A PostgreSQL backend's CPU seconds so far (utime + stime), from /proc; on this machine only."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run(args: argparse.Namespace) -> None:
    import cProfile
    import io
    import pstats

    from django.core.handlers.wsgi import WSGIHandler
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    began = time.monotonic()
    kept = Path(os.environ["YARD_VAR_DIR"]) / "fleet.json"
    if args.fresh:
        call_command("migrate", verbosity=0)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(build(args.nodes)))
    fleet: dict[str, tuple[str, list[int]]] = json.loads(kept.read_text())
    names = sorted(fleet)
    print(f"code: {CODE}")
    print(f"state: {len(names)} READY nodes x 8 H100, {sum(len(t) for _, t in fleet.values())} one-GPU tasks RUNNING "
          f"(built in {time.monotonic() - began:.0f} s)")  # fmt: skip
    app = WSGIHandler()
    started_at = time.time() - 1800

    def beat(kind: str, i: int, at: int) -> float:
        token, tasks = fleet[names[at % len(names)]]
        data = body(kind, tasks, beat=i, started_at=started_at).encode()
        environ = wsgi_environ(data, token)
        status: list[str] = []
        cpu = time.process_time()
        answer = app(environ, lambda code, headers, exc_info=None: status.append(code))
        content = b"".join(answer)
        answer.close()  # request_finished: the connection is kept or closed here, as under gunicorn
        cpu = time.process_time() - cpu
        if not status[0].startswith("200"):
            raise SystemExit(f"heartbeat answered {status[0]}: {content[:500]!r}")
        return cpu

    # The first beat of every node starts its tasks' facts; warm beats also load imports and the compiled query.
    for at in range(len(names)):
        beat("steady", 0, at)
    cursor_pid = connection.cursor().connection.info.backend_pid
    statements: dict[str, list[str]] = {}
    for n, kind in enumerate(KINDS):
        with CaptureQueriesContext(connection) as ctx:
            beat(kind, 10_000 + n, n)
        # BEGIN and COMMIT are the transaction's, not the beat's work: a round trip each all the same.
        statements[kind] = [q["sql"] for q in ctx.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    cpu: dict[str, list[float]] = {k: [] for k in KINDS}
    pg: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    for i in range(args.beats):
        for k, kind in enumerate(KINDS):
            before = backend_cpu(cursor_pid)
            cpu[kind].append(beat(kind, i + 1, i * len(KINDS) + k))
            pg[kind] += backend_cpu(cursor_pid) - before
    print(f"{args.beats} timed beats of each kind, interleaved, each on another node (round robin over the fleet)")
    for kind in KINDS:
        ms = [1000 * c for c in cpu[kind]]
        med, p99 = statistics.median(ms), pct(ms, 99)
        print(f"{kind:8} CPU per beat: median {med:.2f} ms, p99 {p99:.2f} ms, mean {statistics.fmean(ms):.2f} ms; "
              f"{len(statements[kind])} SQL statements besides BEGIN/COMMIT; PostgreSQL backend {1000 * pg[kind] / args.beats:.2f} ms per beat (mean)")  # fmt: skip
        for sql in statements[kind]:
            print(f"    {sql[:120]}")
        result(f"heartbeat_cpu.{kind}_cpu_ms_median", med, "ms", better="lower", over=OVER)
        result(f"heartbeat_cpu.{kind}_cpu_ms_p99", p99, "ms", better="lower", over=OVER)
        result(f"heartbeat_cpu.{kind}_statements", len(statements[kind]), "stmts", better="lower", over=OVER)
        result(f"heartbeat_cpu.{kind}_pg_backend_ms_mean", 1000 * pg[kind] / args.beats, "ms", better="lower", over=OVER)
    if args.profile:
        for kind in ("steady", "minute"):
            profile = cProfile.Profile(time.process_time)  # CPU, as the figures above: waits on PostgreSQL are not in it
            profile.enable()
            for i in range(args.beats):
                beat(kind, 20_000 + i, i)
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(60)
            print(f"-- profile of {args.beats} {kind} beats (CPU)")
            print(out.getvalue())


if __name__ == "__main__":
    main()
