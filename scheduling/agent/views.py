"""The node agent API (docs/agent-api.md): one view per operation, over the schema in protocol.py.

Plain Django views rather than DRF: a heartbeat comes from every node every few seconds, and DRF's
request wrapping, content negotiation and nested serializers cost more CPU than the heartbeat's own
work. Not part of the user API: authenticated only by agent tokens, with its own OpenAPI document
(GET schema) and the contract's error shape ({"code": …}).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from scheduling.agent import enrolment as enrolment_service
from scheduling.agent import protocol, services
from scheduling.agent.auth import NODE_PREFIX, agent_credential, bearer
from scheduling.models import EnrolmentToken, Node
from scheduling.notebook_secrets import seal_url
from scheduling.selectors import yard_number
from tenants.models import hash_token

JSON = "application/json"
ENROLMENT_REFUSED = (
    "not a live enrolment token: unknown, revoked, expired, or it has registered all the nodes it may; "
    "a cluster admin makes a new one with `manage.py enrolment_token NAME --nodes N`"
)


def _error(code: str, status: int, **extra: Any) -> HttpResponse:
    response = HttpResponse(json.dumps({"code": code, **extra}), status=status, content_type=JSON)
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


# separators: a heartbeat answer goes to every node every few seconds; spaces are bytes for nothing. One
# encoder for all answers (json.dumps with any option makes a new one each call): the same text.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _ok(body: dict[str, Any], status: int = 200) -> HttpResponse:
    return HttpResponse(_ENCODE(body), status=status, content_type=JSON)


Handler = Callable[..., HttpResponse]


def agent_endpoint(*, schema: protocol.Obj, credential: type[Node] | type[EnrolmentToken] = Node) -> Callable[[Handler], Handler]:
    """POST only, the right kind of agent token, a JSON object valid under ``schema``; errors in the contract's shape."""

    def decorate(handler: Handler) -> Handler:
        @csrf_exempt
        @wraps(handler)
        def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if request.method != "POST":
                response = _error("method_not_allowed", 405, message="use POST")
                response["Allow"] = "POST"
                return response
            found = agent_credential(request)
            if not isinstance(found, credential):
                # The wrong kind of token for the endpoint is "unauthorized" too (docs/agent-api.md).
                if credential is EnrolmentToken:
                    return _error("unauthorized", 401, message=ENROLMENT_REFUSED)
                return _error("unauthorized", 401)
            try:
                data = protocol.validate(schema, protocol.parse(request.body))
            except protocol.Invalid as exc:
                return _error("invalid", 400, errors=exc.errors)
            try:
                return handler(request, found, data, **kwargs)
            except services.TaskNotFound:
                return _error("not_found", 404)
            except services.StaleAttempt:
                return _error("stale_attempt", 409)

        return view

    return decorate


def _limits() -> dict[str, float]:
    """What an agent must know to keep the liveness arithmetic (docs/agent-api.md) on its side."""
    return {
        "heartbeat_interval_s": yard_number("HEARTBEAT_INTERVAL_S"),
        "stop_after_s": yard_number("AGENT_STOP_AFTER_S"),
        "fence_after_s": yard_number("AGENT_FENCE_AFTER_S"),
        "max_grace_s": yard_number("AGENT_MAX_GRACE_S"),
        "window_s": yard_number("TELEMETRY_WINDOW_S"),
    }


@agent_endpoint(schema=protocol.REGISTER, credential=EnrolmentToken)
def register(request: HttpRequest, enrolment: EnrolmentToken, data: dict[str, Any]) -> HttpResponse:
    gpus = data["gpus"]
    if errors := protocol.register_errors(data):
        return _error("invalid", 400, errors=errors)
    registration = services.Registration(
        name=data["name"],
        address=data["address"],
        leaf=data["leaf"],
        spine=data["spine"],
        simulated=data["simulated"],
        agent_version=data["agent_version"],
        gpus=[services.GpuInfo(**gpu) for gpu in gpus],
        cpus=data["cpus"],
        memory_mb=data["memory_mb"],
        fabric_domain=data["fabric_domain"],
        container_runtime=data["container_runtime"],
        container_runtime_note=data["container_runtime_note"],
    )
    try:
        node, token = enrolment_service.node_enrol(enrolment=enrolment, registration=registration)
    except (services.NodeExists, IntegrityError):
        # The name is taken, raced with another registration, or a GPU uuid belongs to another node.
        return _error("node_exists", 409)
    except enrolment_service.EnrolmentRefused:
        # Another registration took the token's last use between the lookup and the claim.
        return _error("unauthorized", 401, message=ENROLMENT_REFUSED)
    return _ok({"node": {"id": node.pk, "name": node.name}, "token": token, **_limits()}, status=201)


