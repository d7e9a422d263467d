"""Every agent API field type past its bounds answers a JSON 400 naming the field: integers of hundreds
of digits where a float or an int goes (math.isfinite(10**400) raised OverflowError, a 500 in HTML), NaN
and infinities, over-long strings, JSON nested past the decoder's recursion."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduling.agent import protocol
from scheduling.models import Gpu, Node
from tests.agent_api.conftest import AgentClient

HUGE = "9" * 400


def _heartbeat(agent: AgentClient, text: str) -> Any:
    return agent.http.generic(
        "POST",
        "/api/agent/v1/heartbeat",
        text.encode(),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {agent.token}",
    )


@pytest.mark.parametrize(
    ("gpu_field", "value"),
    [
        ("utilization_pct", HUGE),
        ("utilization_pct", f"-{HUGE}"),
        ("power_w", f"{HUGE}.0"),
        ("temperature_c", "1e999"),
        ("memory_used_mb", "NaN"),
        ("power_w", "-Infinity"),
        ("index", HUGE),
        ("index", f"-{HUGE}"),
        ("xid_errors", f"[{HUGE}]"),
    ],
)
def test_a_number_past_any_bound_in_a_heartbeat_is_a_json_400_naming_the_field(
    agent: AgentClient, nodes: list[Node], gpu_field: str, value: str
) -> None:
    before = list(Gpu.objects.filter(node=nodes[0]).values_list("utilization_pct", flat=True))
    gpu = json.dumps({"index": 0, "utilization_pct": 50.0, gpu_field: "X"}).replace('"X"', value)
    answer = _heartbeat(agent, f'{{"gpus": [{gpu}], "tasks": []}}')
    assert answer.status_code == 400, answer.content[:300]
    assert answer["Content-Type"] == "application/json"
    body = answer.json()
    assert body["code"] == "invalid" and any(k.startswith(f"gpus[0].{gpu_field}") for k in body["errors"]), body
    assert list(Gpu.objects.filter(node=nodes[0]).values_list("utilization_pct", flat=True)) == before


@pytest.mark.parametrize(
    "task",
    [
        f'{{"task_id": {HUGE}, "attempt": 1, "state": "running"}}',
        f'{{"task_id": 1, "attempt": {HUGE}, "state": "running", "cpu_used": {HUGE}}}',
        '{"task_id": 1, "attempt": 1, "state": "running", "started_at": 1e999}',
        '{"task_id": 1, "attempt": 1, "state": "' + "r" * 100_000 + '"}',
    ],
)
def test_a_task_report_past_its_bounds_is_a_json_400(agent: AgentClient, nodes: list[Node], task: str) -> None:
    answer = _heartbeat(agent, f'{{"gpus": [], "tasks": [{task}]}}')
    assert answer.status_code == 400, answer.content[:300]
    assert any(k.startswith("tasks[0].") for k in answer.json()["errors"])


@pytest.mark.parametrize("text", ["[" * 200_000, '{"gpus":' * 100_000, "1" * 5000])
def test_json_the_decoder_cannot_hold_is_a_json_400(agent: AgentClient, nodes: list[Node], text: str) -> None:
    answer = _heartbeat(agent, text)
    assert answer.status_code == 400, answer.content[:300]
    assert answer.json()["errors"] == {"body": ["not valid JSON"]}


@pytest.mark.parametrize(
    ("spec", "value"),
    [
        (protocol.Float(0.0, 100.0), 10**400),
        (protocol.Float(0.0, 100.0), -(10**400)),
        (protocol.Float(0.0, 100.0), float("nan")),
        (protocol.Float(0.0, 100.0), float("inf")),
        (protocol.Int(0, 10), 10**400),
        (protocol.Int(0, 10), True),
        (protocol.Str(5), "x" * 10**6),
    ],
)
def test_every_field_type_refuses_what_lies_past_its_bounds_without_raising(spec: Any, value: Any) -> None:
    assert spec.check(value) is not None
    with pytest.raises(protocol.Invalid) as refused:
        protocol.validate(protocol.Obj({"f": protocol.Prop(spec)}), {"f": value})
    assert "f" in refused.value.errors
