"""POST /api/v1/jobs with job files as they are (YAML, shell script, or JSON with a format), and the
endpoints the CLI added: rerun and my quota. Real PostgreSQL, the DRF test client, tokens as CI has."""

from __future__ import annotations

import json

import pytest

from scheduling.models import Job
from scheduling.states import JobState
from tenants.services import membership_set
from tests.api.conftest import token_client
from tests.cli.conftest import FILES, GOLDEN
from tests.factories import make_cluster, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes(db):
    return make_cluster(nodes=8, leaves_per_spine=2)


def _post(client, body: str | bytes, content_type: str, path: str = "/api/v1/jobs"):
    return client.generic("POST", path, body, content_type=content_type)


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("pytorchjob-simple.yaml", "application/yaml"),
        ("pytorchjob-env-args.yaml", "application/x-yaml"),
        ("mpijob-horovod.yaml", "text/yaml"),
        ("yardmaster-job.yaml", "application/yaml"),
        ("sbatch-train.sh", "text/x-shellscript"),
    ],
)
def test_a_job_file_posted_as_it_is_becomes_the_job_its_golden_translation_says(cast, nodes, name, content_type):
    response = _post(token_client(cast.ann_token), (FILES / name).read_bytes(), content_type)
    assert response.status_code == 201, response.json()
    body = response.json()
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    job = Job.objects.get(pk=body["id"])
    for field, value in golden["fields"].items():
        got = job.team.slug if field == "team" else getattr(job, field)
        assert got == ({k: str(v) for k, v in value.items()} if field == "env" else value), field
    assert body["translated_from"] == golden["source"]
    assert body["warnings"] == golden["warnings"]


def test_the_format_field_carries_a_file_in_json(cast, nodes):
    script = (FILES / "sbatch-train.sh").read_text()
    response = token_client(cast.ci_token).post("/api/v1/jobs", {"format": "slurm", "file": script}, format="json")
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).replicas == 2


def test_a_manifest_posted_as_json_is_translated_as_kubectl_would_send_it(cast, nodes):
    import yaml

    manifest = yaml.safe_load((FILES / "pytorchjob-simple.yaml").read_text())
    response = token_client(cast.ann_token).post("/api/v1/jobs", manifest, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["translated_from"] == "pytorchjob"


def test_a_field_that_cannot_be_honoured_is_a_400_naming_it_and_makes_no_job(cast, nodes):
    text = (FILES / "pytorchjob-simple.yaml").read_text().replace("restartPolicy: Never", "restartPolicy: Always")
    response = _post(token_client(cast.ann_token), text, "application/yaml")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert "spec.pytorchReplicaSpecs.Master.restartPolicy" in body["fields"]
    assert body["message"].startswith("spec.pytorchReplicaSpecs.Master.restartPolicy: Always cannot be honoured")
    assert Job.objects.count() == 0


def test_the_apis_own_validation_says_where_in_the_file_the_bad_value_came_from(cast, nodes):
    script = "#!/bin/bash\n#SBATCH --account=team-a\n#SBATCH --gpus-per-node=32\nhostname\n"
    body = _post(token_client(cast.ann_token), script, "text/x-shellscript").json()
    assert body["fields"]["gpus_per_replica"] == [
        "Ensure this value is less than or equal to 16. (from #SBATCH --gpus-per-node=32 (line 3))"
    ]


def test_a_file_without_a_team_uses_the_only_team_of_its_submitter(cast, nodes):
    script = "#!/bin/bash\n#SBATCH --gpus-per-node=1\nhostname\n"
    response = _post(token_client(cast.ann_token), script, "text/x-shellscript")
    assert response.status_code == 201, response.json()
    assert response.json()["team"]["slug"] == cast.org.team_a.slug


def test_a_file_without_a_team_from_someone_in_two_teams_is_told_how_to_name_one(cast, nodes):
    membership_set(actor=None, user=cast.ann, unit=cast.org.team_b, role="member")
    script = "#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --gpus-per-node=1\nhostname\n"
    body = _post(token_client(cast.ann_token), script, "text/x-shellscript").json()
    assert "#SBATCH --account=TEAM" in body["fields"]["team"][0]
    with_param = _post(token_client(cast.ann_token), script, "text/x-shellscript", path="/api/v1/jobs?team=team-b")
    assert with_param.status_code == 201 and with_param.json()["team"]["slug"] == "team-b"


def test_another_tenants_team_in_a_file_is_refused_like_a_missing_one(cast, nodes):
    script = "#!/bin/bash\n#SBATCH --account={}\n#SBATCH --gpus-per-node=1\nhostname\n"
    theirs = _post(token_client(cast.ann_token), script.format(cast.org.team_c.slug), "text/x-shellscript").json()
    missing = _post(token_client(cast.ann_token), script.format("no-such-team"), "text/x-shellscript").json()
    assert theirs["fields"]["team"] == missing["fields"]["team"]
    assert Job.objects.count() == 0


def test_a_job_that_can_never_run_has_its_own_error_code(cast, nodes):
    text = (FILES / "yardmaster-job.yaml").read_text().replace("gpu_type: H100", "gpu_type: B200")
    body = _post(token_client(cast.ann_token), text, "application/yaml").json()
    assert body["code"] == "never_runnable" and body["message"].startswith("This job can never run")
    plain = token_client(cast.ann_token).post(
        "/api/v1/jobs", {"name": "x", "team": "team-a", "gpu_type": "B200", "command": "true"}, format="json"
    )
    assert (plain.status_code, plain.json()["code"]) == (400, "never_runnable")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b"\xff\xfe not utf-8", "application/yaml"), (b"", "application/yaml"), (b"", "text/x-shellscript"),
     (b"[1, 2", "text/yaml"), (b"#!/bin/bash\n#SBATCH --nodes='unclosed\n", "text/x-sh")],
)  # fmt: skip
def test_unreadable_bodies_are_a_400_never_a_500(cast, nodes, body, content_type):
    response = _post(token_client(cast.ann_token), body, content_type)
    assert response.status_code == 400, response.content


