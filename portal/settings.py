"""Yardmaster settings: one file, driven by environment variables.

Zero-setup default (``make run``): SQLite and Celery's filesystem broker under ./var.
Deployments and the test suite set DATABASE_URL (PostgreSQL) and REDIS_URL (Redis).
Every reader fails loudly on a bad value (see portal/env.py).
"""

from __future__ import annotations

from pathlib import Path

from portal.env import database_from_url, env_bool, env_float, env_int, env_int_set, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("YARD_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "dev-only-insecure-secret-key-do-not-use-in-production-0123456789abcdef"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET if DEBUG else None)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    raise RuntimeError("SECRET_KEY is the development key; set a long random SECRET_KEY when DEBUG is off")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
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
    "portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

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

DATABASES = {"default": database_from_url(env_str("DATABASE_URL", "sqlite:///var/yardmaster.sqlite3"), base_dir=BASE_DIR)}
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
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {"token": env_str("YARD_TOKEN_THROTTLE", "30/minute")},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Yardmaster API",
    "DESCRIPTION": "Submit and follow GPU jobs and notebooks; read quotas and usage.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
}

# --------------------------------------------------------------------------- Redis and Celery
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    # kombu's filesystem transport works across processes (memory:// does not): the web
    # process, the worker and beat of `make run` share it with no broker to install.
    _BROKER_DIR = VAR_DIR / "broker"
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "out"),
        "data_folder_out": str(_BROKER_DIR / "out"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(_BROKER_DIR / "control"),
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
CELERY_IMPORTS = ["scheduling.tasks", "scheduling.agent.tasks", "scheduling.governance.tasks"]

# --------------------------------------------------------------------------- Yardmaster
YARD = {
    # scheduling cycle
    "CYCLE_INTERVAL_S": env_float("YARD_CYCLE_INTERVAL_S", 5.0, minimum=0.5),
    "CYCLE_LEASE_S": env_float("YARD_CYCLE_LEASE_S", 60.0, minimum=5.0),
    "HALF_LIFE_S": env_float("YARD_HALF_LIFE_DAYS", 7.0, minimum=0.01) * 86400,
    "GRACE_PERIOD_S": env_float("YARD_GRACE_PERIOD_S", 60.0, minimum=0),
    "MIN_RUNTIME_S": env_float("YARD_MIN_RUNTIME_S", 600.0, minimum=0),
    "DEFAULT_TIME_LIMIT_S": env_int("YARD_DEFAULT_TIME_LIMIT_S", 24 * 3600, minimum=60),
    # node liveness (relations asserted in tests: stop-after + grace < DOWN)
    "HEARTBEAT_INTERVAL_S": env_float("YARD_HEARTBEAT_INTERVAL_S", 10.0, minimum=0.2),
    "NODE_NOT_READY_S": env_float("YARD_NODE_NOT_READY_S", 50.0, minimum=1),
    "NODE_DOWN_S": env_float("YARD_NODE_DOWN_S", 300.0, minimum=2),
    "AGENT_STOP_AFTER_S": env_float("YARD_AGENT_STOP_AFTER_S", 120.0, minimum=1),
    "AGENT_ENROLMENT_TOKEN": env_str("YARD_AGENT_ENROLMENT_TOKEN", ""),
    # XID errors that drain a node (no new work; running work finishes) until an admin resumes it:
    # those after which NVIDIA's XID catalogue calls for a GPU reset, a reboot or a field check
    # (double-bit/uncontained/unrecovered ECC, row remapping, micro-controller halt, NVLink, fallen
    # off the bus, GSP). Application faults (13, 31, 43, 45) are the workload's, not the node's.
    "XID_DRAIN_CODES": env_int_set("YARD_XID_DRAIN_CODES", frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})),
    # storage and governance
    "CHECKPOINT_ROOT": env_str("YARD_CHECKPOINT_ROOT", str(VAR_DIR / "checkpoints")),
    "IDLE_NOTEBOOK_TIMEOUT_S": env_float("YARD_IDLE_NOTEBOOK_TIMEOUT_MIN", 45.0, minimum=1) * 60,
}

CELERY_BEAT_SCHEDULE = {
    "scheduling-cycle": {"task": "scheduling.tasks.run_cycle", "schedule": YARD["CYCLE_INTERVAL_S"]},
    "node-liveness": {"task": "scheduling.agent.tasks.check_nodes", "schedule": 10.0},
    "idle-notebook-reaper": {"task": "scheduling.governance.tasks.reap_idle_notebooks", "schedule": 60.0},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
