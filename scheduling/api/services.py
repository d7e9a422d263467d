"""REST API v1: inference services (docs/services.md) — create, read, change (a rollout), scale, roll back,
delete; their replicas' logs; their endpoint tokens.

Anyone who can see a team's jobs can see its services; its owner, its team's members and lead and admins
above it may change them (scheduling/serving/selectors.py). The endpoint itself is the portal's proxy,
/services/<team>/<name>/…, not this API.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.base import ERRORS, ID_PARAM, ApiView, _team_from_ref
from scheduling.api.schema import query_text
from scheduling.api.serializers import _NO_NUL, QueryIn, TeamRefField, TeamRefOut
from scheduling.models import Service, ServiceToken, Task
from scheduling.selectors import task_log_read, task_log_tail
from scheduling.serving.selectors import (
    access_service,
    can_manage_service,
    replicas_of,
    rollout_progress,
    service_stats,
    services_visible,
)
from scheduling.serving.services import (
    ServiceSpec,
    service_create,
    service_delete,
    service_rollback,
    service_token_create,
    service_token_revoke,
    service_update,
)
from tenants.selectors import team_submittable, units_visible


class _ServiceFields(serializers.Serializer[Any]):
    tier = serializers.IntegerField(min_value=1, max_value=3, required=False, help_text="1 (default): never preempted")
    replicas = serializers.IntegerField(min_value=1, max_value=64, required=False)
    min_replicas = serializers.IntegerField(min_value=1, max_value=64, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=64, required=False)
    target_inflight = serializers.FloatField(min_value=0.1, max_value=10_000, required=False)
    scale_cooldown_s = serializers.IntegerField(min_value=0, max_value=86_400, required=False)
    nodes_per_replica = serializers.IntegerField(min_value=1, max_value=64, required=False)
    gpus_per_node = serializers.IntegerField(min_value=1, max_value=16, required=False)
    gpu_type = serializers.CharField(max_length=32, validators=_NO_NUL, required=False)
    cpus_per_node = serializers.IntegerField(min_value=1, max_value=1024, required=False)
    memory_mb_per_node = serializers.IntegerField(min_value=1, max_value=16 * 1024 * 1024, required=False)
    port = serializers.IntegerField(min_value=1024, max_value=65535, required=False, allow_null=True)
    readiness_path = serializers.RegexField(r"^/[^\s\x00]*$", max_length=512, required=False, help_text="e.g. /health")
    liveness_path = serializers.RegexField(
        r"^(/[^\s\x00]*)?$", max_length=512, required=False, allow_blank=True, help_text="Blank: no liveness probe"
    )
    probe_period_s = serializers.FloatField(min_value=0.2, max_value=300, required=False)
    probe_timeout_s = serializers.FloatField(min_value=0.05, max_value=60, required=False)
    failure_threshold = serializers.IntegerField(min_value=1, max_value=100, required=False)
    success_threshold = serializers.IntegerField(min_value=1, max_value=100, required=False)
    initial_delay_s = serializers.FloatField(min_value=0, max_value=3600, required=False)
    progress_deadline_s = serializers.IntegerField(min_value=30, max_value=86_400, required=False)
    image = serializers.CharField(max_length=512, validators=_NO_NUL, required=False, allow_blank=True)
    command = serializers.CharField(
        max_length=100_000, validators=_NO_NUL, required=False, allow_blank=True, trim_whitespace=False
    )
    env = serializers.DictField(child=serializers.CharField(max_length=10_000, allow_blank=True), required=False)
    container_mounts = serializers.ListField(child=serializers.JSONField(), max_length=64, required=False)
    container_workdir = serializers.CharField(max_length=1024, validators=_NO_NUL, required=False, allow_blank=True)


class ServiceCreateIn(_ServiceFields):
    name = serializers.RegexField(
        r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", max_length=63, help_text="Lowercase, digits, dashes: part of its URL"
    )
    team = TeamRefField(max_length=100, validators=_NO_NUL, help_text="Team id or slug")
    gpu_type = serializers.CharField(max_length=32, validators=_NO_NUL)


class ScaleIn(serializers.Serializer[Any]):
    replicas = serializers.IntegerField(min_value=1, max_value=64)


class RolloutIn(_ServiceFields):
    to_revision = serializers.IntegerField(
        min_value=1, required=False, help_text="Roll back: roll out this earlier revision's release again (a new revision)"
    )


class TokenIn(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, validators=_NO_NUL, help_text="Who uses it, e.g. checkout-frontend")


class ServiceListIn(QueryIn):
    team = TeamRefField(max_length=100, required=False, validators=_NO_NUL)
    name = serializers.CharField(max_length=63, required=False, validators=_NO_NUL)


class LogsIn(QueryIn):
    replica = serializers.IntegerField(
        min_value=1, required=False, help_text="The replica's job id (default: the first live one)"
    )
    rank = serializers.IntegerField(min_value=0, max_value=64, default=0)
    offset = serializers.IntegerField(min_value=0, max_value=2**62, required=False)
    tail = serializers.IntegerField(min_value=0, max_value=10_000, required=False)


# --------------------------------------------------------------------------- output


class RolloutOut(serializers.Serializer[Any]):
    state = serializers.CharField()
    revision = serializers.IntegerField()
    from_revision = serializers.IntegerField(allow_null=True)
    updated = serializers.IntegerField(help_text="Replicas of the current revision")
    updated_ready = serializers.IntegerField()
    old = serializers.IntegerField(help_text="Replicas of earlier revisions still serving")
    wanted = serializers.IntegerField()
    started_at = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_blank=True)


class StatsOut(serializers.Serializer[Any]):
    seconds = serializers.FloatField()
    requests = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="Requests answered 5xx by a replica or by the proxy")
    requests_per_s = serializers.FloatField()
    p50_ms = serializers.FloatField(allow_null=True)
    p99_ms = serializers.FloatField(allow_null=True)
    inflight = serializers.FloatField()


class ReplicaOut(serializers.Serializer[Any]):
    job = serializers.IntegerField()
    revision = serializers.IntegerField()
    state = serializers.CharField()
    attempt = serializers.IntegerField()
    ready = serializers.BooleanField()
    draining = serializers.BooleanField()
    restarts = serializers.IntegerField()
    crash_looping = serializers.BooleanField()
    node = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_blank=True)
    pending_reason = serializers.CharField(allow_blank=True)
    estimated_start = serializers.CharField(allow_null=True)
    requests_per_s = serializers.FloatField()


class ServiceOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = TeamRefOut()
    user = serializers.CharField()
    url = serializers.CharField(help_text="Its endpoint on the portal")
    state = serializers.CharField()
    tier = serializers.IntegerField()
    replicas = serializers.IntegerField()
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    autoscaled = serializers.BooleanField()
    target_inflight = serializers.FloatField()
    scale_cooldown_s = serializers.IntegerField()
    ready_replicas = serializers.IntegerField()
    nodes_per_replica = serializers.IntegerField()
    gpus_per_node = serializers.IntegerField()
    gpu_type = serializers.CharField()
    cpus_per_node = serializers.IntegerField()
    memory_mb_per_node = serializers.IntegerField()
    port = serializers.IntegerField(allow_null=True)
    readiness_path = serializers.CharField()
    liveness_path = serializers.CharField(allow_blank=True)
    probe_period_s = serializers.FloatField()
    probe_timeout_s = serializers.FloatField()
    failure_threshold = serializers.IntegerField()
    success_threshold = serializers.IntegerField()
    initial_delay_s = serializers.FloatField()
    progress_deadline_s = serializers.IntegerField()
    revision = serializers.IntegerField()
    image = serializers.CharField(allow_blank=True)
    command = serializers.CharField(allow_blank=True)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True))
    rollout = RolloutOut()
    created_at = serializers.CharField()
    stats = StatsOut(required=False)
    replica_list = ReplicaOut(many=True, required=False)


class TokenOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField()
    created_at = serializers.CharField()
    last_used_at = serializers.CharField(allow_null=True)
    revoked_at = serializers.CharField(allow_null=True)


class TokenCreatedOut(TokenOut):
    token = serializers.CharField(help_text="Shown this once: only its hash is kept")


class ServiceLogsOut(serializers.Serializer[Any]):
    replica = serializers.IntegerField(allow_null=True)
    attempt = serializers.IntegerField(required=False)
    rank = serializers.IntegerField()
    task_state = serializers.CharField(allow_null=True, required=False, help_text="The rank's task now (null: not placed)")
    replica_state = serializers.CharField(allow_null=True, required=False, help_text="The replica job's state")
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField()
    text = serializers.CharField(allow_blank=True)


def _dt(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def service_out(service: Service, *, detail: bool = True) -> Any:
    return ServiceOut(_service_dict(service, detail=detail)).data


def _service_dict(service: Service, *, detail: bool) -> dict[str, Any]:
    revision = service.revisions.filter(number=service.revision).first()
    replicas = replicas_of(service=service)
    out: dict[str, Any] = {
        "id": service.pk,
        "name": service.name,
        "team": {"id": service.team_id, "slug": service.team.slug, "name": service.team.name},
        "user": service.user.get_username(),
        "url": f"/services/{service.team.slug}/{service.name}/",
        "state": service.state,
        "tier": service.tier,
        "replicas": service.replicas,
        "min_replicas": service.min_replicas,
        "max_replicas": service.max_replicas,
        "autoscaled": service.autoscaled,
        "target_inflight": service.target_inflight,
        "scale_cooldown_s": service.scale_cooldown_s,
        "ready_replicas": sum(1 for r in replicas if r.ready),
        "nodes_per_replica": service.nodes_per_replica,
        "gpus_per_node": service.gpus_per_node,
        "gpu_type": service.gpu_type,
        "cpus_per_node": service.cpus_per_node,
        "memory_mb_per_node": service.memory_mb_per_node,
        "port": service.port,
        "readiness_path": service.readiness_path,
        "liveness_path": service.liveness_path,
        "probe_period_s": service.probe_period_s,
        "probe_timeout_s": service.probe_timeout_s,
        "failure_threshold": service.failure_threshold,
        "success_threshold": service.success_threshold,
        "initial_delay_s": service.initial_delay_s,
        "progress_deadline_s": service.progress_deadline_s,
        "revision": service.revision,
        "image": revision.image if revision else "",
        "command": revision.command if revision else "",
        "env": revision.env if revision else {},
        "rollout": {**rollout_progress(service=service, replicas=replicas), "started_at": _dt(service.rollout_started_at)},
        "created_at": _dt(service.created_at),
    }
    if detail:
        stats = service_stats(service=service, seconds=60)
        out["stats"] = {
            "seconds": stats.seconds,
            "requests": stats.requests,
            "failed": stats.errors,
            "requests_per_s": round(stats.rps, 3),
            "p50_ms": stats.p50_ms,
            "p99_ms": stats.p99_ms,
            "inflight": round(stats.inflight, 3),
        }
        out["replica_list"] = [
            {
                "job": r.job.pk,
                "revision": r.revision,
                "state": r.job.state,
                "attempt": r.job.attempt,
                "ready": r.ready,
                "draining": r.draining,
                "restarts": r.restarts,
                "crash_looping": r.crash_looping,
                "node": r.task.node.name if r.task is not None else None,
                "message": r.task.service_message if r.task is not None else "",
                "pending_reason": r.job.pending_reason,
                "estimated_start": _dt(r.job.estimated_start),
                "requests_per_s": round(stats.per_replica.get(r.job.pk, {}).get("rps", 0.0), 3),
            }
            for r in replicas
        ]
    return out


def _manageable(request: Request, pk: int) -> Service:
    service = access_service(user=request.user, pk=pk)
    if not can_manage_service(user=request.user, service=service):
        raise PermissionDenied("Only the service's owner, its team's members and lead, or an admin above the team may change it")
    return service


def _spec_from(data: dict[str, Any], *, team: Any) -> ServiceSpec:
    values = {k: v for k, v in data.items() if k not in ("team",)}
    return ServiceSpec(team=team, **values)


# --------------------------------------------------------------------------- views


class ServiceListCreateView(ApiView):
    @extend_schema(
        operation_id="services_list",
        parameters=[
            OpenApiParameter("team", query_text("Team id or slug")),
            OpenApiParameter("name", query_text("Service name")),
        ],
        responses={200: ServiceOut(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = ServiceListIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        services = services_visible(user=request.user).select_related("team", "user").order_by("team__slug", "name")
        p = params.validated_data
        if "team" in p:
            team = _team_from_ref(p["team"], user=request.user, candidates=units_visible(user=request.user))
            if team is None:
                # the same answer for another tenant's team as for a missing one
                raise ValidationError({"team": ["No such team, or not one you can see"]})
            services = services.filter(team=team)
        if "name" in p:
            services = services.filter(name=p["name"])
        return Response([service_out(svc, detail=False) for svc in services[:500]])

    @extend_schema(operation_id="services_create", request=ServiceCreateIn, responses={201: ServiceOut, **ERRORS})
    def post(self, request: Request) -> Response:
        body = ServiceCreateIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        team = team_submittable(user=request.user, ref=data["team"])
        if team is None:
            raise ValidationError({"team": ["No such team, or not one you may run services for"]})
        service = service_create(user=cast(User, request.user), spec=_spec_from(data, team=team))
        return Response(service_out(service), status=status.HTTP_201_CREATED)


class ServiceDetailView(ApiView):
    @extend_schema(operation_id="services_retrieve", parameters=[ID_PARAM], responses={200: ServiceOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return Response(service_out(access_service(user=request.user, pk=pk)))

    @extend_schema(
        operation_id="services_update",
        description="Change fields. Scaling fields apply at once; image, command, env, shape or probes make a new revision, "
        "rolled out replica by replica.",
        parameters=[ID_PARAM],
        request=_ServiceFields,
        responses={200: ServiceOut, **ERRORS},
    )
    def patch(self, request: Request, pk: int) -> Response:
        service = _manageable(request, pk)
        body = _ServiceFields(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        service = service_update(user=cast(User, request.user), service=service, changes=dict(body.validated_data))
        return Response(service_out(service))

    @extend_schema(operation_id="services_delete", parameters=[ID_PARAM], responses={202: ServiceOut, **ERRORS})
    def delete(self, request: Request, pk: int) -> Response:
        service = service_delete(user=cast(User, request.user), service=_manageable(request, pk))
        return Response(service_out(service, detail=False), status=status.HTTP_202_ACCEPTED)


class ServiceScaleView(ApiView):
    @extend_schema(operation_id="services_scale", parameters=[ID_PARAM], request=ScaleIn, responses={200: ServiceOut, **ERRORS})
    def post(self, request: Request, pk: int) -> Response:
        service = _manageable(request, pk)
        body = ScaleIn(data=request.data)
        body.is_valid(raise_exception=True)
        service = service_update(
            user=cast(User, request.user), service=service, changes={"replicas": body.validated_data["replicas"]}
        )
        return Response(service_out(service))


class ServiceRolloutView(ApiView):
    @extend_schema(
        operation_id="services_rollout",
        description="Roll out a new release (any of image, command, env, shape, probes), "
        "or an earlier revision again (to_revision).",
        parameters=[ID_PARAM],
        request=RolloutIn,
        responses={200: ServiceOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        service = _manageable(request, pk)
        body = RolloutIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        user = cast(User, request.user)
        if "to_revision" in data:
            if len(data) > 1:
                raise ValidationError({"to_revision": ["Give either to_revision or the fields to change, not both"]})
            service = service_rollback(user=user, service=service, to_revision=data["to_revision"])
        elif not data:
            raise ValidationError({"image": ["Name what changes (image, command, env, …) or give to_revision"]})
        else:
            service = service_update(user=user, service=service, changes=data)
        return Response(service_out(service))


class ServiceLogsView(ApiView):
    @extend_schema(
        operation_id="services_logs",
        parameters=[
            ID_PARAM,
            OpenApiParameter("replica", int, description="A replica's job id (default: the first live one)"),
            OpenApiParameter("rank", int),
            OpenApiParameter("offset", int),
            OpenApiParameter("tail", int),
        ],
        responses={200: ServiceLogsOut, **ERRORS},
    )
    def get(self, request: Request, pk: int) -> Response:
        service = access_service(user=request.user, pk=pk)
        params = LogsIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        p = params.validated_data
        replicas = replicas_of(service=service, include_ended=True)
        if "replica" in p:
            chosen = next((r for r in replicas if r.job.pk == p["replica"]), None)
            if chosen is None:
                raise ValidationError(
                    {
                        "replica": [
                            f"Not a replica of {service.name}: its replicas are jobs "
                            f"{', '.join(str(r.job.pk) for r in replicas) or 'none'}"
                        ]
                    }
                )
        else:
            chosen = replicas[0] if replicas else None
        if chosen is None:
            return Response({"replica": None, "rank": p["rank"], "offset": 0, "next_offset": 0, "text": ""})
        task = Task.objects.filter(job=chosen.job, attempt=chosen.job.attempt, rank=p["rank"]).first()
        offset = p.get("offset", 0)
        text, next_offset = "", offset
        if task is not None:
            if "tail" in p:
                text, next_offset = task_log_tail(task=task, lines=p["tail"])
                offset = next_offset - len(text.encode("utf-8"))
            else:
                text, next_offset = task_log_read(task=task, offset=offset)
        return Response(
            {
                "replica": chosen.job.pk,
                "attempt": chosen.job.attempt,
                "rank": p["rank"],
                "task_state": task.state if task is not None else None,
                "replica_state": chosen.job.state,
                "offset": max(offset, 0),
                "next_offset": next_offset,
                "text": text,
            }
        )


def _token_out(token: ServiceToken) -> dict[str, Any]:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "created_at": _dt(token.created_at),
        "last_used_at": _dt(token.last_used_at),
        "revoked_at": _dt(token.revoked_at),
    }


class ServiceTokenListCreateView(ApiView):
    @extend_schema(operation_id="services_tokens_list", parameters=[ID_PARAM], responses={200: TokenOut(many=True), **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        service = _manageable(request, pk)
        return Response([_token_out(t) for t in service.tokens.order_by("-created_at")])

    @extend_schema(
        operation_id="services_tokens_create", parameters=[ID_PARAM], request=TokenIn, responses={201: TokenCreatedOut, **ERRORS}
    )
    def post(self, request: Request, pk: int) -> Response:
        service = _manageable(request, pk)
        body = TokenIn(data=request.data)
        body.is_valid(raise_exception=True)
        token, raw = service_token_create(user=cast(User, request.user), service=service, name=body.validated_data["name"])
        # The one time the token is shown.
        return Response({**_token_out(token), "token": raw}, status=status.HTTP_201_CREATED)


class ServiceTokenDetailView(ApiView):
    @extend_schema(
        operation_id="services_tokens_revoke",
        parameters=[ID_PARAM, OpenApiParameter("token_id", int, OpenApiParameter.PATH)],
        responses={200: TokenOut, **ERRORS},
    )
    def delete(self, request: Request, pk: int, token_id: int) -> Response:
        service = _manageable(request, pk)
        token = service.tokens.filter(pk=token_id).first()
        if token is None:
            raise Http404("No such token of this service")
        return Response(_token_out(service_token_revoke(user=cast(User, request.user), token=token)))
