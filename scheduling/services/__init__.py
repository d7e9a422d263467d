"""Writes to jobs and the cluster. Keyword-only, atomic, conditional state changes, audited.

One module per concern (this package is what the rest of Yardmaster imports):

- common.py    — the state transition, the stop reasons and limits, event notes, the cycle request;
- submit.py    — a job's spec, the checks a submission passes, admission and preview, creation;
- lifecycle.py — stop, cancel, requeue; the agents' task reports; how a gang's last rank settles it;
- arrays.py    — job arrays: N tasks submitted in one checked, bulk write; cancelling them all;
- nodes.py     — a node lost (its gangs requeued once, whole); drain and resume.

Everything from "submit" on is the contract of docs: services-contract (submit, cancel, stop,
requeue, task reports, node loss). Each change is conditional (a second caller finds nothing to do)
and leaves a JobEvent; user actions and scheduler decisions leave an AuditEntry too.
"""

from scheduling.services.arrays import (
    ArraySubmitted,
    array_spec_parse,
    job_array_cancel,
    job_array_submit,
    job_array_throttle,
    job_arrays_hold_reasons,
    max_array_size,
)
from scheduling.services.common import (
    MAX_GPUS_PER_REPLICA,
    MAX_REPLICAS,
    MAX_TIME_LIMIT_S,
    NODE_LOST_GRACE_S,
    STOP_REASONS,
    IdempotencyConflict,
    StaleState,
    cycle_request,
    job_transition,
)
from scheduling.services.lifecycle import (
    StartReport,
    job_cancel,
    job_request_stop,
    job_requeue,
    task_mark_exited,
    task_mark_running,
    tasks_mark_started,
)
from scheduling.services.nodes import DRAIN_REASON_MAX, node_hold, node_mark_lost, node_resume
from scheduling.services.submit import (
    NEVER_RUNS,
    QUEUED,
    JobSpec,
    job_preview,
    job_spec_of,
    job_submit,
    resources_of,
    service_replica_check,
    with_default_resources,
)

__all__ = [
    "DRAIN_REASON_MAX",
    "MAX_GPUS_PER_REPLICA",
    "MAX_REPLICAS",
    "MAX_TIME_LIMIT_S",
    "NEVER_RUNS",
    "NODE_LOST_GRACE_S",
    "QUEUED",
    "STOP_REASONS",
    "ArraySubmitted",
    "IdempotencyConflict",
    "JobSpec",
    "StaleState",
    "StartReport",
    "array_spec_parse",
    "cycle_request",
    "job_array_cancel",
    "job_array_submit",
    "job_array_throttle",
    "job_arrays_hold_reasons",
    "job_cancel",
    "job_preview",
    "job_request_stop",
    "job_requeue",
    "job_spec_of",
    "job_submit",
    "job_transition",
    "max_array_size",
    "node_hold",
    "node_mark_lost",
    "node_resume",
    "resources_of",
    "service_replica_check",
    "task_mark_exited",
    "task_mark_running",
    "tasks_mark_started",
    "with_default_resources",
]