@csrf_exempt
def heartbeat(request: HttpRequest) -> HttpResponse:
    """As agent_endpoint, but the body is checked before the token, and the token's lookup is the
    liveness update itself (services.node_heartbeat_by_token): the hottest path, one statement less."""
    if request.method != "POST":
        response = _error("method_not_allowed", 405, message="use POST")
        response["Allow"] = "POST"
        return response
    raw = bearer(request)
    if raw is None or not raw.startswith(NODE_PREFIX):
        return _error("unauthorized", 401)
    try:
        data = protocol.validate(protocol.HEARTBEAT, protocol.parse(request.body))
    except protocol.Invalid as exc:
        return _error("invalid", 400, errors=exc.errors)
    for task in data["tasks"]:
        if task["notebook"]:
            # The server's token never reaches the database in the clear.
            task["notebook"]["url"] = seal_url(task["notebook"]["url"])
    beat = services.heartbeat_from(data, received=time.time())
    result = services.node_heartbeat_by_token(token_hash=hash_token(raw), heartbeat=beat)
    if result is None:
        return _error("unauthorized", 401)
    # portal_time: the agent measures its clock's offset from it (nodeagent/health.py).
    return _ok({"desired": result.desired, "node_state": result.node_state, "portal_time": time.time(), **_limits()})


@agent_endpoint(schema=protocol.STATUS)
def task_status(request: HttpRequest, node: Node, data: dict[str, Any], task_id: int) -> HttpResponse:
    report = services.status_from({**data, "notebook_url": seal_url(data["notebook_url"])})
    services.task_report_status(node=node, task_id=task_id, report=report)
    return _ok({})


@agent_endpoint(schema=protocol.LOGS)
def task_logs(request: HttpRequest, node: Node, data: dict[str, Any], task_id: int) -> HttpResponse:
    stored = services.task_log_append(node=node, task_id=task_id, **data)
    return _ok({"next_offset": stored})


@agent_endpoint(schema=protocol.DRAIN)
def drain(request: HttpRequest, node: Node, data: dict[str, Any]) -> HttpResponse:
    return _ok({"node_state": enrolment_service.node_drain_requested(node=node, reason=data["reason"])})


def schema(request: HttpRequest) -> JsonResponse:
    """The agent API's OpenAPI document, generated from the same declarations the server validates with."""
    return JsonResponse(agent_openapi())


def agent_openapi() -> dict[str, Any]:
    def op(summary: str, body: protocol.Obj, ok: int, *, path_id: bool = False, token: str = "node") -> dict[str, Any]:
        responses: dict[str, Any] = {
            str(ok): {"description": "accepted", "content": {JSON: {"schema": {"type": "object"}}}},
            "400": {"description": "invalid body", "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}},
            "401": {
                "description": "wrong or missing token",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
            "413": {"description": "body too large", "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}},
            "503": {"description": "database unreachable", "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}},
        }
        if path_id:
            responses["404"] = {
                "description": "no such task on this node",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
            responses["409"] = {
                "description": "stale attempt",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        if token == "enrolment":
            responses["409"] = {
                "description": "node exists",
                "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        operation: dict[str, Any] = {
            "summary": summary,
            "security": [{"agentToken": []}],
            "requestBody": {"required": True, "content": {JSON: {"schema": protocol.openapi(body)}}},
            "responses": responses,
        }
        if path_id:
            operation["parameters"] = [
                {
                    "name": "task_id",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1, "maximum": protocol.INT64_MAX},
                }
            ]
        return {"post": operation}

    return {
        "openapi": "3.0.3",
        "info": {"title": "Yardmaster agent API", "version": "1", "description": "What node agents speak (docs/agent-api.md)."},
        "servers": [{"url": "/api/agent/v1"}],
        "paths": {
            "/register": op("Register a new node with an enrolment token", protocol.REGISTER, 201, token="enrolment"),
            "/heartbeat": op("Liveness, telemetry and task reports; answers the desired task list", protocol.HEARTBEAT, 200),
            "/tasks/{task_id}/status": op("A task started or ended", protocol.STATUS, 200, path_id=True),
            "/tasks/{task_id}/logs": op("A chunk of a task's log", protocol.LOGS, 200, path_id=True),
            "/drain": op("Ask for the node to be drained", protocol.DRAIN, 200),
        },
        "components": {
            "securitySchemes": {"agentToken": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"code": {"type": "string"}, "errors": {"type": "object"}, "message": {"type": "string"}},
                    "required": ["code"],
                }
            },
        },
    }
