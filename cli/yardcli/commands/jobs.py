"""yard wait, ls, show, logs, cancel, rerun: following and handling jobs once they are submitted."""

from __future__ import annotations

import sys
import time
from typing import Any, NoReturn

import click

from yardcli import result as r
from yardcli.client import Api
from yardcli.commands.common import (
    _api,
    _duration_s,
    _me,
    _poll_s,
    _print_json,
    _shape,
    _table,
    _when,
    api_command,
    err,
    json_option,
    out,
)

# --------------------------------------------------------------------------- waiting


def _ranks_line(job: dict[str, Any]) -> str:
    tasks = job.get("tasks", [])
    running = sum(1 for t in tasks if t.get("state") == "RUNNING")
    return f"{running}/{job['replicas']} ranks running" if tasks else ""


def _progress(job: dict[str, Any], started: float) -> str:
    state = job["state"]
    elapsed = int(time.monotonic() - started)
    parts = [f"job {job['id']} {state}", f"attempt {job.get('attempt', 1)}"]
    if state == "PENDING":
        parts.append(job.get("pending_reason") or "waiting for the scheduler")
    elif state in ("STARTING", "RUNNING", "PREEMPTING"):
        parts.append(_ranks_line(job))
        if job.get("locality"):
            parts.append(str(job["locality"]))
    parts.append(f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}")
    return " · ".join(p for p in parts if p)


def _wait(api: Api, job_id: int, *, timeout_s: int | None, exit_on_preempt: bool, as_json: bool) -> NoReturn:
    """Follow the job until it ends; exit with its result (yardcli/result.py)."""
    started = time.monotonic()
    poll = _poll_s()
    last_line = ""
    live = err.is_terminal and not as_json
    status = err.status("") if live else None
    if status is not None:
        status.start()
    try:
        while True:
            job = api.get(f"/api/v1/jobs/{job_id}")
            line = _progress(job, started)
            if status is not None:
                status.update(line)
            elif not as_json and line.rsplit(" · ", 1)[0] != last_line.rsplit(" · ", 1)[0]:
                err.print(line, markup=False, highlight=False)  # one line per change, for CI logs
            last_line = line
            if job["state"] in r.TERMINAL:
                code, text = r.exit_status(job), r.describe(job)
                break
            if exit_on_preempt and r.was_preempted(job):
                code, text = r.EXIT_PREEMPTED, f"job {job_id} was preempted (it is requeued and will resume on its own)"
                break
            if timeout_s is not None and time.monotonic() - started >= timeout_s:
                if r.was_preempted(job):
                    code, text = r.EXIT_PREEMPTED, f"job {job_id} was preempted and has not resumed yet"
                else:
                    code, text = r.EXIT_WAIT_TIMEOUT, f"stopped waiting: job {job_id} is still {job['state']}"
                break
            time.sleep(poll)
    finally:
        if status is not None:
            status.stop()
    if as_json:
        _print_json(job)
    else:
        err.print(f"{text} (exit {code})", markup=False, highlight=False)
    sys.exit(code)


@click.command()
@click.argument("job_id", type=int)
@click.option("--wait-timeout", help="Stop waiting after this long (exit 125, or 122 if preempted)")
@click.option("--exit-on-preempt", is_flag=True, help="Exit 122 as soon as the job is preempted")
@json_option
@api_command
def wait(job_id: int, wait_timeout: str | None, exit_on_preempt: bool, as_json: bool) -> None:
    """Follow a job until it ends, and exit with its result (`yard help-exit-codes`)."""
    _wait(
        _api(),
        job_id,
        timeout_s=_duration_s(wait_timeout, param="--wait-timeout"),
        exit_on_preempt=exit_on_preempt,
        as_json=as_json,
    )


# --------------------------------------------------------------------------- ls, show, logs, cancel, rerun

STATES = ("PENDING", "STARTING", "RUNNING", "PREEMPTING", "COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "LOST")


def _list(
    api: Api, path: str, *, mine: bool, team: str | None, states: tuple[str, ...], limit: int, array: int | None = None
) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"page_size": min(limit, 200)}
    if array is not None:
        params["array"] = array
    elif mine and team is None:
        params["user"] = _me(api)["username"]
    if team:
        params["team"] = team
    if states:
        params["state"] = ",".join(s.upper() for s in states)
    jobs: list[dict[str, Any]] = []
    page = api.get(path, **params)
    while True:
        jobs.extend(page["results"])
        if len(jobs) >= limit or not page.get("next"):
            return jobs[:limit]
        page = api.request("GET", page["next"]).json()


