"""REST API v1, teams and me: a team's quota, who the caller is, their teams' quotas and fair share.

Apart from the job views because they read tenants and quotas, not jobs; access_unit does the tenant
check as access_job does for jobs.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api import serializers as s
from scheduling.api.base import ERROR, ERRORS, ID_PARAM, ApiView, _team_from_ref
from scheduling.api.schema import query_text
from scheduling.selectors import fairshare_standing, team_quota_usage, yard_number
from tenants.models import ApiToken, TokenKind, UnitKind
from tenants.selectors import access_unit, is_cluster_admin, teams_submittable, user_roles


class TeamQuotaView(ApiView):
    @extend_schema(operation_id="teams_quota", parameters=[ID_PARAM], responses={200: s.TeamQuotaOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        unit = access_unit(user=request.user, pk=pk)
        usage = team_quota_usage(team=unit)
        quotas = [{"gpu_type": t, **v} for t, v in sorted(usage.items())]
        return Response(s.TeamQuotaOut({"team": unit, "quotas": quotas}).data)


class MeView(ApiView):
    @extend_schema(operation_id="me", responses={200: s.MeOut, 401: ERROR, 429: ERROR})
    def get(self, request: Request) -> Response:
        user = request.user
        auth = request.auth
        if isinstance(auth, ApiToken):
            how = "service token" if auth.kind == TokenKind.SERVICE else "personal token"
        else:
            how = "session"
        out = {
            "id": user.pk,
            "username": user.get_username(),
            "is_cluster_admin": is_cluster_admin(user),
            "auth": how,
            "teams": list(teams_submittable(user=user).filter(kind=UnitKind.TEAM)),
            "roles": [{"unit": unit, "kind": unit.kind, "role": role} for unit, role in user_roles(user=user)],
        }
        return Response(s.MeOut(out).data)


class MyQuotaView(ApiView):
    @extend_schema(
        operation_id="me_quota",
        description="Your teams' guarantees, limits, GPUs in use and borrowed, and where each stands in fair share.",
        parameters=[OpenApiParameter("team", query_text("Only this one of your teams (id or slug)"))],
        responses={200: s.MyQuotaOut, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = s.MyQuotaIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        teams = teams_submittable(user=request.user).filter(kind=UnitKind.TEAM).order_by("path")
        if "team" in params.validated_data:
            team = _team_from_ref(params.validated_data["team"], user=request.user, candidates=teams)
            if team is None:
                raise ValidationError({"team": ["No such team, or not one of yours"]})
            teams = teams.filter(pk=team.pk)
        standing = fairshare_standing(now=timezone.now())
        out = []
        for team in teams:
            usage = team_quota_usage(team=team)
            quotas = [{"gpu_type": t, **v} for t, v in sorted(usage.items())]
            out.append({"team": team, "quotas": quotas, "fair_share": standing.get(team.pk)})
        half_life_days = yard_number("HALF_LIFE_S") / 86400
        return Response(s.MyQuotaOut({"teams": out, "half_life_days": half_life_days}).data)
