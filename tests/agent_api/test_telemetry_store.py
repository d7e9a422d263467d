"""A heartbeat's telemetry as stored: each reading on its own GPU, windows, XIDs, in a bounded number of statements.

The latest readings are one UPDATE … FROM (VALUES …) and the windows one INSERT … SELECT … ON CONFLICT
(scheduling/agent/services/heartbeat.py), SQL written by hand for PostgreSQL and SQLite alike, matched by
the GPU's index on the node. Every value below differs from GPU to GPU, so a reading on the wrong row
shows. What reads them is checked too: the ORM, and /metrics.

SQLite: ``test_the_same_behaviour_on_sqlite`` runs this module again in a pytest subprocess whose
DATABASE_URL is a SQLite file (as tests/governance/test_reaper_late_telemetry.py does), so every other
test here also runs on the demo's database; the child writes the engine it ran on to a file the parent checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from scheduling.agent.services.heartbeat import WINDOW_BATCH
from scheduling.models import Gpu, GpuWindow, Node, Task, XidEvent
from tests.agent_api.conftest import AgentClient, heartbeat_body, issue_node_token, task_report
from tests.agent_api.test_register_resources import register_simulated

REPO = Path(__file__).resolve().parents[2]
VENDOR_FILE = "YARD_TEST_TELEMETRY_VENDOR_FILE"  # set by the SQLite run: the child says which engine it got
MINUTE = datetime(2026, 12, 1, 9, 54, tzinfo=UTC)
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _engine_reported() -> None:
    if path := os.environ.get(VENDOR_FILE):
        Path(path).write_text(connection.vendor)


def util(index: int) -> float:
    return (10.0 + index) % 100  # a percentage, also for a MIG instance's index (128 and up)


def reading(index: int, **fields: Any) -> dict[str, Any]:
    """A GPU's latest readings, each a value no other index has."""
    sample: dict[str, Any] = {
        "index": index,
        "utilization_pct": util(index),
        "memory_used_mb": 1000.0 + index,
        "temperature_c": 40.0 + index,
        "power_w": 200.5 + index,
        "xid_errors": [],
    }
    return {**sample, **fields}


def minute(index: int, start: float = MINUTE.timestamp(), **fields: Any) -> dict[str, Any]:
    window = {"index": index, "start": start, "samples": 6, "utilization_sum": 60.0 + index, "utilization_max": util(index + 10)}
    return {**window, "memory_used_max_mb": 5000.0 + index, **fields}


def stored(node: Node) -> dict[int, tuple[Any, ...]]:
    rows = Gpu.objects.filter(node=node).values_list("index", "utilization_pct", "memory_used_mb", "temperature_c", "power_w")
    return {index: tuple(values) for index, *values in rows}


def expected(index: int) -> tuple[float, float, float, float]:
    return (util(index), 1000.0 + index, 40.0 + index, 200.5 + index)


def test_each_reading_lands_on_the_gpu_of_its_index(agent: AgentClient, nodes: list[Node]) -> None:
    order = [5, 0, 7, 2, 6, 1, 3, 4]  # not the GPUs' order: matched by index, not by place
    assert agent.post("heartbeat", heartbeat_body(gpus=[reading(i) for i in order])).status_code == 200
    assert stored(nodes[0]) == {i: expected(i) for i in range(8)}
    # The other node's GPUs, with the same indices, are untouched.
    assert set(stored(nodes[1]).values()) == {(None, None, None, None)}
    assert not Gpu.objects.filter(node=nodes[1], telemetry_at__isnull=False).exists()


def test_the_time_of_the_readings_is_the_heartbeats_on_the_gpus_it_named(agent: AgentClient, nodes: list[Node]) -> None:
    before = datetime.now(tz=UTC)
    agent.post("heartbeat", heartbeat_body(gpus=[reading(1), reading(4)]))
    times = dict(Gpu.objects.filter(node=nodes[0]).values_list("index", "telemetry_at"))
    assert {i for i, at in times.items() if at is not None} == {1, 4}
    assert times[1] == times[4] and times[1] >= before.replace(microsecond=0)
    assert stored(nodes[0])[4] == expected(4) and stored(nodes[0])[0] == (None, None, None, None)


def test_a_metric_that_failed_is_stored_as_null_over_the_last_value(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[reading(i) for i in range(8)]))
    failed = dict.fromkeys(("utilization_pct", "memory_used_mb", "temperature_c", "power_w"))
    agent.post("heartbeat", heartbeat_body(gpus=[reading(0, **failed), reading(3, power_w=None)]))
    after = stored(nodes[0])
    assert after[0] == (None, None, None, None)
    assert after[3] == (*expected(3)[:3], None)
    assert after[5] == expected(5)  # not in this heartbeat: its last readings stand


