"""The agent API's calls past the middleware that serves people: sessions, CSRF, users, messages, htmx
and the sign-in lockout.

Every node posts a heartbeat every few seconds, authenticated by its bearer token and never by a cookie
(scheduling/agent/auth.py); the agent views are csrf_exempt and read neither a session nor a user. The
nine middleware between AdmissionMiddleware and the view did nothing for those calls but walk them
(about a tenth of a steady heartbeat's CPU, bench/heartbeat_cpu.py). So AgentApiMiddleware, right below
AdmissionMiddleware, calls an agent view itself, and the call keeps:

- everything above it in settings.MIDDLEWARE, as before: SecurityMiddleware (the HTTPS redirect, its
  headers), WhiteNoise, FaultAnswersMiddleware (the call's database budget, the 503 of an outage) and
  AdmissionMiddleware (shedding past the agent's deadline); the request signals, the connection's reuse
  and health check, and the logging of every 4xx/5xx answer, which are the handler's (outside the chain);
- of what it skips, all that applies to a token-authenticated JSON call, done by the same code:
  CommonMiddleware's Host check against ALLOWED_HOSTS and its Content-Length, XFrameOptionsMiddleware's
  header (an answer carries the headers it did), FaultAnswersMiddleware's answer to an exception raised
  in the view (503 / 413), and Django's own answer to any other (a 500, logged, got_request_exception);
- and an address under the prefix that no agent view serves goes down the whole chain, as any other.

tests/agent_api/test_lean_path.py compares the answers with the whole chain's and holds each point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.urls import Resolver404, ResolverMatch, URLResolver, get_resolver, set_urlconf

from portal.middleware import AGENT_PATH, fault_answer


class AgentApiMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.common = CommonMiddleware(get_response)
        self.xframe = XFrameOptionsMiddleware(get_response)
        self.matches: dict[tuple[URLResolver, str], ResolverMatch] = {}

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not request.path_info.startswith(AGENT_PATH):
            return self.get_response(request)
        # As BaseHandler.resolve_request resolves (the root URLconf, or the request's own).
        urlconf = getattr(request, "urlconf", None)
        if urlconf is not None:
            set_urlconf(urlconf)
        resolver = get_resolver(urlconf)
        match = self.matches.get((resolver, request.path_info))
        if match is None:
            try:
                match = resolver.resolve(request.path_info)
            except Resolver404:
                return self.get_response(request)  # no agent view: the whole chain answers, as it did
            if not match.args and not match.kwargs:
                # An address without arguments (heartbeat, register, drain, schema: a handful) resolves the
                # same every time: walking the URLconf's patterns for it was 3 % of a heartbeat.
                self.matches[(resolver, request.path_info)] = match
        try:
            # The Host check (request.get_host() against ALLOWED_HOSTS) and the refused user agents.
            response: HttpResponseBase | None = self.common.process_request(request)
        except Exception as exc:
            response = response_for_exception(request, exc)
        if response is None:
            request.resolver_match = match
            try:
                response = match.func(request, *match.args, **match.kwargs)
            except Exception as exc:
                response = fault_answer(request, exc)
                if response is None:
                    response = response_for_exception(request, exc)
            if not isinstance(response, HttpResponseBase):
                raise ValueError(f"the agent view {match.func.__qualname__} returned {type(response).__name__}, not a response")
            # (typed for HttpResponse; it sets a header, which any response has)
            response = self.xframe.process_response(request, cast(HttpResponse, response))
        return self.common.process_response(request, response)
