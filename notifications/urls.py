from django.urls import URLPattern, path

from notifications import views

urlpatterns: list[URLPattern] = [
    path("", views.notification_list, name="notifications"),
    path("settings/", views.preferences, name="notification-preferences"),
    path("webhooks/", views.webhooks, name="webhooks"),
    path("webhooks/<int:pk>/", views.webhook_edit, name="webhook-edit"),
    path("webhooks/<int:pk>/enable/", views.webhook_enable_view, name="webhook-enable"),
    path("webhooks/<int:pk>/delete/", views.webhook_delete_view, name="webhook-delete"),
]
