"""`yard submit --image --container-mounts --container-workdir` against a live portal: the job keeps them.

No agent runs these jobs (the nodes have none): the container run itself is tests/containers/'."""

from __future__ import annotations

import json

import pytest

from scheduling.models import Job
from tests.cli.conftest import Yard
from tests.e2e.conftest import Harness
from tests.factories import make_cluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
NGC = "nvcr.io/nvidia/pytorch:24.05-py3"


def test_submit_with_an_image_mounts_and_a_workdir(harness: Harness, yard: Yard) -> None:
    make_cluster(nodes=1)
    done = yard.run(
        "submit", "--name", "ctr", "--image", NGC, "--container-mounts", "/data:/data:ro,/scratch",
        "--container-workdir", "/workspace", "--json", "--", "python", "train.py",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = Job.objects.get(pk=json.loads(done.stdout)["id"])
    assert (job.image, job.container_workdir) == (NGC, "/workspace")
    assert job.container_mounts == [
        {"source": "/data", "target": "/data", "readonly": True},
        {"source": "/scratch", "target": "/scratch", "readonly": False},
    ]


def test_submit_takes_pyxiss_container_image_spelling(harness: Harness, yard: Yard) -> None:
    make_cluster(nodes=1)
    done = yard.run("submit", "--container-image", "python:3.12", "--json", "--", "python", "-V")
    assert done.returncode == 0, done.stderr
    assert Job.objects.get(pk=json.loads(done.stdout)["id"]).image == "docker.io/library/python:3.12"


def test_a_bad_mount_is_refused_saying_why_and_makes_no_job(harness: Harness, yard: Yard) -> None:
    make_cluster(nodes=1)
    done = yard.run("submit", "--image", NGC, "--container-mounts", "data:/data", "--", "true")
    assert done.returncode != 0
    assert "must be an absolute path" in done.stderr
    assert not Job.objects.exists()


def test_image_flags_with_a_job_file_are_a_usage_error(harness: Harness, yard: Yard) -> None:
    job_file = harness.root / "job.yaml"
    job_file.write_text(f"name: x\nteam: {harness.org.team_a.slug}\ncommand: 'true'\n")
    done = yard.run("submit", str(job_file), "--image", NGC)
    assert done.returncode == 2
    assert "--image: with a job file, say it in the file" in done.stderr


def test_notebook_launch_takes_an_image(harness: Harness, yard: Yard) -> None:
    make_cluster(nodes=1)
    done = yard.run("notebook", "launch", "--image", "jupyter/base-notebook:2024", "--json")
    assert done.returncode == 0, done.stderr
    job = Job.objects.get(pk=json.loads(done.stdout)["id"])
    assert (job.kind, job.image) == ("notebook", "docker.io/jupyter/base-notebook:2024")
