"""Mounted at /api/agent/v1/ (portal/urls.py). The contract is docs/agent-api.md; the OpenAPI document is `schema`."""

from django.urls import URLPattern, URLResolver, path

from scheduling.agent import views

app_name = "agent"
urlpatterns: list[URLPattern | URLResolver] = [
    path("register", views.register, name="register"),
    path("heartbeat", views.heartbeat, name="heartbeat"),
    path("tasks/<int:task_id>/status", views.task_status, name="task-status"),
    path("tasks/<int:task_id>/logs", views.task_logs, name="task-logs"),
    path("drain", views.drain, name="drain"),
    path("schema", views.schema, name="schema"),
]
