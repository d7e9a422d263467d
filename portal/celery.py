"""The Celery app: one for the web process, workers and beat."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("yardmaster")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
