"""The browser portal's pages (mounted at the site root; the dashboard is "/" in portal/urls.py)."""

from django.urls import URLPattern, URLResolver, path

from portal.views import cluster, dev_sessions, fairshare, jobs, notebooks, quotas, services, ssh_keys, tokens, whatif

urlpatterns: list[URLPattern | URLResolver] = [
    path("jobs/", jobs.jobs_list, name="jobs"),
    path("jobs/new/", jobs.job_submit_view, name="job-submit"),
    path("jobs/arrays/<int:pk>/rows/", jobs.job_array_rows, name="job-array-rows"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job"),
    path("jobs/<int:pk>/log/", jobs.job_log_download, name="job-log"),
    path("jobs/<int:pk>/cancel/", jobs.job_cancel_view, name="job-cancel"),
    path("jobs/<int:pk>/rerun/", jobs.job_rerun, name="job-rerun"),
    path("notebooks/", notebooks.notebooks, name="notebooks"),
    path("notebooks/<int:pk>/", notebooks.notebook_detail, name="notebook"),
    path("notebooks/<int:pk>/open", notebooks.notebook_open, name="notebook-open"),
    # Served by the notebook proxy (portal/notebook_proxy.py); reaching the WSGI tier says where it is.
    path("notebooks/<int:pk>/lab/", notebooks.notebook_lab_elsewhere),
    path("notebooks/<int:pk>/lab/<path:rest>", notebooks.notebook_lab_elsewhere),
    path("notebooks/<int:pk>/stop/", notebooks.notebook_stop, name="notebook-stop"),
    # /dev-sessions/<id>/ssh is the SSH tunnel's (portal/dev_proxy.py): the actions on a session are POSTs to its page.
    path("dev-sessions/", dev_sessions.dev_sessions, name="dev-sessions"),
    path("dev-sessions/new", dev_sessions.dev_session_new, name="dev-session-new"),
    path("dev-sessions/<int:pk>/", dev_sessions.dev_session_detail, name="dev-session"),
    path("dev-sessions/<int:pk>/ssh", dev_sessions.dev_session_tunnel_elsewhere),
    # /services/<team>/<name>/… is the service proxy's (portal/service_proxy.py): no page here has a path of
    # that shape, so the actions on a service are POSTs to its page (portal/views/services.py).
    path("services/", services.services_list, name="services"),
    path("services/new", services.service_new, name="service-new"),
    path("services/<int:pk>/", services.service_detail, name="service"),
    # The proxy's paths, should they reach this server: where the proxy is, or what to route.
    path("services/<str:team>/<str:name>/", services.service_elsewhere),
    path("services/<str:team>/<str:name>/<path:rest>", services.service_elsewhere),
    path("cluster/", cluster.cluster, name="cluster"),
    path("cluster/nodes/", cluster.node_maintenance, name="node-maintenance"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("ssh-keys/", ssh_keys.ssh_keys, name="ssh-keys"),
    path("ssh-keys/<int:pk>/delete/", ssh_keys.ssh_key_delete_view, name="ssh-key-delete"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke_view, name="token-revoke"),
    path("quotas/", quotas.quotas, name="quotas"),
    path("fairshare/", fairshare.fairshare_page, name="fairshare"),
    path("quotas/history/", quotas.quota_history, name="quota-history"),
    path("quotas/units/new/", quotas.unit_add, name="unit-add"),
    path("quotas/units/move/", quotas.unit_relocate, name="unit-move"),
    path("quotas/units/<int:unit_id>/remove/", quotas.unit_remove, name="unit-remove"),
    path("quotas/drafts/new/", whatif.draft_new, name="draft-new"),
    path("quotas/drafts/<int:pk>/", whatif.draft_detail, name="draft"),
    path("quotas/drafts/<int:pk>/types/", whatif.draft_add_type, name="draft-add-type"),
    path("quotas/drafts/<int:pk>/apply/", whatif.draft_apply_view, name="draft-apply"),
    path("quotas/drafts/<int:pk>/runs/", whatif.run_new, name="whatif-new"),
    path("quotas/drafts/<int:pk>/<int:unit_id>/<str:gpu_type>/", whatif.draft_cell, name="draft-cell"),
    path("quotas/whatif/<int:pk>/", whatif.run_detail, name="whatif-run"),
    path("quotas/whatif/<int:pk>/cancel/", whatif.run_cancel, name="whatif-cancel"),
    path("quotas/whatif/<int:pk>/csv/", whatif.run_csv, name="whatif-csv"),
    path("quotas/<int:unit_id>/<str:gpu_type>/", quotas.quota_edit, name="quota-edit"),
]
