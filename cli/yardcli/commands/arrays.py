"""yard array show, throttle, cancel: a job array as a whole (its tasks per state), its limit on tasks
running at once, and cancelling all of it.

Its tasks are jobs: `yard ls --array ID` lists them, and `yard show`, `yard logs` and `yard cancel` take a
task's own job id, as scancel takes ARRAYID_INDEX.
"""

from __future__ import annotations

from typing import Any

import click

from yardcli.commands.common import _api, _print_json, _when, api_command, json_option, out

ORDER = ("RUNNING", "STARTING", "PREEMPTING", "PENDING", "COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "LOST")


def _counts(states: dict[str, int]) -> str:
    """'3 running, 47 pending, 950 completed', busiest states first."""
    return ", ".join(f"{states[s]} {s.lower()}" for s in ORDER if states.get(s)) or "no tasks"


def _show(array: dict[str, Any]) -> None:
    limit = array.get("max_running")
    fields = [
        ("array", f"{array['id']} {array['name']}"),
        ("indices", f"{array['array']} ({array['task_count']} tasks{f', at most {limit} running at once' if limit else ''})"),
        ("team / user", f"{array['team']['slug']} / {array['user']}"),
        ("submitted", _when(array.get("submitted_at"))),
        ("tasks", _counts(array.get("states") or {})),
    ]
    for label, value in fields:
        out.print(f"[bold]{label:>12}[/]  ", end="", markup=True)
        out.print(str(value), markup=False)


@click.group("array")
def array() -> None:
    """Job arrays (yard submit --array 0-999%50): show one, change its limit, cancel one."""


@array.command("show")
@click.argument("array_id", type=int)
@json_option
@api_command
def show(array_id: int, as_json: bool) -> None:
    """An array's indices, limit and its tasks per state (its tasks: yard ls --array ID)."""
    found = _api().get(f"/api/v1/arrays/{array_id}")
    if as_json:
        _print_json(found)
        return
    _show(found)


@array.command("throttle")
@click.argument("array_id", type=int)
@click.argument("max_running", type=click.IntRange(0))
@json_option
@api_command
def throttle(array_id: int, max_running: int, as_json: bool) -> None:
    """Change the most tasks running at once, as scontrol update ArrayTaskThrottle (0: no limit). Lowered, none
    is stopped: no more start until fewer run."""
    answer = _api().request("PATCH", f"/api/v1/arrays/{array_id}", json={"max_running": max_running or None}).json()
    if as_json:
        _print_json(answer)
        return
    _show(answer)


@array.command("cancel")
@click.argument("array_ids", type=int, nargs=-1, required=True)
@json_option
@api_command
def cancel(array_ids: tuple[int, ...], as_json: bool) -> None:
    """Cancel every task of an array, as scancel ARRAYID: pending ones at once, running ones get SIGTERM, their
    grace, then SIGKILL. One task alone: yard cancel TASK_JOB_ID."""
    api = _api()
    done = []
    for array_id in array_ids:
        answer = api.post(f"/api/v1/arrays/{array_id}/cancel")
        done.append(answer)
        if not as_json:
            out.print(f"array {answer['id']} ({answer['name']}): {answer['cancelled']} tasks cancelled or told to stop; "
                      f"now {_counts(answer['states'])}", markup=False)  # fmt: skip
    if as_json:
        _print_json(done if len(done) > 1 else done[0])
