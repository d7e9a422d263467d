"""Inputs at and past every bound answer a JSON 4xx naming what is wrong, never a 500 or an HTML page:
integers of hundreds of digits in bodies, query strings and paths, NaN and infinities, JSON nested past
the decoder's recursion."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.conftest import job_body, token_client

HUGE = "9" * 400  # an integer no database column holds; float() of it is inf


def _post_raw(client: Any, path: str, text: str) -> Any:
    return client.generic("POST", path, text.encode(), content_type="application/json")


FIELDS = ["replicas", "gpus_per_replica", "time_limit_s", "priority", "cpus_per_replica", "memory_mb_per_replica"]
VALUES = [HUGE, f"-{HUGE}", f"{HUGE}.5", "1e999", "NaN", "Infinity", f'"{HUGE}"']


def test_a_job_field_past_any_bound_is_a_json_400_naming_it(cast) -> None:
    client = token_client(cast.ann_token)
    wrong = []
    for field in FIELDS:
        for value in VALUES:
            body = json.dumps(job_body(cast.org.team_a, **{field: 0})).replace(f'"{field}": 0', f'"{field}": {value}')
            answer = _post_raw(client, "/api/v1/jobs", body)
            said = answer.content.decode()
            json_400 = answer.status_code == 400 and answer["Content-Type"].startswith("application/json")
            if not json_400 or (field not in said and "JSON" not in said):
                wrong.append((field, value[:12], answer.status_code, said[:200]))
    assert not wrong


@pytest.mark.parametrize("value", [HUGE, "1e999", "NaN"])
def test_a_notebook_gpu_count_past_any_bound_is_a_json_400(cast, value: str) -> None:
    body = json.dumps({"name": "nb", "team": cast.org.team_a.slug, "gpus": 0}).replace('"gpus": 0', f'"gpus": {value}')
    answer = _post_raw(token_client(cast.ann_token), "/api/v1/notebooks", body)
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"].startswith("application/json")


@pytest.mark.parametrize(
    "path",
    [
        f"/api/v1/jobs/{HUGE}",
        f"/api/v1/jobs/{2**63}",
        f"/api/v1/jobs/{2**63}/logs",
        f"/api/v1/notebooks/{HUGE}",
        f"/api/v1/teams/{HUGE}/quota",
        f"/api/v1/jobs/1/logs?offset={HUGE}",
        f"/api/v1/jobs/1/logs?tail={HUGE}",
        f"/api/v1/jobs?page_size={HUGE}",
        f"/api/v1/fairshare?team={HUGE}",
    ],
)
def test_a_huge_integer_in_a_path_or_query_is_a_json_4xx(cast, path: str) -> None:
    answer = token_client(cast.ann_token).get(path)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.content[:300])
    assert answer["Content-Type"].startswith("application/json"), answer.content[:300]


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/preview", "/api/v1/notebooks"])
def test_json_nested_past_the_decoders_recursion_is_a_json_400(cast, path: str) -> None:
    answer = _post_raw(token_client(cast.ann_token), path, "[" * 200_000)
    assert answer.status_code == 400, answer.content[:300]
    assert answer["Content-Type"].startswith("application/json")
