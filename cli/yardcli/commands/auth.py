"""yard login, logout, whoami: the saved portal URL and token, and who it belongs to."""

from __future__ import annotations

import os
import re

import click

from yardcli.client import Api, config_path, config_save
from yardcli.commands.common import (
    _api,
    _fail,
    _me,
    _print_json,
    api_command,
    json_option,
    out,
)


@click.command()
@click.option("--url", help="The portal, e.g. https://yard.example.com (default: YARD_URL or the saved one)")
@click.option("--token", help="An API token (ym_...) from the portal's API tokens page; asked for when not given")
@json_option
@api_command
def login(url: str | None, token: str | None, as_json: bool) -> None:
    """Check a portal URL and token, and keep them (0600) for the next commands."""
    url = (url or os.environ.get("YARD_URL") or "").strip() or click.prompt("Portal URL")
    token = (token or os.environ.get("YARD_TOKEN") or "").strip() or click.prompt("API token", hide_input=True)
    url = url.rstrip("/")
    if not re.match(r"^https?://", url):
        _fail(f"{url!r} is not a URL: give http(s)://host[:port]", as_json=as_json)
    me = _me(Api(url, token))
    path = config_save(url=url, token=token)
    if as_json:
        _print_json({"url": url, "config": str(path), "me": me})
        return
    out.print(f"Signed in to {url} as {me['username']} ({me['auth']}); saved in {path}")


@click.command()
def logout() -> None:
    """Forget the saved URL and token."""
    path = config_path()
    if path.exists():
        path.unlink()
        out.print(f"Removed {path}")
    else:
        out.print("Not signed in")


@click.command()
@json_option
@api_command
def whoami(as_json: bool) -> None:
    """Who the token belongs to, and the teams you may submit to."""
    api = _api()
    me = _me(api)
    if as_json:
        _print_json(me)
        return
    admin = " (cluster admin)" if me.get("is_cluster_admin") else ""
    out.print(f"{me['username']}{admin} on {api.url}, by {me['auth']}")
    teams = ", ".join(t["slug"] for t in me.get("teams", [])) or "none"
    out.print(f"teams you may submit to: {teams}")
    for role in me.get("roles", []):
        out.print(f"  {role['role']} of {role['unit']['name']} ({role['kind']})")
