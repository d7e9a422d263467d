"""OpenAPI description of the bearer-token authentication (drf-spectacular extension).

Lives with the API (tenants must not import drf-spectacular's view layer); imported by the views
so it is registered before any schema is generated.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "ApiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal or team service-account token: `Authorization: Bearer ym_...`",
        }


# --------------------------------------------------------------------------- what the server checks, said in the schema
# So that a client (and schemathesis, tests/api/test_schemathesis.py) knows from the schema alone which
# requests are well formed: text without NUL characters, names that are not blank, environment variable
# names, and links between operations (a job's id leads to its detail, cancel, logs and rerun).

NO_NUL = "^[^\\u0000]*$"
NOT_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]{0,127}$"
INPUT_COMPONENTS = ("JobSubmitIn", "NotebookSubmitIn", "JobFileIn", "CredentialIn")


def _text_rules(schema: dict[str, Any], *, required: bool) -> None:
    if schema.get("type") != "string" or "enum" in schema or "format" in schema or "pattern" in schema:
        return
    schema["pattern"] = NOT_BLANK if required or schema.get("minLength", 0) >= 1 else NO_NUL


def query_text(description: str, *, max_length: int = 100) -> dict[str, Any]:
    """A query parameter's schema: text that is given (not empty), without NUL characters."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": NOT_BLANK, "description": description}


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"])."""
    schemas = result.get("components", {}).get("schemas", {})
    for name in INPUT_COMPONENTS:
        component = schemas.get(name)
        if not component:
            continue
        required = set(component.get("required", []))
        for field, prop in component.get("properties", {}).items():
            _text_rules(prop, required=field in required and field not in ("checkpoint_dir",))
            if prop.get("type") == "object" and isinstance(prop.get("additionalProperties"), dict):
                # env: at most 200 variables, values without NUL; OpenAPI 3.0 cannot say what the names
                # must be (3.1's propertyNames), so the description does.
                prop["maxProperties"] = 200
                prop.setdefault("description", f"Variable names match {ENV_NAME}")
                _text_rules(prop["additionalProperties"], required=False)
    for path, method in (("/api/v1/jobs", "post"), ("/api/v1/jobs/preview", "post"), ("/api/v1/notebooks", "post")):
        body = result.get("paths", {}).get(path, {}).get(method, {}).get("requestBody")
        if body is not None:
            body["required"] = True  # every one of them needs a name and a team
    _links(result)
    return result


def _links(result: dict[str, Any]) -> None:
    """OpenAPI links from a created or read job to what can be done with it (stateful testing follows them)."""
    paths = result.get("paths", {})
    job_ops = {"jobs_retrieve": "/api/v1/jobs/{id}", "jobs_cancel": "/api/v1/jobs/{id}/cancel"}
    job_ops |= {"jobs_logs": "/api/v1/jobs/{id}/logs", "jobs_rerun": "/api/v1/jobs/{id}/rerun"}
    nb_ops = {"notebooks_retrieve": "/api/v1/notebooks/{id}", "notebooks_stop": "/api/v1/notebooks/{id}/stop"}
    nb_ops |= {"notebooks_logs": "/api/v1/notebooks/{id}/logs"}
    sources: list[tuple[str, str, tuple[str, ...], dict[str, str]]] = [
        ("/api/v1/jobs", "post", ("201", "200"), job_ops),
        ("/api/v1/notebooks", "post", ("201", "200"), nb_ops),
        ("/api/v1/jobs/{id}/rerun", "post", ("201",), job_ops),
    ]
    for path, method, statuses, targets in sources:
        operation = paths.get(path, {}).get(method)
        if operation is None:
            continue
        for code in statuses:
            response = operation.get("responses", {}).get(code)
            if response is None:
                continue
            response["links"] = {
                op_id: {"operationId": op_id, "parameters": {"id": "$response.body#/id"}}
                for op_id, target in targets.items()
                if target in paths
            }
