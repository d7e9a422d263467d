"""The portal's error pages for people: a plain 404 where Django's DEBUG mode would show its technical one.

The demo runs with DEBUG on (its console and tracebacks help), and a new user's first 404 (another
team's job, a mistyped address) then read as a crash: a yellow page listing every URL pattern. With
DEBUG off, Django already renders templates/404.html; this middleware makes DEBUG say the same thing
for pages, and leaves the APIs (JSON errors of their own) and everything else as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotFound
from django.template import loader

API_PREFIXES = ("/api/", "/static/", "/metrics")


def not_found_page(request: HttpRequest) -> HttpResponse:
    body = loader.render_to_string("404.html", {"request_path": request.path}, request=request)
    return HttpResponseNotFound(body)


class FriendlyNotFound:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == 404
            and getattr(request, "resolver_match", None) is None  # no view matched: Django's technical page
            and not request.path.startswith(API_PREFIXES)
        ):
            return not_found_page(request)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # A view's Http404 (a job of another team is a 404, like a missing one): in DEBUG, Django would
        # answer with its technical page; the page people see is the same as without DEBUG.
        if settings.DEBUG and isinstance(exception, Http404) and not request.path.startswith(API_PREFIXES):
            return not_found_page(request)
        return None
