"""The node agent API (docs/agent-api.md): one view per operation, small input serializers.

Not part of the user API: excluded from the OpenAPI schema, authenticated only by agent tokens,
and answering in the contract's error shape ({"code": …}) rather than DRF's.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.conf import settings
from django.core.validators import ProhibitNullCharactersValidator
from django.db import IntegrityError
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.agent import services
from scheduling.agent.auth import AgentTokenAuthentication, IsEnrolment, IsNode
from scheduling.models import EnrolmentToken, Node

# --------------------------------------------------------------------------- input


class GpuInfoIn(serializers.Serializer[Any]):
    index = serializers.IntegerField(min_value=0, max_value=255)
    uuid = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=100, allow_blank=True, default="")
    gpu_type = serializers.CharField(max_length=32)
    memory_mb = serializers.IntegerField(min_value=0, default=0)
    nvlink_domain = serializers.CharField(max_length=40)
    pcie_switch = serializers.CharField(max_length=40)
    numa_node = serializers.IntegerField(allow_null=True, required=False, default=None)


class RegisterIn(serializers.Serializer[Any]):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    address = serializers.CharField(max_length=255, allow_blank=True, default="")
    leaf = serializers.CharField(max_length=64)
    spine = serializers.CharField(max_length=64)
    simulated = serializers.BooleanField(default=False)
    agent_version = serializers.CharField(max_length=32, allow_blank=True, default="")
    gpus = GpuInfoIn(many=True, allow_empty=False)

    def validate_gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len({g["index"] for g in gpus}) != len(gpus):
            raise serializers.ValidationError("GPU indices must be unique")
        if len({g["gpu_type"] for g in gpus}) != 1:
            raise serializers.ValidationError("a node holds GPUs of one type")
        return gpus


class GpuSampleIn(serializers.Serializer[Any]):
    index = serializers.IntegerField(min_value=0)
    utilization_pct = serializers.FloatField(allow_null=True, required=False, default=None)
    memory_used_mb = serializers.FloatField(allow_null=True, required=False, default=None)
    temperature_c = serializers.FloatField(allow_null=True, required=False, default=None)
    power_w = serializers.FloatField(allow_null=True, required=False, default=None)
    xid_errors = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False, default=list)


class NotebookIn(serializers.Serializer[Any]):
    url = serializers.CharField(max_length=1024, allow_null=True, allow_blank=True, required=False, default=None)
    kernel_busy = serializers.BooleanField(allow_null=True, required=False, default=None)
    last_activity = serializers.FloatField(allow_null=True, required=False, default=None)


class TaskReportIn(serializers.Serializer[Any]):
    task_id = serializers.IntegerField(min_value=1)
    attempt = serializers.IntegerField(min_value=1)
    state = serializers.ChoiceField(choices=["running", "stopping", "exited"])
    checkpoint_time = serializers.FloatField(allow_null=True, required=False, default=None)
    notebook = NotebookIn(allow_null=True, required=False, default=None)


class HeartbeatIn(serializers.Serializer[Any]):
    gpus = GpuSampleIn(many=True, required=False, default=list)
    tasks = TaskReportIn(many=True, required=False, default=list)
    draining_reason = serializers.CharField(allow_null=True, allow_blank=True, required=False, default=None)


class StatusIn(serializers.Serializer[Any]):
    attempt = serializers.IntegerField(min_value=1)
    state = serializers.ChoiceField(choices=["running", "exited"])
    pid = serializers.IntegerField(allow_null=True, required=False, default=None)
    exit_code = serializers.IntegerField(allow_null=True, required=False, default=None)
    signal = serializers.IntegerField(allow_null=True, required=False, default=None)
    stopped_by = serializers.ChoiceField(choices=["sigterm", "sigkill"], allow_null=True, required=False, default=None)
    started_at = serializers.FloatField(allow_null=True, required=False, default=None)
    ended_at = serializers.FloatField(allow_null=True, required=False, default=None)
    notebook_url = serializers.CharField(max_length=1024, allow_null=True, allow_blank=True, required=False, default=None)
    stop_cause = serializers.ChoiceField(
        choices=["stop", "fenced", "time_limit", "portal_unreachable"], allow_null=True, required=False, default=None
    )


class LogText(serializers.CharField):
    """Log text as the workload wrote it: NUL characters are allowed here (the service replaces them)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)]


class LogIn(serializers.Serializer[Any]):
    attempt = serializers.IntegerField(min_value=1)
    offset = serializers.IntegerField(min_value=0)
    # The wire format names it "data", which shadows Serializer.data for the type checker only.
    data = LogText(allow_blank=True, trim_whitespace=False, max_length=256 * 1024)  # type: ignore[assignment]


