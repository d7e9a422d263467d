"""What every `yard` command shares: the two consoles, JSON and table output, errors said as the CLI's
options, the API client from the environment, and the few parsers more than one group reads."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from yardcli import result as r
from yardcli.client import Api, ApiError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _poll_s() -> float:
    # How often --wait and logs -f ask; YARD_POLL_S lets a test or a patient CI job change it.
    try:
        return max(float(os.environ.get("YARD_POLL_S", "2")), 0.1)
    except ValueError:
        return 2.0


# --------------------------------------------------------------------------- output and errors


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


# The API's field names as `yard submit`, `yard notebook launch` and `yard serve` call them: an error about
# time_limit_s is about --time to the person who typed -t. Only the snake_case names: a plain word
# (team, name) in a sentence stays a word.
OPTION_NAMES = {
    "time_limit_s": "--time",
    "gpus_per_replica": "--gpus",
    "memory_mb_per_replica": "--mem",
    "cpus_per_replica": "--cpus",
    "gpu_type": "--gpu-type",
    "checkpoint_dir": "--checkpoint-dir",
    "leaf_locality": "--leaf-locality",
    # yard serve's (the services API's field names)
    "gpus_per_node": "--gpus-per-node",
    "nodes_per_replica": "--nodes-per-replica",
    "min_replicas": "--min",
    "max_replicas": "--max",
    "target_inflight": "--target-inflight",
    "readiness_path": "--readiness-path",
    "liveness_path": "--liveness-path",
    "progress_deadline_s": "--progress-deadline",
    "to_revision": "--to-revision",
}
_FIELD_WORD = re.compile(r"\b(" + "|".join(sorted(OPTION_NAMES, key=len, reverse=True)) + r")\b")


def option_words(text: str) -> str:
    """``text`` with the API's field names said as the CLI's options (time_limit_s -> --time)."""
    return _FIELD_WORD.sub(lambda m: OPTION_NAMES[m.group(1)], text)


def _fail(message: str, *, code: int = r.EXIT_ERROR, body: Any = None, as_json: bool = False) -> NoReturn:
    if as_json:
        _print_json(body if body is not None else {"code": "cli_error", "message": message, "fields": {}})
    else:
        message = option_words(message)
        err.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
        if isinstance(body, dict):
            # The message is the first field's first error; every other one is listed under it.
            for field, messages in (body.get("fields") or {}).items():
                for msg in messages if isinstance(messages, list) else [messages]:
                    label = "" if field == "non_field_errors" else f"{OPTION_NAMES.get(field, field)}: "
                    msg = option_words(str(msg))
                    if f"{label}{msg}" != message:
                        err.print(f"  {label}{msg}", markup=False, highlight=False)
    sys.exit(code)


def api_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Every command: the API's errors as the API stated them, and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return func(*args, **kwargs)
        except ApiError as exc:
            code = r.EXIT_NEVER_RUNNABLE if exc.code == "never_runnable" else r.EXIT_ERROR
            _fail(exc.message, code=code, body=exc.body, as_json=as_json)

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer instead of a table")


def _table(columns: list[str], rows: list[list[Any]], *, title: str | None = None) -> None:
    """A table; on a terminal its cells fold to fit, piped (to grep, awk, a file) each row is one line of
    columns two spaces apart, no cell cut or wrapped mid-word."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if not out.is_terminal:
        widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
        lines = [title] if title else []
        for row in [columns, *cells]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        click.echo("\n".join(lines))
        return
    table = Table(title=title, box=None, header_style="bold", pad_edge=False, show_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in cells:
        table.add_row(*row)
    out.print(table)


def _when(stamp: str | None) -> str:
    return (stamp or "")[:19].replace("T", " ")


def _shape(job: dict[str, Any]) -> str:
    return f"{job['replicas']}×{job['gpus_per_replica']} {job['gpu_type']}"


def _api() -> Api:
    return Api.from_environment()


def _me(api: Api) -> dict[str, Any]:
    return dict(api.get("/api/v1/me"))


# --------------------------------------------------------------------------- read by more than one group


def _only_team(api: Api) -> str:
    teams = [str(t["slug"]) for t in _me(api).get("teams", [])]
    if len(teams) == 1:
        return teams[0]
    if not teams:
        raise ApiError(0, None, "You may not submit to any team: ask a team lead to add you")
    raise click.UsageError(f"Say which team with --team: you may submit to {', '.join(teams)}")


def _duration_s(text: str | None, *, param: str) -> int | None:
    """'90' (seconds), '45m', '2h', '1d12h', or sbatch's HH:MM:SS."""
    if text is None:
        return None
    text = text.strip()
    if text.isdigit():
        return int(text)
    if re.fullmatch(r"(\d+:)?\d+:\d+", text):
        parts = [int(p) for p in text.split(":")]
        return sum(v * m for v, m in zip(reversed(parts), (1, 60, 3600), strict=False))
    match = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not text or match is None:
        raise click.BadParameter(f"{text!r}: give seconds, 45m, 2h, 1d12h or HH:MM:SS", param_hint=param)
    d, h, m, s = (int(g or 0) for g in match.groups())
    return ((d * 24 + h) * 60 + m) * 60 + s
