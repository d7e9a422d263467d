"""Reading the SSO settings from the environment: the group map, checked at start-up.

No Django here: portal/settings.py calls these while settings are being built. A map that names a
role that does not exist, or a group with no unit, stops the process with a message that names the
group and says what to write, as every other setting does (portal/env.py).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("member", "team_lead", "org_admin", "cluster_admin")
# When two groups grant roles on the same unit, the strongest wins (one membership per user and unit).
ROLE_RANK = {role: rank for rank, role in enumerate(ROLES)}


class GroupMapError(ValueError):
    pass


@dataclass(frozen=True)
class Grant:
    """One thing a group gives: ``role`` on the unit with slug ``unit`` (None: the cluster root)."""

    group: str
    unit: str | None
    role: str


_EXAMPLE = '{"gpu-pretraining": {"unit": "pretraining", "role": "member"}, "platform": {"role": "cluster_admin"}}'


def _grant(group: str, entry: Any) -> Grant:
    if not isinstance(entry, dict):
        raise GroupMapError(f'group {group!r}: write an object like {{"unit": "pretraining", "role": "member"}}')
    unknown = set(entry) - {"unit", "team", "role"}
    if unknown:
        raise GroupMapError(f"group {group!r}: unknown key(s) {', '.join(sorted(unknown))}; use unit (or team) and role")
    role = entry.get("role", "member")
    if role not in ROLES:
        raise GroupMapError(f"group {group!r}: role {role!r} is not one of {', '.join(ROLES)}")
    unit = entry.get("unit", entry.get("team"))
    if role == "cluster_admin":
        if unit not in (None, "", "root"):
            raise GroupMapError(f"group {group!r}: cluster_admin is held on the cluster root; leave out the unit")
        return Grant(group=group, unit=None, role=role)
    if not isinstance(unit, str) or not unit.strip():
        raise GroupMapError(f'group {group!r}: role {role} needs the slug of a unit, e.g. "unit": "pretraining"')
    return Grant(group=group, unit=unit.strip(), role=role)


def parse_group_map(data: Any) -> tuple[Grant, ...]:
    """{group: {unit, role} | [{unit, role}, ...]} -> grants, in a fixed order."""
    if not isinstance(data, dict):
        raise GroupMapError(f"the group map must be an object of group -> grant, e.g. {_EXAMPLE}")
    grants: list[Grant] = []
    for group in sorted(data):
        entries = data[group] if isinstance(data[group], list) else [data[group]]
        if not entries:
            raise GroupMapError(f"group {group!r}: an empty list grants nothing; remove the group or give it a unit")
        grants.extend(_grant(str(group), entry) for entry in entries)
    return tuple(grants)


def load_group_map(*, inline: str, path: str) -> tuple[Grant, ...]:
    """The map from YARD_OIDC_GROUP_MAP (JSON) or YARD_OIDC_GROUP_MAP_FILE (TOML or JSON); both empty: none."""
    if inline and path:
        raise GroupMapError("set YARD_OIDC_GROUP_MAP or YARD_OIDC_GROUP_MAP_FILE, not both")
    if path:
        file = Path(path)
        try:
            text = file.read_text()
        except OSError as exc:
            raise GroupMapError(f"YARD_OIDC_GROUP_MAP_FILE={path!r} cannot be read: {exc.strerror}") from None
        try:
            data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise GroupMapError(
                f"YARD_OIDC_GROUP_MAP_FILE={path!r} is not valid {'JSON' if file.suffix == '.json' else 'TOML'}: {exc}"
            ) from None
        return parse_group_map(data)
    if not inline.strip():
        return ()
    try:
        data = json.loads(inline)
    except ValueError as exc:
        raise GroupMapError(f"YARD_OIDC_GROUP_MAP is not valid JSON ({exc}); write e.g. {_EXAMPLE}") from None
    return parse_group_map(data)