def test_a_metric_null_on_every_gpu_is_stored(agent: AgentClient, nodes: list[Node]) -> None:
    """A column of NULLs alone has no type in PostgreSQL's VALUES: the statement must say it."""
    body = heartbeat_body(gpus=[reading(i, temperature_c=None, power_w=None) for i in range(8)])
    assert agent.post("heartbeat", body).status_code == 200
    assert stored(nodes[0]) == {i: (*expected(i)[:2], None, None) for i in range(8)}


def test_readings_for_gpus_the_node_does_not_have_are_dropped(agent: AgentClient, nodes: list[Node]) -> None:
    Gpu.objects.filter(node=nodes[0], index__gte=4).delete()  # a node of 4 GPUs whose agent reports 8
    body = heartbeat_body(gpus=[reading(i) for i in range(8)], windows=[minute(i) for i in range(8)])
    assert agent.post("heartbeat", body).status_code == 200
    assert stored(nodes[0]) == {i: expected(i) for i in range(4)}
    assert sorted(GpuWindow.objects.filter(gpu__node=nodes[0]).values_list("gpu__index", flat=True)) == [0, 1, 2, 3]
    assert not GpuWindow.objects.filter(gpu__node=nodes[1]).exists()
    assert set(stored(nodes[1]).values()) == {(None, None, None, None)}


def test_the_last_reading_of_an_index_wins_should_one_repeat(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[reading(2, utilization_pct=1.0), reading(2, utilization_pct=99.0)]))
    assert Gpu.objects.get(node=nodes[0], index=2).utilization_pct == 99.0


