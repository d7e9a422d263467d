"""REST API v1, mounted at /api/v1/ (portal/urls.py). Every operation is in the authorization matrix test.

One module per resource: jobs.py, arrays.py, notebooks.py, dev_sessions.py, ssh_keys.py, teams.py (teams and me),
registry.py; base.py is what they share, submission.py what a submission's body becomes.
"""

from django.urls import URLPattern, URLResolver, path

from scheduling.api import arrays, dev_sessions, jobs, notebooks, registry, services, ssh_keys, teams

app_name = "api"
urlpatterns: list[URLPattern | URLResolver] = [
    path("jobs", jobs.JobListCreateView.as_view(), name="jobs"),
    path("jobs/preview", jobs.JobPreviewView.as_view(), name="jobs-preview"),
    path("jobs/<int:pk>", jobs.JobDetailView.as_view(), name="job"),
    path("jobs/<int:pk>/cancel", jobs.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:pk>/logs", jobs.JobLogsView.as_view(), name="job-logs"),
    path("jobs/<int:pk>/rerun", jobs.JobRerunView.as_view(), name="job-rerun"),
    path("arrays/<int:pk>", arrays.JobArrayDetailView.as_view(), name="array"),
    path("arrays/<int:pk>/cancel", arrays.JobArrayCancelView.as_view(), name="array-cancel"),
    path("notebooks", notebooks.NotebookListCreateView.as_view(), name="notebooks"),
    path("notebooks/<int:pk>", notebooks.NotebookDetailView.as_view(), name="notebook"),
    path("notebooks/<int:pk>/stop", notebooks.NotebookStopView.as_view(), name="notebook-stop"),
    path("notebooks/<int:pk>/logs", notebooks.NotebookLogsView.as_view(), name="notebook-logs"),
    path("dev-sessions", dev_sessions.DevSessionListCreateView.as_view(), name="dev-sessions"),
    path("dev-sessions/<int:pk>", dev_sessions.DevSessionDetailView.as_view(), name="dev-session"),
    path("dev-sessions/<int:pk>/stop", dev_sessions.DevSessionStopView.as_view(), name="dev-session-stop"),
    path("dev-sessions/<int:pk>/logs", dev_sessions.DevSessionLogsView.as_view(), name="dev-session-logs"),
    path("ssh-keys", ssh_keys.SshKeyListCreateView.as_view(), name="ssh-keys"),
    path("ssh-keys/<int:pk>", ssh_keys.SshKeyDetailView.as_view(), name="ssh-key"),
    path("services", services.ServiceListCreateView.as_view(), name="services"),
    path("services/<int:pk>", services.ServiceDetailView.as_view(), name="service"),
    path("services/<int:pk>/scale", services.ServiceScaleView.as_view(), name="service-scale"),
    path("services/<int:pk>/rollout", services.ServiceRolloutView.as_view(), name="service-rollout"),
    path("services/<int:pk>/logs", services.ServiceLogsView.as_view(), name="service-logs"),
    path("services/<int:pk>/tokens", services.ServiceTokenListCreateView.as_view(), name="service-tokens"),
    path("services/<int:pk>/tokens/<int:token_id>", services.ServiceTokenDetailView.as_view(), name="service-token"),
    path("teams/<int:pk>/quota", teams.TeamQuotaView.as_view(), name="team-quota"),
    path("me", teams.MeView.as_view(), name="me"),
    path("me/quota", teams.MyQuotaView.as_view(), name="me-quota"),
    path("registry-credentials", registry.RegistryCredentialListCreateView.as_view(), name="registry-credentials"),
    path("registry-credentials/<int:pk>", registry.RegistryCredentialDetailView.as_view(), name="registry-credential"),
]
