"""Identity and registration: which node this agent speaks for, and with which token.

An enrolment token (``yen_…``) registers the node once; the node token the portal answers with is kept
in the state dir (0600) and used from then on, with the portal's limits (node.json). The journal
records a hash of the node token, so a journal written for another identity (a re-enrolled node, a
new portal database) is never trusted (nodeagent/agent.py).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import Any

from nodeagent import __version__
from nodeagent import journal as journal_mod
from nodeagent.client import Backoff, PortalClient, PortalError, PortalUnreachable
from nodeagent.config import BACKOFF_INITIAL_S
from nodeagent.context import AgentFatal, Node

ENROLMENT_PREFIX = "yen_"
LIMIT_KEYS = ("heartbeat_interval_s", "stop_after_s", "fence_after_s", "max_grace_s", "window_s")


def identity_of(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:16]


class Identity:
    """The node token and the portal's limits kept beside it. `adopt_limits` applies limits the portal
    sent earlier (node.json) to the running agent; registration gives up once `stop_event` is set."""

    def __init__(self, node: Node, *, stop_event: threading.Event, adopt_limits: Callable[[dict[str, Any]], None]) -> None:
        self.node = node
        self.stop_event = stop_event
        self.adopt_limits = adopt_limits
        self.token_file = node.state_dir / "node-token"
        self.node_file = node.state_dir / "node.json"

    def node_token(self) -> str | None:
        """The node token: given, kept from an earlier registration, or got now (None: stopped meanwhile)."""
        node = self.node
        config = node.config
        if not config.token.startswith(ENROLMENT_PREFIX):
            return config.token
        if self.token_file.exists():
            self.load_portal_limits()
            return self.token_file.read_text().strip()
        enrol = PortalClient(config.portal, config.token, timeout_s=config.http_timeout_s)
        body = {
            "name": config.name,
            "address": config.address,
            "leaf": config.leaf,
            "spine": config.spine,
            "simulated": node.gpus.simulated,
            "agent_version": __version__,
            # The scheduler holds tasks to these (0: unknown, not limited); a simulated node's are configured.
            "cpus": node.gpus.cpus,
            "memory_mb": node.gpus.memory_mb,
            # Configured, else what NVML says (only real GPUs know one: simulated sources have none).
            "fabric_domain": config.fabric_domain or str(getattr(node.gpus, "fabric_domain", "")),
            "container_runtime": node.container_runtime[0],
            "container_runtime_note": node.container_runtime[1],
            "gpus": [gpu.to_json() for gpu in node.gpus.gpus()],
        }
        backoff = Backoff(initial_s=BACKOFF_INITIAL_S, max_s=30.0)
        while not self.stop_event.is_set():
            try:
                answer = enrol.post("register", body)
                break
            except PortalUnreachable as exc:
                delay = backoff.next_delay()
                node.log.warning("cannot register with %s (%s); retrying in %.1f s", config.portal, exc, delay)
                self.stop_event.wait(delay)
            except PortalError as exc:
                raise AgentFatal(self.refusal(exc)) from exc
        else:
            return None
        token = str(answer["token"])
        journal_mod.atomic_write(self.token_file, token + "\n", mode=0o600)
        journal_mod.atomic_write(
            self.node_file, json.dumps({"node": answer.get("node"), **{k: answer.get(k) for k in LIMIT_KEYS}})
        )
        self.load_portal_limits()
        node.log.info("registered as %s", answer.get("node"))
        return token

    def refusal(self, exc: PortalError) -> str:
        if exc.status == 409:
            return (
                f"node {self.node.config.name!r} is registered already: pass its node token (ynd_…) with --token, "
                f"or remove the node in the portal and enrol it again"
            )
        if exc.status == 401:
            return "the portal refused the enrolment token (unknown, expired, used up or revoked)"
        return f"the portal refused the registration: HTTP {exc.status} {exc.body}"

    def load_portal_limits(self) -> None:
        try:
            saved: Any = json.loads(self.node_file.read_text())
        except (OSError, ValueError):
            return
        if isinstance(saved, dict):
            self.adopt_limits(saved)

    def save_portal_limits(self, limits: dict[str, Any]) -> None:
        """Keep the portal's latest limits, so a restarted agent applies them before its first heartbeat."""
        try:
            saved: Any = json.loads(self.node_file.read_text()) if self.node_file.exists() else {}
        except (OSError, ValueError):
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
        merged = {**saved, **{k: limits[k] for k in LIMIT_KEYS if k in limits}}
        if merged != saved:
            journal_mod.atomic_write(self.node_file, json.dumps(merged))
