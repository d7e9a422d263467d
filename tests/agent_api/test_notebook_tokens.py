"""Notebook tokens are sealed before they reach the database, and only the portal can open them."""

from __future__ import annotations

from django.db import connection

from scheduling.models import Node, Task
from scheduling.notebook_secrets import MARK, Server, open_url, seal_url
from tests.agent_api.conftest import AgentClient

from .test_heartbeat import Gang, heartbeat_body, task_report

URL = "http://10.1.4.17:41873/notebooks/42/lab/?token=s3cret-token-0123456789"


def test_the_token_is_not_in_the_database_in_the_clear(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0])], kind="notebook")[0]
    notebook = {"url": URL, "kernel_busy": False, "last_activity": None}
    assert agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, notebook=notebook)])).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT notebook_url FROM scheduling_task WHERE id = %s", [task.pk])
        (stored,) = cursor.fetchone()
    assert "s3cret" not in stored and stored.startswith("http://10.1.4.17:41873/notebooks/42/lab/" + MARK)
    assert open_url(stored) == Server(base="http://10.1.4.17:41873/notebooks/42/lab/", token="s3cret-token-0123456789")


def test_a_repeated_report_writes_nothing(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0])], kind="notebook")[0]
    body = heartbeat_body(tasks=[task_report(task, notebook={"url": URL, "kernel_busy": False, "last_activity": None})])
    agent.post("heartbeat", body)
    first = Task.objects.get(pk=task.pk).notebook_url
    agent.post("heartbeat", body)
    assert Task.objects.get(pk=task.pk).notebook_url == first  # the same seal: deterministic


def test_a_changed_seal_does_not_open(settings) -> None:
    stored = seal_url(URL)
    assert stored is not None
    tampered = stored[:-2] + ("A" if stored[-2] != "A" else "B") + stored[-1]
    assert open_url(tampered).token is None


def test_a_rotated_secret_key_still_opens_with_the_fallback(settings) -> None:
    stored = seal_url(URL)
    assert stored is not None
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "another-secret-key-" + "x" * 40, [old]
    assert open_url(stored).token == "s3cret-token-0123456789"
    settings.SECRET_KEY_FALLBACKS = []
    assert open_url(stored).token is None


def test_a_url_without_a_token_is_kept_as_it_is() -> None:
    assert seal_url("http://10.1.4.17:41873/lab/") == "http://10.1.4.17:41873/lab/"
    assert seal_url(None) is None
