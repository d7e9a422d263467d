"""The `yard` commands. Each one is a few REST calls and a table; `--json` prints what the API answered.

Coming from Slurm: `yard submit`/`yard sbatch` ~ sbatch, `yard ls` ~ squeue, `yard cancel` ~ scancel,
`yard report` ~ sacct/sreport. Coming from Kubeflow: `yard submit pytorchjob.yaml` ~ kubectl apply -f.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from yardcli import __version__
from yardcli import result as r
from yardcli.client import Api, ApiError, config_path, config_save, credentials

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

SCRIPT_SUFFIXES = (".sh", ".sbatch", ".slurm", ".bash")
YAML_SUFFIXES = (".yaml", ".yml", ".json")
FORMATS = ("auto", "yardmaster", "pytorchjob", "mpijob", "slurm")


def _poll_s() -> float:
    # How often --wait and logs -f ask; YARD_POLL_S lets a test or a patient CI job change it.
    try:
        return max(float(os.environ.get("YARD_POLL_S", "2")), 0.1)
    except ValueError:
        return 2.0


# --------------------------------------------------------------------------- output and errors


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


# The API's field names as `yard submit` and `yard notebook launch` call them: an error about
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


# --------------------------------------------------------------------------- the group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="yard")
def cli() -> None:
    """Yardmaster from the command line: submit jobs (flags, Yardmaster job files, Kubeflow PyTorchJob/MPIJob
    manifests, Slurm batch scripts), follow them, and read quotas and usage.

    Sign in once with `yard login`, or set YARD_URL and YARD_TOKEN (CI)."""


# --------------------------------------------------------------------------- login, whoami


@cli.command()
@click.option("--url", help="The portal, e.g. https://yard.example.com (default: YARD_URL or the saved one)")
@click.option("--token", help="An API token (ym_...) from the portal's API tokens page; asked for when not given")
@json_option
@api_command
def login(url: str | None, token: str | None, as_json: bool) -> None:
    """Check a portal URL and token, and keep them (0600) for the next commands."""
    url = (url or os.environ.get("YARD_URL") or "").strip() or click.prompt("Portal URL")
    token = (token or os.environ.get("YARD_TOKEN") or "").strip() or click.prompt("API token", hide_input=True)
    url = url.rstrip("/")
    if not re.match(r"^https?://", url):
        _fail(f"{url!r} is not a URL: give http(s)://host[:port]", as_json=as_json)
    me = _me(Api(url, token))
    path = config_save(url=url, token=token)
    if as_json:
        _print_json({"url": url, "config": str(path), "me": me})
        return
    out.print(f"Signed in to {url} as {me['username']} ({me['auth']}); saved in {path}")


@cli.command()
def logout() -> None:
    """Forget the saved URL and token."""
    path = config_path()
    if path.exists():
        path.unlink()
        out.print(f"Removed {path}")
    else:
        out.print("Not signed in")


@cli.command()
@json_option
@api_command
def whoami(as_json: bool) -> None:
    """Who the token belongs to, and the teams you may submit to."""
    api = _api()
    me = _me(api)
    if as_json:
        _print_json(me)
        return
    admin = " (cluster admin)" if me.get("is_cluster_admin") else ""
    out.print(f"{me['username']}{admin} on {api.url}, by {me['auth']}")
    teams = ", ".join(t["slug"] for t in me.get("teams", [])) or "none"
    out.print(f"teams you may submit to: {teams}")
    for role in me.get("roles", []):
        out.print(f"  {role['role']} of {role['unit']['name']} ({role['kind']})")


# --------------------------------------------------------------------------- submit


def _file_request(path: Path, fmt: str) -> tuple[bytes, str]:
    """The file as it is, and the content type the server translates it by."""
    data = path.read_bytes()
    if fmt == "slurm" or (fmt == "auto" and (path.suffix in SCRIPT_SUFFIXES or data.startswith(b"#!"))):
        return data, "text/x-shellscript"
    if fmt in ("auto", "yardmaster", "pytorchjob", "mpijob"):
        # YAML is a superset of JSON: a .json job file gets the same strict reading as a YAML one.
        return data, "application/yaml"
    raise click.BadParameter(f"unknown format {fmt}", param_hint="--format")


def _print_submitted(job: dict[str, Any], *, replay: bool, verdict: str) -> None:
    for warning in job.get("warnings", []):
        err.print(f"[yellow]warning:[/] {warning}", markup=True, highlight=False)
    source = f" from a {job['translated_from']} file" if job.get("translated_from") else ""
    again = " (already submitted with this Idempotency-Key)" if replay else ""
    out.print(
        f"Submitted job {job['id']} ({job['name']}){source}{again}: {_shape(job)}, tier {job['tier']}, "
        f"team {job['team']['slug']}",
        markup=False,
    )
    out.print(f"Admission: {verdict}", markup=False)


def _print_preview(preview: dict[str, Any]) -> None:
    for warning in preview.get("warnings", []):
        err.print(f"[yellow]warning:[/] {warning}", markup=True, highlight=False)
    job = preview["job"]
    source = f" (from a {preview['translated_from']} file)" if preview.get("translated_from") else ""
    out.print(f"Would submit{source}:", markup=False)
    for key in (
        "name",
        "team",
        "tier",
        "replicas",
        "gpus_per_replica",
        "gpu_type",
        "time_limit_s",
        "cpus_per_replica",
        "memory_mb_per_replica",
        "priority",
        "leaf_locality",
        "env",
    ):
        if key in job and job[key] not in (None, "", {}):
            out.print(f"  {key}: {job[key]}", markup=False)
    if not job.get("cpus_per_replica") or not job.get("memory_mb_per_replica"):
        # Said even where the cluster's defaults apply: a refusal may be for the cores or memory a node lacks.
        out.print("  cpus_per_replica, memory_mb_per_replica: the cluster's share per GPU (not given)", markup=False)
    out.print("  command:", markup=False)
    for line in str(job.get("command", "")).splitlines():
        out.print(f"    {line}", markup=False)
    out.print(f"Admission: {preview['verdict']}" if preview["ok"] else f"Can never run: {preview['verdict']}", markup=False)


def _only_team(api: Api) -> str:
    teams = [str(t["slug"]) for t in _me(api).get("teams", [])]
    if len(teams) == 1:
        return teams[0]
    if not teams:
        raise ApiError(0, None, "You may not submit to any team: ask a team lead to add you")
    raise click.UsageError(f"Say which team with --team: you may submit to {', '.join(teams)}")


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise click.BadParameter(f"{pair!r}: give NAME=value", param_hint="--env")
        env[key] = value
    return env


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


def _memory_mb(text: str | None, *, param: str) -> int | None:
    """Slurm's --mem: a number of MiB, or with a unit: 512M, 64G, 1.5T (K is rounded up to 1 MiB)."""
    if text is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)(?:i?B)?", text.strip(), flags=re.IGNORECASE)
    if match is None:
        raise click.BadParameter(f"{text!r}: give MiB, or a number with K, M, G or T (e.g. 64G)", param_hint=param)
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
    return max(1, round(float(match.group(1)) * scale))


