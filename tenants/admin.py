from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms import BaseInlineFormSet
from django.http import HttpRequest

from tenants.models import ApiToken, AuditEntry, Membership, OrgUnit, Quota
from tenants.services import validate_quota


class QuotaInlineFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    def clean(self) -> None:
        super().clean()
        for form in self.forms:
            if not form.cleaned_data or form.cleaned_data.get("DELETE"):
                continue
            data = form.cleaned_data
            try:
                validate_quota(
                    unit=self.instance,
                    gpu_type=data["gpu_type"],
                    guaranteed=data["guaranteed"],
                    limit=data.get("limit"),
                    weight=data.get("weight") or 1.0,
                )
            except ValidationError as exc:
                for field, messages in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, messages)


class QuotaInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Quota
    formset = QuotaInlineFormSet
    extra = 1


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(OrgUnit)
class OrgUnitAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["tree_name", "kind", "quota_summary"]
    list_filter = ["kind"]
    search_fields = ["name", "slug"]
    readonly_fields = ["path"]
    inlines = [QuotaInline, MembershipInline]
    ordering = ["path"]

    @admin.display(description="unit", ordering="path")
    def tree_name(self, obj: OrgUnit) -> str:
        return "\u2003" * obj.depth + ("└ " if obj.depth else "") + obj.name

    @admin.display(description="quotas (guaranteed / limit)")
    def quota_summary(self, obj: OrgUnit) -> str:
        return ", ".join(f"{q.gpu_type} {q.guaranteed}/{'∞' if q.limit is None else q.limit}" for q in obj.quotas.all())

    def get_queryset(self, request: HttpRequest):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).prefetch_related("quotas")

    def save_model(self, request: HttpRequest, obj: OrgUnit, form, change: bool) -> None:  # type: ignore[no-untyped-def]
        super().save_model(request, obj, form, change)
        expected = f"{obj.parent.path if obj.parent else '/'}{obj.pk}/"
        if obj.path != expected:
            # Creating or moving through the admin: keep the materialised paths right.
            old = obj.path
            if old:
                for d in OrgUnit.objects.filter(path__startswith=old).exclude(pk=obj.pk):
                    d.path = expected + d.path[len(old) :]
                    d.save(update_fields=["path"])
            obj.path = expected
            obj.save(update_fields=["path"])


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["user", "unit", "role"]
    list_filter = ["role"]
    search_fields = ["user__username", "unit__name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["prefix", "name", "kind", "user", "team", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["kind"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "token_hash", "created_at", "last_used_at"]


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["time", "actor_label", "action", "object_type", "object_id", "message"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor_label", "message", "object_id"]
    date_hierarchy = "time"

    # The audit log is append-only, for superusers too: no add, edit or delete here (the services write
    # it), so that what an admin did cannot be undone by the same admin. Entries can still be read.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
