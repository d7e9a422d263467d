"""Seven job files as public repositories publish them (tests/cli/realfiles/README.md): each is accepted
unchanged, its translation is pinned by a golden copy, and each batch script runs in a Slurm-like
environment as far as its own missing files allow -- `scontrol show hostnames` names the gang's nodes,
its head is a host the other nodes reach, and the Slurm variables are the task's.

Set YARD_UPDATE_GOLDEN=1 to rewrite tests/cli/realfiles/golden/ after a deliberate change, and read the diff.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from nodeagent import hostlist
from nodeagent.launch import gang_env
from scheduling import jobfiles
from scheduling.jobfiles.slurm_shims import SCONTROL_SHIM
from scheduling.models import Job, Node, Task
from tests.api.conftest import token_client
from tests.factories import make_cluster

REAL = Path(__file__).parent / "realfiles"
SOURCES = json.loads((REAL / "SOURCES.json").read_text())
NAMES = sorted(SOURCES)
SCRIPTS = [n for n in NAMES if n.endswith(".sh")]
GPU_TYPES = ("A100", "H100")
SCRIPT_MARK = "# ---- the batch script\n"


def _real_dir() -> Path:
    given = os.environ.get("YARD_REAL_JOBFILES")
    return Path(given) if given else Path(__file__).resolve().parents[2].parent / "shared" / "jobfiles" / "real"


def real_text(name: str) -> str:
    """The file as its repository has it, or a skip saying where to put it; a changed copy fails."""
    path = _real_dir() / name
    if not path.is_file():
        pytest.skip(f"{name} is not at {path}: see tests/cli/realfiles/README.md (or set YARD_REAL_JOBFILES)")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SOURCES[name]["sha256"], f"{path} is not the file SOURCES.json records"
    return data.decode()


def _translate(name: str) -> jobfiles.Translation:
    return jobfiles.translate(fmt="slurm" if name.endswith(".sh") else "auto", text=real_text(name), gpu_types=GPU_TYPES)


def _pinned(name: str) -> dict[str, object]:
    """The translation as the golden copy holds it: a batch script's command is what comes before the script."""
    t = _translate(name)
    fields = dict(t.fields)
    if name.endswith(".sh"):
        before, mark, script = fields.pop("command").partition(SCRIPT_MARK)
        assert mark and script == real_text(name), "the script must follow Yardmaster's header unchanged"
        fields["command_before_script"] = before
    return {"source": t.source, "fields": fields, "warnings": t.warnings}


