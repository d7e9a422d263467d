from django.urls import URLPattern, path

from sso import views

urlpatterns: list[URLPattern] = [
    path("authenticate/", views.AuthenticateView.as_view(), name="oidc_authentication_init"),
    path("callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
]
