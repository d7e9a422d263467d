"""What can be notified, on which channels, and what each user gets unless they say otherwise."""

from __future__ import annotations

from django.db import models


class Kind(models.TextChoices):
    JOB_STARTED = "job_started", "Job started"
    JOB_COMPLETED = "job_completed", "Job completed"
    JOB_FAILED = "job_failed", "Job failed"
    JOB_PREEMPTED = "job_preempted", "Job preempted and requeued"
    JOB_REQUEUED = "job_requeued", "Job requeued after its node was lost"
    JOB_NEAR_LIMIT = "job_near_limit", "Job near its time limit"
    IDLE_WARNING = "idle_warning", "Notebook idle: warning"
    IDLE_STOPPED = "idle_stopped", "Notebook idle: stopped"
    QUOTA_CHANGED = "quota_changed", "Quota of your team changed"
    SERVICE_CRASH_LOOP = "service_crash_loop", "Service replica crash-looping"
    SERVICE_ROLLED_BACK = "service_rolled_back", "Service rollout rolled back"
    # Not a preference: the owner of a webhook is always told in the portal that it was switched off.
    WEBHOOK_DISABLED = "webhook_disabled", "Webhook disabled"


class Channel(models.TextChoices):
    PORTAL = "portal", "In the portal"
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook"


# Kinds a person can choose for themselves (the preference form's rows, a webhook's checkboxes).
CHOOSABLE = tuple(k for k in Kind if k != Kind.WEBHOOK_DISABLED)

# Defaults: everything in the portal (it is quiet: an unread count), e-mail only for what needs a person
# to act — a failure, a preemption, a job about to hit its limit, a notebook about to be (or just) stopped.
DEFAULTS: dict[str, frozenset[str]] = {
    Channel.PORTAL: frozenset(Kind),
    Channel.EMAIL: frozenset(
        {
            Kind.JOB_FAILED,
            Kind.JOB_PREEMPTED,
            Kind.JOB_NEAR_LIMIT,
            Kind.IDLE_WARNING,
            Kind.IDLE_STOPPED,
            Kind.SERVICE_CRASH_LOOP,
            Kind.SERVICE_ROLLED_BACK,
        }
    ),
    # What a new webhook is ticked for: everything but "started" (the noisiest and least actionable).
    Channel.WEBHOOK: frozenset(CHOOSABLE) - {Kind.JOB_STARTED},
}
