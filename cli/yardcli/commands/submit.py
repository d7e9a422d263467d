"""yard submit, sbatch and help-exit-codes: a job file as it is or flags and a command, its admission
verdict first (--test-only prints only that), then the job, and with --wait its result as the exit code."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from yardcli import result as r
from yardcli.commands.common import (
    _api,
    _duration_s,
    _only_team,
    _print_json,
    _shape,
    api_command,
    err,
    json_option,
    out,
)
from yardcli.commands.jobs import _wait

SCRIPT_SUFFIXES = (".sh", ".sbatch", ".slurm", ".bash")
YAML_SUFFIXES = (".yaml", ".yml", ".json")
FORMATS = ("auto", "yardmaster", "pytorchjob", "mpijob", "slurm")


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


def _print_array_submitted(array: dict[str, Any], *, replay: bool, verdict: str) -> None:
    for warning in array.get("warnings", []):
        err.print(f"[yellow]warning:[/] {warning}", markup=True, highlight=False)
    source = f" from a {array['translated_from']} file" if array.get("translated_from") else ""
    again = " (already submitted with this Idempotency-Key)" if replay else ""
    limit = f": at most {array['max_running']} running at once" if array.get("max_running") else ""
    out.print(
        f"Submitted array {array['id']} ({array['name']}){source}{again}: {array['task_count']} tasks "
        f"(--array {array['array']}{limit}), team {array['team']['slug']}",
        markup=False,
    )
    out.print(f"Each task: {verdict}", markup=False)
    out.print(f"Follow it: yard array show {array['id']}; its tasks: yard ls --array {array['id']}", markup=False)


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
        "image",
        "container_mounts",
        "container_workdir",
        "env",
        "array",
    ):
        if key in job and job[key] not in (None, "", {}, []):
            out.print(f"  {key}: {job[key]}", markup=False)
    if not job.get("cpus_per_replica") or not job.get("memory_mb_per_replica"):
        # Said even where the cluster's defaults apply: a refusal may be for the cores or memory a node lacks.
        out.print("  cpus_per_replica, memory_mb_per_replica: the cluster's share per GPU (not given)", markup=False)
    out.print("  command:", markup=False)
    for line in str(job.get("command", "")).splitlines():
        out.print(f"    {line}", markup=False)
    each = "Admission (each task of the array, checked once)" if job.get("array") else "Admission"
    out.print(f"{each}: {preview['verdict']}" if preview["ok"] else f"Can never run: {preview['verdict']}", markup=False)


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq:
            raise click.BadParameter(f"{pair!r}: give NAME=value", param_hint="--env")
        env[key] = value
    return env


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
        click.option("--image", "--container-image", "image",
                     help="Run every replica in this container image, e.g. nvcr.io/nvidia/pytorch:24.05-py3 "
                          "(pyxis's --container-image; default: on the nodes' own environment)"),
        click.option("--container-mounts", help="With --image: SRC:DST[:ro|rw],... host paths to mount (as pyxis)"),
        click.option("--container-workdir", help="With --image: the working directory inside the container"),
        click.option("-a", "--array", "array",
                     help="A job array, as sbatch's --array: 0-999, 1,3,5-7, 0-99:2, and %N for at most N running at "
                          "once (0-999%50); each index is a job of its own with $YARD_ARRAY_TASK_ID"),
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
    image: str | None,
    container_mounts: str | None,
    container_workdir: str | None,
    array: str | None,
    command_text: str | None,
    idempotency_key: str | None,
    wait: bool,
    wait_timeout: str | None,
    exit_on_preempt: bool,
    test_only: bool,
    as_json: bool,
) -> None:
    if wait and array:
        raise click.UsageError("--wait follows one job: follow an array with `yard array show ID` (or `yard ls --array ID`)")
    api = _api()
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    timeout_s = _duration_s(wait_timeout, param="--wait-timeout")
    if file is not None:
        shaped = {"--tier": tier, "--replicas": replicas, "--gpus": gpus, "--gpu-type": gpu_type, "--cpus": cpus,
                  "--mem": memory, "--time": time_limit,
                  "--env": env or None, "--checkpoint-dir": checkpoint_dir, "--priority": priority,
                  "--leaf-locality": leaf_locality, "--image": image, "--container-mounts": container_mounts,
                  "--container-workdir": container_workdir, "--array": array,
                  "--command": command_text or (command or None)}  # fmt: skip
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
                    "cpus_per_replica": cpus, "memory_mb_per_replica": _memory_mb(memory, param="--mem"),
                    "image": image, "container_mounts": container_mounts, "container_workdir": container_workdir,
                    "array": array}  # fmt: skip
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
    if "task_count" in job:  # an array (a job file's #SBATCH --array, or --array)
        if as_json:
            _print_json(job)
        else:
            _print_array_submitted(job, replay=replay, verdict=preview["verdict"])
        if wait:
            raise click.UsageError(f"--wait follows one job: follow array {job['id']} with `yard array show {job['id']}`")
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


@click.command(cls=_SubmitCommand)
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
      yard submit -G 8 --image nvcr.io/nvidia/pytorch:24.05-py3 --container-mounts /data:/data:ro -- python train.py

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


@click.command()
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_submit_options
@api_command
def sbatch(script: Path, **options: Any) -> None:
    """Submit a Slurm batch script (yard submit --format slurm): #SBATCH directives become the job's shape."""
    options["fmt"] = "slurm"
    _submit(file=script, command=(), **options)


@click.command("help-exit-codes")
def help_exit_codes() -> None:
    """What `yard submit --wait` and `yard wait` exit with."""
    click.echo((r.__doc__ or "").strip())
