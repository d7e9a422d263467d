"""Drain and resume by an operator: the services and `manage.py nodes`."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Node, NodeState, Task
from scheduling.services import JobSpec, job_submit, node_hold, node_resume
from tenants.models import AuditEntry
from tests.factories import make_cluster, make_org, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> list[Node]:
    make_cluster(nodes=2, leaves_per_spine=1)
    Node.objects.update(last_heartbeat=timezone.now())
    return list(Node.objects.order_by("name"))


def test_drain_takes_a_ready_node_out_with_the_reason_and_who(cluster: list[Node]) -> None:
    node = node_hold(node=cluster[0], reason="  replace   GPU 3 ", actor=None, actor_label="cat")
    assert (node.state, node.state_reason, node.hold_reason) == (
        NodeState.DRAINING,
        "drained: replace GPU 3 (cat)",
        "replace GPU 3 (cat)",
    )
    entry = AuditEntry.objects.get(action="node.drain")
    assert (entry.actor_label, entry.object_id, entry.message) == ("cat", str(node.pk), f"{node.name}: replace GPU 3")


@pytest.mark.parametrize(("reason", "message"), [("   ", "Say why the node is drained"), ("x" * 201, "under 200 characters")])
def test_drain_refuses_a_missing_or_overlong_reason(cluster: list[Node], reason: str, message: str) -> None:
    with pytest.raises(ValidationError) as error:
        node_hold(node=cluster[0], reason=reason, actor=None)
    assert message in " ".join(error.value.messages)
    assert Node.objects.get(pk=cluster[0].pk).state == NodeState.READY


def test_a_down_node_drained_stays_down_and_keeps_the_hold(cluster: list[Node]) -> None:
    Node.objects.filter(pk=cluster[0].pk).update(state=NodeState.DOWN, state_reason="no heartbeat")
    node = node_hold(node=cluster[0], reason="RMA", actor=None, actor_label="cat")
    assert (node.state, node.state_reason, node.hold_reason) == (NodeState.DOWN, "no heartbeat", "RMA (cat)")


def test_resume_of_a_node_that_is_not_drained_says_so(cluster: list[Node]) -> None:
    with pytest.raises(ValidationError, match="h100-01 is Ready, not drained: there is nothing to resume"):
        node_resume(node=cluster[0], actor=None)


def test_nothing_new_lands_on_a_drained_node_and_resume_brings_it_back(cluster: list[Node]) -> None:
    org = make_org()
    user = make_user("alice", unit=org.team_a)
    node_hold(node=cluster[0], reason="firmware", actor=None)
    node_hold(node=cluster[1], reason="firmware", actor=None)
    job = job_submit(user=user, spec=JobSpec(name="one", team=org.team_a, command="true", gpus_per_replica=1))
    assert job.pk not in run_cycle_once().placed
    assert Job.objects.get(pk=job.pk).state == "PENDING"
    node_resume(node=cluster[1], actor=None)
    assert job.pk in run_cycle_once().placed
    assert Task.objects.get(job=job).node_id == cluster[1].pk


def test_the_command_lists_drains_and_resumes(cluster: list[Node]) -> None:
    out = StringIO()
    call_command("nodes", stdout=out)
    assert out.getvalue().strip() == "every node is READY"
    out = StringIO()
    call_command("nodes", "drain", "h100-02", "--reason", "swap NIC", stdout=out)
    assert out.getvalue().strip() == "h100-02: DRAINING drained: swap NIC (manage.py nodes)"
    out = StringIO()
    call_command("nodes", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NODE", "LEAF", "STATE", "REASON", "[HELD]"]
    assert len(lines) == 2 and lines[1].startswith("h100-02") and "DRAINING" in lines[1] and "swap NIC" in lines[1]
    out = StringIO()
    call_command("nodes", "--all", stdout=out)
    assert len(out.getvalue().splitlines()) == 3
    call_command("nodes", "resume", "h100-02", stdout=StringIO())
    assert Node.objects.get(name="h100-02").state == NodeState.READY


def test_the_command_names_what_to_fix(cluster: list[Node]) -> None:
    with pytest.raises(CommandError, match=re.escape("no node named 'h100-99'; `manage.py nodes --all` lists them")):
        call_command("nodes", "drain", "h100-99", "--reason", "x")
    with pytest.raises(CommandError, match="nothing to resume"):
        call_command("nodes", "resume", "h100-01")