def _task_of(job: dict[str, Any]) -> str:
    """An array task as squeue names it, ARRAYID_INDEX; empty for a job of its own."""
    return f"{job['array_id']}_{job['array_index']}" if job.get("array_id") is not None else ""


def _reason(job: dict[str, Any]) -> str:
    if job["state"] == "PENDING":
        return str(job.get("pending_reason") or "")
    if job["state"] in ("FAILED",) and job.get("exit_code") is not None:
        return f"exit {job['exit_code']}"
    return str(job.get("locality") or "")


@click.command("ls")
@click.option("--team", help="Every job of this team (slug or id), not only yours")
@click.option("--state", "states", multiple=True, help="Only these states (repeatable, or comma-separated)")
@click.option("--all", "all_states", is_flag=True, help="Finished jobs too (default: pending and running only)")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--array", type=click.IntRange(1), help="The tasks of this job array, whoever submitted them")
@json_option
@api_command
def list_jobs(team: str | None, states: tuple[str, ...], all_states: bool, limit: int, array: int | None, as_json: bool) -> None:
    """Your jobs, like squeue (--team for the team's, --all for finished ones too, --array for an array's tasks)."""
    wanted = tuple(s.strip() for v in states for s in v.split(",") if s.strip())
    if not wanted and not all_states:
        wanted = ("PENDING", "STARTING", "RUNNING", "PREEMPTING")
    jobs = _list(_api(), "/api/v1/jobs", mine=True, team=team, states=wanted, limit=limit, array=array)
    if as_json:
        _print_json(jobs)
        return
    rows = [
        [j["id"], j["name"], j["user"], j["team"]["slug"], j["state"], j["tier"], _shape(j), _when(j["submitted_at"]), _reason(j)]
        for j in jobs
    ]
    columns = ["ID", "NAME", "USER", "TEAM", "STATE", "TIER", "GPUS", "SUBMITTED", "REASON / WHERE"]
    if any(j.get("array_id") is not None for j in jobs):  # squeue's ARRAYID_INDEX, where there are array tasks
        rows = [[row[0], _task_of(j), *row[1:]] for row, j in zip(rows, jobs, strict=True)]
        columns.insert(1, "ARRAY")
    _table(columns, rows)
    if not jobs:
        out.print("no jobs" + ("" if all_states or states else " pending or running (--all for finished ones)"))


@click.command()
@click.argument("job_id", type=int)
@json_option
@api_command
def show(job_id: int, as_json: bool) -> None:
    """A job's spec, state, ranks and events."""
    job = _api().get(f"/api/v1/jobs/{job_id}")
    if as_json:
        _print_json(job)
        return
    _show(job)


def _show(job: dict[str, Any]) -> None:
    fields = [
        ("job", f"{job['id']} {job['name']}"),
        ("array task", f"{_task_of(job)} (yard array show {job['array_id']})" if job.get("array_id") is not None else ""),
        ("state", job["state"] + (f" (exit {job['exit_code']})" if job.get("exit_code") is not None else "")),
        ("team / user", f"{job['team']['slug']} / {job['user']}"),
        ("shape", f"{_shape(job)}, tier {job['tier']}, priority {job['priority']}"),
        ("attempt", job.get("attempt")),
        ("submitted", _when(job.get("submitted_at"))),
        ("started", _when(job.get("started_at"))),
        ("ended", _when(job.get("ended_at"))),
        ("time limit", f"{job.get('time_limit_s')} s"),
        ("pending reason", job.get("pending_reason")),
        ("placement", f"{job.get('locality')}, {job.get('leaves_spanned')} leaf switch(es)" if job.get("locality") else ""),
        ("stop", f"{job.get('stop_reason')} at {_when(job.get('stop_requested_at'))}" if job.get("stop_reason") else ""),
        ("checkpoint dir", job.get("checkpoint_dir")),
        ("command", job.get("command")),
    ]
    for label, value in fields:
        if value not in (None, ""):
            out.print(f"[bold]{label:>15}[/]  ", end="", markup=True)
            out.print(str(value), markup=False)
    if job.get("env"):
        out.print(f"[bold]{'env':>15}[/]  ", end="", markup=True)
        out.print(" ".join(f"{k}={v}" for k, v in sorted(job["env"].items())), markup=False)
    if job.get("tasks"):
        rows = [
            [t["rank"], t["state"], t["node"], t["leaf"], ",".join(map(str, t["gpu_indexes"])), t.get("exit_code"),
             t.get("signal"), t.get("stopped_by")]
            for t in job["tasks"]
        ]  # fmt: skip
        out.print()
        _table(["RANK", "STATE", "NODE", "LEAF", "GPUS", "EXIT", "SIGNAL", "STOPPED BY"], rows)
    if job.get("events"):
        out.print()
        rows = [
            [_when(e["time"]), e["attempt"], e["from_state"], e["to_state"], e["actor_label"], e["reason"]] for e in job["events"]
        ]
        _table(["TIME", "ATTEMPT", "FROM", "TO", "BY", "REASON"], rows)


