"""yard registry-credential ls, set, rm: a unit's logins to private container registries (docs/containers.md).

Over /api/v1/registry-credentials, for those who administer the unit (its team lead, an org admin above
it, a cluster admin). The password is write-only there and here: read from stdin (--password-stdin, as
`docker login` takes it), from YARD_REGISTRY_PASSWORD, or asked without echo; never an argument (a
command line is visible to every user of the machine in `ps` and lands in shell history), never printed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from yardcli.commands.common import _api, _fail, _print_json, _table, _when, api_command, json_option, out

PASSWORD_ENV = "YARD_REGISTRY_PASSWORD"


@click.group("registry-credential")
def registry_credential() -> None:
    """Logins to private container registries, per team or unit: ls, set, rm (the password is never shown)."""


def _unit_words(unit: dict[str, Any]) -> str:
    return str(unit.get("slug") or unit.get("name") or unit.get("id"))


@registry_credential.command("ls")
@click.option("--unit", help="Only this unit's (slug or id)")
@json_option
@api_command
def credential_ls(unit: str | None, as_json: bool) -> None:
    """The credentials of the units you administer: unit, registry, user, who set it and when (no password)."""
    found = _api().get("/api/v1/registry-credentials", unit=unit)
    if as_json:
        _print_json(found)
        return
    rows = [
        [c["id"], _unit_words(c["unit"]), c["registry"], c["username"], c.get("created_by") or "", _when(c.get("updated_at"))]
        for c in found
    ]
    _table(["ID", "UNIT", "REGISTRY", "USERNAME", "SET BY", "UPDATED"], rows)
    if not rows:
        out.print("No registry credentials: jobs pull their images without one.")


def _password(from_stdin: bool) -> str:
    if from_stdin:
        text = sys.stdin.read()
        password = text[:-1] if text.endswith("\n") else text  # what `echo $TOKEN |` adds, and nothing else
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV]
    elif sys.stdin.isatty():
        password = click.prompt("Password (or access token)", hide_input=True, err=True)
    else:
        _fail(f"give the password on stdin with --password-stdin, or in {PASSWORD_ENV} (never as an argument)")
    if not password:
        _fail("the password is empty")
    return password


@registry_credential.command("set")
@click.argument("unit")
@click.argument("registry")
@click.option("-u", "--username", required=True, help="The registry user ($oauthtoken for NGC)")
@click.option("--password-stdin", is_flag=True, help="Read the password (or token) from stdin, as docker login does")
@json_option
@api_command
def credential_set(unit: str, registry: str, username: str, password_stdin: bool, as_json: bool) -> None:
    """Set UNIT's login to REGISTRY (host[:port], e.g. nvcr.io), replacing the one it had there; its teams'
    jobs pull their images with the nearest unit's up the tree."""
    password = _password(password_stdin)
    body = {"unit": unit, "registry": registry, "username": username, "password": password}
    response = _api().request("POST", "/api/v1/registry-credentials", json=body)
    saved = response.json()
    if as_json:
        _print_json(saved)
        return
    verb = "set" if response.status_code == 201 else "replaced"
    out.print(f"{verb} credential {saved['id']}: {saved['username']}@{saved['registry']} for {_unit_words(saved['unit'])}")


@registry_credential.command("rm")
@click.argument("credential_id", type=int)
@json_option
@api_command
def credential_rm(credential_id: int, as_json: bool) -> None:
    """Delete a credential (by its ID from `yard registry-credential ls`)."""
    _api().request("DELETE", f"/api/v1/registry-credentials/{credential_id}")
    if as_json:
        _print_json({"id": credential_id, "deleted": True})
    else:
        out.print(f"deleted credential {credential_id}")
