"""Reads of jobs and the cluster, with the tenant check built in.

One module per concern (this package is what the rest of Yardmaster imports):

- jobs.py       — which jobs a user may read or manage (``jobs_visible``, ``access_job*``), a job's tasks
  and their logs;
- usage.py      — decayed usage per team, quota usage (guaranteed, used, borrowed, reclaimable), what fair
  share divides usage by;
- quotas.py     — the quota tree as the core sees it (units named by ``unit_key``), a team's chain for the
  admission check, where a team stands in fair share;
- topology.py   — the nodes and healthy GPUs as the core's topology, cached while unchanged, and the
  cluster's capacity for admission;
- arrays.py     — which pending tasks of a job array wait for its limit on tasks running at once;
- snapshot.py   — ``snapshot_build``, the one place that turns database rows into the core's snapshot;
- invariants.py — what must never be true of the cluster's state;
- config.py     — numbers from settings.YARD and the core's ``Config``.

Views and tasks never filter jobs by tenant themselves: they call ``jobs_visible`` /
``access_job*``, so none can forget the check.
"""

from scheduling.selectors.arrays import access_array, array_limit_reason, array_state_counts, array_tasks_held
from scheduling.selectors.config import scheduler_config, yard_number
from scheduling.selectors.invariants import invariant_violations
from scheduling.selectors.jobs import (
    LOG_READ_MAX_BYTES,
    access_job,
    access_job_manage,
    can_manage_job,
    job_tasks,
    jobs_visible,
    task_log_read,
    task_log_tail,
)
from scheduling.selectors.quotas import fairshare_standing, quota_chain, quota_tree, refresh_unit_keys, unit_id_of, unit_key
from scheduling.selectors.snapshot import pending_jobs, snapshot_build
from scheduling.selectors.topology import (
    MIG_NODE_MARK,
    cluster_capacity,
    core_node_name,
    node_name_of,
    topology_cached,
)
from scheduling.selectors.usage import (
    borrowed_beyond,
    decayed_usage,
    fairshare_capacity,
    quota_usage,
    team_quota_usage,
)

__all__ = [
    "LOG_READ_MAX_BYTES",
    "MIG_NODE_MARK",
    "access_array",
    "access_job",
    "access_job_manage",
    "array_limit_reason",
    "array_state_counts",
    "array_tasks_held",
    "borrowed_beyond",
    "can_manage_job",
    "cluster_capacity",
    "core_node_name",
    "decayed_usage",
    "fairshare_capacity",
    "fairshare_standing",
    "invariant_violations",
    "job_tasks",
    "jobs_visible",
    "node_name_of",
    "pending_jobs",
    "quota_chain",
    "quota_tree",
    "quota_usage",
    "refresh_unit_keys",
    "scheduler_config",
    "snapshot_build",
    "task_log_read",
    "task_log_tail",
    "team_quota_usage",
    "topology_cached",
    "unit_id_of",
    "unit_key",
    "yard_number",
]
