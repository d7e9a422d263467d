from django.contrib import admin

from sso.models import OidcIdentity


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "issuer", "subject", "last_login_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("groups", "created_at", "last_login_at")