class DrainIn(serializers.Serializer[Any]):
    reason = serializers.CharField(max_length=1000)


# --------------------------------------------------------------------------- views


def _error(code: str, http_status: int, **extra: Any) -> Response:
    return Response({"code": code, **extra}, status=http_status)


STALE = {"code": "stale_attempt"}


@extend_schema(exclude=True)
class AgentView(APIView):
    """Agent-token auth, JSON only, and the contract's error bodies for every failure."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes: list[type[BasePermission]] = [IsNode]
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]
    throttle_classes: list[Any] = []
    http_method_names = ["post", "options"]

    def permission_denied(self, request: Request, message: str | None = None, code: str | None = None) -> NoReturn:
        # The wrong kind of token for the endpoint is "unauthorized" too (docs/agent-api.md).
        raise exceptions.NotAuthenticated()

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            response = _error("unauthorized", status.HTTP_401_UNAUTHORIZED)
            response["WWW-Authenticate"] = "Bearer"
            return response
        if isinstance(exc, exceptions.ValidationError):
            detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
            return _error("invalid", status.HTTP_400_BAD_REQUEST, errors=detail)
        if isinstance(exc, exceptions.ParseError):
            return _error("invalid", status.HTTP_400_BAD_REQUEST, errors={"body": [str(exc.detail)]})
        if isinstance(exc, services.TaskNotFound):
            return _error("not_found", status.HTTP_404_NOT_FOUND)
        if isinstance(exc, services.StaleAttempt):
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        return super().handle_exception(exc)

    def parse(self, serializer_class: type[serializers.Serializer[Any]], request: Request) -> dict[str, Any]:
        if not isinstance(request.data, dict):
            raise exceptions.ParseError("the body must be a JSON object")
        serializer = serializer_class(data=request.data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    @property
    def node(self) -> Node:
        assert isinstance(self.request.auth, Node)
        return self.request.auth


class RegisterView(AgentView):
    permission_classes = [IsEnrolment]

    def post(self, request: Request) -> Response:
        data = self.parse(RegisterIn, request)
        registration = services.Registration(
            name=data["name"],
            address=data["address"],
            leaf=data["leaf"],
            spine=data["spine"],
            simulated=data["simulated"],
            agent_version=data["agent_version"],
            gpus=[services.GpuInfo(**gpu) for gpu in data["gpus"]],
        )
        assert isinstance(request.auth, EnrolmentToken)
        try:
            node, token = services.node_register(enrolment=request.auth, registration=registration)
        except services.NodeExists:
            return _error("node_exists", status.HTTP_409_CONFLICT)
        except IntegrityError:
            # The name raced with another registration, or a GPU uuid belongs to another node.
            return _error("node_exists", status.HTTP_409_CONFLICT)
        yard = settings.YARD
        return Response(
            {
                "node": {"id": node.pk, "name": node.name},
                "token": token,
                "heartbeat_interval_s": yard["HEARTBEAT_INTERVAL_S"],
                "stop_after_s": yard["AGENT_STOP_AFTER_S"],
            },
            status=status.HTTP_201_CREATED,
        )


class HeartbeatView(AgentView):
    def post(self, request: Request) -> Response:
        data = self.parse(HeartbeatIn, request)
        heartbeat = services.Heartbeat(
            gpus=[services.GpuSample(**gpu) for gpu in data["gpus"]],
            tasks=[
                services.TaskReport(
                    task_id=t["task_id"],
                    attempt=t["attempt"],
                    state=t["state"],
                    checkpoint_time=t["checkpoint_time"],
                    notebook=services.NotebookReport(**t["notebook"]) if t["notebook"] else None,
                )
                for t in data["tasks"]
            ],
            draining_reason=data["draining_reason"] or None,
        )
        result = services.node_heartbeat(node=self.node, heartbeat=heartbeat)
        return Response(
            {
                "desired": [services.task_spec(task) for task in result.live_tasks],
                "heartbeat_interval_s": settings.YARD["HEARTBEAT_INTERVAL_S"],
                "node_state": result.node_state,
            }
        )


class TaskStatusView(AgentView):
    def post(self, request: Request, task_id: int) -> Response:
        data = self.parse(StatusIn, request)
        services.task_report_status(node=self.node, task_id=task_id, report=services.StatusReport(**data))
        return Response({})


class TaskLogsView(AgentView):
    def post(self, request: Request, task_id: int) -> Response:
        data = self.parse(LogIn, request)
        stored = services.task_log_append(node=self.node, task_id=task_id, **data)
        return Response({"next_offset": stored})


class DrainView(AgentView):
    def post(self, request: Request) -> Response:
        data = self.parse(DrainIn, request)
        return Response({"node_state": services.node_drain(node=self.node, reason=data["reason"])})
