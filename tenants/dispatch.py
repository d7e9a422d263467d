"""Sending Celery tasks by name (Celery's advice for a caller its task module imports): the services
that queue work never import the task modules that call them, so neither side makes a circle.

An eager app (``CELERY_TASK_ALWAYS_EAGER``: some tests, a deployment that runs tasks in-process) has
no broker to send to; there the task is looked up by its name, which is its module and function, and
run in-process as ``apply_async`` would run it.
"""

from __future__ import annotations

import importlib
from typing import Any

from celery import current_app


def send_task(name: str, args: tuple[Any, ...] = (), *, countdown: float | None = None) -> Any:
    app = current_app
    if app.conf.task_always_eager:
        module, _, function = name.rpartition(".")
        return getattr(importlib.import_module(module), function).apply_async(args, countdown=countdown)
    return app.send_task(name, args=args, countdown=countdown)
