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
