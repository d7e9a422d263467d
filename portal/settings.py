"""Yardmaster settings: one file, driven by environment variables.

Zero-setup default (``make run``): SQLite and Celery's filesystem broker under ./var.
Deployments and the test suite set DATABASE_URL (PostgreSQL) and REDIS_URL (Redis).
Every reader fails loudly on a bad value (see portal/env.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from portal.env import (
    ImproperlyConfiguredEnv,
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
)
from portal.secret_key import DEV_SECRET, HOW_TO_SET, demo_secret_key
from portal.yard_settings import yard_settings

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("YARD_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
# The zero-setup demo of `make run`: SQLite, the embedded broker, everything on 127.0.0.1.
# Its database lives in the demo's var/ folder (YARD_VAR_DIR), beside its broker and logs.
_DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'yardmaster.sqlite3'}")
_SQLITE_DEMO = _DATABASE_URL.startswith("sqlite:")
if "SECRET_KEY" in os.environ:
    SECRET_KEY = os.environ["SECRET_KEY"]
elif _SQLITE_DEMO:
    # Generated once under var/ (0600), so the demo runs with DEBUG off too and keeps its sessions.
    SECRET_KEY = demo_secret_key(VAR_DIR)
elif DEBUG:
    SECRET_KEY = DEV_SECRET
else:
    raise ImproperlyConfiguredEnv(f"SECRET_KEY must be set when DEBUG is off: {HOW_TO_SET}")
if not DEBUG and SECRET_KEY == DEV_SECRET:
    raise ImproperlyConfiguredEnv(f"SECRET_KEY is the development key and DEBUG is off: {HOW_TO_SET}")
# A weak key (short, few distinct characters) stops the web server, worker and beat as they start
# (portal/secret_key.py), not here: tools that only load these settings run with SECRET_KEY=lint.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG or _SQLITE_DEMO else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "template_partials",
    "tenants",
    "scheduling",
    "scheduling.whatif",
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files from the app itself (gunicorn serves none), compressed and cached; right after
    # SecurityMiddleware as WhiteNoise asks, so its responses skip the session and auth work.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Outermost of ours: a database outage anywhere below answers 503 (JSON on the APIs), never a 500.
    "portal.middleware.FaultAnswersMiddleware",
    # Under gunicorn: a worker sheds what it cannot start at once, heartbeats aside (fast 503 + Retry-After).
    "portal.middleware.AdmissionMiddleware",
    # The agent API's calls go from here straight to their view (token-authenticated JSON: no session,
    # user, CSRF, messages, htmx or sign-in lockout below); portal/agent_middleware.py says what they keep.
    "portal.agent_middleware.AgentApiMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

if env_bool("YARD_QUERY_COUNT_HEADER", False):  # benchmarks: SQL statements per request in a header
    MIDDLEWARE.insert(0, "portal.middleware.QueryCountMiddleware")

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.views.context.yard",
            ],
        },
    }
]

DATABASES = {"default": database_from_url(_DATABASE_URL, base_dir=BASE_DIR)}
if _SQLITE_DEMO:
    # WAL: readers (pages, heartbeats) no longer wait for a writer, nor a writer for readers; with the
    # busy timeout and IMMEDIATE transactions (portal/env.py) concurrent requests queue for the write
    # lock instead of failing with "database is locked". synchronous=NORMAL is WAL's usual pairing: a
    # power cut may lose the last commits of a demo, never corrupt it.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"]["OPTIONS"],  # type: ignore[dict-item]
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    # Each web thread keeps its connection for a minute (no connect per heartbeat), checked before
    # reuse. This is bounded because gunicorn's gthread workers run a fixed pool of threads: at most
    # workers x threads connections from the web tier (tests/demo/test_gunicorn.py counts them), where
    # runserver's thread per request leaked one connection per request thread.
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("YARD_DB_CONN_MAX_AGE", 60, minimum=0)
    # A health check (a "SELECT 1" round trip before a request's first query on a kept connection): a
    # connection the database dropped while it sat idle (a restart, a failover) is replaced before the
    # request uses it, so recovery costs no 503; one that hangs is bounded like any other round trip
    # (portal/env.py, portal/pg/base.py). YARD_DB_HEALTH_CHECKS=0 saves the round trip: then the first
    # request on a dead connection answers 503 (portal/middleware.py) and Django drops it at its end.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = env_bool("YARD_DB_HEALTH_CHECKS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
USE_I18N = False
USE_TZ = True
TIME_ZONE = env_str("YARD_TIME_ZONE", "UTC")  # the cluster's time zone: month boundaries of reports

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STATICFILES_DIRS = [BASE_DIR / "portal" / "static"]
# `make run` runs collectstatic; WhiteNoise serves STATIC_ROOT. Compressed copies (no hashed names,
# so templates need no manifest and the tests no collectstatic).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --------------------------------------------------------------------------- security
# Off by default so that `make run` works over plain http on 127.0.0.1; a deployment behind
# TLS sets YARD_HTTPS=1 and passes `manage.py check --deploy` with no warnings.
_HTTPS = env_bool("YARD_HTTPS", False)
SECURE_SSL_REDIRECT = _HTTPS
SESSION_COOKIE_SECURE = _HTTPS
CSRF_COOKIE_SECURE = _HTTPS
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if _HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _HTTPS
SECURE_HSTS_PRELOAD = _HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("YARD_BEHIND_PROXY", False) else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

# --------------------------------------------------------------------------- REST API


def _token_throttle(value: str) -> str | None:
    """YARD_TOKEN_THROTTLE: N/second, N/minute, N/hour or N/day (DRF's rates), or off."""
    if value.strip().lower() in ("off", "none", "0"):
        return None
    number, _, period = value.strip().partition("/")
    periods = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")
    if not number.isdigit() or int(number) < 1 or period.lower() not in periods:
        raise ImproperlyConfiguredEnv(
            f"YARD_TOKEN_THROTTLE={value!r}: give requests per token as N/minute (e.g. 120/minute), N/second, "
            "N/hour, N/day, or off"
        )
    return f"{int(number)}/{period.lower()}"


REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Per API token (sessions are not throttled); sized so a CI poll loop of one request a second never
    # meets a 429. README: "The API's rate limit". Checked below.
    "DEFAULT_THROTTLE_RATES": {"token": _token_throttle(env_str("YARD_TOKEN_THROTTLE", "120/minute"))},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Yardmaster API",
    "DESCRIPTION": "Submit and follow GPU jobs and notebooks; read quotas and usage.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # What the server checks, in the schema too (scheduling/api/schema.py): NUL-free and non-blank text,
    # environment variable names, links between a job's operations.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "scheduling.api.schema.postprocess",
    ],
}

