"""Bodies larger than the portal accepts answer 413 JSON on both APIs, over real HTTP (the live server),
never a 400 HTML page, and nothing is written."""

from __future__ import annotations

import json

import pytest
import requests
from django.conf import settings

from scheduling.models import Job
from tests.agent_api.conftest import issue_node_token
from tests.api.conftest import job_body

pytestmark = pytest.mark.django_db


def _too_big() -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1024


def test_the_user_api_answers_413_json_for_an_oversized_json_body(cast, nodes, live_server):
    body = json.dumps(job_body(cast.org.team_a, command="x" * _too_big()))
    answer = requests.post(
        f"{live_server.url}/api/v1/jobs",
        data=body,
        headers={"Authorization": f"Bearer {cast.ann_token}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 413 and answer.headers["Content-Type"].startswith("application/json")
    assert answer.json()["code"] == "too_large" and "body" in answer.json()["fields"]
    assert not Job.objects.exists()


def test_the_user_api_answers_413_json_for_an_oversized_job_file(cast, nodes, live_server):
    answer = requests.post(
        f"{live_server.url}/api/v1/jobs",
        data=b"# " + b"x" * (1024 * 1024 + 10),
        headers={"Authorization": f"Bearer {cast.ann_token}", "Content-Type": "application/yaml"},
        timeout=60,
    )
    assert answer.status_code == 413 and answer.json()["code"] == "too_large"
    assert "at most 1024 KiB" in answer.json()["message"]


def test_the_agent_api_answers_413_json_for_an_oversized_heartbeat(nodes, live_server):
    token = issue_node_token(nodes[0])
    body = json.dumps({"gpus": [], "tasks": [], "draining_reason": "x" * _too_big()})
    answer = requests.post(
        f"{live_server.url}/api/agent/v1/heartbeat",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 413 and answer.headers["Content-Type"].startswith("application/json")
    assert answer.json()["code"] == "too_large" and "body" in answer.json()["errors"]
