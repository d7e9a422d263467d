"""Sending one notification: an e-mail through Django's SMTP backend, or a signed webhook POST."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from notifications.models import Event, Notification, Webhook

SIGNATURE_HEADER = "X-Yardmaster-Signature-256"


class DeliveryError(Exception):
    """The channel refused or failed; the message is shown to the webhook's owner."""


def notify_settings() -> dict[str, Any]:
    return dict(getattr(settings, "YARD_NOTIFY", {}))


def email_enabled() -> bool:
    """E-mail is a channel only where an SMTP server is configured (EMAIL_HOST)."""
    return bool(getattr(settings, "EMAIL_HOST", ""))


def absolute(path: str) -> str:
    base = str(notify_settings().get("PUBLIC_URL", "")).rstrip("/")
    return f"{base}{path}" if path else base


def send_email(notification: Notification) -> None:
    event, user = notification.event, notification.user
    if user is None or not user.email:
        raise DeliveryError("the recipient has no e-mail address")
    lines = [event.body, ""]
    if event.link:
        lines.append(absolute(event.link))
    lines += ["", f"Choose what Yardmaster e-mails you: {absolute('/notifications/settings/')}"]
    message = EmailMessage(
        subject=f"[Yardmaster] {event.title}",
        body="\n".join(lines),
        to=[user.email],
        headers={"X-Yardmaster-Event": event.kind, "X-Yardmaster-Delivery": str(notification.pk)},
        connection=get_connection(timeout=notify_settings().get("EMAIL_TIMEOUT_S", 10)),
    )
    try:
        message.send(fail_silently=False)
    except Exception as exc:  # smtplib raises OSError and SMTPException subclasses; any of them is a failed try
        raise DeliveryError(f"SMTP: {type(exc).__name__}: {exc}") from exc


def payload(event: Event, notification_id: int) -> dict[str, Any]:
    """Slack, Mattermost and Teams (incoming webhook) show ``text``; programs read ``yardmaster``."""
    url = absolute(event.link) if event.link else ""
    text = f"*{event.title}*\n{event.body}" + (f"\n<{url}|Open in Yardmaster>" if url else "")
    return {
        "text": text,
        "username": "Yardmaster",
        "yardmaster": {
            "event": event.kind,
            "event_id": event.pk,
            "delivery": notification_id,
            "time": event.time.isoformat(),
            "title": event.title,
            "body": event.body,
            "url": url,
            "team": event.team.slug if event.team else None,
            "job": event.job_id,
            "data": event.data,
        },
    }


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _denied_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n, strict=False) for n in notify_settings().get("WEBHOOK_DENY_NETWORKS", ())]


def check_webhook_url(url: str) -> str:
    """'' if the portal may call ``url``; otherwise why not (for the form and for each delivery)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "use an http:// or https:// URL with a host name"
    denied = _denied_networks()
    if not denied:
        return ""
    try:
        infos = socket.getaddrinfo(
            parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), proto=socket.IPPROTO_TCP
        )
    except socket.gaierror:
        return f"the host {parts.hostname} cannot be resolved"
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if any(address in network for network in denied):
            # The metadata service of a cloud VM, or the portal's own host: not a place for user-given URLs.
            return f"{parts.hostname} resolves to {address}, which webhooks may not call (YARD_WEBHOOK_DENY_NETWORKS)"
    return ""


def post_webhook(notification: Notification, webhook: Webhook) -> None:
    refused = check_webhook_url(webhook.url)
    if refused:
        raise DeliveryError(refused)
    body = json.dumps(payload(notification.event, notification.pk), separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Yardmaster-Webhook/1",
        "X-Yardmaster-Event": notification.event.kind,
        "X-Yardmaster-Delivery": str(notification.pk),
        SIGNATURE_HEADER: sign(webhook.secret, body),
    }
    timeout = float(notify_settings().get("WEBHOOK_TIMEOUT_S", 5.0))
    try:
        # No redirects: a 3xx could send the signed body somewhere the owner never named.
        response = requests.post(webhook.url, data=body, headers=headers, timeout=timeout, allow_redirects=False)
    except requests.RequestException as exc:
        raise DeliveryError(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"HTTP {response.status_code}: {response.text[:200]}")
