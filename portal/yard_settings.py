"""The YARD setting: the scheduler's, the agents' and governance's tunables, and the liveness check.

Apart from portal/settings.py because it is the one setting with arithmetic of its own: its node
liveness timings must leave a silent node's work gone before the node is declared DOWN, and a bad
combination stops the portal as it starts. settings.py calls ``yard_settings`` where it always built
the dict, so every variable is read, and fails, in the same order as before; the sign-in, token and
enrolment keys are added there beside the middleware they tune.
"""

from __future__ import annotations

from pathlib import Path

from portal.env import ImproperlyConfiguredEnv, env_bool, env_float, env_int, env_int_set, env_list, env_port_range, env_str


def yard_settings(var_dir: Path) -> dict[str, object]:
    """YARD from the environment (``var_dir``: where checkpoints go by default), checked (``check_liveness``)."""
    yard: dict[str, object] = {
        # scheduling cycle
        "CYCLE_INTERVAL_S": env_float("YARD_CYCLE_INTERVAL_S", 5.0, minimum=0.5),
        # A holder renews its lease at every write; a crashed holder's PostgreSQL session lock frees the cycle
        # at once, and where there is none (SQLite) the lease's expiry does within this many seconds.
        "CYCLE_LEASE_S": env_float("YARD_CYCLE_LEASE_S", 8.0, minimum=2.0),
        "HALF_LIFE_S": env_float("YARD_HALF_LIFE_DAYS", 7.0, minimum=0.01) * 86400,
        "GRACE_PERIOD_S": env_float("YARD_GRACE_PERIOD_S", 60.0, minimum=0),
        "MIN_RUNTIME_S": env_float("YARD_MIN_RUNTIME_S", 600.0, minimum=0),
        # How much longer a gang runs when it spans leaf switches (0.25: 25 % more wall time), what an "auto"
        # gang's wait for one leaf is weighed against (docs/scheduler-core.md, "Leaf locality by cost").
        # Measure it on your fabric; "inf" makes every gang that one leaf could hold wait for one.
        "SPAN_SLOWDOWN": env_float("YARD_SPAN_SLOWDOWN", 0.25, minimum=0),
        "DEFAULT_TIME_LIMIT_S": env_int("YARD_DEFAULT_TIME_LIMIT_S", 24 * 3600, minimum=60),
        # Job arrays (--array): indices run from 0 to this less one, so an array has at most this many tasks
        # (Slurm's MaxArraySize). Each task is a job of its own in the queue and in every cycle's snapshot.
        "MAX_ARRAY_SIZE": env_int("YARD_MAX_ARRAY_SIZE", 10_000, minimum=1),
        # CPU cores and memory beside GPUs. A job that does not say gets these per GPU of a replica (Slurm's
        # DefCpuPerGPU / DefMemPerGPU): under every usual node's share, so such jobs place as by GPUs alone.
        # Each node keeps a system reserve for the OS and the agent (Slurm's CoreSpecCount / MemSpecLimit,
        # Kubernetes' system-reserved): jobs are given what the agent reports less this.
        "DEFAULT_CPUS_PER_GPU": env_int("YARD_DEFAULT_CPUS_PER_GPU", 8, minimum=1),
        "DEFAULT_MEMORY_MB_PER_GPU": env_int("YARD_DEFAULT_MEMORY_MB_PER_GPU", 64 * 1024, minimum=1),
        "SYSTEM_RESERVE_CPUS": env_int("YARD_SYSTEM_RESERVE_CPUS", 2, minimum=0),
        "SYSTEM_RESERVE_MEMORY_MB": env_int("YARD_SYSTEM_RESERVE_MEMORY_MB", 8 * 1024, minimum=0),
        # Inference services (docs/services.md): the controller's beat; how long a replica is out of the
        # proxy's rotation before it is stopped (the proxy's route cache plus the longest usual request);
        # the proxy's measuring window (requests/s, p50/p99, in-flight for the autoscaler).
        "SERVICE_TICK_S": env_float("YARD_SERVICE_TICK_S", 2.0, minimum=0.2),
        "SERVICE_DRAIN_S": env_float("YARD_SERVICE_DRAIN_S", 5.0, minimum=0),
        "SERVICE_WINDOW_S": env_float("YARD_SERVICE_WINDOW_S", 5.0, minimum=0.5),
        # Dev sessions (docs/dev-sessions.md): what their sshd allows beyond a shell, scp/sftp and rsync.
        "DEV_ALLOW_AGENT_FORWARDING": env_bool("YARD_DEV_ALLOW_AGENT_FORWARDING", False),
        "DEV_ALLOW_TCP_FORWARDING": env_bool("YARD_DEV_ALLOW_TCP_FORWARDING", False),
        "DEV_ALLOW_X11_FORWARDING": env_bool("YARD_DEV_ALLOW_X11_FORWARDING", False),
        # node liveness (relations asserted in tests: stop-after + grace < DOWN)
        "HEARTBEAT_INTERVAL_S": env_float("YARD_HEARTBEAT_INTERVAL_S", 10.0, minimum=0.2),
        # The most an agent's call waits on the database in all before it answers 503 "unavailable" (0:
        # derived from the agents' limits, portal/middleware.py agent_budget_s).
        "AGENT_DB_BUDGET_S": env_float("YARD_AGENT_DB_BUDGET_S", 0.0, minimum=0),
        "NODE_NOT_READY_S": env_float("YARD_NODE_NOT_READY_S", 50.0, minimum=1),
        "NODE_DOWN_S": env_float("YARD_NODE_DOWN_S", 300.0, minimum=2),
        "AGENT_STOP_AFTER_S": env_float("YARD_AGENT_STOP_AFTER_S", 120.0, minimum=1),
        # A workload whose agent is gone (killed, hung) is stopped by its node's watchdog once the agent has
        # not renewed its lease for this long; an agent restarted sooner adopts its workloads.
        "AGENT_FENCE_AFTER_S": env_float("YARD_AGENT_FENCE_AFTER_S", 60.0, minimum=1),
        # The most grace an agent (or its watchdog) gives work it stops on its own account.
        "AGENT_MAX_GRACE_S": env_float("YARD_AGENT_MAX_GRACE_S", 60.0, minimum=0),
        # Node liveness checks: their period, and the gap after which the checker counts its own absence
        # (database, broker or workers down) as time it could not observe.
        "LIVENESS_TICK_S": env_float("YARD_LIVENESS_TICK_S", 10.0, minimum=0.2),
        "LIVENESS_BLIND_GAP_S": env_float("YARD_LIVENESS_BLIND_GAP_S", 30.0, minimum=0.5),
        # Disruption guard (Kubernetes' unhealthy-zone-threshold): when at least this share of a leaf's or of
        # the cluster's nodes, and at least DISRUPTION_MIN_NODES of them, are silent at once, no node is marked lost.
        "DISRUPTION_SHARE": env_float("YARD_DISRUPTION_SHARE", 0.5, minimum=0.01),
        "DISRUPTION_MIN_NODES": env_int("YARD_DISRUPTION_MIN_NODES", 3, minimum=1),
        # Each job's rendezvous port (MASTER_PORT) on its rank-0 node comes from this range.
        "RENDEZVOUS_PORTS": env_port_range("YARD_RENDEZVOUS_PORTS", (29500, 29999)),
        "AGENT_ENROLMENT_TOKEN": env_str("YARD_AGENT_ENROLMENT_TOKEN", ""),
        # XID errors that drain a node (no new work; running work finishes) until an admin resumes it:
        # those after which NVIDIA's XID catalogue calls for a GPU reset, a reboot or a field check
        # (double-bit/uncontained/unrecovered ECC, row remapping, micro-controller halt, NVLink, fallen
        # off the bus, GSP). Application faults (13, 31, 43, 45) are the workload's, not the node's.
        "XID_DRAIN_CODES": env_int_set("YARD_XID_DRAIN_CODES", frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})),
        # storage and governance
        "CHECKPOINT_ROOT": env_str("YARD_CHECKPOINT_ROOT", str(var_dir / "checkpoints")),
        "IDLE_NOTEBOOK_TIMEOUT_S": env_float("YARD_IDLE_NOTEBOOK_TIMEOUT_MIN", 45.0, minimum=0.1) * 60,
        # GPU telemetry is folded by the agents into windows of this many seconds (GpuWindow rows): the grain
        # of idleness for the reaper and of utilisation in reports. Set it once per deployment.
        "TELEMETRY_WINDOW_S": env_int("YARD_TELEMETRY_WINDOW_S", 60, minimum=1),
        "REAPER_INTERVAL_S": env_float("YARD_REAPER_INTERVAL_S", 60.0, minimum=0.5),
        # GpuWindow rows older than this are deleted hourly (scheduling/governance/retention.py); 62 days keep
        # this month's and last month's reports whole. GPU-hours (allocations) are never deleted.
        "TELEMETRY_KEEP_DAYS": env_int("YARD_TELEMETRY_KEEP_DAYS", 62, minimum=1),
        # Container images (docs/containers.md): the registries a job's image may come from, host[:port]
        # ("nvcr.io,registry.corp:5000"; a bare host allows its every port); empty: any registry.
        "REGISTRY_ALLOW": tuple(env_list("YARD_REGISTRY_ALLOW", [])),
    }
    check_liveness(yard)
    return yard


