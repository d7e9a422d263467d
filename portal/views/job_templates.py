"""Saved job templates: a user's named job specs, offered on the submit page."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet

from portal.forms import JobForm, format_env
from scheduling import images
from scheduling.models import JobTemplate
from tenants.services import audit


def templates_of(*, user: Any) -> QuerySet[JobTemplate]:
    return JobTemplate.objects.filter(user=user) if user.is_authenticated else JobTemplate.objects.none()


@transaction.atomic
def job_template_save(*, user: User, name: str, form: JobForm) -> JobTemplate:
    """Save (or overwrite) the user's template ``name`` with the form's spec, as the form's initial data."""
    data = form.cleaned_data
    spec = {
        "name": data["name"],
        "team": data["team"].pk,
        "tier": data["tier"],
        "replicas": data["replicas"],
        "gpus_per_replica": data["gpus_per_replica"],
        "gpu_type": data["gpu_type"],
        "command": data.get("command") or "",
        "env": format_env(data.get("env") or {}),
        "time_limit_h": data.get("time_limit_h"),
        "checkpoint_dir": data.get("checkpoint_dir") or "",
        "image": data.get("image") or "",
        "container_mounts": images.mounts_text(data.get("container_mounts") or []),
        "container_workdir": data.get("container_workdir") or "",
        "array": data.get("array") or "",
    }
    template, _ = JobTemplate.objects.update_or_create(user=user, name=name, defaults={"spec": spec})
    audit(actor=user, action="jobtemplate.save", obj=template, message=f"saved job template {name}")
    return template
