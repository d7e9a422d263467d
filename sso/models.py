"""Which identity-provider account a local user is: (issuer, subject), the only stable key OIDC gives."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class OidcIdentity(models.Model):
    # Matching on the e-mail address (mozilla-django-oidc's default) would let anyone who can set an
    # address at the provider take over the local account that has it; `sub` is stable and unique per
    # issuer (OpenID Connect Core §5.7).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)
    last_login_at = models.DateTimeField(null=True, blank=True)
    # The groups claim as it was at the last sign-in, to show why a user holds what they hold.
    groups = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name_plural = "OIDC identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="oidcidentity_unique_issuer_subject")]

    def __str__(self) -> str:
        return f"{self.subject} @ {self.issuer}"
