from django.db import connection
from django.http import HttpRequest, JsonResponse

from portal.middleware import DATABASE_DOWN, unavailable


def healthz(request: HttpRequest) -> JsonResponse:
    """200 while the database answers; 503 JSON with Retry-After while it does not (for load balancers)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DATABASE_DOWN:
        return unavailable(request)  # type: ignore[return-value]
    return JsonResponse({"status": "ok"})
