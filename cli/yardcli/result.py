"""What `yard submit --wait` (and `yard wait`) exits with: the job's result as a process status.

  0     the job completed (every rank exited 0)
  1-255 the job failed: the exit code of the rank that failed first (128 + N if it died of signal N)
  1     also: the API refused the request or could not be reached (the message says which)
  2     a usage error (a bad option)
  120   the job failed and no rank reported an exit code (see `yard show`)
  121   the job can never run here (the admission check refused it at submit)
  122   the job was preempted and had not resumed when the wait ended (--exit-on-preempt, --wait-timeout)
  123   the job was cancelled (by someone, or an idle notebook by the reaper)
  124   the job reached its time limit, as GNU timeout's 124
  125   --wait-timeout passed while the job was still pending or running (not preempted)

A failing rank's own exit code may collide with 120-125; `--json` prints the job, which tells them apart.
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_FAILED_NO_CODE = 120
EXIT_NEVER_RUNNABLE = 121
EXIT_PREEMPTED = 122
EXIT_CANCELLED = 123
EXIT_TIMED_OUT = 124
EXIT_WAIT_TIMEOUT = 125

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}


def failing_rank(job: dict[str, Any]) -> dict[str, Any] | None:
    """The rank that failed on its own (not one Yardmaster stopped after it), the earliest to end."""
    failed = [
        t
        for t in job.get("tasks", [])
        if not t.get("stopped_by") and ((t.get("exit_code") not in (0, None)) or t.get("signal") is not None)
    ]
    if not failed:
        failed = [t for t in job.get("tasks", []) if (t.get("exit_code") not in (0, None)) or t.get("signal") is not None]
    return min(failed, key=lambda t: (t.get("ended_at") or "", t.get("rank", 0))) if failed else None


def exit_status(job: dict[str, Any]) -> int:
    """The process status for a job in a terminal state."""
    state = job.get("state")
    if state == "COMPLETED":
        return EXIT_OK
    if state == "CANCELLED":
        return EXIT_CANCELLED
    if state == "FAILED" and job.get("stop_reason") == "TIME_LIMIT":
        return EXIT_TIMED_OUT
    rank = failing_rank(job)
    if rank is not None:
        code = rank.get("exit_code")
        if isinstance(code, int) and 0 < code < 256:
            return code
        if rank.get("signal") is not None:
            return min(128 + int(rank["signal"]), 255)
    code = job.get("exit_code")
    if isinstance(code, int) and 0 < code < 256:
        return code
    return EXIT_FAILED_NO_CODE


def was_preempted(job: dict[str, Any]) -> bool:
    """Preempted in this wait's view: being preempted now, or requeued after a preemption and not running again."""
    if job.get("state") == "PREEMPTING":
        return True
    if job.get("state") != "PENDING":
        return False
    events = job.get("events", [])
    return any(e.get("to_state") == "PREEMPTED" and e.get("attempt") == job.get("attempt", 1) - 1 for e in events)


def describe(job: dict[str, Any]) -> str:
    """One line for the end of a wait."""
    state = job.get("state")
    if state == "COMPLETED":
        return f"job {job['id']} completed"
    if state == "CANCELLED":
        return f"job {job['id']} was cancelled"
    if state == "FAILED" and job.get("stop_reason") == "TIME_LIMIT":
        return f"job {job['id']} reached its time limit of {job.get('time_limit_s')} s"
    if state == "FAILED" and job.get("stop_reason") == "IMAGE_PULL":
        return f"job {job['id']} failed: its image could not be pulled ({job.get('stop_message') or job.get('image')})"
    rank = failing_rank(job)
    if rank is not None:
        how = f"exit {rank.get('exit_code')}" if rank.get("signal") is None else f"signal {rank.get('signal')}"
        return f"job {job['id']} failed: rank {rank.get('rank')} on {rank.get('node')} ({how})"
    return f"job {job['id']} failed (exit {job.get('exit_code')})"
