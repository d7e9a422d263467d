"""Build the demo: an org of 2 business units, 4 departments and 8 teams with quotas that add
up, a user for each role, and a cluster of 2 spines, 4 leaves, 32 × 8 H100 and 8 × 8 A100 nodes
(each node one NVLink domain over two PCIe switches and two NUMA nodes, as an HGX board)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from scheduling.agent.tokens import new_enrolment_token, new_node_token
from scheduling.management.commands.demo_history import seed_history
from scheduling.models import EnrolmentToken, Gpu, Leaf, Node, NodeState, Spine
from tenants.models import OrgUnit, Role, UnitKind, hash_token
from tenants.services import membership_set, quota_set, unit_create

DEMO_ENROLMENT_TTL = timedelta(hours=24)  # what `manage.py enrolment_token` gives by default

DEMO_PASSWORD = "yardmaster-demo"

# name, kind, {gpu_type: (guaranteed, limit)}, children
ORG: tuple[Any, ...] = (
    "Acme AI Cluster",
    UnitKind.ROOT,
    {"H100": (256, None), "A100": (64, None)},
    [
        (
            "Research",
            UnitKind.BUSINESS_UNIT,
            {"H100": (160, None), "A100": (32, None)},
            [
                (
                    "Foundation Models",
                    UnitKind.DEPARTMENT,
                    {"H100": (112, None), "A100": (8, None)},
                    [
                        ("pretraining", UnitKind.TEAM, {"H100": (96, 200), "A100": (0, 16)}, []),
                        ("alignment", UnitKind.TEAM, {"H100": (16, 64), "A100": (8, 24)}, []),
                    ],
                ),
                (
                    "Vision",
                    UnitKind.DEPARTMENT,
                    {"H100": (48, None), "A100": (24, None)},
                    [
                        ("perception", UnitKind.TEAM, {"H100": (32, 96), "A100": (16, 32)}, []),
                        ("generative-video", UnitKind.TEAM, {"H100": (16, 64), "A100": (8, 32)}, []),
                    ],
                ),
            ],
        ),
        (
            "Products",
            UnitKind.BUSINESS_UNIT,
            {"H100": (96, None), "A100": (32, None)},
            [
                (
                    "Search",
                    UnitKind.DEPARTMENT,
                    {"H100": (56, None), "A100": (16, None)},
                    [
                        ("ranking", UnitKind.TEAM, {"H100": (32, 96), "A100": (8, 32)}, []),
                        ("retrieval", UnitKind.TEAM, {"H100": (24, 64), "A100": (8, 32)}, []),
                    ],
                ),
                (
                    "Assistants",
                    UnitKind.DEPARTMENT,
                    {"H100": (40, None), "A100": (16, None)},
                    [
                        ("speech", UnitKind.TEAM, {"H100": (24, 64), "A100": (8, 32)}, []),
                        ("agents", UnitKind.TEAM, {"H100": (16, 64), "A100": (8, 32)}, []),
                    ],
                ),
            ],
        ),
    ],
)

# username, unit name, role, what they are for
USERS = (
    ("admin", "Acme AI Cluster", Role.CLUSTER_ADMIN, "cluster admin (everything, Django admin too)"),
    ("rita", "Research", Role.ORG_ADMIN, "org admin of the Research business unit"),
    ("bob", "perception", Role.TEAM_LEAD, "team lead of perception"),
    ("alice", "pretraining", Role.MEMBER, "member of pretraining"),
    ("carol", "ranking", Role.MEMBER, "member of ranking"),
)


def build_cluster(
    *,
    spines: int = 2,
    leaves_per_spine: int = 2,
    layout: tuple[tuple[str, int], ...] = (("H100", 32), ("A100", 8)),
    gpus_per_node: int = 8,
    state: str = NodeState.NOT_READY,
) -> list[Node]:
    """Create spines, leaves and nodes; nodes are spread over the leaves round-robin by type."""
    leaves: list[Leaf] = []
    for s in range(1, spines + 1):
        spine = Spine.objects.create(name=f"spine-{s}")
        for _ in range(leaves_per_spine):
            leaves.append(Leaf.objects.create(name=f"leaf-{len(leaves) + 1}", spine=spine))
    nodes: list[Node] = []
    memory = {"H100": 81559, "A100": 81920, "H200": 143771}
    for gpu_type, count in layout:
        per_leaf = -(-count // len(leaves))
        for i in range(count):
            leaf = leaves[min(i // per_leaf, len(leaves) - 1)]
            name = f"{gpu_type.lower()}-{i + 1:02d}"
            node = Node.objects.create(
                name=name,
                leaf=leaf,
                gpu_type=gpu_type,
                state=state,
                address="127.0.0.1",
                simulated=True,
                cpus=128,
                memory_mb=2048 * 1024,
            )
            half = gpus_per_node // 2
            Gpu.objects.bulk_create(
                Gpu(
                    node=node,
                    index=g,
                    uuid=f"GPU-sim-{name}-{g}",
                    gpu_type=gpu_type,
                    model_name=f"NVIDIA {gpu_type} (simulated)",
                    memory_mb=memory.get(gpu_type, 81920),
                    nvlink_domain=f"{name}/nvl0",
                    pcie_switch=f"{name}/pcie{g // half}",
                    numa_node=f"{name}/numa{g // half}",
                )
                for g in range(gpus_per_node)
            )
            nodes.append(node)
    return nodes


class Command(BaseCommand):
    help = "Seed a demo org, users and a simulated cluster (idempotent: does nothing if the org exists)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--agent-tokens", help="Write per-node agent tokens to this JSON file (for the demo fleet)")
        parser.add_argument("--no-history", action="store_true", help="Skip the month of past jobs and telemetry")

    def handle(self, *args: Any, **opts: Any) -> None:
        if OrgUnit.objects.filter(kind=UnitKind.ROOT).exists():
            self.stdout.write("Demo data already present; leaving it as it is.")
        else:
            with transaction.atomic():
                self._seed()
                counts = {} if opts.get("no_history") else seed_history(now=timezone.now())
            self.stdout.write(self.style.SUCCESS("Seeded the demo org, users and cluster."))
            if counts:
                self.stdout.write("A month of history: " + ", ".join(f"{n:,} {what}" for what, n in counts.items()))
        if opts.get("agent_tokens"):
            self._write_agent_tokens(Path(opts["agent_tokens"]))
        self.stdout.write(f"Demo logins (password for all: {DEMO_PASSWORD}):")
        for username, _unit, _role, what in USERS:
            self.stdout.write(f"  {username:<6} {what}")

    def _seed(self) -> None:
        def create(spec: tuple[Any, ...], parent: OrgUnit | None) -> None:
            name, kind, quotas, children = spec
            unit = unit_create(actor=None, name=name, kind=kind, parent=parent)
            for gpu_type, (guaranteed, limit) in quotas.items():
                quota_set(actor=None, unit=unit, gpu_type=gpu_type, guaranteed=guaranteed, limit=limit)
            for child in children:
                create(child, unit)

        create(ORG, None)
        user_model = get_user_model()
        for username, unit_name, role, _ in USERS:
            user = user_model.objects.create_user(username=username, password=DEMO_PASSWORD, email=f"{username}@example.com")
            if role == Role.CLUSTER_ADMIN:
                user.is_staff = user.is_superuser = True
                user.save()
            membership_set(actor=None, user=user, unit=OrgUnit.objects.get(name=unit_name), role=role)
        build_cluster()
        _setup_is_not_news()

    def _write_agent_tokens(self, path: Path) -> None:
        """Fresh node tokens for every simulated node, plus an enrolment token, for `make run`."""
        tokens: dict[str, Any] = {"nodes": {}}
        for node in Node.objects.filter(simulated=True).select_related("leaf__spine"):
            raw = new_node_token()
            Node.objects.filter(pk=node.pk).update(token_hash=hash_token(raw))
            tokens["nodes"][node.name] = {
                "token": raw,
                "leaf": node.leaf.name,
                "spine": node.leaf.spine.name,
                "gpu_type": node.gpu_type,
                "gpus": node.gpus.count(),
            }
        raw_enrol = new_enrolment_token()
        # It expires as a real one does (enrolment_token_create's 24 h), and a re-seed (every `make run`)
        # revokes the ones the earlier runs wrote, rather than leave them live for ever.
        now = timezone.now()
        EnrolmentToken.objects.filter(name="demo", revoked_at__isnull=True).update(revoked_at=now)
        EnrolmentToken.objects.create(
            name="demo", token_hash=hash_token(raw_enrol), created_at=now, expires_at=now + DEMO_ENROLMENT_TTL
        )
        tokens["enrolment"] = raw_enrol
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(tokens, indent=1))
        path.chmod(0o600)
        self.stdout.write(f"Agent tokens for {len(tokens['nodes'])} simulated nodes written to {path}")


def _setup_is_not_news() -> None:
    """The demo's org and quotas are its starting point, not changes anyone made: the notifications
    collector starts past their audit rows (else every demo user signs in to eight "Quota changed (by
    system)" notifications). Changes made after the seed are collected as ever."""
    from django.db.models import Max

    from notifications.models import Watermark
    from tenants.models import AuditEntry

    last = AuditEntry.objects.aggregate(m=Max("id"))["m"] or 0
    Watermark.objects.update_or_create(name="audit", defaults={"last_id": last})