@pytest.mark.parametrize("name", NAMES)
def test_each_real_job_file_translates_as_its_golden_copy_says(name: str) -> None:
    golden = REAL / "golden" / f"{name}.json"
    got = _pinned(name)
    if os.environ.get("YARD_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert golden.exists(), f"no golden copy for {name}: run with YARD_UPDATE_GOLDEN=1 and review it"
    assert got == json.loads(golden.read_text())


def test_slurm_nodes_are_replicas_and_kubeflow_restarts_are_counted() -> None:
    """What the issue saw, said plainly: --nodes=4 is four replicas of the node's share; OnFailure is a
    restart loop bounded by Kubernetes' default backoffLimit; v2beta1 and --mem=0 are accepted."""
    ddp = _translate("pytorch-examples-sbatch_run.sh").fields
    assert (ddp["replicas"], ddp["gpus_per_replica"], ddp["cpus_per_replica"]) == (4, 1, 4)
    simple = _translate("training-operator-simple.yaml")
    assert "restarts=0" in simple.fields["command"] and "-ge 6 ]" in simple.fields["command"]
    assert _translate("mpi-operator-v2beta1-pi.yaml").fields["replicas"] == 2
    lightning = _translate("lightning-submit.sh")
    assert "memory_mb_per_replica" not in lightning.fields
    assert any("--mem=0" in w and "all of each node's memory" in w for w in lightning.warnings)


# --------------------------------------------------------------------------- accepted via the API


@pytest.fixture
def nodes(db):
    built = make_cluster(nodes=8, leaves_per_spine=2)
    # accelerate's script asks 160 cores per task: nodes of the size it was written for.
    Node.objects.update(cpus=192)
    return built


@pytest.mark.django_db
@pytest.mark.parametrize("name", NAMES)
def test_each_real_job_file_posted_unchanged_becomes_its_translation(cast, nodes, name):
    body = real_text(name).encode()
    content_type = "text/x-shellscript" if name.endswith(".sh") else "application/yaml"
    response = token_client(cast.ann_token).generic("POST", "/api/v1/jobs", body, content_type=content_type)
    assert response.status_code == 201, response.json()
    t = _translate(name)
    job = Job.objects.get(pk=response.json()["id"])
    for field, value in t.fields.items():
        if field != "name" or t.origin["name"] != "sbatch's name for a script without --job-name":
            assert getattr(job, field) == ({k: str(v) for k, v in value.items()} if field == "env" else value), field
    assert response.json()["warnings"] == t.warnings


# --------------------------------------------------------------------------- the Slurm environment, run


def _stub(bin_dir: Path, name: str) -> None:
    """A program the script calls that this machine need not have: it prints what it was given."""
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "{name}[$SLURM_PROCID/$SLURM_LOCALID]: $*"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_as_task(name: str, tmp_path: Path, *, node_rank: int, nodes: list[list[str]]) -> subprocess.CompletedProcess[str]:
    """The translated job's command, under bash, with the variables the agent gives rank ``node_rank``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for program in ("accelerate", "torchrun", "python3"):
        _stub(bin_dir, program)
    spec = {"job_name": "real-job", "nodes": nodes}
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        **gang_env(spec, name="unused", address="unused"),
        "YARD_JOB_ID": "4711", "YARD_ATTEMPT": "1", "WORLD_SIZE": str(len(nodes)), "NODE_RANK": str(node_rank),
        "RANK": str(node_rank), "YARD_NUM_GPUS": "8", "MASTER_ADDR": nodes[0][1], "MASTER_PORT": "29500",
    }  # fmt: skip
    command = _translate(name).fields["command"]
    return subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)


# Simulated nodes as on the demo: names no resolver knows, all on one address.
DEMO_NODES = [[f"ym-sim-node{n}", "127.0.0.1"] for n in ("07", "08", "10", "03")]


def test_the_accelerate_script_reaches_accelerate_launch_with_the_head_node_resolved(tmp_path):
    run = _run_as_task("accelerate-submit_multinode.sh", tmp_path, node_rank=2, nodes=DEMO_NODES)
    # its own file is missing here (the warning at submit said so); the script goes on, as under Slurm;
    # --error=E-%x.%j is where its standard error went (and --output=O-%x.%j its output, too)
    assert "activateEnvironment.sh: No such file" in (tmp_path / "E-real-job.4711").read_text()
    assert "accelerate[2/0]: launch" in (tmp_path / "O-real-job.4711").read_text()
    launched = [line for line in run.stdout.splitlines() if line.startswith("accelerate[")]
    assert len(launched) == 1, run.stdout + run.stderr
    words = launched[0].split()
    assert launched[0].startswith("accelerate[2/0]: launch ")
    assert words[words.index("--num_machines") + 1] == "4" and words[words.index("--num_processes") + 1] == "16"
    assert words[words.index("--main_process_ip") + 1] == "127.0.0.1"


def test_the_ddp_tutorial_script_finds_its_head_node_address_through_srun_w(tmp_path):
    nodes = [["gpu-a01", "10.0.0.11"], ["gpu-a02", "10.0.0.12"], ["gpu-b01", "10.0.0.21"], ["gpu-b02", "10.0.0.22"]]
    run = _run_as_task("pytorch-examples-sbatch_run.sh", tmp_path, node_rank=3, nodes=nodes)
    assert "Node IP: 10.0.0.11" in run.stdout, run.stdout + run.stderr
    (launched,) = [line for line in run.stdout.splitlines() if line.startswith("torchrun[")]
    assert launched.startswith("torchrun[3/0]: --nnodes 4 --nproc_per_node 1 ")
    assert "--rdzv_endpoint 10.0.0.11:29500 /shared/examples/multinode_torchrun.py 50 10" in launched


def test_lightnings_submit_script_starts_eight_tasks_per_node_with_slurms_ranks(tmp_path):
    run = _run_as_task("lightning-submit.sh", tmp_path, node_rank=1, nodes=DEMO_NODES)
    started = sorted(line for line in run.stdout.splitlines() if line.startswith("python3["))
    assert started == sorted(f"python3[{8 + i}/{i}]: train.py" for i in range(8)), run.stdout + run.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_slurm_variables_and_scontrol_inside_each_script_task(name, tmp_path):
    """The header every translated script runs under, probed with the script's own variables."""
    t = _translate(name)
    before = t.fields["command"].partition(SCRIPT_MARK)[0]
    probe = (
        'echo "$SLURM_JOB_NODELIST|$SLURM_NNODES|$SLURM_NODEID|$SLURM_PROCID|$SLURM_LOCALID|$SLURM_NTASKS|'
        '$SLURM_JOB_NAME|$SLURM_JOB_ID|$SLURM_NTASKS_PER_NODE|$SLURM_GPUS_ON_NODE|$SLURM_SUBMIT_DIR"\n'
        "scontrol show hostnames | tr '\\n' ' '; echo\n"
        "scontrol show hostnames 'a1,b[2-3],c[08-10]' | tr '\\n' ' '; echo\n"
        "bash -c 'scontrol show job' | head -n 1\n"
    )
    env = {
        "PATH": "/usr/bin:/bin", **gang_env({"job_name": "real-job", "nodes": DEMO_NODES}, name="x", address="y"),
        "YARD_JOB_ID": "4711", "YARD_ATTEMPT": "1", "WORLD_SIZE": "4", "NODE_RANK": "2", "YARD_NUM_GPUS": "8",
    }  # fmt: skip
    run = subprocess.run(["bash", "-c", before + probe], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    variables, hostnames, expanded, job = run.stdout.splitlines()
    per_node = {"accelerate-submit_multinode.sh": 1, "pytorch-examples-sbatch_run.sh": 1, "lightning-submit.sh": 8}[name]
    assert variables.split("|") == [
        "ym-sim-node[07-08,10,03]", "4", "2", "2", "0", str(4 * per_node), "real-job", "4711",
        str(per_node), "8", str(tmp_path),
    ]  # fmt: skip
    assert hostnames.split() == ["127.0.0.1"] * 4  # the names resolve nowhere here: their addresses
    assert expanded.split() == ["a1", "b2", "b3", "c08", "c09", "c10"]
    assert job == "JobId=4711 JobName=real-job"


# --------------------------------------------------------------------------- host lists and the gang's nodes


@pytest.mark.parametrize(
    ("names", "compressed"),
    [
        (["node01", "node02", "node03", "node04"], "node[01-04]"),
        (["a1", "b2", "b3"], "a1,b[2-3]"),
        (["n1", "n3", "n2"], "n[1,3,2]"),
        (["gpu-a07"], "gpu-a07"),
        (["login", "x9", "x10"], "login,x9,x10"),
        (["r1n01", "r1n02", "r2n01"], "r1n[01-02],r2n01"),
    ],
)
def test_host_lists_compress_as_slurm_writes_them_and_expand_back(names, compressed, tmp_path):
    assert hostlist.compress(names) == compressed
    assert hostlist.expand(compressed) == names
    shim = SCONTROL_SHIM  # the shell's expansion agrees with the agent's
    run = subprocess.run(["bash", "-c", f"{shim}\n_yard_hostlist_expand '{compressed}'"], capture_output=True, text=True)
    assert run.stdout.split() == names


@pytest.mark.django_db
def test_the_heartbeat_sends_each_task_its_jobs_name_and_its_gangs_nodes_in_rank_order(cast):
    from scheduling.agent.services import gang_nodes, live_tasks_of, task_spec

    first, second, third = make_cluster(nodes=3, leaves_per_spine=1)
    Node.objects.filter(pk=third.pk).update(address="")
    job = Job.objects.create(team=cast.org.team_a, user=cast.ann, name="ddp", replicas=3, gpus_per_replica=1, command="true")
    for rank, node in enumerate((second, third, first)):
        Task.objects.create(job=job, attempt=1, rank=rank, node=node, master_addr=second.address)
    live = live_tasks_of(node=first)
    spec = task_spec(live[0], gang_nodes(live).get((job.pk, 1)))
    assert spec["job_name"] == "ddp"
    assert spec["nodes"] == [[second.name, second.address], [third.name, third.name], [first.name, first.address]]
    env = gang_env(spec, name=first.name, address=first.address)
    assert hostlist.expand(env["YARD_NODELIST"]) == [second.name, third.name, first.name]


@pytest.mark.django_db
def test_the_ddp_tutorials_four_one_gpu_tasks_are_placed_on_four_distinct_nodes(cast, nodes):
    """--nodes=4 --ntasks=4 --gpus-per-task=1: four replicas of one GPU, which one node's free GPUs
    would hold; as in Slurm they get four nodes."""
    from scheduling.cycle import run_cycle_once

    body = real_text("pytorch-examples-sbatch_run.sh").encode()
    response = token_client(cast.ann_token).generic("POST", "/api/v1/jobs", body, content_type="text/x-shellscript")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.one_per_node and job.replicas == 4
    assert job.pk in run_cycle_once().placed, Job.objects.get(pk=job.pk).pending_reason
    assert len({t.node_id for t in Task.objects.filter(job=job)}) == 4
