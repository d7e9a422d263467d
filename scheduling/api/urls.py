"""REST API v1, mounted at /api/v1/ (portal/urls.py). Every operation is in the authorization matrix test."""

from django.urls import URLPattern, URLResolver, path

from scheduling.api import registry, views

app_name = "api"
urlpatterns: list[URLPattern | URLResolver] = [
    path("jobs", views.JobListCreateView.as_view(), name="jobs"),
    path("jobs/preview", views.JobPreviewView.as_view(), name="jobs-preview"),
    path("jobs/<int:pk>", views.JobDetailView.as_view(), name="job"),
    path("jobs/<int:pk>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:pk>/logs", views.JobLogsView.as_view(), name="job-logs"),
    path("jobs/<int:pk>/rerun", views.JobRerunView.as_view(), name="job-rerun"),
    path("notebooks", views.NotebookListCreateView.as_view(), name="notebooks"),
    path("notebooks/<int:pk>", views.NotebookDetailView.as_view(), name="notebook"),
    path("notebooks/<int:pk>/stop", views.NotebookStopView.as_view(), name="notebook-stop"),
    path("notebooks/<int:pk>/logs", views.NotebookLogsView.as_view(), name="notebook-logs"),
    path("teams/<int:pk>/quota", views.TeamQuotaView.as_view(), name="team-quota"),
    path("me", views.MeView.as_view(), name="me"),
    path("me/quota", views.MyQuotaView.as_view(), name="me-quota"),
    path("registry-credentials", registry.RegistryCredentialListCreateView.as_view(), name="registry-credentials"),
    path("registry-credentials/<int:pk>", registry.RegistryCredentialDetailView.as_view(), name="registry-credential"),
]