# --------------------------------------------------------------------------- Redis and Celery
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}
    # A dead or hung Redis answers a cache call in about a second (an exception the caller degrades on,
    # or a 503 from portal/middleware.py), never holds a web thread: YARD_REDIS_TIMEOUT_S bounds both the
    # connect and each command.
    _REDIS_TIMEOUT_S = env_float("YARD_REDIS_TIMEOUT_S", 1.0, minimum=0.05)
    CACHES = {
        "default": {
            "BACKEND": "portal.cache.RedisCache",  # Django's, reusing its Redis clients (portal/cache.py)
            "LOCATION": REDIS_URL,
            "OPTIONS": {"socket_connect_timeout": _REDIS_TIMEOUT_S, "socket_timeout": _REDIS_TIMEOUT_S},
        }
    }
else:
    # kombu's filesystem transport works across processes (memory:// does not): the web
    # process, the worker and beat of `make run` share it with no broker to install.
    _BROKER_DIR = VAR_DIR / "broker"
    CELERY_BROKER_URL = "filesystem://localhost//"  # a host, or kombu warns at every connection
    # kombu's filesystem transport with atomic writes and claims (portal/broker.py): the stock one
    # lets a reader take a half-written message and the worker dies of the JSONDecodeError.
    CELERY_BROKER_TRANSPORT = "portal.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "out"),
        "data_folder_out": str(_BROKER_DIR / "out"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(_BROKER_DIR / "control"),
        # The worker polls the folder; kombu's 1 s poll added up to seconds of a warm shutdown.
        "polling_interval": 0.2,
    }
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": str(VAR_DIR / "cache")}}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
# Each decision of these settings is tested in tests/scheduling/test_celery_config.py.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a long cycle must not hold tasks other workers could run
CELERY_TASK_ACKS_LATE = False  # opted into per task, and only for idempotent ones
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # a SIGKILLed worker's late-ack task is redelivered
CELERY_TASK_TIME_LIMIT = 300  # well below the broker's visibility timeout (3600 s)
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_IMPORTS = ["scheduling.tasks", "scheduling.agent.tasks", "scheduling.governance.tasks", "scheduling.serving.tasks"]

