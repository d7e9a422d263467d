"""Governance URLs, mounted at "" by portal/urls.py (so the API path is spelled out in full here)."""

from django.urls import URLPattern, URLResolver, path

from scheduling.governance import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("reports/", views.report_page, name="reports"),
    path("reports/usage.csv", views.report_units_csv, name="report-usage-csv"),
    path("reports/jobs.csv", views.report_jobs_csv, name="report-jobs-csv"),
    path("notebooks/<int:pk>/extend-idle", views.notebook_extend_idle_view, name="notebook-extend-idle"),
    path("metrics", views.metrics, name="metrics"),
    path("api/v1/reports/usage", views.UsageReportAPI.as_view(), name="api-reports-usage"),
    path("api/v1/fairshare", views.FairShareAPI.as_view(), name="api-fairshare"),
]
