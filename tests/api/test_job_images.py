"""A job names a container image, its mounts and working directory through the API; bad ones are 400s saying why."""

from typing import Any

import pytest

from scheduling.models import Job
from tests.api.conftest import job_body, session_client, token_client

pytestmark = pytest.mark.django_db


def submit(cast: Any, **fields: Any) -> Any:
    return token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a, **fields), format="json")


def test_a_job_with_an_image_mounts_and_a_workdir_keeps_them_normalised(cast, nodes):
    response = submit(cast, image="pytorch/pytorch:2.3.0", container_mounts="/data:/data:ro,/scratch", container_workdir="/ws/")
    assert response.status_code == 201, response.content
    out = response.json()
    assert out["image"] == "docker.io/pytorch/pytorch:2.3.0"
    assert out["container_mounts"] == [
        {"source": "/data", "target": "/data", "readonly": True},
        {"source": "/scratch", "target": "/scratch", "readonly": False},
    ]
    assert out["container_workdir"] == "/ws"
    job = Job.objects.get(pk=out["id"])
    assert (job.image, job.container_workdir, len(job.container_mounts)) == ("docker.io/pytorch/pytorch:2.3.0", "/ws", 2)


def test_mounts_as_a_list_of_mappings(cast, nodes):
    mounts = [{"source": "/datasets/imagenet", "target": "/data", "readonly": True}]
    response = submit(cast, image="nvcr.io/nvidia/pytorch:24.05-py3", container_mounts=mounts)
    assert response.status_code == 201, response.content
    assert response.json()["container_mounts"] == mounts


def test_a_job_without_an_image_runs_on_the_host(cast, nodes):
    out = submit(cast).json()
    assert (out["image"], out["container_mounts"], out["container_workdir"]) == ("", [], "")


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"image": "nvcr.io/Bad/Name"}, "image", "is not a repository name part"),
        ({"image": "https://nvcr.io/x"}, "image", "without a scheme"),
        ({"image": "x", "container_mounts": "relative:/x"}, "container_mounts", "must be an absolute path"),
        ({"image": "x", "container_mounts": "/a/../etc:/x"}, "container_mounts", "must not contain '..'"),
        ({"image": "x", "container_workdir": "ws"}, "container_workdir", "absolute path"),
        ({"container_mounts": "/a:/b"}, "image", "need an image"),
    ],
)
def test_a_bad_container_field_is_a_400_naming_it(cast, nodes, fields, field, says):
    response = submit(cast, **fields)
    assert response.status_code == 400, response.content
    assert any(says in m for m in response.json()["fields"][field]), response.json()


def test_an_image_from_a_registry_off_the_allow_list_is_a_400_naming_the_allowed(cast, nodes, settings):
    settings.YARD = {**settings.YARD, "REGISTRY_ALLOW": ("nvcr.io", "registry.corp:5000")}
    refused = submit(cast, image="ghcr.io/me/train:1")
    assert refused.status_code == 400
    assert refused.json()["fields"]["image"] == [
        "Images may not come from ghcr.io on this cluster: the registries allowed are nvcr.io, registry.corp:5000"
    ]
    assert submit(cast, image="nvcr.io/nvidia/pytorch:24.05-py3").status_code == 201


def test_a_notebook_names_an_image_and_keeps_it_normalised(cast, nodes):
    response = token_client(cast.ann_token).post(
        "/api/v1/notebooks", {"name": "nb", "team": cast.org.team_a.slug, "image": "jupyter/base-notebook:2024"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json()["image"] == "docker.io/jupyter/base-notebook:2024"
    assert Job.objects.get(pk=response.json()["id"]).image == "docker.io/jupyter/base-notebook:2024"


def test_a_notebooks_image_off_the_allow_list_is_a_400(cast, nodes, settings):
    settings.YARD = {**settings.YARD, "REGISTRY_ALLOW": ("nvcr.io",)}
    response = token_client(cast.ann_token).post(
        "/api/v1/notebooks", {"name": "nb", "team": cast.org.team_a.slug, "image": "ghcr.io/me/lab:1"}, format="json"
    )
    assert response.status_code == 400
    assert "the registries allowed are nvcr.io" in response.json()["fields"]["image"][0]


def test_a_rerun_keeps_the_image(cast, nodes):
    first = submit(cast, image="python:3.12", container_mounts="/data").json()
    again = session_client(cast.ann).post(f"/api/v1/jobs/{first['id']}/rerun")
    assert again.status_code == 201, again.content
    assert (again.json()["image"], again.json()["container_mounts"]) == (first["image"], first["container_mounts"])


def test_the_same_idempotency_key_with_another_image_is_a_conflict(cast, nodes):
    client = token_client(cast.ann_token)
    body = job_body(cast.org.team_a, image="python:3.12")
    assert client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code == 201
    assert client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code == 200
    other = {**body, "image": "python:3.13"}
    assert client.post("/api/v1/jobs", other, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code == 409


def test_an_sbatch_script_posted_to_the_api_makes_a_job_in_its_image(cast, nodes):
    script = (
        "#!/bin/bash\n#SBATCH --gpus-per-node=8\n"
        f"#SBATCH --account={cast.org.team_a.slug}\n"
        "#SBATCH --container-image=nvcr.io/nvidia/pytorch:24.05-py3\nsrun python train.py\n"
    )
    response = token_client(cast.ann_token).post("/api/v1/jobs", script, content_type="text/x-shellscript")
    assert response.status_code == 201, response.content
    assert response.json()["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
