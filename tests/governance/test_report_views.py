"""The report page, its CSVs, the usage API and the idle-extension endpoint: happy paths, tenants, bad input."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from scheduling.models import JobKind
from scheduling.states import JobState
from tenants.models import Role
from tenants.services import token_create_personal
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import attempt, running_job

pytestmark = pytest.mark.django_db
OCT = "2026-10"


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 10, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def world():
    org = make_org()
    nodes = make_cluster(nodes=2)
    ada = make_user("ada", unit=org.team_a)
    carl = make_user("carl", unit=org.team_c)
    admin = make_user("root", unit=org.root, role=Role.CLUSTER_ADMIN)
    j1 = make_job(team=org.team_a, user=ada, name="resnet")
    attempt(j1, node=nodes[0], number=1, gpus=[0, 1], start=at(3, 10), end=at(3, 13))
    j2 = make_job(team=org.team_c, user=carl, name="ranker")
    attempt(j2, node=nodes[1], number=1, gpus=[0], start=at(4, 0), end=at(4, 1, 30), borrowed=True)
    return org, nodes, ada, carl, admin


def _csv(response) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_report_page_shows_the_whole_tree_to_a_cluster_admin(client, world):
    *_, admin = world
    client.force_login(admin)
    response = client.get(reverse("reports"), {"month": OCT})
    body = response.content.decode()
    assert response.status_code == 200
    assert all(name in body for name in ("Research", "Vision", "team-a", "Products", "team-c", "<svg"))


def test_report_page_shows_a_member_only_their_team(client, world):
    _, _, ada, *_ = world
    client.force_login(ada)
    body = client.get(reverse("reports"), {"month": OCT}).content.decode()
    assert "team-a" in body and "team-c" not in body and "Products" not in body


def test_report_page_answers_404_for_another_tenants_unit(client, world):
    org, _, ada, *_ = world
    client.force_login(ada)
    assert client.get(reverse("reports"), {"month": OCT, "unit": org.team_c.pk}).status_code == 404


def test_report_page_says_what_is_wrong_with_a_bad_month(client, world):
    _, _, ada, *_ = world
    client.force_login(ada)
    response = client.get(reverse("reports"), {"month": "October"})
    assert response.status_code == 400 and "month must be YYYY-MM" in response.content.decode()


def test_report_page_needs_a_login(client, world):
    response = client.get(reverse("reports"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_units_csv_has_a_header_and_one_row_per_unit_and_gpu_type(client, world):
    org, *_, admin = world
    client.force_login(admin)
    response = client.get(reverse("report-usage-csv"), {"month": OCT, "unit": org.bu.pk})
    rows = _csv(response)
    assert response["Content-Type"].startswith("text/csv")
    assert [r["unit"] for r in rows] == ["Research", "Vision", "team-a", "team-b"]
    assert {r["month"] for r in rows} == {OCT} and {r["gpu_type"] for r in rows} == {"H100"}
    team_a = next(r for r in rows if r["unit"] == "team-a")
    assert float(team_a["used_gpu_hours"]) == 6.0 and float(team_a["guaranteed_gpu_hours"]) == 16 * 744  # UTC: 31 days


def test_jobs_csv_lists_the_months_jobs_with_their_hours(client, world):
    *_, admin = world
    client.force_login(admin)
    rows = _csv(client.get(reverse("report-jobs-csv"), {"month": OCT}))
    assert {(r["job_name"], float(r["used_gpu_hours"]), float(r["reclaimable_gpu_hours"])) for r in rows} == {
        ("resnet", 6.0, 0.0),
        ("ranker", 1.5, 1.5),
    }


def test_jobs_csv_hides_other_tenants_jobs(client, world):
    _, _, ada, *_ = world
    client.force_login(ada)
    assert [r["job_name"] for r in _csv(client.get(reverse("report-jobs-csv"), {"month": OCT}))] == ["resnet"]


def _bearer(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token_create_personal(user=user, name='ci', expires_at=None).raw}"}


def test_usage_api_returns_json_with_a_token(client, world):
    org, _, ada, *_ = world
    response = client.get("/api/v1/reports/usage", {"month": OCT, "unit": org.team_a.pk}, **_bearer(ada))
    data = response.json()
    assert response.status_code == 200
    assert data["month"] == OCT and data["totals"]["used_gpu_hours"] == 6.0
    assert [r["unit"] for r in data["rows"]] == ["team-a"]


def test_usage_api_returns_csv_for_format_csv(client, world):
    *_, admin = world
    response = client.get("/api/v1/reports/usage", {"month": OCT, "format": "csv"}, **_bearer(admin))
    rows = _csv(response)
    assert response["Content-Type"].startswith("text/csv") and rows[0]["unit"] == "Cluster"
    assert float(rows[0]["used_gpu_hours"]) == 7.5


def test_usage_api_returns_csv_for_accept_text_csv(client, world):
    *_, admin = world
    response = client.get("/api/v1/reports/usage", {"month": OCT}, HTTP_ACCEPT="text/csv", **_bearer(admin))
    assert response["Content-Type"].startswith("text/csv") and _csv(response)[0]["month"] == OCT


def test_usage_api_rejects_a_bad_month_with_400_and_a_message(client, world):
    *_, admin = world
    response = client.get("/api/v1/reports/usage", {"month": "2026-1"}, **_bearer(admin))
    assert response.status_code == 400 and "month must be YYYY-MM" in response.json()["detail"]


def test_usage_api_answers_404_for_another_tenants_unit(client, world):
    org, _, ada, *_ = world
    assert client.get("/api/v1/reports/usage", {"unit": org.team_c.pk}, **_bearer(ada)).status_code == 404


def test_usage_api_refuses_anonymous_callers(client, world):
    assert client.get("/api/v1/reports/usage").status_code in (401, 403)


def test_usage_api_accepts_a_session(client, world):
    _, _, ada, *_ = world
    client.force_login(ada)
    assert client.get("/api/v1/reports/usage", {"month": OCT}).status_code == 200


def test_usage_api_refuses_post(client, world):
    *_, admin = world
    assert client.post("/api/v1/reports/usage", **_bearer(admin)).status_code == 405


# --------------------------------------------------------------------------- idle extension


def _notebook(world):
    org, nodes, ada, *_ = world
    return running_job(team=org.team_a, user=ada, node=nodes[0], gpus=1, start=at(20, 9), kind=JobKind.NOTEBOOK)


def test_owner_extends_their_notebook(client, world):
    _, _, ada, *_ = world
    job = _notebook(world)
    client.force_login(ada)
    response = client.post(reverse("notebook-extend-idle", args=[job.pk]), {"next": "/notebooks/"})
    job.refresh_from_db()
    assert response.status_code == 302 and response["Location"] == "/notebooks/" and job.idle_extended_at is not None


def test_teammate_cannot_extend_a_notebook(client, world):
    org, *_ = world
    job = _notebook(world)
    client.force_login(make_user("bea", unit=org.team_a, role=Role.TEAM_LEAD))
    assert client.post(reverse("notebook-extend-idle", args=[job.pk])).status_code == 403


def test_other_tenant_gets_404_on_extend(client, world):
    _, _, _, carl, _ = world
    job = _notebook(world)
    client.force_login(carl)
    assert client.post(reverse("notebook-extend-idle", args=[job.pk])).status_code == 404


def test_extend_refuses_get(client, world):
    _, _, ada, *_ = world
    job = _notebook(world)
    client.force_login(ada)
    assert client.get(reverse("notebook-extend-idle", args=[job.pk])).status_code == 405


def test_extend_does_not_redirect_off_site(client, world):
    _, _, ada, *_ = world
    job = _notebook(world)
    client.force_login(ada)
    response = client.post(reverse("notebook-extend-idle", args=[job.pk]), {"next": "//evil.example/"})
    assert response["Location"] == "/"


def test_finished_notebook_cannot_be_extended(client, world):
    _, _, ada, *_ = world
    job = _notebook(world)
    job.state = JobState.CANCELLED
    job.save(update_fields=["state"])
    client.force_login(ada)
    client.post(reverse("notebook-extend-idle", args=[job.pk]))
    job.refresh_from_db()
    assert job.idle_extended_at is None


def test_report_page_opens_on_last_month_in_a_months_first_days_and_its_csv_links_say_which(client, world, monkeypatch):
    *_, admin = world
    monkeypatch.setattr("django.utils.timezone.now", lambda: datetime(2026, 11, 2, 9, 0, tzinfo=UTC))
    client.force_login(admin)
    response = client.get(reverse("reports"))
    body = response.content.decode()
    assert response.context["report"].month.label == OCT and 'id="previous-month"' in body
    assert "month=2026-10" in response.context["query"]


def test_report_numbers_share_one_format(client, world):
    *_, admin = world
    client.force_login(admin)
    body = client.get(reverse("reports"), {"month": OCT}).content.decode()
    assert "47,616.0 guaranteed GPU-h" in body and ">47,616.0</td>" in body  # the root's 64 H100 x 744 h
    assert "47616" not in body.replace('data-value="47616', "")  # only the machine-readable copy is bare
