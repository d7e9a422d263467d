from django.contrib import admin

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
    SchedulerLease,
    Spine,
    Task,
)


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
admin.site.register(EnrolmentToken)
