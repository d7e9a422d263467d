"""manage.py enrolment_token NAME [--nodes N] [--expires-in 24h] [--approval]: a token for agents to register nodes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from scheduling.agent.enrolment import enrolment_token_create

_DURATION = re.compile(r"^(\d+)\s*([mhd])$")
_UNIT = {"m": "minutes", "h": "hours", "d": "days"}


def duration(text: str) -> timedelta | None:
    if text in ("never", "none"):
        return None
    found = _DURATION.match(text.strip().lower())
    if not found or int(found.group(1)) < 1:
        raise CommandError(f"--expires-in {text!r}: give a duration such as 30m, 24h or 7d, or never")
    return timedelta(**{_UNIT[found.group(2)]: int(found.group(1))})


class Command(BaseCommand):
    help = "Make an enrolment token (yen_…) for `python -m nodeagent --token`; it is printed once and kept hashed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="what it is for, e.g. rack-12")
        parser.add_argument("--nodes", type=int, default=1, help="how many nodes it may register (default 1)")
        parser.add_argument("--expires-in", default="24h", help="30m, 24h, 7d or never (default 24h)")
        parser.add_argument("--approval", action="store_true", help="the nodes it registers wait for an admin's approval")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["nodes"] < 1:
            raise CommandError("--nodes: at least 1")
        token, raw = enrolment_token_create(
            actor=None,
            actor_label="manage.py enrolment_token",
            name=options["name"],
            max_uses=options["nodes"],
            expires_in=duration(options["expires_in"]),
            requires_approval=options["approval"],
        )
        until = f"until {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "with no expiry"
        self.stdout.write(raw)
        approval = ", each held until a cluster admin approves it" if token.requires_approval else ""
        self.stderr.write(f"Registers up to {token.max_uses} node(s), {until}{approval}. It is shown only now.")
