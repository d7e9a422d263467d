"""The real `yard` console script against a live portal with real node agents on simulated GPUs.

Each test submits from one format, follows the job with --wait as CI would, and checks the exit
code and the logs. The test plays the scheduler's beat (tests/e2e/conftest.py): it runs the cycle
in-process once `yard` has submitted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job
from scheduling.services import job_request_stop
from scheduling.states import JobState
from tests.cli.conftest import Yard
from tests.e2e.conftest import Harness, wait_for
from tests.factories import make_cluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PY = sys.executable


def _submitted(harness: Harness, process: subprocess.Popen[str]) -> Job:
    """The job `yard` just submitted (the newest of the user's), once it is there."""

    def newest() -> Job | None:
        if process.poll() is not None:
            out, errs = process.communicate()
            raise AssertionError(f"yard exited {process.returncode} before the job was placed:\n{out}\n{errs}")
        return Job.objects.filter(user=harness.user).order_by("-id").first()

    return wait_for("yard to submit", newest, timeout=30)


def _finish(process: subprocess.Popen[str], *, timeout: float = 60) -> tuple[int, str, str]:
    out, errs = process.communicate(timeout=timeout)
    return process.returncode, out, errs


def _two_agents(harness: Harness) -> None:
    harness.start_agent("cli-a")
    harness.start_agent("cli-b")
    harness.node_ready("cli-a")
    harness.node_ready("cli-b")


def _one_agent(harness: Harness) -> None:
    harness.start_agent("cli-a")
    harness.node_ready("cli-a")


def _write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_a_yardmaster_job_file_completes_and_wait_exits_0_with_its_logs(harness: Harness, yard: Yard) -> None:
    _one_agent(harness)
    job_file = _write(
        harness.root,
        "hello.yaml",
        f"""
        apiVersion: yardmaster.io/v1
        kind: Job
        name: hello-yard
        team: {harness.org.team_a.slug}
        gpus_per_replica: 2
        command: {PY} -c "import os; print('hello from', os.environ['RANK'], os.environ['GREETING'])"
        env:
          GREETING: yardmaster
    """,
    )
    process = yard.start("submit", str(job_file), "--wait")
    job = _submitted(harness, process)
    harness.place(job)
    code, out, errs = _finish(process)
    assert code == 0, errs
    assert f"Submitted job {job.pk} (hello-yard) from a yardmaster file" in out
    assert "Admission: fits now" in out
    assert f"job {job.pk} completed (exit 0)" in errs
    logs = yard.run("logs", str(job.pk), check=True)
    assert "hello from 0 yardmaster" in logs.stdout


FAILS = """
import os, sys, time
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "nnodes", os.environ["PET_NNODES"], flush=True)
failing = sys.argv[1] == "--fail-rank=" + os.environ["RANK"]
time.sleep(0.5 if failing else 60)  # the other rank is stopped when this one fails
sys.exit(7 if failing else 0)
"""


def test_a_pytorchjob_whose_worker_fails_exits_with_that_ranks_exit_code(harness: Harness, yard: Yard) -> None:
    _two_agents(harness)
    program = _write(harness.root, "fails.py", FAILS)
    manifest = _write(
        harness.root,
        "ptjob.yaml",
        f"""
        apiVersion: kubeflow.org/v1
        kind: PyTorchJob
        metadata:
          name: pt-fails
          labels:
            yardmaster.io/team: {harness.org.team_a.slug}
        spec:
          pytorchReplicaSpecs:
            Master:
              replicas: 1
              restartPolicy: Never
              template:
                spec:
                  containers:
                    - name: pytorch
                      command: ["{PY}"]
                      args: ["{program}", "--fail-rank=$(FAIL_RANK)"]
                      env:
                        - name: FAIL_RANK
                          value: "1"
                      resources:
                        limits:
                          nvidia.com/gpu: 2
            Worker:
              replicas: 1
              restartPolicy: Never
              template:
                spec:
                  containers:
                    - name: pytorch
                      command: ["{PY}"]
                      args: ["{program}", "--fail-rank=$(FAIL_RANK)"]
                      env:
                        - name: FAIL_RANK
                          value: "1"
                      resources:
                        limits:
                          nvidia.com/gpu: 2
    """,
    )
    process = yard.start("submit", str(manifest), "--wait")
    job = _submitted(harness, process)
    harness.place(job)
    code, out, errs = _finish(process)
    assert code == 7, errs
    assert "from a pytorchjob file" in out
    assert "rank 1 on" in errs and "(exit 7)" in errs
    worker_log = yard.run("logs", str(job.pk), "--rank", "1", check=True).stdout
    assert "rank 1 of 2 nnodes 2" in worker_log
    shown = json.loads(yard.run("show", str(job.pk), "--json", check=True).stdout)
    assert shown["image"] == ""  # no image: its ranks ran on the host


def test_an_mpijob_runs_its_program_on_every_worker_and_completes(harness: Harness, yard: Yard) -> None:
    _two_agents(harness)
    program = _write(
        harness.root,
        "hvd.py",
        """
        import os
        print("worker", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "debug", os.environ["NCCL_DEBUG"])
    """,
    )
    manifest = _write(
        harness.root,
        "mpijob.yaml",
        f"""
        apiVersion: kubeflow.org/v1
        kind: MPIJob
        metadata:
          name: hvd-bench
          annotations:
            yardmaster.io/team: {harness.org.team_a.slug}
        spec:
          slotsPerWorker: 1
          runPolicy:
            cleanPodPolicy: Running
          mpiReplicaSpecs:
            Launcher:
              replicas: 1
              template:
                spec:
                  containers:
                  - name: launcher
                    command: [mpirun, --allow-run-as-root, -np, "2", -x, NCCL_DEBUG=INFO, -bind-to, none, {PY}, {program}]
            Worker:
              replicas: 2
              template:
                spec:
                  containers:
                  - name: worker
                    resources:
                      limits:
                        nvidia.com/gpu: 1
    """,
    )
    # No image: these agents run on the host (the image path is tests/containers/').
    process = yard.start("submit", str(manifest), "--wait")
    job = _submitted(harness, process)
    harness.place(job)
    code, _, errs = _finish(process)
    assert code == 0, errs
    assert "mpirun is not run" in errs
    for rank in (0, 1):
        text = yard.run("logs", str(job.pk), "--rank", str(rank), check=True).stdout
        assert f"worker {rank} of 2 debug INFO" in text


def test_an_sbatch_script_runs_with_slurm_variables_srun_and_its_output_file(harness: Harness, yard: Yard) -> None:
    _one_agent(harness)
    out_dir = harness.root / "slurm-out"
    out_dir.mkdir()
    script = _write(
        harness.root,
        "train.sbatch",
        f"""
        #!/bin/bash
        #SBATCH --job-name=slurm-train
        #SBATCH --account={harness.org.team_a.slug}
        #SBATCH --partition=h100
        #SBATCH --qos=spot
        #SBATCH --nodes=1
        #SBATCH --ntasks-per-node=2
        #SBATCH --gres=gpu:2
        #SBATCH --time=00:10:00
        #SBATCH --output={out_dir}/%x-%j.out
        #SBATCH --mail-type=ALL

        echo "job $SLURM_JOB_ID on $SLURM_NNODES node(s), $SLURM_GPUS_ON_NODE GPUs"
        srun --label {PY} -c "import os; print('task', os.environ['SLURM_PROCID'], 'local', os.environ['SLURM_LOCALID'])"
    """,
    )
    process = yard.start("sbatch", str(script), "--wait")
    job = _submitted(harness, process)
    assert (job.tier, job.gpus_per_replica, job.time_limit_s) == (3, 2, 600)
    harness.place(job)
    code, _, errs = _finish(process)
    assert code == 0, errs
    assert "--mail-type=ALL (line 11) is ignored" in errs
    logs = yard.run("logs", str(job.pk), check=True).stdout
    assert f"job {job.pk} on 1 node(s), 2 GPUs" in logs
    assert "task 0 local 0" in logs and "task 1 local 1" in logs
    written = (out_dir / f"slurm-train-{job.pk}.out").read_text()
    assert "task 1 local 1" in written


def test_cancelled_while_waiting_exits_123(harness: Harness, yard: Yard) -> None:
    _one_agent(harness)
    sleeper = "import time; print('started', flush=True); time.sleep(120)"
    process = yard.start("submit", "--name", "sleeper", "--gpus", "1", "--", PY, "-c", sleeper)
    code, out, errs = _finish(process)
    assert code == 0, errs
    job_id = int(out.split("Submitted job ")[1].split()[0])
    waiting = yard.start("wait", str(job_id))
    harness.place(Job.objects.get(pk=job_id))
    harness.job_in(Job.objects.get(pk=job_id), JobState.RUNNING)
    following = yard.start("logs", str(job_id), "-f")
    cancelled = yard.run("cancel", str(job_id), check=True)
    assert "told to stop" in cancelled.stdout
    code, _, errs = _finish(waiting)
    assert code == 123, errs
    assert "was cancelled" in errs
    # `logs -f` followed the running job and ended with it
    code, followed, errs = _finish(following)
    assert code == 0 and "started" in followed, errs


def test_a_job_past_its_time_limit_exits_124(harness: Harness, yard: Yard) -> None:
    _one_agent(harness)
    process = yard.start("submit", "--time", "60", "--wait", "--", PY, "-c", "import time; time.sleep(120)")
    job = _submitted(harness, process)
    harness.place(job)
    harness.job_in(job, JobState.RUNNING)
    # The beat's cycle a little over a minute later: it orders the TIME_LIMIT stop.
    result = run_cycle_once(now=timezone.now() + timedelta(seconds=61))
    assert job.pk in result.time_limited
    code, _, errs = _finish(process)
    assert code == 124, errs
    assert "reached its time limit of 60 s" in errs


def test_a_preempted_job_exits_122_with_exit_on_preempt_and_is_left_to_resume(harness: Harness, yard: Yard) -> None:
    _one_agent(harness)
    process = yard.start("submit", "--tier", "3", "--wait", "--exit-on-preempt", "--", PY, "-c", "import time; time.sleep(120)")
    job = _submitted(harness, process)
    harness.place(job)
    job = harness.job_in(job, JobState.RUNNING)
    job_request_stop(job=job, reason="PREEMPTED", grace_s=2, actor_label="test")
    code, _, errs = _finish(process)
    assert code == 122, errs
    assert "was preempted" in errs
    requeued = harness.job_in(job, JobState.PENDING)
    assert requeued.attempt == 2


def test_a_job_that_can_never_run_exits_121_and_says_why(harness: Harness, yard: Yard) -> None:
    done = yard.run("submit", "--gpu-type", "B200", "--wait", "--", "true")
    assert done.returncode == 121, done.stderr
    assert "This job can never run" in done.stderr and "B200" in done.stderr
    assert not Job.objects.exists()


def test_test_only_prints_the_translation_and_verdict_and_submits_nothing(harness: Harness, yard: Yard) -> None:
    make_cluster(nodes=2)
    script = _write(
        harness.root,
        "big.sbatch",
        f"""
        #!/bin/bash
        #SBATCH --account={harness.org.team_a.slug}
        #SBATCH --nodes=2
        #SBATCH --gpus-per-node=8
        srun hostname
    """,
    )
    done = yard.run("sbatch", str(script), "--test-only", check=True)
    assert "replicas: 2" in done.stdout and "gpus_per_replica: 8" in done.stdout and "name: big" in done.stdout
    assert "Admission: fits now on 2 nodes" in done.stdout
    assert "srun hostname" in done.stdout
    assert not Job.objects.exists()


def test_ls_show_quota_and_the_api_errors_as_the_api_states_them(harness: Harness, yard: Yard) -> None:
    make_cluster(nodes=1)  # nodes without agents: the job is admitted and stays pending (no cycle runs)
    submitted = yard.run("submit", "--name", "queued", "--leaf-locality", "required", "--json", "--", "true", check=True)
    job = json.loads(submitted.stdout)
    assert Job.objects.get(pk=job["id"]).leaf_locality == "required"
    listed = yard.run("ls", check=True).stdout
    assert "queued" in listed and "PENDING" in listed
    assert [j["id"] for j in json.loads(yard.run("ls", "--json", check=True).stdout)] == [job["id"]]
    assert "queued" in yard.run("show", str(job["id"]), check=True).stdout
    quota = json.loads(yard.run("quota", "--json", check=True).stdout)
    assert quota["teams"][0]["team"]["slug"] == harness.org.team_a.slug
    assert "FAIR-SHARE PLACE" in yard.run("quota", check=True).stdout
    missing = yard.run("show", "987654")
    assert missing.returncode == 1 and "Not found: no such object, or not one you can see" in missing.stderr
    as_json = yard.run("show", "987654", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["code"] == "not_found"
    bad = yard.run("submit", "--team", harness.org.team_c.slug, "--", "true")
    assert bad.returncode == 1 and "team: No such team, or not one you may submit to" in bad.stderr
    rerun = yard.run("rerun", str(job["id"]), "--json", check=True)
    assert json.loads(rerun.stdout)["id"] != job["id"]
    assert Job.objects.get(pk=json.loads(rerun.stdout)["id"]).leaf_locality == "required"
    report = yard.run("report", "--csv", check=True)
    assert report.stdout.splitlines()[0].startswith("month,unit_id,unit")
    table = yard.run("report", check=True).stdout
    assert "USED GPU-H" in table and harness.org.team_a.name in table


def test_login_keeps_the_url_and_token_private_and_whoami_uses_them(harness: Harness, yard: Yard) -> None:
    env = {k: v for k, v in yard.env().items() if k not in ("YARD_URL", "YARD_TOKEN")}
    login = subprocess.run(
        [*_yard(), "login", "--url", yard.url, "--token", yard.token], env=env, capture_output=True, text=True, timeout=60
    )
    assert login.returncode == 0, login.stderr
    config = yard.home / "yard" / "config.toml"
    assert config.stat().st_mode & 0o777 == 0o600
    whoami = subprocess.run([*_yard(), "whoami"], env=env, capture_output=True, text=True, timeout=60)
    assert whoami.returncode == 0 and whoami.stdout.startswith("alice")
    bad = subprocess.run([*_yard(), "login", "--url", yard.url, "--token", "ym_wrong"], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 1 and "Invalid, revoked or expired token" in bad.stderr


def _yard() -> list[str]:
    from tests.cli.conftest import yard_executable

    return [yard_executable()]
