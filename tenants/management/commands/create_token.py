"""Create an API token from the shell (bootstrapping CI before anyone has signed in).

manage.py create_token --user alice --name laptop --days 30
manage.py create_token --team pretraining --name gitlab-ci --days 90
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from tenants.models import OrgUnit, UnitKind
from tenants.services import token_create_personal, token_create_service


class Command(BaseCommand):
    help = "Create a personal (--user) or team service-account (--team) API token and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", help="username: a personal token that acts as this user")
        who.add_argument("--team", help="team slug or name: a service-account token for its CI")
        parser.add_argument("--name", required=True, help="what the token is for")
        parser.add_argument("--days", type=int, default=90, help="days until it expires (default 90; 0: never)")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["days"] < 0:
            raise CommandError("--days must be 0 (never expires) or more")
        expires = timezone.now() + timedelta(days=opts["days"]) if opts["days"] else None
        if opts["user"]:
            user = get_user_model().objects.filter(username=opts["user"]).first()
            if user is None:
                raise CommandError(f"no user named {opts['user']!r}")
            issued = token_create_personal(user=user, name=opts["name"], expires_at=expires)
        else:
            team = (
                OrgUnit.objects.filter(kind=UnitKind.TEAM, slug=opts["team"]).first()
                or OrgUnit.objects.filter(kind=UnitKind.TEAM, name=opts["team"]).first()
            )
            if team is None:
                raise CommandError(f"no team with slug or name {opts['team']!r}")
            issued = token_create_service(actor=None, team=team, name=opts["name"], expires_at=expires)
        self.stdout.write(issued.raw)
