"""Golden translations of job files in the shapes the Kubeflow and Slurm documentation show, and the
refusals: a field that cannot be honoured is a 400 naming it; what is ignored is a warning naming it.

Set YARD_UPDATE_GOLDEN=1 to rewrite tests/cli/golden/ after a deliberate change, and read the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling import jobfiles
from scheduling.jobfiles import JobFileInvalid
from tests.cli.conftest import FILES, GOLDEN

GPU_TYPES = ("A100", "H100")
SOURCES = sorted(p.name for p in FILES.iterdir())


def _translated(name: str) -> dict[str, object]:
    text = (FILES / name).read_text()
    fmt = "slurm" if name.endswith(".sh") else "auto"
    t = jobfiles.translate(fmt=fmt, text=text, gpu_types=GPU_TYPES)
    return {"source": t.source, "fields": t.fields, "warnings": t.warnings}


@pytest.mark.parametrize("name", SOURCES)
def test_each_job_file_translates_as_its_golden_copy_says(name: str) -> None:
    golden = GOLDEN / f"{name}.json"
    got = _translated(name)
    if os.environ.get("YARD_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert golden.exists(), f"no golden copy for {name}: run with YARD_UPDATE_GOLDEN=1 and review it"
    assert got == json.loads(golden.read_text())


def _refusal(text: str, *, fmt: str = "auto") -> dict[str, list[str]]:
    with pytest.raises(JobFileInvalid) as err:
        jobfiles.translate(fmt=fmt, text=text, gpu_types=GPU_TYPES)
    return err.value.message_dict


def _pytorchjob(container_extra: str = "", pod_extra: str = "", spec_extra: str = "", restart: str = "Never") -> str:
    return f"""
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: t, labels: {{yardmaster.io/team: team-a}}}}
spec:
{spec_extra}
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      restartPolicy: {restart}
      template:
        spec:
{pod_extra}
          containers:
            - name: pytorch
              image: pytorch:2
              command: [python3, train.py]
              resources: {{limits: {{nvidia.com/gpu: 2}}}}
{container_extra}
"""


def test_the_pytorchjob_helper_itself_translates() -> None:
    t = jobfiles.translate(fmt="auto", text=_pytorchjob(), gpu_types=GPU_TYPES)
    assert (t.fields["replicas"], t.fields["gpus_per_replica"], t.fields["team"]) == (2, 2, "team-a")


@pytest.mark.parametrize(
    ("manifest", "place", "words"),
    [
        (_pytorchjob(restart="Always"), "spec.pytorchReplicaSpecs.Worker.restartPolicy", "it is not started again"),
        (_pytorchjob(pod_extra="          volumes: [{name: data, persistentVolumeClaim: {claimName: d}}]"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.volumes", "volumes cannot be mounted"),
        (_pytorchjob(pod_extra="          nodeSelector: {gpu: h100}"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelector", "yardmaster.io/gpu-type"),
        (_pytorchjob(container_extra="              env: [{name: KEY, valueFrom: {secretKeyRef: {name: s, key: k}}}]"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env[0].valueFrom", "Secrets"),
        (_pytorchjob(container_extra="              envFrom: [{configMapRef: {name: c}}]"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].envFrom", "ConfigMaps"),
        (_pytorchjob(spec_extra="  elasticPolicy: {minReplicas: 1, maxReplicas: 4}"), "spec.elasticPolicy", "fixed size"),
        (_pytorchjob(spec_extra="  runPolicy: {backoffLimit: 3}"), "spec.runPolicy.backoffLimit", "without restartPolicy"),
        (_pytorchjob(spec_extra="  runPolicy: {schedulingPolicy: {minAvailable: 1}}"),
         "spec.runPolicy.schedulingPolicy.minAvailable", "all or nothing"),
        (_pytorchjob(pod_extra="          priorityClassName: high"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.priorityClassName", "yardmaster.io/tier"),
        (_pytorchjob(pod_extra="          initContainers: [{name: fetch, image: busybox}]"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.initContainers", "init containers"),
        (_pytorchjob(container_extra="              shmSize: 1Gi"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].shmSize", "not a field Yardmaster knows"),
        (_pytorchjob().replace("nvidia.com/gpu: 2", "amd.com/gpu: 2"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits.amd.com/gpu", "nvidia.com/gpu"),
        (_pytorchjob().replace("command: [python3, train.py]", "args: [train.py]"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].command", "entrypoint"),
        (_pytorchjob().replace("yardmaster.io/team", "yardmaster.io/teem"), "metadata.labels.yardmaster.io/teem", "unknown"),
        (_pytorchjob().replace("kind: PyTorchJob", "kind: TFJob"), "kind", "PyTorchJob and MPIJob"),
        (_pytorchjob().replace("kubeflow.org/v1", "kubeflow.org/v2beta1"), "apiVersion", "kubeflow.org/v1"),
    ],
)  # fmt: skip
def test_a_kubeflow_field_that_cannot_be_honoured_is_refused_by_name(manifest: str, place: str, words: str) -> None:
    errors = _refusal(manifest)
    assert place in errors, errors
    assert words in " ".join(errors[place])


def test_master_and_worker_that_differ_are_refused_naming_the_worker_field() -> None:
    manifest = _pytorchjob().replace("    Worker:", "    Master:\n      replicas: 1\n      restartPolicy: Never\n"
                                     "      template:\n        spec:\n          containers:\n            - name: m\n"
                                     "              image: pytorch:2\n              command: [python3, other.py]\n"
                                     "              resources: {limits: {nvidia.com/gpu: 2}}\n    Worker:")  # fmt: skip
    errors = _refusal(manifest)
    assert "same command" in " ".join(errors["spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].command"])


def _mpijob(launcher_command: str, slots: int = 1) -> str:
    return f"""
