"""#SBATCH --array in a batch script: the array's tasks, Slurm's SLURM_ARRAY_* variables in each task, and
%A/%a in --output/--error; with a real public script that uses --array, posted unchanged."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from scheduling import jobfiles
from scheduling.arrayspec import parse_array
from scheduling.models import Job
from tests.api.conftest import token_client

GPU_TYPES = ("A100", "H100")
SCRIPT_MARK = "# ---- the batch script\n"
HEAD = "#!/bin/bash\n#SBATCH --account=team-a\n#SBATCH --gpus-per-node=1\n"

# A public script that uses --array, as its repository has it (not committed here: other projects' files
# stay theirs, as tests/cli/realfiles/README.md says). Get it with
#   git -C CLONE show 826e6b176d414ece7bc0db051981ec59f64950a6:job_script/job_within.sh > "$YARD_REAL_JOBFILES/NAME"
REAL_NAME = "ci-failing-builds-job_within.sh"
REAL = {
    "repo": "MaherDissem/CI-Failing-Builds-Detection",
    "path": "job_script/job_within.sh",
    "commit": "826e6b176d414ece7bc0db051981ec59f64950a6",
    "sha256": "1d92dc32a3f049dce3318fe108efae6bebe85d7757fe2ba59cf5e9ac475f55ca",
}


def _real_text() -> str:
    given = os.environ.get("YARD_REAL_JOBFILES")
    folder = Path(given) if given else Path(__file__).resolve().parents[2].parent / "shared" / "jobfiles" / "real"
    path = folder / REAL_NAME
    if not path.is_file():
        pytest.skip(f"{REAL_NAME} is not at {path}: see this module's REAL (or set YARD_REAL_JOBFILES)")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == REAL["sha256"], f"{path} is not the file REAL records"
    return data.decode()


def _translate(text: str) -> jobfiles.Translation:
    return jobfiles.translate(fmt="slurm", text=text, gpu_types=GPU_TYPES)


def _task_env(array_id: int, index: int, array: str, tmp_path: Path, job_id: int) -> dict[str, str]:
    """The variables the agent gives one task: the job's own (YARD_ARRAY_* among them) and the agent's."""
    return {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        **parse_array(array, max_size=10_000).env(array_id=array_id, index=index),
        "YARD_JOB_ID": str(job_id), "YARD_ATTEMPT": "1", "WORLD_SIZE": "1", "NODE_RANK": "0", "RANK": "0",
        "YARD_NUM_GPUS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    }  # fmt: skip


def _run(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_array_and_its_short_form_become_the_array_field():
    assert _translate(HEAD + "#SBATCH --array=0-9%2\necho hi\n").fields["array"] == "0-9%2"
    assert _translate(HEAD + "#SBATCH -a 1,3,5-7\necho hi\n").fields["array"] == "1,3,5-7"
    assert "array" not in _translate(HEAD + "echo hi\n").fields


def test_a_task_sees_slurms_array_variables_and_its_own_job_id(tmp_path):
    command = _translate(HEAD + "#SBATCH --array=0-20:5%2\necho hi\n").fields["command"]
    probe = command.partition(SCRIPT_MARK)[0] + (
        'echo "$SLURM_JOB_ID|$SLURM_ARRAY_JOB_ID|$SLURM_ARRAY_TASK_ID|$SLURM_ARRAY_TASK_COUNT|'
        '$SLURM_ARRAY_TASK_MIN|$SLURM_ARRAY_TASK_MAX|$SLURM_ARRAY_TASK_STEP"\n'
    )
    run = _run(probe, _task_env(500, 10, "0-20:5%2", tmp_path, job_id=502), tmp_path)
    assert run.stdout.strip() == "502|500|10|5|0|20|5", run.stderr


def test_a_single_job_has_no_array_variables(tmp_path):
    command = _translate(HEAD + "echo hi\n").fields["command"]
    env = _task_env(1, 0, "0", tmp_path, job_id=77)
    env = {k: v for k, v in env.items() if not k.startswith("YARD_ARRAY_")}
    run = _run(
        command.partition(SCRIPT_MARK)[0] + 'echo "${SLURM_ARRAY_JOB_ID-unset}|${SLURM_ARRAY_TASK_ID-unset}"\n', env, tmp_path
    )
    assert run.stdout.strip() == "unset|unset", run.stderr


def test_output_and_error_names_take_the_array_id_the_index_and_the_tasks_own_job_id(tmp_path):
    script = (
        HEAD
        + "#SBATCH --array=0-3\n#SBATCH --output=out-%A_%a-%j.log\n#SBATCH --error=err-%A_%4a.log\necho said\necho oops >&2\n"
    )
    command = _translate(script).fields["command"]
    run = _run(command, _task_env(900, 2, "0-3", tmp_path, job_id=902), tmp_path)
    assert run.returncode == 0, run.stderr
    assert "said" in (tmp_path / "out-900_2-902.log").read_text()  # with its errors too, as the log has them
    assert (tmp_path / "err-900_0002.log").read_text() == "oops\n"


def test_percent_a_outside_an_array_is_what_slurm_writes(tmp_path):
    command = _translate(HEAD + "#SBATCH --output=o-%A-%a.log\necho x\n").fields["command"]
    env = {k: v for k, v in _task_env(1, 0, "0", tmp_path, job_id=55).items() if not k.startswith("YARD_ARRAY_")}
    _run(command, env, tmp_path)
    assert (tmp_path / "o-55-4294967294.log").read_text() == "x\n"


@pytest.mark.django_db
def test_a_bad_array_in_a_script_is_a_400_naming_its_line(cast, nodes):
    script = HEAD + "#SBATCH --array=5-1\necho hi\n"
    response = token_client(cast.ann_token).generic("POST", "/api/v1/jobs", script.encode(), content_type="text/x-shellscript")
    assert response.status_code == 400
    (message,) = response.json()["fields"]["array"]
    assert "give 1-5" in message and "#SBATCH --array=5-1 (line 4)" in message


def test_the_real_script_translates_unchanged_with_its_array():
    text = _real_text()
    t = _translate(text)
    assert t.fields["array"] == "0-14"
    assert t.fields["command"].partition(SCRIPT_MARK)[2] == text
    # its --output comes after its first command: sbatch ignores it, and so does Yardmaster, saying so
    assert any("--output" in w and "after the script's first command" in w for w in t.warnings)


@pytest.mark.django_db
def test_the_real_script_posted_unchanged_makes_fifteen_tasks_each_running_with_its_index(cast, nodes, tmp_path):
    text = _real_text()
    response = token_client(cast.ann_token).generic(
        "POST", "/api/v1/jobs?team=team-a", text.encode(), content_type="text/x-shellscript"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["task_count"], body["array"], body["translated_from"]) == (15, "0-14", "slurm")
    task = Job.objects.get(array_id=body["id"], array_index=7)
    assert task.command.partition(SCRIPT_MARK)[2] == text
    # the task's command, run with its own variables as its agent would run it: python is a stub here
    (tmp_path / "bin").mkdir()
    stub = tmp_path / "bin" / "python"
    stub.write_text('#!/bin/sh\necho "python: $*"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = {**_task_env(0, 0, "0", tmp_path, job_id=task.pk), **task.env}
    run = _run(task.command, env, tmp_path)
    assert f"python: ./job.py within 7 {body['id']}" in run.stdout, run.stdout + run.stderr
    assert (tmp_path / "slurm_output").is_dir()


def test_the_output_file_is_whole_when_the_script_has_ended_and_its_exit_status_kept(tmp_path):
    """sbatch's --output is a tee beside the script: the script's end waits for it, so an agent that finds
    the task over (and stops what is left of it) never cuts the file short. Here tee starts a second late."""
    slow = tmp_path / "bin" / "tee"
    slow.parent.mkdir(parents=True, exist_ok=True)
    slow.write_text('#!/bin/sh\nsleep 1\nexec /usr/bin/tee "$@"\n')
    slow.chmod(0o755)
    script = HEAD + "#SBATCH --output=out-%j.log\n#SBATCH --error=err-%j.log\necho said\necho oops >&2\nexit 3\n"
    command = _translate(script).fields["command"]
    env = {k: v for k, v in _task_env(1, 0, "0", tmp_path, job_id=61).items() if not k.startswith("YARD_ARRAY_")}
    # Not captured: the call returns when bash exits, not when the last holder of a pipe lets go.
    done = subprocess.run(
        ["bash", "-c", command], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60
    )
    assert done.returncode == 3
    assert "said" in (tmp_path / "out-61.log").read_text()
    assert (tmp_path / "err-61.log").read_text() == "oops\n"
