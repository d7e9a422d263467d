from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from scheduling import images
from scheduling.agent.tokens import new_enrolment_token
from scheduling.models import (
    Allocation,
    EnrolmentToken,
    Gpu,
    IdlePolicy,
    Job,
    JobEvent,
    JobTemplate,
    Leaf,
    Node,
    RegistryCredential,
    SchedulerLease,
    Spine,
    Task,
)
from scheduling.registry_credentials import MAX_PASSWORD, credential_delete, credential_set
from scheduling.services import node_resume
from tenants.models import hash_token
from tenants.services import audit


class LeafInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Leaf
    extra = 0


@admin.register(Spine)
class SpineAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    inlines = [LeafInline]


@admin.register(Leaf)
class LeafAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "spine"]
    list_filter = ["spine"]


class GpuInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "gpu_type", "memory_mb", "nvlink_domain", "pcie_switch", "numa_node", "healthy", "utilization_pct"]
    readonly_fields = ["utilization_pct"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["name", "leaf", "gpu_type", "state", "state_reason", "last_heartbeat", "simulated"]
    list_filter = ["state", "gpu_type", "leaf__spine", "leaf", "simulated"]
    search_fields = ["name", "address"]
    exclude = ["token_hash"]
    inlines = [GpuInline]
    actions = ["approve_or_resume"]

    @admin.action(description="Approve (a new node) or resume (a drained node)")
    def approve_or_resume(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        # The same service as the cluster page's Resume: it clears the hold (an approval is one) and audits it.
        for node in queryset:
            try:
                node_resume(node=node, actor=request.user)  # type: ignore[arg-type]
            except ValidationError as exc:
                self.message_user(request, "; ".join(exc.messages), messages.WARNING)
            else:
                self.message_user(request, f"{node.name}: approved / resumed", messages.SUCCESS)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["__str__", "uuid", "gpu_type", "nvlink_domain", "pcie_switch", "numa_node", "healthy", "utilization_pct"]
    list_filter = ["gpu_type", "healthy"]
    search_fields = ["uuid", "node__name"]


class TaskInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Task
    extra = 0
    fields = readonly_fields = ("attempt", "rank", "node", "state", "pid", "exit_code", "stopped_by", "started_at", "ended_at")


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    fields = readonly_fields = ("time", "attempt", "from_state", "to_state", "reason", "actor_label")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "id",
        "name",
        "team",
        "user",
        "tier",
        "kind",
        "state",
        "replicas",
        "gpus_per_replica",
        "gpu_type",
        "submitted_at",
    ]
    list_filter = ["state", "tier", "kind", "gpu_type", "team"]
    search_fields = ["name", "user__username", "team__name", "=id"]
    date_hierarchy = "submitted_at"
    raw_id_fields = ["copied_from"]
    readonly_fields = ["state", "attempt", "pending_reason", "estimated_start", "locality", "borrowed"]
    inlines = [TaskInline, JobEventInline]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["gpu", "job", "attempt", "allocated_at", "released_at", "borrowed"]
    list_filter = ["borrowed"]
    raw_id_fields = ["gpu", "task", "job"]


admin.site.register(SchedulerLease)
admin.site.register(JobTemplate)
admin.site.register(IdlePolicy)


@admin.register(EnrolmentToken)
class EnrolmentTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Made here or with ``manage.py enrolment_token``: the raw token is shown once, only its hash is kept."""

    list_display = ["name", "uses", "max_uses", "requires_approval", "created_at", "expires_at", "last_used_at", "revoked_at"]
    fields = ["name", "max_uses", "expires_at", "requires_approval", "revoked_at", "uses", "created_at", "last_used_at"]
    readonly_fields = ["uses", "created_at", "last_used_at"]

    def save_model(self, request: HttpRequest, obj: EnrolmentToken, form, change: bool) -> None:  # type: ignore[no-untyped-def]
        raw = None
        if not change:
            raw = new_enrolment_token()
            obj.token_hash = hash_token(raw)
        super().save_model(request, obj, form, change)
        audit(
            actor=request.user,  # type: ignore[arg-type]
            action="enrolment.update" if change else "enrolment.create",
            obj=obj,
            message=f"{obj.name}: up to {obj.max_uses} node(s)" + (", revoked" if obj.revoked_at else ""),
            data={"max_uses": obj.max_uses, "requires_approval": obj.requires_approval},
        )
        if raw is not None:
            self.message_user(request, f"Enrolment token for {obj.name} (shown only now): {raw}", messages.SUCCESS)


class RegistryCredentialForm(forms.ModelForm):  # type: ignore[type-arg]
    """The password is write-only here as in the API: an empty box on every page, never the sealed text."""

    password = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        max_length=MAX_PASSWORD,
        strip=False,
        help_text="The password or access token: sealed at rest and never shown again. Give it again to change the user.",
    )

    class Meta:
        model = RegistryCredential
        fields = ["unit", "registry", "username"]

    def clean_registry(self) -> str:
        try:
            return images.parse_registry(self.cleaned_data["registry"])
        except images.ImageError as exc:
            raise ValidationError(str(exc)) from None


@admin.register(RegistryCredential)
class RegistryCredentialAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A unit's login to a container registry (docs/containers.md). Saved and deleted through the same
    services as the API (sealed, audited); the sealed password is neither listed, shown nor searchable."""

    form = RegistryCredentialForm
    list_display = ["registry", "username", "unit", "created_by", "updated_at"]
    list_filter = ["registry"]
    search_fields = ["registry", "username", "unit__name", "unit__slug"]
    readonly_fields = ["created_by", "created_at", "updated_at"]

    fields = ["unit", "registry", "username", "password", "created_by", "created_at", "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Another unit or registry is another credential: set a new one and delete this.
        return [*self.readonly_fields, "unit", "registry"] if obj is not None else list(self.readonly_fields)

    def save_model(self, request: HttpRequest, obj: RegistryCredential, form: Any, change: bool) -> None:
        saved, _ = credential_set(
            actor=request.user,  # type: ignore[arg-type]
            unit=obj.unit,
            registry=obj.registry,
            username=obj.username,
            password=form.cleaned_data["password"],
        )
        obj.pk, obj.password_sealed = saved.pk, saved.password_sealed

    def delete_model(self, request: HttpRequest, obj: RegistryCredential) -> None:
        credential_delete(actor=request.user, credential=obj)  # type: ignore[arg-type]

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RegistryCredential]) -> None:
        for credential in queryset.select_related("unit"):
            credential_delete(actor=request.user, credential=credential)  # type: ignore[arg-type]
