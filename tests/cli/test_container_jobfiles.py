"""Each job-file format names the job's container image (issue 26): Yardmaster files, PyTorchJob, MPIJob, sbatch's
pyxis options on #SBATCH lines and on srun lines. Pure translations (scheduling/jobfiles); through the API:
tests/api/test_job_images.py."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from scheduling.jobfiles import JobFileInvalid, translate
from scheduling.jobfiles.common import parse_yaml

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"


def yaml(text: str) -> Any:
    return parse_yaml(textwrap.dedent(text))


def sbatch(body: str) -> str:
    return "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n" + textwrap.dedent(body).lstrip()


def test_a_yardmaster_file_names_its_image_mounts_and_workdir() -> None:
    out = translate(
        fmt="yardmaster",
        data=yaml(
            f"""
            name: t
            team: team-a
            command: python train.py
            image: {NGC}
            container_mounts: /data:/data:ro
            container_workdir: /workspace
            """
        ),
    )
    assert (out.fields["image"], out.fields["container_mounts"], out.fields["container_workdir"]) == (
        NGC,
        "/data:/data:ro",
        "/workspace",
    )


PYTORCHJOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: bert}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          imagePullSecrets: [{{name: ngc}}]
          containers:
            - name: pytorch
              image: {image}
              imagePullPolicy: IfNotPresent
              workingDir: /workspace/bert
              command: [torchrun, train.py]
              resources: {{limits: {{nvidia.com/gpu: 8}}}}
"""


def test_a_pytorchjobs_image_is_the_jobs_and_its_working_dir_the_containers() -> None:
    out = translate(fmt="pytorchjob", data=yaml(PYTORCHJOB.format(image=NGC)))
    assert out.fields["image"] == NGC
    assert out.fields["container_workdir"] == "/workspace/bert"
    assert "YARD_IMAGE" not in out.fields["env"]
    assert not [w for w in out.warnings if "recorded on the job" in w or "not pulled" in w]
    assert any("imagePullSecrets is ignored: the image is pulled with the team's registry credential" in w for w in out.warnings)
    assert any("imagePullPolicy is ignored: every launch asks the registry" in w for w in out.warnings)


def test_a_pytorchjob_with_a_bad_image_is_refused_at_its_place() -> None:
    with pytest.raises(JobFileInvalid) as caught:
        translate(fmt="pytorchjob", data=yaml(PYTORCHJOB.format(image="nvcr.io/NVIDIA/pytorch")))
    assert list(caught.value.message_dict) == ["spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image"]


MPIJOB = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: hvd}
spec:
  slotsPerWorker: 1
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
            - name: launcher
              image: horovod/horovod:0.28.1
              command: [mpirun, -np, "2", python, train.py]
    Worker:
      replicas: 2
      template:
        spec:
          containers:
            - name: worker
              image: horovod/horovod:0.28.1
              resources: {limits: {nvidia.com/gpu: 4}}
"""


def test_an_mpijobs_image_is_the_jobs() -> None:
    out = translate(fmt="mpijob", data=yaml(MPIJOB))
    assert out.fields["image"] == "docker.io/horovod/horovod:0.28.1"
    assert "YARD_IMAGE" not in out.fields["env"]


def test_sbatch_pyxis_options_on_sbatch_lines() -> None:
    script = sbatch(
        f"""
        #SBATCH --container-image={NGC}
        #SBATCH --container-mounts=/datasets:/data:ro,/scratch
        #SBATCH --container-workdir=/workspace
        #SBATCH --container-writable
        srun python train.py
        """
    )
    out = translate(fmt="slurm", text=script)
    assert out.fields["image"] == NGC
    assert out.fields["container_mounts"] == [
        {"source": "/datasets", "target": "/data", "readonly": True},
        {"source": "/scratch", "target": "/scratch", "readonly": False},
    ]
    assert out.fields["container_workdir"] == "/workspace"
    assert any("--container-writable" in w and "overlay" in w for w in out.warnings)
    assert "--container-image" in out.fields["command"]  # the srun shim skips pyxis's options with their values


def test_sbatch_pyxis_options_on_an_srun_line_with_enroots_registry_form() -> None:
    script = sbatch(
        """
        srun --container-image nvcr.io#nvidia/pytorch:24.05-py3 --container-mounts=/data:/data python train.py
        """
    )
    out = translate(fmt="slurm", text=script)
    assert out.fields["image"] == NGC
    assert out.fields["container_mounts"] == [{"source": "/data", "target": "/data", "readonly": False}]
    assert any("the whole script runs in this image" in w for w in out.warnings)


def test_two_images_in_one_script_are_refused() -> None:
    script = sbatch(
        f"""
        #SBATCH --container-image={NGC}
        srun --container-image=python:3.12 python train.py
        """
    )
    with pytest.raises(JobFileInvalid) as caught:
        translate(fmt="slurm", text=script)
    (place,) = caught.value.message_dict
    assert place.startswith("srun --container-image=python:3.12")
    assert "runs in one image" in caught.value.messages[0]


def test_mounts_without_an_image_and_a_squashfs_file_are_refused() -> None:
    with pytest.raises(JobFileInvalid) as caught:
        translate(fmt="slurm", text=sbatch("#SBATCH --container-mounts=/data\nsrun true\n"))
    assert "needs --container-image" in caught.value.messages[0]
    with pytest.raises(JobFileInvalid) as caught:
        translate(fmt="slurm", text=sbatch("#SBATCH --container-image=/shared/pytorch.sqsh\nsrun true\n"))
    assert "squashfs file cannot be used" in caught.value.messages[0]


def test_slurms_own_container_option_is_refused_pointing_at_pyxis() -> None:
    with pytest.raises(JobFileInvalid) as caught:
        translate(fmt="slurm", text=sbatch("#SBATCH --container=/bundles/x\nsrun true\n"))
    assert "--container-image" in caught.value.messages[0]


def test_a_script_without_pyxis_options_runs_on_the_host() -> None:
    assert "image" not in translate(fmt="slurm", text=sbatch("srun python train.py\n")).fields


def test_an_sbatch_line_with_enroots_escaped_registry_form() -> None:
    # pyxis's documentation escapes the "#" on #SBATCH lines, as sbatch would read the rest as a comment.
    script = sbatch("#SBATCH --container-image=nvcr.io\\#nvidia/pytorch:24.05-py3\nsrun python train.py\n")
    assert translate(fmt="slurm", text=script).fields["image"] == NGC
