"""SSH public keys (docs/dev-sessions.md): checked and fingerprinted as OpenSSH does, one's own only, over
the API and on the SSH keys page."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from scheduling.agent.services import task_spec
from scheduling.models import JobKind, Task
from tenants.models import AuditEntry, SshKey
from tenants.services import ssh_key_add, ssh_key_delete, ssh_key_parse, token_create_personal
from tests.factories import make_cluster, make_job, make_org, make_user

pytestmark = pytest.mark.django_db

SSH_KEYGEN = shutil.which("ssh-keygen")
needs_ssh_keygen = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen (openssh-client) is not installed")
# A real ed25519 public key (ssh-keygen -t ed25519) and its fingerprint as ssh-keygen -lf prints it.
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJeydCn38sbRTRwmOmdrcmDOENk2ojY+o9EBHo+Chbsn ann@laptop"
ED25519_FINGERPRINT = "SHA256:bThyPChBZiuHCQN8UEM0DEq5cfV+wociOzd2mQ0paHc"


def _generate(tmp_path: Path, *args: str, comment: str = "ann@laptop") -> tuple[str, str, str]:
    """A fresh key pair from ssh-keygen: (public line, private key text, the fingerprint `ssh-keygen -lf` prints)."""
    path = tmp_path / f"key-{len(list(tmp_path.iterdir()))}"
    subprocess.run([SSH_KEYGEN, *args, "-N", "", "-C", comment, "-q", "-f", str(path)], check=True)  # type: ignore[list-item]
    listed = subprocess.run([SSH_KEYGEN, "-lf", f"{path}.pub"], check=True, capture_output=True, text=True).stdout  # type: ignore[list-item]
    return Path(f"{path}.pub").read_text().strip(), path.read_text(), listed.split()[1]


def _api(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_create_personal(user=user, name='t', expires_at=None).raw}")
    return client


def _fields(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["fields"]


@needs_ssh_keygen
@pytest.mark.parametrize(
    "args",
    [
        ("-t", "ed25519"),
        ("-t", "ecdsa", "-b", "256"),
        ("-t", "ecdsa", "-b", "384"),
        ("-t", "ecdsa", "-b", "521"),
        ("-t", "rsa", "-b", "3072"),
    ],
)
def test_the_fingerprint_is_the_one_ssh_keygen_prints(tmp_path, args):
    public, _, fingerprint = _generate(tmp_path, *args)
    parsed = ssh_key_parse(public)
    assert parsed.fingerprint == fingerprint
    assert parsed.public_key == " ".join(public.split()[:2]) and parsed.comment == "ann@laptop"


@needs_ssh_keygen
def test_a_key_added_through_the_api_is_listed_with_its_fingerprint_and_audited(tmp_path):
    ann = make_user("ann")
    public, _, fingerprint = _generate(tmp_path, "-t", "ed25519")
    client = _api(ann)
    created = client.post("/api/v1/ssh-keys", {"public_key": public}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["name"], body["key_type"], body["fingerprint"]) == ("ann@laptop", "ssh-ed25519", fingerprint)
    assert body["public_key"] == " ".join(public.split()[:2])  # stored without its comment
    assert client.get("/api/v1/ssh-keys").json() == [body]
    assert AuditEntry.objects.filter(action="ssh_key.add", object_id=str(body["id"]), actor=ann).exists()


def test_a_name_given_is_kept():
    key = ssh_key_add(user=make_user("ann"), name="work laptop", public_key=ED25519)
    assert (key.name, key.fingerprint) == ("work laptop", ED25519_FINGERPRINT)


def test_the_same_key_twice_is_a_clear_error_on_public_key():
    ann = make_user("ann")
    client = _api(ann)
    assert client.post("/api/v1/ssh-keys", {"name": "a", "public_key": ED25519}, format="json").status_code == 201
    fields = _fields(
        client.post("/api/v1/ssh-keys", {"name": "b", "public_key": ED25519.replace("ann@laptop", "x")}, format="json")
    )
    assert "already" in fields["public_key"][0] and "“a”" in fields["public_key"][0]
    assert SshKey.objects.count() == 1
    # Another person may add the same public key: it is theirs to hold too.
    assert _api(make_user("ben")).post("/api/v1/ssh-keys", {"public_key": ED25519}, format="json").status_code == 201


@needs_ssh_keygen
def test_a_private_key_pasted_by_mistake_is_refused_and_not_echoed(tmp_path):
    _, private, _ = _generate(tmp_path, "-t", "ed25519")
    response = _api(make_user("ann")).post("/api/v1/ssh-keys", {"public_key": private}, format="json")
    message = _fields(response)["public_key"][0]
    assert "private key" in message and ".pub" in message
    secret = private.splitlines()[1]
    assert secret not in response.content.decode() and not SshKey.objects.exists()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "Give a key"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "DSA"),
        ("ecdsa-sha2-nistp999 AAAA", "starts with its type"),
        ('from="10.0.0.1" ' + ED25519, "starts with its type"),
        ("ssh-ed25519", "base64 is missing"),
        ("ssh-ed25519 not*base64!", "does not decode"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJeydCn38sbRTRwmOmdrcmDOENk2ojY", "does not decode"),
        ("ssh-rsa " + ED25519.split()[1], "not an ssh-rsa key"),
        (ED25519 + "\n" + ED25519, "One key at a time"),
        ("ssh-ed25519-cert-v01@openssh.com AAAA", "certificate"),
        ("---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----", "ssh-keygen -i"),
    ],
)
def test_what_is_not_one_public_key_is_refused_saying_why(text, says):
    response = _api(make_user("ann")).post("/api/v1/ssh-keys", {"public_key": text or " "}, format="json")
    fields = _fields(response)
    assert says in " ".join(fields["public_key"]), fields


def _rsa_line(bits: int) -> str:
    def string(b: bytes) -> bytes:
        return len(b).to_bytes(4, "big") + b

    n = (1 << (bits - 1)) | 1
    blob = string(b"ssh-rsa") + string(b"\x01\x00\x01") + string(b"\x00" + n.to_bytes(bits // 8, "big"))
    return "ssh-rsa " + base64.b64encode(blob).decode()


def test_an_rsa_key_under_2048_bits_is_refused_and_one_of_2048_taken():
    with pytest.raises(Exception, match="1024 bits is too weak"):
        ssh_key_parse(_rsa_line(1024))
    assert ssh_key_parse(_rsa_line(2048)).key_type == "ssh-rsa"


def test_another_persons_key_is_neither_listed_nor_deleted_a_404_as_a_missing_one():
    ann, ben = make_user("ann"), make_user("ben")
    bens = ssh_key_add(user=ben, name="ben", public_key=ED25519)
    client = _api(ann)
    assert client.get("/api/v1/ssh-keys").json() == []
    theirs, missing = client.delete(f"/api/v1/ssh-keys/{bens.pk}"), client.delete("/api/v1/ssh-keys/987654321")
    assert theirs.status_code == missing.status_code == 404 and theirs.json() == missing.json()
    assert SshKey.objects.filter(pk=bens.pk).exists()


def test_deleting_ones_own_key_removes_it_and_is_audited():
    ann = make_user("ann")
    key = ssh_key_add(user=ann, name="old", public_key=ED25519)
    assert _api(ann).delete(f"/api/v1/ssh-keys/{key.pk}").status_code == 204
    assert not SshKey.objects.exists()
    assert AuditEntry.objects.filter(action="ssh_key.delete", object_id=str(key.pk)).exists()


def test_only_the_owner_may_delete_through_the_service():
    key = ssh_key_add(user=make_user("ann"), name="k", public_key=ED25519)
    with pytest.raises(Exception, match="Only its owner"):
        ssh_key_delete(user=make_user("ben"), key=key)


def test_a_dev_sessions_spec_carries_its_owners_keys_and_no_one_elses():
    org = make_org()
    node = make_cluster(nodes=1)[0]
    ann, ben = make_user("ann", unit=org.team_a), make_user("ben", unit=org.team_a)
    ssh_key_add(user=ann, name="ann", public_key=ED25519)
    ssh_key_add(user=ben, name="ben", public_key=_rsa_line(2048))
    job = make_job(team=org.team_a, user=ann, kind=JobKind.DEV, command="")
    task = Task.objects.create(job=job, attempt=1, rank=0, node=node)
    assert task_spec(task)["dev"]["authorized_keys"] == [" ".join(ED25519.split()[:2])]


# --------------------------------------------------------------------------- the page


def test_the_page_lists_ones_keys_with_fingerprints_and_adds_one(client):
    ann = make_user("ann")
    client.force_login(ann)
    page = client.get(reverse("ssh-keys"))
    assert page.status_code == 200 and "No keys yet" in page.content.decode()
    added = client.post(reverse("ssh-keys"), {"public_key": ED25519, "name": ""})
    assert added.status_code == 302
    page = client.get(reverse("ssh-keys")).content.decode()
    assert ED25519_FINGERPRINT in page and "ann@laptop" in page


def test_the_page_says_what_is_wrong_with_a_bad_key_next_to_the_field(client):
    client.force_login(make_user("ann"))
    response = client.post(
        reverse("ssh-keys"), {"public_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----"}
    )
    assert response.status_code == 400 and "This is a private key" in response.content.decode()
    assert not SshKey.objects.exists()


def test_the_page_removes_ones_own_key_and_404s_for_anothers(client):
    ann, ben = make_user("ann"), make_user("ben")
    mine, theirs = ssh_key_add(user=ann, name="a", public_key=ED25519), ssh_key_add(user=ben, name="b", public_key=ED25519)
    client.force_login(ann)
    assert client.post(reverse("ssh-key-delete", args=[theirs.pk])).status_code == 404
    assert client.post(reverse("ssh-key-delete", args=[mine.pk])).status_code == 302
    assert list(SshKey.objects.values_list("pk", flat=True)) == [theirs.pk]
    assert ED25519_FINGERPRINT not in client.get(reverse("ssh-keys")).content.decode()


def test_the_nav_links_to_the_ssh_keys_page(client):
    client.force_login(make_user("ann"))
    assert f'href="{reverse("ssh-keys")}"' in client.get(reverse("tokens")).content.decode()
