"""Writes on behalf of node agents: registration, heartbeats (liveness, telemetry, task facts),
task status and logs, drain. Keyword-only and atomic, as every service.

- reports.py      — what agents send, as the services take it (times in the portal's clock), and the errors;
- registration.py — a node's registration: its place in the topology, its GPUs, its token;
- heartbeat.py    — the hottest path: liveness, the node's state, task starts and facts, telemetry, `desired`;
- live_tasks.py   — a node's live tasks as the heartbeat reads them: one statement compiled once, fast rows;
- desired.py      — each entry of `desired`: a live task, its job and its gang as the agent's task spec;
- status.py       — task status and log reports, an agent's own drain.

Job and task state changes are not made here: status reports go through the scheduling services
(task_mark_running, task_mark_exited) so that the rules for settling a gang live in one place.
"""

from scheduling.agent.services.desired import gang_nodes, task_spec
from scheduling.agent.services.heartbeat import (
    DISK_FULL,
    XID_MEANING,
    node_heartbeat,
    node_heartbeat_by_token,
)
from scheduling.agent.services.live_tasks import live_tasks_of, live_tasks_queryset
from scheduling.agent.services.registration import node_register
from scheduling.agent.services.reports import (
    SKEW_CORRECTED_S,
    SKEW_SHOWN_S,
    DevReport,
    GpuInfo,
    GpuSample,
    GpuWindowReport,
    Heartbeat,
    HeartbeatResult,
    NodeExists,
    NotebookReport,
    Registration,
    ServiceReport,
    StaleAttempt,
    StatusReport,
    TaskNotFound,
    TaskReport,
    clock_offset,
    epoch,
    heartbeat_from,
    status_from,
)
from scheduling.agent.services.status import node_drain, task_log_append, task_report_status

__all__ = [
    "DISK_FULL",
    "SKEW_CORRECTED_S",
    "SKEW_SHOWN_S",
    "XID_MEANING",
    "DevReport",
    "GpuInfo",
    "GpuSample",
    "GpuWindowReport",
    "Heartbeat",
    "HeartbeatResult",
    "NodeExists",
    "NotebookReport",
    "Registration",
    "ServiceReport",
    "StaleAttempt",
    "StatusReport",
    "TaskNotFound",
    "TaskReport",
    "clock_offset",
    "epoch",
    "gang_nodes",
    "heartbeat_from",
    "live_tasks_of",
    "live_tasks_queryset",
    "node_drain",
    "node_heartbeat",
    "node_heartbeat_by_token",
    "node_register",
    "status_from",
    "task_log_append",
    "task_report_status",
    "task_spec",
]