def _submit_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
                     help="The job file's format (auto: .sh/#! is a Slurm script; YAML/JSON by apiVersion and kind)"),
        click.option("--name", help="Job name (a file's own name wins; for a file without one, the file's name)"),
        click.option("--team", help="Team slug or id (a file's own team wins; default: your only team)"),
        click.option("--tier", type=click.IntRange(1, 3), help="1 production, 2 research (default), 3 spot"),
        click.option("-N", "--replicas", type=click.IntRange(1), help="Replicas (nodes), default 1"),
        click.option("-G", "--gpus", type=click.IntRange(1), help="GPUs per replica, default 1"),
        click.option("--gpu-type", help="GPU type, e.g. H100 (a MIG slice type: H100.1g.10gb)"),
        click.option("-c", "--cpus", type=click.IntRange(1, 1024), help="CPU cores per replica (default: the cluster's per GPU)"),
        click.option("--mem", "memory", help="Memory per replica: MiB, or 512M, 64G, 1.5T (default: the cluster's per GPU)"),
        click.option("-t", "--time", "time_limit", help="Time limit: seconds, 45m, 2h, 1d12h or HH:MM:SS"),
        click.option("-e", "--env", "env", multiple=True, help="NAME=value (repeatable)"),
        click.option("--checkpoint-dir", help="Inside your team's checkpoint directory"),
        click.option("--priority", type=click.IntRange(-1000, 1000), help="Order within the team's tier"),
        click.option("--leaf-locality", type=click.Choice(["auto", "required", "preferred"]),
                     help="A multi-node gang one leaf switch could hold: wait for one only while that costs less "
                          "than spanning (auto, default), always (required), or never when none has room (preferred)"),
        click.option("--command", "command_text", help="The command every replica runs (or give it after --)"),
        click.option("--idempotency-key", help="A CI retry with the same key gets the same job (e.g. $CI_PIPELINE_ID)"),
        click.option("--wait", is_flag=True, help="Follow the job and exit with its result (see `yard help-exit-codes`)"),
        click.option("--wait-timeout", help="With --wait: stop waiting after this long (exit 125, or 122 if preempted)"),
        click.option("--exit-on-preempt", is_flag=True, help="With --wait: exit 122 as soon as the job is preempted"),
        click.option("--test-only", is_flag=True,
                     help="Submit nothing: print the job (a file's translation) and its admission verdict (sbatch --test-only)"),
        json_option,
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def _submit(
    *,
    file: Path | None,
    fmt: str,
    command: tuple[str, ...],
    name: str | None,
    team: str | None,
    tier: int | None,
    replicas: int | None,
    gpus: int | None,
    gpu_type: str | None,
    cpus: int | None,
    memory: str | None,
    time_limit: str | None,
    env: tuple[str, ...],
    checkpoint_dir: str | None,
    priority: int | None,
    leaf_locality: str | None,
    command_text: str | None,
    idempotency_key: str | None,
    wait: bool,
    wait_timeout: str | None,
    exit_on_preempt: bool,
    test_only: bool,
    as_json: bool,
) -> None:
    api = _api()
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    timeout_s = _duration_s(wait_timeout, param="--wait-timeout")
    if file is not None:
        shaped = {"--tier": tier, "--replicas": replicas, "--gpus": gpus, "--gpu-type": gpu_type, "--cpus": cpus,
                  "--mem": memory, "--time": time_limit,
                  "--env": env or None, "--checkpoint-dir": checkpoint_dir, "--priority": priority,
                  "--leaf-locality": leaf_locality, "--command": command_text or (command or None)}  # fmt: skip
        given = [flag for flag, value in shaped.items() if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: with a job file, say it in the file (it is sent as it is)")
        body, content_type = _file_request(file, fmt)
        params = {"team": team, "name": name or file.stem}
        request: dict[str, Any] = {
            "content": body,
            "params": {k: v for k, v in params.items() if v},
            "headers": {"Content-Type": content_type},
        }
    else:
        text = command_text or (" ".join(_quote(c) for c in command) if command else "")
        if not text:
            raise click.UsageError("Give a job file, or the command to run: yard submit [OPTIONS] -- python train.py")
        payload: dict[str, Any] = {
            "name": name or (command[0].rsplit("/", 1)[-1] if command else "job"),
            "team": team or _only_team(api),
            "command": text,
        }
        optional = {"tier": tier, "replicas": replicas, "gpus_per_replica": gpus, "gpu_type": gpu_type,
                    "time_limit_s": _duration_s(time_limit, param="--time"), "checkpoint_dir": checkpoint_dir,
                    "priority": priority, "leaf_locality": leaf_locality, "env": _env_pairs(env) or None,
                    "cpus_per_replica": cpus, "memory_mb_per_replica": _memory_mb(memory, param="--mem")}  # fmt: skip
        payload.update({k: v for k, v in optional.items() if v is not None})
        request = {"json": payload, "headers": {}}
    # The full admission check first, as the portal's submit page shows it: submitting itself only
    # accepts or refuses (fast, for CI at volume), and where and when is the next cycle's word.
    preview = api.post("/api/v1/jobs/preview", **request)
    if test_only or not preview["ok"]:
        if as_json:
            _print_json(preview)
        elif test_only:
            _print_preview(preview)
        else:
            err.print(f"[bold red]error:[/] This job can never run: {preview['verdict']}", markup=True, highlight=False)
        sys.exit(r.EXIT_OK if preview["ok"] else r.EXIT_NEVER_RUNNABLE)
    request["headers"] = {**request["headers"], **headers}
    response = api.request("POST", "/api/v1/jobs", **request)
    job = response.json()
    # A 200 to the key the client made itself is its own retry landing, not an earlier submission.
    replay = response.status_code == 200 and bool(idempotency_key)
    if as_json and not wait:
        _print_json(job)
        return
    if not as_json:
        _print_submitted(job, replay=replay, verdict=preview["verdict"])
    if wait:
        _wait(api, job["id"], timeout_s=timeout_s, exit_on_preempt=exit_on_preempt, as_json=as_json)


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


class _SubmitCommand(click.Command):
    """Tells `yard submit FILE` from `yard submit -- COMMAND...`: words after -- are always the command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["yard_dashdash"] = "--" in args
        return super().parse_args(ctx, args)


@cli.command(cls=_SubmitCommand)
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
@_submit_options
@api_command
def submit(words: tuple[str, ...], **options: Any) -> None:
    """Submit a job: a job file as it is (Yardmaster YAML/JSON, Kubeflow PyTorchJob/MPIJob, Slurm batch script),
    or flags and a command after --.

    \b
      yard submit train.yaml
      yard submit pytorchjob.yaml --wait
      yard submit job.sbatch
      yard submit -N 2 -G 8 --gpu-type H100 -t 2h -- torchrun --nproc-per-node 8 train.py

    Prints the admission verdict: fits now, waits about N minutes and why, or can never run and why (exit 121).
    """
    file: Path | None = None
    if words and not click.get_current_context().meta.get("yard_dashdash"):
        if len(words) > 1:
            raise click.UsageError("Give one job file, or the command after --: yard submit -- python train.py")
        file = Path(words[0])
        if not file.is_file():
            raise click.BadParameter(f"{words[0]!r} is not a file (a command goes after --)", param_hint="FILE")
        words = ()
    _submit(file=file, command=words, **options)


@cli.command()
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_submit_options
@api_command
def sbatch(script: Path, **options: Any) -> None:
    """Submit a Slurm batch script (yard submit --format slurm): #SBATCH directives become the job's shape."""
    options["fmt"] = "slurm"
    _submit(file=script, command=(), **options)


@cli.command("help-exit-codes")
def help_exit_codes() -> None:
    """What `yard submit --wait` and `yard wait` exit with."""
    click.echo((r.__doc__ or "").strip())


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


@cli.command()
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


def _list(api: Api, path: str, *, mine: bool, team: str | None, states: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"page_size": min(limit, 200)}
    if mine and team is None:
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


def _reason(job: dict[str, Any]) -> str:
    if job["state"] == "PENDING":
        return str(job.get("pending_reason") or "")
    if job["state"] in ("FAILED",) and job.get("exit_code") is not None:
        return f"exit {job['exit_code']}"
    return str(job.get("locality") or "")


@cli.command("ls")
@click.option("--team", help="Every job of this team (slug or id), not only yours")
@click.option("--state", "states", multiple=True, help="Only these states (repeatable, or comma-separated)")
@click.option("--all", "all_states", is_flag=True, help="Finished jobs too (default: pending and running only)")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@json_option
@api_command
def list_jobs(team: str | None, states: tuple[str, ...], all_states: bool, limit: int, as_json: bool) -> None:
    """Your jobs, like squeue (--team for the team's, --all for finished ones too)."""
    wanted = tuple(s.strip() for v in states for s in v.split(",") if s.strip())
    if not wanted and not all_states:
        wanted = ("PENDING", "STARTING", "RUNNING", "PREEMPTING")
    jobs = _list(_api(), "/api/v1/jobs", mine=True, team=team, states=wanted, limit=limit)
    if as_json:
        _print_json(jobs)
        return
    rows = [
        [j["id"], j["name"], j["user"], j["team"]["slug"], j["state"], j["tier"], _shape(j), _when(j["submitted_at"]), _reason(j)]
        for j in jobs
    ]
    _table(["ID", "NAME", "USER", "TEAM", "STATE", "TIER", "GPUS", "SUBMITTED", "REASON / WHERE"], rows)
    if not jobs:
        out.print("no jobs" + ("" if all_states or states else " pending or running (--all for finished ones)"))


@cli.command()
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


@cli.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the job writes, until it ends")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True)
@click.option("--tail", type=click.IntRange(0, 10_000), help="Only the last N lines first")
@json_option
@api_command
def logs(job_id: int, follow: bool, rank: int, tail: int | None, as_json: bool) -> None:
    """A job's output (rank 0 unless --rank), as the agents shipped it."""
    _logs(_api(), "/api/v1/jobs", job_id, rank=rank, follow=follow, tail=tail, as_json=as_json)


@cli.command()
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


@cli.command()
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


# --------------------------------------------------------------------------- notebooks


@cli.group()
def notebook() -> None:
    """Jupyter notebooks on GPUs: launch, ls, open, stop."""


@notebook.command("launch")
@click.option("--name", default="notebook", show_default=True)
@click.option("--team", help="Team slug or id (default: your only team)")
@click.option("-G", "--gpus", type=click.IntRange(1), default=1, show_default=True)
@click.option("--gpu-type", help="GPU type, e.g. H100")
@click.option("--tier", type=click.IntRange(1, 3), help="1 production, 2 research (default), 3 spot")
@click.option("-t", "--time", "time_limit", help="Time limit: seconds, 45m, 2h, 1d12h or HH:MM:SS")
@click.option("--open", "open_it", is_flag=True, help="Open it in the browser once it runs")
@json_option
@api_command
def notebook_launch(
    name: str, team: str | None, gpus: int, gpu_type: str | None, tier: int | None, time_limit: str | None, open_it: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Launch a notebook (JupyterLab on GPUs); the idle reaper stops it when its GPUs sit unused."""
    api = _api()
    payload: dict[str, Any] = {"name": name, "team": team or _only_team(api), "gpus": gpus}
    optional = {"gpu_type": gpu_type, "tier": tier, "time_limit_s": _duration_s(time_limit, param="--time")}
    payload.update({k: v for k, v in optional.items() if v is not None})
    nb = api.post("/api/v1/notebooks", json=payload)
    if as_json:
        _print_json(nb)
    else:
        out.print(f"Launched notebook {nb['id']} ({nb['name']}): {nb['gpus']} {nb['gpu_type']}; {nb['pending_reason']}")
    if open_it:
        _open_when_running(api, nb["id"])


def _notebook_page(api: Api, notebook_id: int) -> str:
    # The portal proxies the notebook behind the browser's session: no token in the URL.
    return f"{api.url}/notebooks/{notebook_id}/open"


def _open_when_running(api: Api, notebook_id: int) -> None:
    with err.status(f"notebook {notebook_id}: waiting for it to run"):
        while True:
            nb = api.get(f"/api/v1/notebooks/{notebook_id}")
            if nb["state"] == "RUNNING":
                break
            if nb["state"] in r.TERMINAL:
                _fail(f"notebook {notebook_id} is {nb['state']}")
            time.sleep(_poll_s())
    url = _notebook_page(api, notebook_id)
    out.print(url)
    webbrowser.open(url)


@notebook.command("ls")
@click.option("--all", "all_states", is_flag=True, help="Stopped ones too")
@json_option
@api_command
def notebook_ls(all_states: bool, as_json: bool) -> None:
    """Your notebooks."""
    states = () if all_states else ("PENDING", "STARTING", "RUNNING", "PREEMPTING")
    nbs = _list(_api(), "/api/v1/notebooks", mine=True, team=None, states=states, limit=200)
    if as_json:
        _print_json(nbs)
        return
    rows = [[n["id"], n["name"], n["team"]["slug"], n["state"], f"{n['gpus']} {n['gpu_type']}", _when(n["submitted_at"]),
             _reason(n)] for n in nbs]  # fmt: skip
    _table(["ID", "NAME", "TEAM", "STATE", "GPUS", "LAUNCHED", "REASON / WHERE"], rows)


@notebook.command("open")
@click.argument("notebook_id", type=int)
@click.option("--print", "print_only", is_flag=True, help="Print the URL, do not start a browser")
@json_option
@api_command
def notebook_open(notebook_id: int, print_only: bool, as_json: bool) -> None:
    """Open a running notebook in the browser (through the portal, which checks your session)."""
    api = _api()
    nb = api.get(f"/api/v1/notebooks/{notebook_id}")
    url = _notebook_page(api, notebook_id)
    if as_json:
        _print_json({"id": notebook_id, "state": nb["state"], "url": url})
        return
    if nb["state"] != "RUNNING":
        _fail(f"notebook {notebook_id} is {nb['state']}, not running: {nb.get('pending_reason') or ''}".rstrip(": "))
    out.print(url)
    if not print_only:
        webbrowser.open(url)


@notebook.command("stop")
@click.argument("notebook_id", type=int)
@json_option
@api_command
def notebook_stop(notebook_id: int, as_json: bool) -> None:
    """Stop a notebook (its kernel gets SIGTERM, then SIGKILL after the grace)."""
    nb = _api().post(f"/api/v1/notebooks/{notebook_id}/stop")
    if as_json:
        _print_json(nb)
    else:
        out.print(notebook_stop_words(nb))


def notebook_stop_words(nb: dict[str, Any]) -> str:
    """What `yard notebook stop` says: the state after the stop, not the RUNNING it answered in."""
    head = f"notebook {nb['id']} ({nb['name']})"
    state = str(nb.get("state", ""))
    if state in r.TERMINAL:
        return f"{head}: {state} (ended)"
    if state in ("RUNNING", "STARTING", "PREEMPTING") or nb.get("stop_requested_at"):
        return (
            f"{head}: STOPPING (its kernel got SIGTERM, then SIGKILL after the grace; `yard notebook ls` shows when it has ended)"
        )
    return f"{head}: {state or 'stopping'}"


# --------------------------------------------------------------------------- quota, report


@cli.command()
@click.option("--team", help="Only this one of your teams")
@json_option
@api_command
def quota(team: str | None, as_json: bool) -> None:
    """Your teams' guaranteed GPUs, limits, GPUs in use and borrowed, and fair-share standing."""
    data = _api().get("/api/v1/me/quota", team=team)
    if as_json:
        _print_json(data)
        return
    rows = []
    for entry in data["teams"]:
        fs = entry.get("fair_share") or {}
        standing = f"{fs['rank']} of {fs['teams']}" if fs else ""
        for line in entry["quotas"] or [{"gpu_type": "", "guaranteed": "", "limit": "", "used": "", "borrowed": ""}]:
            usage = fs.get("usage_gpu_hours", {}).get(line["gpu_type"], 0.0) if fs else ""
            share = fs.get("usage_share", {}).get(line["gpu_type"]) if fs else None
            rows.append([
                entry["team"]["slug"], line["gpu_type"], line["guaranteed"],
                "none" if line["limit"] is None else line["limit"], line["used"], line["borrowed"],
                f"{usage:.1f}" if isinstance(usage, float) else usage, "" if share is None else f"{share:.0%}", standing,
            ])  # fmt: skip
    _table(["TEAM", "GPU", "GUARANTEED", "LIMIT", "IN USE", "BORROWED", "RECENT GPU-H", "SHARE", "FAIR-SHARE PLACE"], rows)
    out.print(
        f"Recent use decays with a half-life of {data['half_life_days']:g} days; place 1 is served first. "
        "Borrowed GPUs run beyond the guarantee and may be reclaimed."
    )


@cli.command()
@click.option("--month", help="YYYY-MM (default: this month)")
@click.option("--unit", type=int, help="The top unit's id (default: every unit you may see)")
@click.option("--csv", "as_csv", is_flag=True, help="CSV, as the portal's download")
@json_option
@api_command
def report(month: str | None, unit: int | None, as_csv: bool, as_json: bool) -> None:
    """Monthly GPU usage by unit, like sreport: guaranteed, used and borrowed GPU-hours."""
    api = _api()
    params = {k: v for k, v in {"month": month, "unit": unit}.items() if v is not None}
    if as_csv:
        response = api.request("GET", "/api/v1/reports/usage", params={**params, "format": "csv"})
        sys.stdout.write(response.text)
        return
    data = api.get("/api/v1/reports/usage", **params)
    if as_json:
        _print_json(data)
        return
    rows = data.get("rows", [])
    columns = {"unit_path": "UNIT", "unit_kind": "KIND", "gpu_type": "GPU", "guaranteed_gpus": "GUARANTEED",
               "guaranteed_gpu_hours": "GUARANTEED GPU-H", "used_gpu_hours": "USED GPU-H", "borrowed_gpu_hours": "BORROWED GPU-H",
               "lost_to_preemption_gpu_hours": "LOST TO PREEMPTION", "idle_reaped_gpu_hours": "IDLE REAPED",
               "efficiency_ratio": "EFFICIENCY"}  # fmt: skip
    _table(list(columns.values()), [[row.get(c) for c in columns] for row in rows],
           title=f"GPU usage, {data['month']} ({data['time_zone']})")  # fmt: skip
    totals = data.get("totals", {})
    out.print(
        f"total: {totals.get('used_gpu_hours', 0):.1f} GPU-h used of {totals.get('guaranteed_gpu_hours', 0):.1f} guaranteed, "
        f"{totals.get('borrowed_gpu_hours', 0):.1f} borrowed"
    )


__all__ = ["cli", "credentials"]
