"""The cluster page's node maintenance form: cluster admins drain and resume nodes; nobody else can."""

from __future__ import annotations

import pytest
from django.urls import reverse

from scheduling.models import Node, NodeState
from tenants.models import AuditEntry

URL = reverse("node-maintenance")


def test_only_cluster_admins_see_the_form(client, cast):
    client.force_login(cast.cat)
    assert 'id="node-maintenance"' in client.get(reverse("cluster")).content.decode()
    client.force_login(cast.oli)
    assert 'id="node-maintenance"' not in client.get(reverse("cluster")).content.decode()


def test_a_cluster_admin_drains_a_node_and_sees_it_on_the_map(client, cast):
    client.force_login(cast.cat)
    response = client.post(URL, {"node": "h100-02", "action": "drain", "reason": "replace GPU 3"}, follow=True)
    body = response.content.decode()
    assert response.redirect_chain == [(reverse("cluster"), 302)]
    assert "h100-02 drained: no new work lands on it" in body
    assert 'class="node DRAINING"' in body and "drained: replace GPU 3 (cat)" in body
    assert Node.objects.get(name="h100-02").state == NodeState.DRAINING
    assert AuditEntry.objects.filter(action="node.drain", actor=cast.cat).count() == 1


def test_a_drain_without_a_reason_is_refused_next_to_the_field(client, cast):
    client.force_login(cast.cat)
    response = client.post(URL, {"node": "h100-02", "action": "drain", "reason": " "})
    assert response.status_code == 400
    assert "Say why the node is drained" in response.content.decode()
    assert Node.objects.get(name="h100-02").state == NodeState.READY


def test_resume_of_a_ready_node_is_refused_with_the_service_message(client, cast):
    client.force_login(cast.cat)
    response = client.post(URL, {"node": "h100-01", "action": "resume"})
    assert response.status_code == 400
    assert "h100-01 is Ready, not drained: there is nothing to resume." in response.content.decode()


def test_an_unknown_node_is_a_form_error(client, cast):
    client.force_login(cast.cat)
    response = client.post(URL, {"node": "h100-99", "action": "drain", "reason": "x"})
    assert response.status_code == 400 and "Select a valid choice" in response.content.decode()


def test_a_cluster_admin_resumes_a_drained_node(client, cast):
    Node.objects.filter(name="h100-03").update(state=NodeState.DRAINING, state_reason="stuck task", hold_reason="stuck task")
    client.force_login(cast.cat)
    response = client.post(URL, {"node": "h100-03", "action": "resume"})
    assert response.status_code == 302
    node = Node.objects.get(name="h100-03")
    # The cast's nodes have never heartbeated: resumed, they wait for their agent.
    assert (node.state, node.hold_reason) == (NodeState.NOT_READY, "")


@pytest.mark.parametrize("who", ["ann", "lea", "oli", "zed"])
def test_nobody_but_a_cluster_admin_may_drain(client, cast, who):
    client.force_login(getattr(cast, who))
    response = client.post(URL, {"node": "h100-01", "action": "drain", "reason": "mine now"})
    assert response.status_code == 403
    assert Node.objects.get(name="h100-01").state == NodeState.READY
    assert not AuditEntry.objects.filter(action="node.drain").exists()


def test_signed_out_is_sent_to_log_in(client, cast):
    response = client.post(URL, {"node": "h100-01", "action": "drain", "reason": "x"})
    assert response.status_code == 302 and reverse("login") in response["Location"]
    assert Node.objects.get(name="h100-01").state == NodeState.READY