apiVersion: kubeflow.org/v1
kind: MPIJob
metadata: {{name: m}}
spec:
  slotsPerWorker: {slots}
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers: [{{name: l, image: hvd, command: {launcher_command}}}]
    Worker:
      replicas: 2
      template:
        spec:
          containers: [{{name: w, image: hvd, resources: {{limits: {{nvidia.com/gpu: 4}}}}}}]
"""


def test_mpirun_np_must_match_the_workers() -> None:
    errors = _refusal(_mpijob("[mpirun, -np, '8', python, train.py]"))
    assert "use -np 2" in " ".join(errors["spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command"])


def test_more_than_one_slot_per_worker_is_refused_with_what_to_do() -> None:
    errors = _refusal(_mpijob("[mpirun, -np, '2', python, train.py]", slots=4))
    assert "torchrun --nproc-per-node" in " ".join(errors["spec.slotsPerWorker"])


def test_an_unknown_mpirun_option_is_refused_rather_than_guessed() -> None:
    errors = _refusal(_mpijob("[mpirun, --frobnicate, '3', python, train.py]"))
    assert "--frobnicate" in " ".join(errors["spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command"])


def test_a_launcher_without_mpirun_runs_its_program_on_every_worker() -> None:
    t = jobfiles.translate(fmt="auto", text=_mpijob("[python3, gloo_train.py]"), gpu_types=GPU_TYPES)
    assert t.fields["command"].endswith("exec python3 gloo_train.py")
    assert (t.fields["replicas"], t.fields["gpus_per_replica"]) == (2, 4)


SBATCH_HEAD = "#!/bin/bash\n#SBATCH --account=team-a\n#SBATCH --gpus-per-node=2\n"


@pytest.mark.parametrize(
    ("directive", "words"),
    [
        ("--dependency=afterok:12", "dependencies"),
        ("--nodelist=gpu-[01-04]", "cannot name its nodes"),
        ("--constraint=ib", "--partition"),
        ("--no-requeue", "always requeues"),
        ("--begin=now+1hour", "delayed start"),
        ("--nodes=2-4", "fixed size"),
        ("--partition=v100", "partitions here are GPU types (A100, H100)"),
        ("--qos=urgent", "production (tier 1)"),
        ("--time=UNLIMITED", "at most 30 days"),
        ("--time=soon", "HH:MM:SS"),
        ("--gres=gpu:2,license:matlab:1", "GPUs only"),
        ("--output=out-%b.log", "%b"),
        ("--ntasks=8", "give --nodes"),
    ],
)
def test_a_directive_whose_loss_would_change_the_result_is_refused_by_name(directive: str, words: str) -> None:
    errors = _refusal(SBATCH_HEAD + f"#SBATCH {directive}\nsrun hostname\n", fmt="slurm")
    joined = " ".join(f"{k} {' '.join(v)}" for k, v in errors.items())
    assert words in joined, errors
    assert directive.split("=")[0] in joined


def test_unknown_and_ignored_directives_are_warnings_that_name_them() -> None:
    t = jobfiles.translate(fmt="slurm", text=SBATCH_HEAD + "#SBATCH --frobnicate=7\n#SBATCH --hint=compute_bound\nhostname\n")
    assert any("--frobnicate=7" in w and "not an sbatch option" in w for w in t.warnings)
    assert any("--hint=compute_bound" in w and "ignored" in w for w in t.warnings)


@pytest.mark.parametrize(
    "directives,cpus,memory_mb",
    [
        ("#SBATCH --cpus-per-task=6\n#SBATCH --ntasks-per-node=4\n#SBATCH --mem=64G\n", 24, 65536),
        ("#SBATCH --cpus-per-gpu=10\n#SBATCH --mem-per-gpu=8000\n", 20, 16000),
        ("#SBATCH -c 3\n#SBATCH --mem-per-cpu=2G\n", 3, 6144),
    ],
)
def test_sbatch_cores_and_memory_become_the_replicas_as_sbatch_counts_them(directives: str, cpus: int, memory_mb: int) -> None:
    head = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=2\n"
    t = jobfiles.translate(fmt="slurm", text=head + directives + "hostname\n")
    assert (t.fields["cpus_per_replica"], t.fields["memory_mb_per_replica"]) == (cpus, memory_mb)


def test_sbatch_memory_that_cannot_be_honoured_says_why() -> None:
    assert (
        "--mem=0"
        in _refusal("#!/bin/bash\n#SBATCH --gpus-per-node=1\n#SBATCH --mem-per-gpu=0\nhostname\n", fmt="slurm")[
            "#SBATCH --mem-per-gpu=0 (line 3)"
        ][0]
    )
    missing = _refusal("#!/bin/bash\n#SBATCH --gpus-per-node=1\n#SBATCH --mem-per-cpu=1G\nhostname\n", fmt="slurm")
    assert "needs --cpus-per-task" in missing["#SBATCH --mem-per-cpu=1G (line 3)"][0]


def test_a_directive_after_the_first_command_is_ignored_with_a_warning_as_sbatch_ignores_it() -> None:
    t = jobfiles.translate(fmt="slurm", text=SBATCH_HEAD + "hostname\n#SBATCH --nodes=16\n")
    assert t.fields["replicas"] == 1
    assert any("line 5" in w and "sbatch ignores it" in w for w in t.warnings)


def test_a_script_without_an_interpreter_line_is_refused_as_sbatch_refuses_it() -> None:
    errors = _refusal("#SBATCH --gpus-per-node=1\nhostname\n", fmt="slurm")
    assert "#!" in errors["line 1"][0]


@pytest.mark.parametrize("time_text,seconds", [("30", 1800), ("10:30", 630), ("2:00:00", 7200), ("1-0", 86400),
                                               ("1-2:30", 95400), ("0-0:0:90", 90)])  # fmt: skip
def test_slurm_time_formats(time_text: str, seconds: int) -> None:
    t = jobfiles.translate(fmt="slurm", text=SBATCH_HEAD + f"#SBATCH --time={time_text}\nhostname\n")
    assert t.fields["time_limit_s"] == seconds


def test_the_srun_shim_starts_ntasks_per_node_copies_with_their_slurm_ranks(tmp_path: Path) -> None:
    script = SBATCH_HEAD + "#SBATCH --ntasks-per-node=3\nsrun --label -n 3 sh -c 'echo task $SLURM_PROCID local $SLURM_LOCALID'\n"
    command = jobfiles.translate(fmt="slurm", text=script).fields["command"]
    env = {"PATH": os.environ["PATH"], "YARD_JOB_ID": "7", "WORLD_SIZE": "2", "NODE_RANK": "1", "YARD_NUM_GPUS": "2",
           "YARD_ATTEMPT": "1"}  # fmt: skip
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # --label: each line prefixed with its task's rank, as Slurm's srun does
    assert sorted(done.stdout.split("\n")[:-1]) == ["3: task 3 local 0", "4: task 4 local 1", "5: task 5 local 2"]
    unlabelled = command.replace("srun --label", "srun")
    plain = subprocess.run(["bash", "-c", unlabelled], env=env, capture_output=True, text=True, timeout=30)
    assert sorted(plain.stdout.split("\n")[:-1]) == ["task 3 local 0", "task 4 local 1", "task 5 local 2"]


def test_srun_tasks_never_splice_their_lines_together(tmp_path: Path) -> None:
    # Each task writes a line in two writes, as print() does on an unbuffered stdout: Slurm's srun
    # forwards whole lines, so must this one.
    body = (
        "import os, time\nfor i in range(50):\n"
        "    os.write(1, b'task ' + os.environ['SLURM_LOCALID'].encode()); time.sleep(0.001); os.write(1, b' line\\n')"
    )
    (tmp_path / "w.py").write_text(body)
    script = SBATCH_HEAD + f"#SBATCH --ntasks-per-node=4\nsrun {sys.executable} {tmp_path / 'w.py'}\n"
    command = jobfiles.translate(fmt="slurm", text=script).fields["command"]
    env = {"PATH": os.environ["PATH"], "YARD_JOB_ID": "7", "WORLD_SIZE": "1", "NODE_RANK": "0", "YARD_NUM_GPUS": "4",
           "YARD_ATTEMPT": "1"}  # fmt: skip
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")[:-1]
    assert len(lines) == 200 and set(lines) == {f"task {i} line" for i in range(4)}


def test_the_translated_pytorchjob_command_expands_kubernetes_references_like_the_kubelet(tmp_path: Path) -> None:
    command = _translated("pytorchjob-env-args.yaml")["fields"]["command"]  # type: ignore[index]
    command = str(command).replace("exec torchrun", "exec printf '%s\\n'").replace("cd /workspace/bert || exit 1", "")
    env = {"PATH": os.environ["PATH"], "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29512", "NODE_RANK": "0",
           "OUTPUT_DIR": "/checkpoints/bert"}  # fmt: skip
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == [
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-endpoint=10.0.0.1:29512",
        "train.py",
        "--output=/checkpoints/bert/run-$(UNDEFINED_VAR)",
        "--price=$(not a reference) it's quoted",
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: &x [1, 2]\nb: *x\n", "aliases"),
        ("name: a\n---\nname: b\n", "one job per file"),
        ("name: [unclosed\n", "Not valid YAML (line 2"),
        ("- just\n- a list\n", "mapping"),
        ("name: t\nteam: team-a\ngpu_per_replica: 8\n", "did you mean gpus_per_replica"),
        ("apiVersion: apps/v1\nkind: Deployment\n", "not a format Yardmaster reads"),
    ],
)
def test_a_bad_yaml_file_is_refused_with_what_to_change(text: str, words: str) -> None:
    errors = _refusal(text)
    assert words in " ".join(m for ms in errors.values() for m in ms), errors


def test_sbatch_switches_1_asks_for_one_leaf_switch_and_other_counts_are_weighed() -> None:
    one = jobfiles.translate(fmt="slurm", text=SBATCH_HEAD + "#SBATCH --switches=1\nsrun true\n")
    assert one.fields["leaf_locality"] == "required"
    bounded = jobfiles.translate(fmt="slurm", text=SBATCH_HEAD + "#SBATCH --switches=1@30:00\nsrun true\n")
    assert "leaf_locality" not in bounded.fields
    assert any("--switches" in w and "leaf_locality auto" in w for w in bounded.warnings)
    with pytest.raises(JobFileInvalid):
        jobfiles.translate(fmt="slurm", text=SBATCH_HEAD + "#SBATCH --switches=none\nsrun true\n")


def test_a_yardmaster_job_file_may_set_leaf_locality() -> None:
    text = (
        "apiVersion: yardmaster.io/v1\nname: g\nteam: team-a\nreplicas: 2\ngpus_per_replica: 8\ncommand: 'true'\n"
        "leaf_locality: preferred\n"
    )
    assert jobfiles.translate(fmt="yardmaster", text=text).fields["leaf_locality"] == "preferred"


@pytest.mark.parametrize("zero", ["0", "0G", "0m"])
def test_sbatch_mem_0_is_all_of_a_nodes_memory_no_ask_and_no_limit_said_at_submit(zero: str) -> None:
    t = jobfiles.translate(fmt="slurm", text=f"#!/bin/bash\n#SBATCH --gpus-per-node=1\n#SBATCH --mem={zero}\nhostname\n")
    assert "memory_mb_per_replica" not in t.fields
    assert "SLURM_MEM_PER_NODE=0" in t.fields["command"]
    assert [w for w in t.warnings if "all of each node's memory" in w and "no memory limit" in w]


def test_on_failure_restarts_a_failed_rank_up_to_the_backoff_limit_and_never_a_stopped_one(tmp_path: Path) -> None:
    """The restart loop itself, run: a command that exits 0 ends the rank; one stopped by Yardmaster
    (143: SIGTERM) is not started again; with backoffLimit 0 a failure is final at once. (A restart waits
    the kubelet's 10 s back-off first: the golden copies pin that part.)"""

    def run(command: str, backoff: int) -> subprocess.CompletedProcess[str]:
        manifest = _pytorchjob(restart="OnFailure", spec_extra=f"  runPolicy: {{backoffLimit: {backoff}}}").replace(
            "[python3, train.py]", json.dumps(["sh", "-c", command])
        )
        t = jobfiles.translate(fmt="auto", text=manifest)
        return subprocess.run(["bash", "-c", t.fields["command"]], capture_output=True, text=True, timeout=30, cwd=tmp_path)

    assert run("echo ran >> log; exit 0", 2).returncode == 0 and (tmp_path / "log").read_text() == "ran\n"
    assert run("echo ran >> log; exit 143", 2).returncode == 143 and (tmp_path / "log").read_text() == "ran\n" * 2
    assert run("echo ran >> log; exit 3", 0).returncode == 3 and (tmp_path / "log").read_text() == "ran\n" * 3


def test_what_a_script_needs_from_its_nodes_is_said_at_submit_line_by_line() -> None:
    body = (
        "module load cuda/12.4\n"
        "source ~/venvs/train/bin/activate\n"
        "conda activate llm\n"
        'head=$(srun -w "$node" hostname --ip-address)\n'
        "squeue -u $USER\n"
        "python /shared/train.py --data /datasets/c4.json\n"
        "python /usr/lib/python3/x.py train.py\n"
    )
    t = jobfiles.translate(fmt="slurm", text="#!/bin/bash\n#SBATCH --gpus-per-node=1\n" + body)
    said = "\n".join(t.warnings)
    assert "line 3: 'module load cuda/12.4': environment modules (module load) must be installed" in said
    assert "line 4: 'source ~/venvs/train/bin/activate': this file must exist on every node" in said
    assert "line 5: 'conda activate llm': conda and this environment must exist on every node" in said
    assert "only `srun -w NODE hostname [-i|-s]` answers for NODE" in said
    assert "line 7: 'squeue -u $USER': Slurm's other commands do not exist here" in said
    assert "line 8: /shared/train.py must exist on every node" in said and "/datasets/c4.json must exist" in said
    assert "/usr/lib" not in said and "train.py must exist" not in said.replace("/shared/train.py must exist", "")
