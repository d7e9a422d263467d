"""The REST API's one_fabric job option (and #SBATCH --segment): kept, shown and planned with."""

import pytest
from django.utils import timezone

from scheduling import jobfiles
from scheduling.jobfiles import JobFileInvalid
from scheduling.models import Job, Node
from scheduling.selectors import snapshot_build
from tests.api.conftest import job_body, token_client

pytestmark = pytest.mark.django_db

SBATCH = "#!/bin/bash\n#SBATCH --account=team-a\n#SBATCH --gpus-per-node=8\n#SBATCH --nodes=4\n"


def test_a_jobs_one_fabric_is_kept_shown_and_planned_with(cast, nodes):
    Node.objects.filter(name__in=["h100-01", "h100-02"]).update(fabric_domain="nvl72-rack-1")
    client = token_client(cast.ann_token)
    body = client.post("/api/v1/jobs", job_body(cast.org.team_a, one_fabric=True), format="json").json()
    assert body["one_fabric"] is True
    assert Job.objects.get(pk=body["id"]).one_fabric is True
    (pending,) = [p for p in snapshot_build(now=timezone.now()).pending if p.job_id == str(body["id"])]
    assert pending.one_fabric is True
    default = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json").json()
    assert default["one_fabric"] is False
    bad = client.post("/api/v1/jobs", job_body(cast.org.team_a, one_fabric="rack"), format="json")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"one_fabric"}


def test_a_one_fabric_gang_is_refused_where_no_fabric_domain_could_ever_hold_it(cast, nodes):
    response = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a, one_fabric=True), format="json")
    assert response.status_code == 400
    assert "needs one NVLink fabric domain for 2 replicas of 8 H100; the cluster has none" in response.json()["message"]


def test_sbatch_segment_of_the_whole_gang_asks_for_one_fabric_domain():
    whole = jobfiles.translate(fmt="slurm", text=SBATCH + "#SBATCH --segment=4\nsrun true\n")
    assert whole.fields["one_fabric"] is True
    parts = jobfiles.translate(fmt="slurm", text=SBATCH + "#SBATCH --segment=2\nsrun true\n")
    assert "one_fabric" not in parts.fields
    assert any("--segment" in w and "one_fabric" in w for w in parts.warnings)
    with pytest.raises(JobFileInvalid):
        jobfiles.translate(fmt="slurm", text=SBATCH + "#SBATCH --segment=rack\nsrun true\n")


def test_a_yardmaster_job_file_may_set_one_fabric():
    text = (
        "apiVersion: yardmaster.io/v1\nname: g\nteam: team-a\nreplicas: 2\ngpus_per_replica: 8\ncommand: 'true'\n"
        "one_fabric: true\n"
    )
    assert jobfiles.translate(fmt="yardmaster", text=text).fields["one_fabric"] is True