def test_rerun_submits_a_copy_as_the_caller(cast, nodes):
    old = make_job(team=cast.org.team_a, user=cast.amy, state=JobState.FAILED, command="python train.py")
    response = token_client(cast.ann_token).post(f"/api/v1/jobs/{old.pk}/rerun")
    assert response.status_code == 201, response.json()
    new = Job.objects.get(pk=response.json()["id"])
    assert (new.copied_from_id, new.user, new.command, new.state) == (old.pk, cast.ann, "python train.py", JobState.PENDING)


def test_my_quota_lists_my_teams_with_their_fair_share_standing(cast, nodes):
    body = token_client(cast.ann_token).get("/api/v1/me/quota").json()
    (team,) = body["teams"]
    assert team["team"]["slug"] == cast.org.team_a.slug
    assert team["quotas"] == [{"gpu_type": "H100", "guaranteed": 16, "limit": 32, "used": 0, "borrowed": 0, "reclaimable": 0}]
    assert team["fair_share"]["teams"] == 3 and 1 <= team["fair_share"]["rank"] <= 3
    assert body["half_life_days"] == pytest.approx(7.0)


def test_my_quota_refuses_a_team_that_is_not_mine(cast, nodes):
    response = token_client(cast.ann_token).get("/api/v1/me/quota", {"team": cast.org.team_c.slug})
    assert response.status_code == 400 and "team" in response.json()["fields"]


def test_the_schema_documents_the_job_file_formats(cast):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    operation = schema["paths"]["/api/v1/jobs"]["post"]
    assert {"application/json", "application/yaml", "text/x-shellscript"} <= set(operation["requestBody"]["content"])
    one_of = schema["components"]["schemas"]["JobSubmitRequest"]["oneOf"]
    assert {"#/components/schemas/JobSubmitIn", "#/components/schemas/JobFileIn"} == {o["$ref"] for o in one_of}
    assert "slurm" in json.dumps(schema["components"]["schemas"]["JobFileIn"])


def test_preview_gives_the_full_verdict_and_the_translation_and_submits_nothing(cast, nodes):
    script = (FILES / "sbatch-train.sh").read_text()
    response = _post(token_client(cast.ann_token), script, "text/x-shellscript", path="/api/v1/jobs/preview")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["ok"] and body["fits_now"] and body["verdict"].startswith("fits now on 2 nodes")
    assert (body["job"]["replicas"], body["job"]["gpus_per_replica"], body["job"]["team"]) == (2, 8, "team-a")
    assert body["translated_from"] == "slurm" and body["warnings"]
    assert Job.objects.count() == 0


def test_preview_says_why_a_job_can_never_run(cast, nodes):
    body = {"name": "x", "team": "team-a", "replicas": 64, "gpus_per_replica": 8, "command": "true"}
    response = token_client(cast.ann_token).post("/api/v1/jobs/preview", body, format="json")
    body = response.json()
    assert (response.status_code, body["ok"], body["fits_now"]) == (200, False, False)
    assert "64" in body["verdict"] or "nodes" in body["verdict"]
