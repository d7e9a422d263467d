"""REST API v1 /services: the happy paths, bad input that says what to change, who may do what."""

from __future__ import annotations

import pytest

from scheduling.models import RolloutState, Service, ServiceToken
from scheduling.serving.services import token_hash
from tests.api.conftest import session_client, token_client
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

BODY = {"name": "chat", "team": "team-a", "gpu_type": "H100", "command": "exec python -m http.server $PORT", "replicas": 2}


@pytest.fixture
def cluster(db):
    return make_cluster(nodes=4)


def test_create_read_scale_roll_out_and_roll_back(cast, cluster):
    client = token_client(cast.ann_token)
    created = client.post("/api/v1/services", BODY, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["tier"], body["replicas"], body["revision"], body["url"]) == (1, 2, 1, "/services/team-a/chat/")
    sid = body["id"]
    listed = client.get("/api/v1/services", {"team": "team-a", "name": "chat"}).json()
    assert [s["id"] for s in listed] == [sid]
    detail = client.get(f"/api/v1/services/{sid}").json()
    assert detail["stats"]["requests"] == 0 and detail["replica_list"] == []
    scaled = client.post(f"/api/v1/services/{sid}/scale", {"replicas": 3}, format="json").json()
    assert scaled["replicas"] == 3 and scaled["revision"] == 1, "scaling is not a new revision"
    rolled = client.post(f"/api/v1/services/{sid}/rollout", {"env": {"MODEL": "v2"}}, format="json").json()
    assert rolled["revision"] == 2 and rolled["env"] == {"MODEL": "v2"} and rolled["rollout"]["state"] == RolloutState.PROGRESSING
    back = client.post(f"/api/v1/services/{sid}/rollout", {"to_revision": 1}, format="json").json()
    assert back["revision"] == 3 and back["env"] == {}, "a rollback is revision 1's release as revision 3"
    gone = client.delete(f"/api/v1/services/{sid}")
    assert gone.status_code == 202 and gone.json()["state"] == "deleting"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Not A Slug"}, "name"),
        ({"command": ""}, "command"),
        ({"replicas": 5, "max_replicas": 3}, "replicas"),
        ({"gpu_type": "B300"}, "gpu_type"),
        ({"readiness_path": "health"}, "readiness_path"),
        ({"gpus_per_node": 64}, "gpus_per_node"),
        ({"tier": 4}, "tier"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(cast, cluster, change, field):
    response = token_client(cast.ann_token).post("/api/v1/services", {**BODY, **change}, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["fields"], response.json()
    assert not Service.objects.exists()


def test_a_second_service_of_the_same_name_in_the_team_is_refused(cast, cluster):
    client = token_client(cast.ann_token)
    assert client.post("/api/v1/services", BODY, format="json").status_code == 201
    again = client.post("/api/v1/services", BODY, format="json")
    assert again.status_code == 400 and "already" in str(again.json()["fields"]["name"])


def test_a_token_is_shown_once_kept_as_a_hash_and_revocable(cast, cluster):
    client = token_client(cast.ann_token)
    sid = client.post("/api/v1/services", BODY, format="json").json()["id"]
    made = client.post(f"/api/v1/services/{sid}/tokens", {"name": "frontend"}, format="json").json()
    raw = made["token"]
    stored = ServiceToken.objects.get(pk=made["id"])
    assert stored.token_hash == token_hash(raw) and raw not in str(ServiceToken.objects.values())
    listed = client.get(f"/api/v1/services/{sid}/tokens").json()
    assert [t["prefix"] for t in listed] == [raw[:12]] and "token" not in listed[0]
    revoked = client.delete(f"/api/v1/services/{sid}/tokens/{made['id']}").json()
    assert revoked["revoked_at"] is not None


def test_a_team_member_may_change_it_another_team_gets_404(cast, cluster):
    sid = token_client(cast.ann_token).post("/api/v1/services", BODY, format="json").json()["id"]
    colleague = session_client(cast.amy)
    assert colleague.post(f"/api/v1/services/{sid}/scale", {"replicas": 1}, format="json").status_code == 200
    stranger = token_client(cast.bea_token)
    assert stranger.get(f"/api/v1/services/{sid}").status_code == 404
    assert stranger.post(f"/api/v1/services/{sid}/scale", {"replicas": 4}, format="json").status_code == 404
    assert Service.objects.get(pk=sid).replicas == 1