def _logs(api: Api, base: str, job_id: int, *, rank: int, follow: bool, tail: int | None, as_json: bool) -> None:
    params: dict[str, Any] = {"rank": rank}
    if tail is not None:
        params["tail"] = tail
    else:
        params["offset"] = 0
    poll = _poll_s()
    while True:
        page = api.get(f"{base}/{job_id}/logs", **params)
        if as_json:
            _print_json(page)
        elif page["text"]:
            sys.stdout.write(page["text"])
            sys.stdout.flush()
        params = {"rank": rank, "offset": page["next_offset"], "attempt": page["attempt"]}
        if not follow:
            return
        if page["text"]:
            continue  # more may be there already
        job = api.get(f"{base}/{job_id}")
        done_attempt = job["state"] in r.TERMINAL or job.get("attempt") != page["attempt"]
        if done_attempt and page.get("task_state") in (None, "EXITED", "LOST"):
            last = api.get(f"{base}/{job_id}/logs", **params)  # what came between the two reads
            if last["text"] and not as_json:
                sys.stdout.write(last["text"])
            if job.get("attempt") != page["attempt"] and job["state"] not in r.TERMINAL:
                params = {"rank": rank, "offset": 0, "attempt": job["attempt"]}
                err.print(f"-- attempt {job['attempt']} --", markup=False)
                continue
            return
        time.sleep(poll)


@click.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the job writes, until it ends")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True)
@click.option("--tail", type=click.IntRange(0, 10_000), help="Only the last N lines first")
@json_option
@api_command
def logs(job_id: int, follow: bool, rank: int, tail: int | None, as_json: bool) -> None:
    """A job's output (rank 0 unless --rank), as the agents shipped it."""
    _logs(_api(), "/api/v1/jobs", job_id, rank=rank, follow=follow, tail=tail, as_json=as_json)


@click.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
@json_option
@api_command
def cancel(job_ids: tuple[int, ...], as_json: bool) -> None:
    """Cancel jobs, like scancel: a pending one at once; a running one gets SIGTERM, its grace, then SIGKILL."""
    api = _api()
    done = []
    for job_id in job_ids:
        job = api.post(f"/api/v1/jobs/{job_id}/cancel")
        done.append(job)
        if not as_json:
            what = "cancelled" if job["state"] == "CANCELLED" else f"{job['state']}, told to stop"
            if job["state"] in ("COMPLETED", "FAILED"):
                what = f"already {job['state']}: nothing to cancel"
            out.print(f"job {job['id']} ({job['name']}): {what}", markup=False)
    if as_json:
        _print_json(done if len(done) > 1 else done[0])


@click.command()
@click.argument("job_id", type=int)
@click.option("--wait", is_flag=True, help="Follow the new job and exit with its result")
@json_option
@api_command
def rerun(job_id: int, wait: bool, as_json: bool) -> None:
    """Submit a job again with the same spec (a new job; the old one stays as it ended)."""
    api = _api()
    job = api.post(f"/api/v1/jobs/{job_id}/rerun")
    if as_json and not wait:
        _print_json(job)
        return
    if not as_json:
        out.print(f"Submitted job {job['id']}, a copy of job {job_id}: {job['pending_reason']}", markup=False)
    if wait:
        _wait(api, job["id"], timeout_s=None, exit_on_preempt=False, as_json=as_json)
