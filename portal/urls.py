from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from portal.views import dashboard, health
from sso import views as sso_views

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("healthz", health.healthz, name="healthz"),
    path("login/", sso_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("oidc/", include("sso.urls")),
    path("admin/login/", sso_views.admin_login),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("scheduling.api.urls")),
    path("api/agent/v1/", include("scheduling.agent.urls")),
    path("", include("scheduling.governance.urls")),
    path("", include("portal.views.urls")),
    path("notifications/", include("notifications.urls")),
]