# --------------------------------------------------------------------------- Yardmaster
# The scheduler's, the agents' and governance's tunables, and their liveness check: portal/yard_settings.py.
YARD = yard_settings(VAR_DIR)

CELERY_BEAT_SCHEDULE = {
    "scheduling-cycle": {"task": "scheduling.tasks.run_cycle", "schedule": YARD["CYCLE_INTERVAL_S"]},
    "node-liveness": {"task": "scheduling.agent.tasks.check_nodes", "schedule": YARD["LIVENESS_TICK_S"]},
    "idle-notebook-reaper": {"task": "scheduling.governance.tasks.reap_idle_notebooks", "schedule": YARD["REAPER_INTERVAL_S"]},
    "telemetry-retention": {"task": "scheduling.governance.tasks.prune_telemetry", "schedule": 3600.0},
    "service-controller": {"task": "scheduling.serving.tasks.reconcile_services", "schedule": YARD["SERVICE_TICK_S"]},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# --------------------------------------------------------------------------- single sign-on (OIDC)
# sso/: mozilla-django-oidc, endpoints from the issuer's discovery document, authorization code with
# PKCE, groups mapped to memberships at every sign-in. README: "Connecting an identity provider".
from portal.env import ImproperlyConfiguredEnv as _SsoEnvError  # noqa: E402
from sso.config import GroupMapError, load_group_map  # noqa: E402

INSTALLED_APPS += ["sso", "notifications"]
OIDC_OP_ISSUER = env_str("YARD_OIDC_ISSUER", "").rstrip("/")
OIDC_RP_CLIENT_ID = env_str("YARD_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("YARD_OIDC_CLIENT_SECRET", "")
OIDC_RP_SCOPES = env_str("YARD_OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = env_str("YARD_OIDC_SIGN_ALGO", "RS256")
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env_float("YARD_OIDC_TIMEOUT_S", 10.0, minimum=1)
OIDC_VERIFY_SSL = env_bool("YARD_OIDC_VERIFY_TLS", True)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
LOGIN_REDIRECT_URL_FAILURE = "login"
YARD_OIDC_GROUPS_CLAIM = env_str("YARD_OIDC_GROUPS_CLAIM", "groups")
YARD_OIDC_USERNAME_CLAIM = env_str("YARD_OIDC_USERNAME_CLAIM", "preferred_username")
YARD_OIDC_PROVIDER_NAME = env_str("YARD_OIDC_PROVIDER_NAME", "single sign-on")
YARD_OIDC_SESSION_S = env_float("YARD_OIDC_SESSION_HOURS", 12.0, minimum=0.05) * 3600
YARD_LOCAL_LOGIN = env_bool("YARD_LOCAL_LOGIN", True)
try:
    YARD_OIDC_GROUP_MAP = load_group_map(inline=env_str("YARD_OIDC_GROUP_MAP", ""), path=env_str("YARD_OIDC_GROUP_MAP_FILE", ""))
except GroupMapError as _exc:
    raise _SsoEnvError(str(_exc)) from None
if OIDC_OP_ISSUER and not OIDC_OP_ISSUER.startswith(("https://", "http://")):
    raise _SsoEnvError(
        f"YARD_OIDC_ISSUER={OIDC_OP_ISSUER!r} must be the provider's issuer URL, e.g. https://login.example.com/realms/gpu"
    )
if bool(OIDC_OP_ISSUER) != bool(OIDC_RP_CLIENT_ID):
    raise _SsoEnvError("set both YARD_OIDC_ISSUER and YARD_OIDC_CLIENT_ID (and YARD_OIDC_CLIENT_SECRET), or neither")
if OIDC_OP_ISSUER and not YARD_OIDC_GROUP_MAP:
    raise _SsoEnvError(
        "YARD_OIDC_ISSUER is set but YARD_OIDC_GROUP_MAP (or _FILE) maps no group: nobody signing in would get a team; "
        'e.g. YARD_OIDC_GROUP_MAP=\'{"gpu-pretraining": {"unit": "pretraining", "role": "member"}}\''
    )
if not YARD_LOCAL_LOGIN and not OIDC_OP_ISSUER:
    raise _SsoEnvError("YARD_LOCAL_LOGIN=0 switches passwords off, but no YARD_OIDC_ISSUER is set: nobody could sign in")
# Password sign-in exists only while local login is on; API tokens are DRF's business and keep working.
AUTHENTICATION_BACKENDS = [
    *(["django.contrib.auth.backends.ModelBackend"] if YARD_LOCAL_LOGIN else []),
    "sso.backend.YardOidcBackend",
]

# --------------------------------------------------------------------------- notifications
# notifications/: derived from JobEvent and AuditEntry rows by a beat task, sent by Celery after commit.
# README: "Notifications".
YARD_NOTIFY = {
    "SCAN_INTERVAL_S": env_float("YARD_NOTIFY_SCAN_INTERVAL_S", 10.0, minimum=0.5),
    "TIME_LIMIT_LEAD_S": env_float("YARD_NOTIFY_TIME_LIMIT_LEAD_MIN", 30.0, minimum=1) * 60,
    "MAX_ATTEMPTS": env_int("YARD_NOTIFY_MAX_ATTEMPTS", 6, minimum=1),
    "RETRY_BASE_S": env_float("YARD_NOTIFY_RETRY_BASE_S", 30.0, minimum=0.1),
    "WEBHOOK_DISABLE_AFTER": env_int("YARD_WEBHOOK_DISABLE_AFTER", 10, minimum=1),
    "WEBHOOK_TIMEOUT_S": env_float("YARD_WEBHOOK_TIMEOUT_S", 5.0, minimum=0.5),
    # Where user-given webhook URLs may not point: the portal's own host and cloud metadata services.
    # Private ranges stay allowed (an on-premises Mattermost); empty: no check.
    "WEBHOOK_DENY_NETWORKS": env_list(
        "YARD_WEBHOOK_DENY_NETWORKS", ["127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8"]
    ),
    "EMAIL_TIMEOUT_S": env_float("YARD_EMAIL_TIMEOUT_S", 10.0, minimum=1),
    # Links in e-mails and webhook messages.
    "PUBLIC_URL": env_str("YARD_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/"),
}
CELERY_IMPORTS = [*CELERY_IMPORTS, "notifications.tasks"]
CELERY_BEAT_SCHEDULE["notifications-collect"] = {
    "task": "notifications.tasks.collect",
    "schedule": YARD_NOTIFY["SCAN_INTERVAL_S"],
}
if env_str("YARD_NOTIFY_QUEUE", ""):
    CELERY_TASK_ROUTES = {"notifications.tasks.*": {"queue": env_str("YARD_NOTIFY_QUEUE", "")}}
# E-mail is a channel only where EMAIL_HOST is set (Django's SMTP backend).
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env_str("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise _SsoEnvError("set EMAIL_USE_TLS (STARTTLS, port 587) or EMAIL_USE_SSL (port 465), not both")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Yardmaster <yardmaster@localhost>")

# --------------------------------------------------------------------------- the portal's own pages
# API docs with no internet: Swagger UI's files come from drf-spectacular-sidecar and are served by the
# portal itself (GPU clusters are often air-gapped; a CDN URL left /api/docs/ blank there).
INSTALLED_APPS += ["drf_spectacular_sidecar"]
SPECTACULAR_SETTINGS.update({"SWAGGER_UI_DIST": "SIDECAR", "SWAGGER_UI_FAVICON_HREF": "SIDECAR", "REDOC_DIST": "SIDECAR"})
# The portal's 404 page for people, also where DEBUG would show Django's technical one (the demo's).
_MESSAGES = MIDDLEWARE.index("django.contrib.messages.middleware.MessageMiddleware")
MIDDLEWARE.insert(_MESSAGES + 1, "portal.views.errors.FriendlyNotFound")

# --------------------------------------------------------------------------- hardening (docs: README "Security")
# Enrolment (scheduling/agent/enrolment.py): YARD_AGENT_ENROLMENT_TOKEN registers at most this many nodes
# (counted in the database), and with YARD_AGENT_REQUIRE_APPROVAL every newly registered node waits for a
# cluster admin's approval before it gets work, whatever its token says.
YARD["AGENT_ENROLMENT_MAX_USES"] = env_int("YARD_AGENT_ENROLMENT_MAX_USES", 1, minimum=1)
YARD["AGENT_REQUIRE_APPROVAL"] = env_bool("YARD_AGENT_REQUIRE_APPROVAL", False)

from datetime import timedelta as _timedelta  # noqa: E402

# Sign-in throttling (django-axes): a username from one address is locked out after this many wrong
# passwords in a row, for the cool-off from the last one (then it may try again; a success resets the
# count). Per username and address, so nobody can lock another person out from elsewhere. The lockout
# page says why and for how long (portal/lockout.py), with 429 and Retry-After.
INSTALLED_APPS += ["axes"]
# Password spraying: every password sign-in from one address counts, across usernames; past
# YARD_SIGN_IN_ADDRESS_LIMIT failures within YARD_SIGN_IN_ADDRESS_WINDOW_MIN of the first, that address
# is refused (429, the lockout page) until the window ends (tenants/lockout.py, AddressLimitBackend).
AUTHENTICATION_BACKENDS = ["tenants.lockout.AddressLimitBackend", "axes.backends.AxesStandaloneBackend", *AUTHENTICATION_BACKENDS]
YARD["SIGN_IN_ADDRESS_LIMIT"] = env_int("YARD_SIGN_IN_ADDRESS_LIMIT", 20, minimum=1)
YARD["SIGN_IN_ADDRESS_WINDOW_S"] = 60 * env_float("YARD_SIGN_IN_ADDRESS_WINDOW_MIN", 15.0, minimum=0.01)
MIDDLEWARE.append("axes.middleware.AxesMiddleware")
AXES_FAILURE_LIMIT = env_int("YARD_LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = _timedelta(minutes=env_float("YARD_LOGIN_COOLOFF_MIN", 15.0, minimum=0.01))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "portal.lockout.locked_out"
AXES_CLIENT_IP_CALLABLE = "tenants.lockout.client_ip"
AXES_VERBOSE = False
# The same for bad API tokens, per address (tenants/lockout.py).
YARD["TOKEN_FAILURE_LIMIT"] = env_int("YARD_TOKEN_FAILURE_LIMIT", 20, minimum=1)
YARD["TOKEN_LOCKOUT_S"] = env_float("YARD_TOKEN_LOCKOUT_S", 900.0, minimum=1)

# Content-Security-Policy (django-csp): scripts only from the portal itself (htmx and yard.js are static
# files; no inline script, no eval: yard.js switches htmx's eval off), styles from it plus the inline style
# attributes the pages use for bars and colours, no framing, forms posting only here (and to the identity
# provider). Report-only with YARD_CSP_REPORT_ONLY=1, to try a change on a live portal first.
from csp.constants import NONE as _CSP_NONE  # noqa: E402
from csp.constants import SELF as _CSP_SELF  # noqa: E402
from csp.constants import UNSAFE_INLINE as _CSP_UNSAFE_INLINE  # noqa: E402

# django-csp's middleware, but not on the agent API's JSON (portal.middleware.ContentSecurityPolicyMiddleware).
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1, "portal.middleware.ContentSecurityPolicyMiddleware"
)
INSTALLED_APPS += ["csp"]
_CSP = {
    "DIRECTIVES": {
        "default-src": [_CSP_SELF],
        "script-src": [_CSP_SELF],
        "style-src": [_CSP_SELF, _CSP_UNSAFE_INLINE],
        "img-src": [_CSP_SELF, "data:"],
        "font-src": [_CSP_SELF],
        "connect-src": [_CSP_SELF],
        "object-src": [_CSP_NONE],
        "base-uri": [_CSP_SELF],
        "frame-ancestors": [_CSP_NONE],
        "form-action": [_CSP_SELF, *([OIDC_OP_ISSUER] if OIDC_OP_ISSUER else [])],
    }
}
if env_bool("YARD_CSP_REPORT_ONLY", False):
    CONTENT_SECURITY_POLICY_REPORT_ONLY = _CSP
else:
    CONTENT_SECURITY_POLICY = _CSP

# Notebooks through the portal (portal/notebook_proxy.py, served by uvicorn portal.asgi:application):
# where browsers reach the notebook proxy. Empty: at the portal's own address (the reverse proxy routes
# /notebooks/<id>/lab/ to it); `make run` serves it at http://127.0.0.1:8001. A host of its own
# (https://notebooks.yard.example.com, with SESSION_COOKIE_DOMAIN=.yard.example.com) keeps notebooks'
# pages off the portal's origin, as JupyterHub advises with subdomains.
YARD_NOTEBOOK_URL = env_str("YARD_NOTEBOOK_URL", "").rstrip("/")
if YARD_NOTEBOOK_URL and not YARD_NOTEBOOK_URL.startswith(("https://", "http://")):
    raise ImproperlyConfiguredEnv(
        f"YARD_NOTEBOOK_URL={YARD_NOTEBOOK_URL!r}: give the notebook proxy's URL, e.g. https://notebooks.example.com"
    )