def test_mig_instances_get_their_own_readings_and_windows(db: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = register_simulated(monkeypatch, tmp_path, "node-m01", simulate="2xH100", mig="0:1g.10gb*7")
    indices = sorted(Gpu.objects.filter(node=node).values_list("index", flat=True))
    assert indices == [1, *range(128, 135)]  # the whole GPU 1, and GPU 0's seven instances
    agent = AgentClient(issue_node_token(node))
    body = heartbeat_body(gpus=[reading(i) for i in indices], windows=[minute(i) for i in indices])
    assert agent.post("heartbeat", body).status_code == 200
    assert stored(node) == {i: expected(i) for i in indices}
    windows = GpuWindow.objects.filter(gpu__node=node).values_list("gpu__index", "utilization_sum", "memory_used_max_mb")
    assert sorted(windows) == [(i, 60.0 + i, 5000.0 + i) for i in indices]


def test_windows_land_on_their_gpus_at_their_minute(agent: AgentClient, nodes: list[Node]) -> None:
    late = MINUTE.timestamp() + 17.5  # the agent's start is floored to the portal's window
    body = heartbeat_body(windows=[minute(i, start=late) for i in (3, 0, 6)] + [minute(1, utilization_sum=9_999.0)])
    assert agent.post("heartbeat", body).status_code == 200
    rows = GpuWindow.objects.filter(gpu__node=nodes[0]).values_list(
        "gpu__index", "start", "samples", "utilization_sum", "utilization_max", "memory_used_max_mb"
    )
    assert sorted(rows) == [
        (0, MINUTE, 6, 60.0, 20.0, 5000.0),
        (1, MINUTE, 6, 600.0, 21.0, 5001.0),  # a sum over 100 % a sample is cut to it
        (3, MINUTE, 6, 63.0, 23.0, 5003.0),
        (6, MINUTE, 6, 66.0, 26.0, 5006.0),
    ]
    # What the idle reaper asks for: the window by its start, as the ORM compares times.
    assert GpuWindow.objects.filter(gpu__node=nodes[0], start=MINUTE).count() == 4
    assert GpuWindow.objects.filter(gpu__node=nodes[0], start__gt=MINUTE).count() == 0


def test_a_window_sent_again_overwrites_its_row(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(windows=[minute(2), minute(5)]))
    agent.post("heartbeat", heartbeat_body(windows=[minute(2, samples=12, utilization_sum=240.0), minute(2, samples=3)]))
    rows = dict(GpuWindow.objects.filter(gpu__node=nodes[0]).values_list("gpu__index", "samples"))
    assert rows == {2: 3, 5: 6}  # the last of a repeated window in one body wins; the other minute stands


def test_a_backlog_of_windows_longer_than_a_batch_is_stored_whole(agent: AgentClient, nodes: list[Node], settings: Any) -> None:
    # What is stored, not how fast: a loaded suite run took the default 4 s database budget of an agent's
    # call (answered 503 "unavailable", which an agent counts blind and sends again) for this body.
    settings.YARD = {**settings.YARD, "AGENT_DB_BUDGET_S": 60.0}
    minutes = WINDOW_BATCH // 8 + 5  # an agent that could not reach the portal for over two hours
    windows = [minute(i, start=MINUTE.timestamp() + 60 * m) for m in range(minutes) for i in range(8)]
    assert len(windows) > WINDOW_BATCH
    assert agent.post("heartbeat", heartbeat_body(windows=windows)).status_code == 200
    assert GpuWindow.objects.filter(gpu__node=nodes[0]).count() == len(windows)
    assert GpuWindow.objects.filter(gpu__node=nodes[0], gpu__index=7).latest("start").start.timestamp() == windows[-1]["start"]


def test_xids_are_counted_on_the_gpu_that_saw_them(agent: AgentClient, nodes: list[Node]) -> None:
    Gpu.objects.filter(node=nodes[0], index=7).delete()
    body = heartbeat_body(gpus=[reading(2, xid_errors=[13, 13, 31]), reading(5, xid_errors=[43]), reading(7, xid_errors=[13])])
    assert agent.post("heartbeat", body).status_code == 200
    events = XidEvent.objects.filter(gpu__node=nodes[0]).values_list("gpu__index", "code", "count")
    assert sorted(events) == [(2, 13, 2), (2, 31, 1), (5, 43, 1)]  # GPU 7 is not the node's any more
    assert not XidEvent.objects.filter(gpu__node=nodes[1]).exists()
    assert stored(nodes[0])[2] == expected(2)


def test_a_draining_xid_still_drains_the_node_and_marks_its_gpu(agent: AgentClient, nodes: list[Node]) -> None:
    body = heartbeat_body(gpus=[reading(i) for i in range(8)] + [reading(6, xid_errors=[79])])
    assert agent.post("heartbeat", body).status_code == 200
    assert list(Gpu.objects.filter(node=nodes[0], healthy=False).values_list("index", flat=True)) == [6]
    node = Node.objects.get(pk=nodes[0].pk)
    assert node.state == "DRAINING" and "XID 79" in node.hold_reason and "GPU 6" in node.hold_reason


def test_metrics_export_what_the_heartbeat_stored(
    agent: AgentClient, nodes: list[Node], client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("YARD_METRICS_TOKEN", "metrics-token-for-tests-0123456789")
    agent.post("heartbeat", heartbeat_body(gpus=[reading(i) for i in range(8)]))
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-for-tests-0123456789")
    families = {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}
    utilization = {
        int(s.labels["gpu"]): s.value for s in families["yard_gpu_utilization_ratio"] if s.labels["node"] == nodes[0].name
    }
    memory = {int(s.labels["gpu"]): s.value for s in families["yard_gpu_memory_used_bytes"] if s.labels["node"] == nodes[0].name}
    assert utilization == {i: pytest.approx(util(i) / 100) for i in range(8)}
    assert memory == {i: (1000.0 + i) * 1024 * 1024 for i in range(8)}


def _statements(agent: AgentClient, body: dict[str, Any]) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert agent.post("heartbeat", body).status_code == 200
    return [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"] and q["sql"] not in ("BEGIN", "COMMIT")]


def test_telemetry_costs_a_statement_each_for_readings_and_windows(agent: AgentClient, nodes: list[Node], gang: Any) -> None:
    tasks: list[Task] = [gang([(nodes[0], [i])])[0] for i in range(8)]
    reports = [task_report(t, started_at=1796012000.0) for t in tasks]
    agent.post("heartbeat", heartbeat_body(tasks=reports))  # starts them: the writes of a change
    steady = _statements(agent, heartbeat_body(tasks=reports))
    readings = _statements(agent, heartbeat_body(tasks=reports, gpus=[reading(i) for i in range(8)]))
    both = _statements(
        agent, heartbeat_body(tasks=reports, gpus=[reading(i) for i in range(8)], windows=[minute(i) for i in range(8)])
    )
    assert len(steady) == 2, steady  # the liveness UPDATE (the token's lookup), the live tasks
    assert len(readings) == 3 and readings[2].startswith("WITH") and "UPDATE" in readings[2], readings
    assert len(both) == 4 and "INSERT INTO" in both[2] and "UPDATE" in both[3], both
    # Not growing with the GPUs reported or the minutes of a backlog (up to a batch).
    backlog = [minute(i, start=MINUTE.timestamp() + 60 * m) for m in range(60) for i in range(8)]
    many = _statements(agent, heartbeat_body(tasks=reports, gpus=[reading(i) for i in range(128)], windows=backlog))
    assert len(many) == 4, many


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(VENDOR_FILE)), reason="this is the SQLite run itself")
def test_the_same_behaviour_on_sqlite(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'telemetry.sqlite3'}",
        "YARD_VAR_DIR": str(tmp_path / "var"),
        VENDOR_FILE: str(vendor),
    }
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", str(Path(__file__).relative_to(REPO))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-2000:]
    assert "14 passed, 1 skipped" in child.stdout, child.stdout[-2000:]
    assert vendor.read_text() == "sqlite"
