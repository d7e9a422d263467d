"""The org tree (root -> business unit -> department -> team), quotas, roles, tokens, audit."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class UnitKind(models.TextChoices):
    ROOT = "root", "Cluster"
    BUSINESS_UNIT = "bu", "Business unit"
    DEPARTMENT = "dept", "Department"
    TEAM = "team", "Team"


# A child is always strictly deeper than its parent (a team may sit directly under a
# business unit; a department never under a team).
KIND_DEPTH = {UnitKind.ROOT: 0, UnitKind.BUSINESS_UNIT: 1, UnitKind.DEPARTMENT: 2, UnitKind.TEAM: 3}


class OrgUnit(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=UnitKind.choices)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    # Materialised path of ids ("/1/4/9/"): subtree queries are one indexed prefix match.
    path = models.CharField(max_length=512, db_index=True, editable=False, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["path"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind=UnitKind.ROOT, parent__isnull=True) | (~Q(kind=UnitKind.ROOT) & Q(parent__isnull=False)),
                name="orgunit_only_root_has_no_parent",
            ),
            models.UniqueConstraint(fields=["parent", "name"], name="orgunit_unique_name_per_parent"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def depth(self) -> int:
        return max(self.path.count("/") - 2, 0)

    @property
    def is_team(self) -> bool:
        return self.kind == UnitKind.TEAM


class Quota(models.Model):
    """Per unit and GPU type: guaranteed GPUs, an optional limit (borrowing included), a weight."""

    unit = models.ForeignKey(OrgUnit, on_delete=models.CASCADE, related_name="quotas")
    gpu_type = models.CharField(max_length=32)
    guaranteed = models.PositiveIntegerField(default=0)
    limit = models.PositiveIntegerField(null=True, blank=True, help_text="Most GPUs it may hold, borrowing included")
    weight = models.FloatField(default=1.0, help_text="Share of idle capacity, relative to siblings")

    class Meta:
        ordering = ["unit__path", "gpu_type"]
        constraints = [
            models.UniqueConstraint(fields=["unit", "gpu_type"], name="quota_unique_unit_gpu_type"),
            models.CheckConstraint(
                condition=Q(limit__isnull=True) | Q(limit__gte=F("guaranteed")), name="quota_limit_gte_guaranteed"
            ),
            models.CheckConstraint(condition=Q(weight__gt=0), name="quota_weight_positive"),
        ]

    def __str__(self) -> str:
        limit = "∞" if self.limit is None else self.limit
        return f"{self.unit} {self.gpu_type}: {self.guaranteed} guaranteed, limit {limit}"


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    TEAM_LEAD = "team_lead", "Team lead"
    ORG_ADMIN = "org_admin", "Org admin"  # admin of the unit's whole subtree
    CLUSTER_ADMIN = "cluster_admin", "Cluster admin"  # held on the root unit


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    unit = models.ForeignKey(OrgUnit, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "unit"], name="membership_unique_user_unit")]

    def __str__(self) -> str:
        return f"{self.user} {self.get_role_display()} of {self.unit}"


def hash_token(raw: str) -> str:
    # Tokens are 240 random bits, so a fast hash is enough (as GitHub and healthchecks do);
    # a slow password hash would only slow every API call.
    return hashlib.sha256(raw.encode()).hexdigest()


class TokenKind(models.TextChoices):
    PERSONAL = "personal", "Personal"
    SERVICE = "service", "Team service account (CI)"


class ApiToken(models.Model):
    """A bearer token: personal (acts as its user) or a team's service account (acts for the team)."""

    kind = models.CharField(max_length=10, choices=TokenKind.choices)
    name = models.CharField(max_length=100)
    # Personal tokens act as their user; service tokens act as the team's service-account user,
    # whose only membership is the team, so every permission check stays uniform.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(OrgUnit, null=True, blank=True, on_delete=models.CASCADE, related_name="service_tokens")
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a token in lists")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kind=TokenKind.PERSONAL, team__isnull=True) | Q(kind=TokenKind.SERVICE, team__isnull=False),
                name="apitoken_service_tokens_have_team",
            )
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def is_active(self, now: object | None = None) -> bool:
        moment = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > moment)  # type: ignore[operator]


class SshKey(models.Model):
    """A person's SSH public key (OpenSSH's one-line form): what their dev sessions' sshd lets in
    (docs/dev-sessions.md). Only public keys are ever stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    key_type = models.CharField(max_length=64)  # "ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa", ...
    public_key = models.TextField(help_text="<type> <base64> as OpenSSH writes it, without the comment")
    fingerprint = models.CharField(max_length=64, help_text="SHA256:… as ssh-keygen -l prints it")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["user_id", "name"]
        constraints = [models.UniqueConstraint(fields=["user", "fingerprint"], name="sshkey_unique_per_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


class AuditEntry(models.Model):
    """Who did what, when: every mutating request, quota change and scheduler decision, once."""

    time = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=100, help_text="'scheduler', 'agent node-3', or the username")
    action = models.CharField(max_length=64, db_index=True)  # e.g. "quota.update", "job.place"
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=64)
    unit = models.ForeignKey(OrgUnit, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"])]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.object_type}:{self.object_id}"


class RateCounter(models.Model):
    """One fixed-window counter of tenants/counters.py where the cache is no Redis (the SQLite demo, or
    PostgreSQL without REDIS_URL): counted by one INSERT … ON CONFLICT DO UPDATE SET count = count + 1,
    atomic in the database whatever the number of web processes."""

    name = models.CharField(max_length=200, primary_key=True)
    count = models.BigIntegerField(default=0)
    expires_at = models.FloatField(help_text="epoch seconds the window ends at")

    class Meta:
        db_table = "yard_rate_counter"

    def __str__(self) -> str:
        return f"{self.name}: {self.count}"