def check_liveness(yard: dict[str, object]) -> None:
    """Refuse node timings under which two attempts of one job could run at once.

    The liveness arithmetic (docs/agent-api.md): a node's work must be gone, whether its agent stopped it
    (portal lost) or its watchdog did (agent gone), before the portal declares the node DOWN and starts the
    next attempt elsewhere. Checked here so that a deployment cannot configure two attempts at once.
    """
    y: dict[str, float] = {k: float(v) for k, v in yard.items() if isinstance(v, int | float)}
    stop_bound = max(y["AGENT_STOP_AFTER_S"], y["AGENT_FENCE_AFTER_S"]) + y["AGENT_MAX_GRACE_S"]
    margin = 2 * y["HEARTBEAT_INTERVAL_S"] + y["LIVENESS_TICK_S"] + 5
    if y["NODE_DOWN_S"] <= stop_bound + margin:
        raise ImproperlyConfiguredEnv(
            f"YARD_NODE_DOWN_S={y['NODE_DOWN_S']:.0f} is too short: a silent node's work may run for up to "
            f"{stop_bound:.0f} s (max of YARD_AGENT_STOP_AFTER_S and YARD_AGENT_FENCE_AFTER_S, plus YARD_AGENT_MAX_GRACE_S) "
            f"and the margin is {margin:.0f} s; raise YARD_NODE_DOWN_S above {stop_bound + margin:.0f} or shorten those"
        )
    if y["NODE_NOT_READY_S"] >= y["NODE_DOWN_S"]:
        raise ImproperlyConfiguredEnv("YARD_NODE_NOT_READY_S must be shorter than YARD_NODE_DOWN_S")
