"""Mounted at /api/agent/v1/ (portal/urls.py). The contract is docs/agent-api.md."""

from django.urls import URLPattern, URLResolver, path

from scheduling.agent import views

app_name = "agent"
urlpatterns: list[URLPattern | URLResolver] = [
    path("register", views.RegisterView.as_view(), name="register"),
    path("heartbeat", views.HeartbeatView.as_view(), name="heartbeat"),
    path("tasks/<int:task_id>/status", views.TaskStatusView.as_view(), name="task-status"),
    path("tasks/<int:task_id>/logs", views.TaskLogsView.as_view(), name="task-logs"),
    path("drain", views.DrainView.as_view(), name="drain"),
]
